"""PLAN.md: Goal, Constraints, Progress (done / in progress / blocked), Key decisions, Next steps,
Critical context, Relevant files — the state of the campaign for whoever picks it up next."""

from __future__ import annotations

from pathlib import Path

from rooftop.campaign.collect import one_line, workload_evidence
from rooftop.campaign.completeness import Completeness
from rooftop.campaign.diagnosis import touches_capacity
from rooftop.campaign.evidence import Diagnosis, Evidence, Finding
from rooftop.campaign.store import DecisionRow, RunRow
from rooftop.report import fmt, incomplete_md, workload_md
from rooftop.spec.campaign import CampaignSpec

SECTIONS = ["Goal", "Constraints", "Progress", "Key decisions", "Next steps", "Critical context",
            "Relevant files"]


def goal(run: RunRow, spec: CampaignSpec) -> str:
    levers = ", ".join(lv.name for lv in spec.levers) or "none"
    return (f"{run.goal or '(no goal given)'}\n\nCampaign `{run.name}` ({spec.campaign.mode} mode): baseline "
            f"`{spec.deployment.engine}` serving `{spec.deployment.model}` ({spec.deployment.topology}); "
            f"levers: {levers}.\n")


def constraints(spec: CampaignSpec, run: RunRow) -> str:
    b, q = spec.bench, spec.quality
    w = workload_evidence(spec, None)
    lines = [
        f"- Hardware: {spec.hardware.gpu or 'no GPU named (CPU or detected)'}"
        + (f"; host {run.host}" if run.host else ""),
        f"- Model: {spec.model.path or spec.model.preset or spec.deployment.model}",
        f"- Baseline engine args: `{fmt.redact(spec.deployment.args)}`",
        f"- Workload: {workload_md.kind(w)}; {workload_md.requests(w)}; {workload_md.arrivals(w)}",
        f"- Bench: {b.repeats} repeats, {b.warmup} warm-up requests per bring-up",
        f"- Profile: {'C=' + str(spec.profile_concurrency) + f', {spec.profile.steps} steps' if spec.profile.enabled else 'off'}",
        f"- Quality: {q.prompts} greedy prompts × {q.max_tokens} tokens; flagged below {q.agreement_threshold:.0%}"
        f" agreement or above {q.kl_threshold} nats mean KL"
        + (f" (a prompt whose outputs part at a near-tie, within {q.tie_margin:g} nats, counts as agreeing)"
           if q.tie_margin > 0 else " (near-tie partings not counted as agreeing: tie_margin 0)"),
    ]
    return "\n".join(lines) + "\n"


def _group(keys: list[str]) -> list[str]:
    """'main/baseline/r0/deploy', ... -> 'main/baseline/r0: deploy, sweep, ...'."""
    groups: dict[str, list[str]] = {}
    for k in keys:
        head, _, stage = k.rpartition("/")
        groups.setdefault(head, []).append(stage)
    return [f"- {h}: {', '.join(s)}" for h, s in groups.items()]


def progress(units: dict[str, str], errors: dict[str, str], remaining: list[str]) -> str:
    done = [k for k, s in units.items() if s == "done"]
    running = [k for k, s in units.items() if s == "running"]
    interrupted = [k for k, s in units.items() if s == "interrupted"]
    out = ["### Done", ""] + (_group(done) or ["- nothing yet"])
    if interrupted:
        out.append(f"- ({len(interrupted)} unit(s) were cut off by a kill; any measurement among them "
                   f"was redone on resume)")
    out.append("")
    out += ["### In progress", ""]
    out += (_group(running) + [f"- not started: {k}" for k in remaining]) or ["- nothing: the campaign is complete"]
    out += ["", "### Blocked", ""]
    out += [f"- {k}: {one_line(e)}" for k, e in errors.items()] or ["- nothing"]
    return "\n".join(out) + "\n"


def decisions(ev: Evidence, rows: list[DecisionRow], dx: Diagnosis) -> str:
    out = []
    for lv in ev.levers:
        tok = [e for e in lv.effects if e.metric == "output_tok_s"]
        if not tok:
            out.append(f"- **{lv.name}**: not measured (yet).")
            continue
        top = max(tok, key=lambda e: e.concurrency)
        state = "joined the baseline" if lv.joined_baseline else (
            "kept out of the baseline" if ev.mode == "cumulative" else f"measured against {lv.base_variant}")
        out.append(f"- **{lv.name}** ({lv.hypothesis or 'no hypothesis'}): tok/s {fmt.effect(top)} at "
                   f"C={top.concurrency}; {state}.")
    for d in rows:
        if d.kind not in ("comparison",):
            out.append(f"- {d.decided_utc}: {d.kind} {d.subject} {fmt.redact(d.payload)}")
    if dx.top is not None:
        gain = dx.top.gain_text() if dx.top.expected_gain else "not quantified"
        out.append(f"- Top bottleneck: **{dx.top.title}** (expected gain {gain}).")
    return "\n".join(out) + "\n" if out else "_No decisions yet._\n"


def _action(f: Finding, ev: Evidence) -> str:
    if f.rule == "capacity":
        lever = f.numbers.get("lever")
        how = f" as lever {lever} did" if lever else ""
        return (f"Bound the {f.numbers['component']}'s work by the requests' real context, not the allocated "
                f"capacity: cap the context length or use an actual-length kernel{how}; keep the change "
                f"in the baseline and re-profile.")
    if f.rule == "pd":
        if f.numbers.get("said") == "not measured":
            return f"Get PD measured: {f.sentence}"
        if f.numbers.get("said") == "helped":
            return f"Keep PD in the deployment: {f.sentence}"
        return f"PD is not where the gain is ({f.numbers.get('said')}); measure it again once the top finding is fixed."
    if f.rule == "lever":
        return f"Adopt lever {f.numbers['lever']} (measured {f.numbers['ratio']:.2f}×) after its quality check."
    if f.rule == "idle":
        if f.numbers.get("graphed"):  # CUDA graphs already replay the steps: advise what is left
            return ("Cut host overhead per step (fewer launches, a leaner scheduler, sampling and token hand-out): "
                    "the profiled steps already ran in CUDA graphs.")
        return "Cut host overhead per step (CUDA graphs, fewer launches, leaner scheduler)."
    if f.rule == "what_bounds":
        if f.numbers.get("component") is None:
            return "Profile the baseline ([profile] enabled) to see which component takes the decode step."
        return (f"Shorten the {f.numbers['component']} ({f.numbers['share']:.0%} of the decode step): put a change "
                "that does (another kernel or backend for it, fewer of its ops per step) in a lever and measure it.")
    if f.rule == "roofline":
        return f"Close the gap in the {f.numbers.get('gap_component', 'largest component')}: {f.sentence}"
    return f.sentence


def next_steps(ev: Evidence, dx: Diagnosis, remaining: list[str], run_dir: Path) -> str:
    out = []
    if remaining:
        out.append(f"Finish the campaign: `rooftop run --resume {run_dir}` ({len(remaining)} unit(s) left).")
    for f in [f for f in dx.findings if f.expected_gain][:3]:
        out.append(_action(f, ev))
    if dx.top is not None and dx.top.rule == "what_bounds":  # no lever gained: the goal's answer is the lead
        out.append(_action(dx.top, ev))
    for f in dx.findings:
        if f.rule == "pd" and f.numbers.get("said") == "not measured":
            out.append(_action(f, ev))
    if dx.binds_next is not None:
        out.append(f"Then: {dx.binds_next.sentence}")
    if not any(touches_capacity(lv) for lv in ev.levers):
        out.append("Add a lever that caps the context length: capacity-sized work is invisible at small contexts.")
    return "\n".join(f"{i + 1}. {s}" for i, s in enumerate(out)) + "\n" if out else "_None._\n"


def critical_context(spec: CampaignSpec, dx: Diagnosis) -> str:
    lines = [
        "- Definitions: TTFT from the decision to send; TPOT = (E2E − TTFT) / (output tokens − 1); "
        f"intervals are {fmt.pct(spec.bench.confidence)} bootstrap across repeats; one repeat = one bring-up and "
        "one sweep.",
        f"- Baseline deployment: `{fmt.redact(spec.deployment.model_dump(exclude_none=True))}`",
    ]
    for lv in spec.levers:
        lines.append(f"- Lever {lv.name}: `{fmt.redact(lv.changes())}`"
                     + (" (quality checked)" if lv.quality_check else ""))
    for f in dx.findings:
        if f.rule == "capacity":
            lines.append(f"- Capacity-derived sizes seen in the profile: dims {', '.join(f.numbers['dims'])} "
                         f"= {', '.join(f.numbers['derived_from'])}; ops {', '.join(f.numbers['ops'][:8])}.")
    return "\n".join(lines) + "\n"


def relevant_files(run_dir: Path, plots: dict[str, Path], ev: Evidence) -> str:
    files = [("store.sqlite", "everything measured; `rooftop report` rebuilds the documents from it"),
             ("SUMMARY.md", "results and finding"), ("results.json", "the same, as data")]
    files += [(str(p.relative_to(run_dir)), f"plot: {n}") for n, p in plots.items()]
    files += [(p.trace_path, f"profile trace of {v}") for v, p in ev.profiles.items()]
    logs = sorted(str(p.relative_to(run_dir)) for p in run_dir.glob("**/*.log"))
    files += [(p, "process log") for p in logs]
    return "\n".join(f"- `{p}` — {what}" for p, what in files) + "\n"


def render(run: RunRow, spec: CampaignSpec, ev: Evidence, dx: Diagnosis, units: dict[str, str],
           errors: dict[str, str], remaining: list[str], decision_rows: list[DecisionRow],
           plots: dict[str, Path], run_dir: Path, done: Completeness) -> str:
    """The whole PLAN.md text; an incomplete run says so first."""
    body = {
        "Goal": goal(run, spec),
        "Constraints": constraints(spec, run),
        "Progress": progress(units, errors, remaining),
        "Key decisions": decisions(ev, decision_rows, dx),
        "Next steps": next_steps(ev, dx, remaining, run_dir),
        "Critical context": critical_context(spec, dx),
        "Relevant files": relevant_files(run_dir, plots, ev),
    }
    banner = incomplete_md.banner(done, run_dir)
    return f"# {run.name} — plan\n\n" + (banner + "\n" if banner else "") + "\n".join(
        f"## {s}\n\n{body[s]}" for s in SECTIONS)
