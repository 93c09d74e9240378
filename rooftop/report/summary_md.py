"""SUMMARY.md: Stack, Workload, Topology and verified placement, Single-node results, PD results, Levers,
Roofline, Profile, Finding, Launch scripts — every compared figure with its interval."""

from __future__ import annotations

import json
from pathlib import Path

from rooftop.bench.slo import short as capacity_text
from rooftop.campaign.completeness import Completeness
from rooftop.campaign.evidence import Diagnosis, Evidence
from rooftop.campaign.quality import ties_note
from rooftop.campaign.store import DeploymentRow, RunRow
from rooftop.campaign.verdicts import capacity_change
from rooftop.report import fmt, incomplete_md
from rooftop.report.stack_md import placement, stack
from rooftop.report.workload_md import headline, workload

SECTIONS = ["Stack", "Workload", "Topology and verified placement", "Single-node results", "PD results", "Levers",
            "Roofline", "Profile", "Finding", "Launch scripts"]

def definitions(confidence: float) -> str:
    return (
        "TTFT is from the moment the load generator decided to send a request (time waiting for a "
        "concurrency slot counts) to its first token; TPOT is (E2E − TTFT) / (output tokens − 1). "
        f"Intervals are {fmt.pct(confidence)} bootstrap intervals across repeats (one repeat = one deployment, "
        "one sweep; repeats of compared variants alternate in time). A verdict says \"faster\" or \"slower\" "
        "only when the whole interval of the ratio lies on one side of 1."
    )


def planned_variants(ev: Evidence) -> list[str]:
    """The baseline and every lever's variant, in campaign order."""
    return list(dict.fromkeys([ev.baseline, *(lv.variant for lv in ev.levers)]))


def _why_not(ev: Evidence, variant: str, *stages: str) -> str:
    return ev.why(variant, *stages) or "not run yet (`rooftop run --resume RUN_DIR` continues the campaign)"


def results(ev: Evidence, topology: str) -> str:
    chosen = [v for v in ev.variants.values() if v.topology == topology]
    if not chosen:
        planned = [lv for lv in ev.levers if (lv.changes.get("topology") or "single") == topology]
        names = ([ev.baseline] if topology == "single" else []) + [lv.variant for lv in planned]
        if not names:
            return f"_No {topology} variant in this campaign._\n"
        why = [f"- {name}: {_why_not(ev, name, 'deploy', 'verify', 'warmup', 'sweep')}" for name in names]
        return f"_No {topology} variant was measured:_\n\n" + "\n".join(why) + "\n"
    out = [line for line in [telemetry_line(ev, chosen, say_off=topology == "single")] if line]
    for v in chosen:
        out.append(f"**{v.name}**" + (f" (levers: {', '.join(v.levers)})" if v.levers else ""))
        out.append("")
        out.append(fmt.level_table(v.levels, ev.confidence))
        out += telemetry_notes(v.levels)
        if ev.slo is not None:
            out.append((v.slo_capacity["sentence"][0].upper() + v.slo_capacity["sentence"][1:]
                        if v.slo_capacity else "No SLO capacity: no level of this variant has SLO figures "
                        "(measured before the campaign stated its [slo]?)") + ".\n")
        if v.knee_concurrency is not None:
            out.append(f"Knee: C={v.knee_concurrency}" + (f" ({v.knee_note})" if v.knee_note else "") + ".\n")
    if topology == "pd":
        for lv in ev.levers:
            if lv.changes.get("topology") == "pd":
                rows = [[str(e.concurrency), fmt.effect(e)] for e in lv.effects if e.metric == "output_tok_s"]
                out.append(f"PD ({lv.variant}) against {lv.base_variant}, output tok/s:\n")
                out.append(fmt.table(["C", f"ratio [{fmt.pct(ev.confidence)} CI] verdict"], rows))
    return "\n".join(out)


def telemetry_line(ev: Evidence, variants, say_off: bool) -> str:
    """What the GPU columns are and where they came from, or (`say_off`) why there are none."""
    got = [lv.telemetry for v in variants for lv in v.levels if lv.telemetry is not None]
    if not got:
        return f"_{ev.telemetry_note}._\n" if ev.telemetry_note and say_off else ""
    t = got[0]
    gpus = sorted({g for x in got for g in x["gpus"]})
    energy = {x["energy_source"] for x in got} - {None}
    short = any(x["all"]["sm_util_mean_pct"]["mean"] is None for x in got)
    return (f"GPU telemetry ({t['source'].upper()}, GPU{'s' if len(gpus) > 1 else ''} "
            f"{', '.join(map(str, gpus))}, over each level's measured window): GPU util is the share of "
            "time a kernel ran (NVML's and DCGM's utilization, not how busy the SMs were)"
            + (", not given (–) for a level that lasted under 1 s, the driver's utilization period" if short else "")
            + "; power is the GPUs' mean power over the level, summed; J/tok is their energy over the level ("
            + ("the GPU's energy counter" if energy == {"counter"} else "power integrated over time"
               if energy == {"power_integral"} else "counter or power integral") + ") per output token.\n")


# A level whose telemetry covers less of it than this is said (as `rooftop bench` says it)
TELEMETRY_COVERAGE_WARN = 0.9


def telemetry_notes(levels) -> list[str]:
    """Per level, what its GPU telemetry's note says (reads that failed, GPUs an all-GPU figure leaves
    out, gaps) and a coverage under TELEMETRY_COVERAGE_WARN, as `rooftop bench` prints them."""
    out = []
    for lv in levels:
        t = lv.telemetry
        if t is None:
            continue
        if t.get("note"):
            out.append(f"_GPU telemetry at C={lv.concurrency}: {t['note']}; figures from the readings that "
                       "succeeded._\n")
        if t.get("coverage") is not None and t["coverage"] < TELEMETRY_COVERAGE_WARN:
            out.append(f"_GPU telemetry at C={lv.concurrency} covers {100 * t['coverage']:.0f}% of the level"
                       + (f" (longest stretch without a reading {t['max_gap_s']:.1f} s)" if t.get("max_gap_s")
                          else "") + "._\n")
    return out


def levers(ev: Evidence) -> str:
    if not ev.levers:
        return "_No levers in this campaign._\n"
    rows = []
    for lv in ev.levers:
        concs = sorted({e.concurrency for e in lv.effects})
        if not concs:
            why = ev.why(lv.variant, "deploy", "verify", "warmup", "sweep") or (
                f"its base {lv.base_variant}: {ev.why(lv.base_variant, 'deploy', 'verify', 'warmup', 'sweep')}"
                if ev.why(lv.base_variant) else "not run yet")
            rows.append([lv.name, lv.hypothesis, "–", f"not measured: {why}", "–", "–",
                         *(["–"] if ev.slo is not None else []), "–", "–"])
        for c in concs:
            q = f"not checked: {ev.stage_errors[lv.variant]['quality']}" \
                if "quality" in ev.stage_errors.get(lv.variant, {}) else "–"
            if lv.quality:
                q = (f"agreement {lv.quality.get('agreement', 0):.0%}"
                     + ties_note(lv.quality.get("tie_flips") or 0, lv.quality.get("prompts"),
                                 lv.quality.get("agreement_ties_as_agreeing"))
                     + (f", KL {lv.quality['mean_kl']:.3g}" if lv.quality.get("mean_kl") is not None else "")
                     + (" **flagged**" if lv.quality.get("flagged") else ""))
            at = next((e.label for e in lv.effects if e.concurrency == c and e.label), str(c))
            rows.append([lv.name, lv.hypothesis, at, fmt.effect(lv.effect("output_tok_s", c)),
                         fmt.effect(lv.effect("ttft_ms", c)), fmt.effect(lv.effect("tpot_ms", c)),
                         *([fmt.effect(lv.effect("goodput_req_s", c))] if ev.slo is not None else []), q,
                         ("joined baseline" if lv.joined_baseline else f"vs {lv.base_variant}")])
    head = ["lever", "hypothesis", "level" if any(e.label for lv in ev.levers for e in lv.effects) else "C",
            "tok/s ratio", "TTFT ratio", "TPOT ratio",
            *(["goodput ratio"] if ev.slo is not None else []), "quality", "decision"]
    changes = "\n".join(f"- **{lv.name}** changes: `{json.dumps(lv.changes, sort_keys=True)}`" for lv in ev.levers)
    return (fmt.table(head, rows) + "\nRatios are lever ÷ base; for TTFT and TPOT lower is better, so "
            "\"faster\" there means a ratio below 1.\n\n" + slo_capacities(ev) + changes + "\n")


def slo_capacities(ev: Evidence) -> str:
    """Each lever's SLO capacity beside its base's, with their intervals and whether it moved."""
    if ev.slo is None or not ev.levers:
        return ""
    rows = []
    for lv in ev.levers:
        base, cand = ev.variants.get(lv.base_variant), ev.variants.get(lv.variant)
        b, c = (base.slo_capacity if base else None), (cand.slo_capacity if cand else None)
        rows.append([lv.name, f"{lv.base_variant}: {capacity_text(b)}", f"{lv.variant}: {capacity_text(c)}",
                     capacity_change(b, c)])
    return (f"Capacity under the SLO ({ev.slo['describe']}): the highest concurrency at which it held, "
            f"with its {fmt.pct(ev.confidence)} interval across repeats.\n\n"
            + fmt.table(["lever", "base capacity", "lever capacity", "change"], rows) + "\n")


def roofline(ev: Evidence) -> str:
    absent = [f"- {v}: {ev.missing.get(f'roofline:{v}') or _why_not(ev, v)}" for v in planned_variants(ev)
              if v not in ev.rooflines]
    if not ev.rooflines:
        return "_No roofline was computed:_\n\n" + "\n".join(absent) + "\n"
    rows = []
    for r in ev.rooflines.values():
        measured, times = "–", "–"
        if r.measured_step_ms and r.floor_ms > 0:
            measured = fmt.with_ci(r.measured_step_ms, r.measured_step_low, r.measured_step_high, 2)
            # the floor is analytic: the ratio's interval is the measured step's, divided by it
            times = fmt.with_ci(r.measured_step_ms / r.floor_ms, r.measured_step_low / r.floor_ms,
                                r.measured_step_high / r.floor_ms, 1)
        rows.append([r.variant, r.hardware, str(r.batch), str(r.context), str(r.context_capacity or "–"),
                     f"{fmt.num(r.floor_ms, 3)} (bound)", measured, times])
    ci = f"[{fmt.pct(ev.confidence)} CI]"
    out = fmt.table(["variant", "hardware", "batch", "context", "capacity", "floor ms", f"measured step ms {ci}",
                     f"× floor {ci}"], rows)
    out += ("\nMeasured step: the server's own decode step at that concurrency where it exports one (the "
            "embedded engine's step histogram; vLLM's and SGLang's server-side inter-token latency, which like "
            "TPOT counts prefills run between two tokens), else TPOT.\n")
    notes = list(dict.fromkeys(n for r in ev.rooflines.values() for n in r.notes))
    if notes:  # what the floors assumed where the model's config left a choice
        out += "\nThe floors assume:\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    if absent:
        out += "\nNo roofline for:\n\n" + "\n".join(absent) + "\n"
    base = ev.rooflines.get(ev.baseline)
    if base and base.component_floor_ms:
        comp = sorted(base.component_floor_ms.items(), key=lambda kv: -kv[1])
        out += f"\nFloors of a {ev.baseline} decode step by component:\n\n"
        out += fmt.table(["component", "floor ms"], [[k, fmt.num(v, 4)] for k, v in comp])
    return out


def profile(ev: Evidence) -> str:
    if not ev.profiling:
        return "_Profiling is off in this campaign (`[profile] enabled = false`)._\n"
    out, absent = [], []
    for variant in planned_variants(ev):
        got = [name for name in ev.profiles if name == variant or name.startswith(variant + "/")]
        for name in (n for n in ev.missing if n.startswith(f"profile:{variant}/")):
            absent.append(f"- {name.split(':', 1)[1]}: {ev.missing[name]}")
        if not got:
            absent.append(f"- {variant}: {ev.missing.get(f'profile:{variant}') or _why_not(ev, variant, 'profile')}")
    if not ev.profiles:
        return "_No profile was captured:_\n\n" + "\n".join(absent) + "\n"
    for p in ev.profiles.values():
        unit = "GPU" if p.device == "gpu" else "CPU"
        head = (f"**{p.variant}** — {p.steps} steps at C={p.concurrency}, {fmt.num(p.busy_ms_per_step, 2)} ms "
                f"{unit}-busy per step")
        if p.idle_share is not None:
            head += f", {unit} idle {p.idle_share:.0%}"
        if p.tensor_core_share is not None:
            head += f", tensor cores {p.tensor_core_share:.0%}"
        out.append(head + f". Trace: `{p.trace_path}`\n")
        if p.measured:
            out.append(f"Measured: {p.measured}.\n")
        if p.attribution_source:
            unattributed = (f"; {p.unattributed_share:.0%} of the step in no component"
                            if p.unattributed_share is not None else "")
            out.append(f"Attributed by {p.attribution_source}{unattributed}.\n")
        for note in p.notes:
            # how the step was attributed, and (a trace of several GPUs) what its ms per step are per
            if note.startswith(("module paths come from the eager map", "the eager map could not be taken",
                                "the step ran a torch.compile graph", "kernels ran on ")) \
                    or "ran as CUDA-graph replays" in note:
                out.append(f"_{note[0].upper() + note[1:]}._\n")
        out.append(fmt.table(["component", "share", "ms/step", "path"],
                             [[c.name, f"{c.share:.1%}", fmt.num(c.ms_per_step, 3), c.path]
                              for c in p.components[:10]]))
        if p.capacity_findings:
            out.append("Work sized by capacity, not by the requests:\n")
            out.append(fmt.table(["dim", "derived from", "ops", "component", "ms/step"],
                                 [[str(c.dim), c.derived_from, ", ".join(c.ops), c.component,
                                   fmt.num(c.ms_per_step, 3)]
                                  for c in p.capacity_findings]))
    if absent:
        out.append("No profile of:\n\n" + "\n".join(absent) + "\n")
    return "\n".join(out)


def finding(dx: Diagnosis, ev: Evidence) -> str:
    if not dx.findings:
        why = [f"- {v}: {ev.why(v)}" for v in planned_variants(ev) if ev.why(v)]
        return "_Not enough evidence for a finding yet" + (":_\n\n" + "\n".join(why) if why else "._") + "\n"
    top = dx.top
    out = [f"**{top.title}.** {top.sentence}", "", f"Evidence: {top.evidence_pointer}.", ""]
    pd = next((f for f in dx.findings if f.rule == "pd" and f is not top), None)
    if pd is not None:
        out += [f"**PD:** {pd.sentence}", ""]
    if dx.binds_next is not None:
        out += [f"**Next:** {dx.binds_next.sentence}", ""]
    out.append("All findings, ranked by expected gain:\n")
    rows = [[str(i + 1), f.title, f.gain_text(), f.sentence,
             f.evidence_pointer] for i, f in enumerate(dx.findings)]
    out.append(fmt.table(["#", "finding", "expected gain", "what the evidence says", "evidence"], rows))
    return "\n".join(out)


def launch_scripts(deployments: list[DeploymentRow]) -> str:
    seen: dict[str, str] = {}
    for d in deployments:
        if d.launch_script and d.variant not in seen:
            seen[d.variant] = d.launch_script
    if not seen:
        return "_No launch scripts recorded._\n"
    return "\n".join(f"**{v}**\n\n```bash\n{fmt.redact_text(s).rstrip()}\n```\n" for v, s in seen.items())


def render(run: RunRow, ev: Evidence, dx: Diagnosis, deployments: list[DeploymentRow],
           plots: dict[str, Path], run_dir: Path, done: Completeness) -> str:
    """The whole SUMMARY.md text; an incomplete run says so first."""
    def img(name: str) -> str:
        p = plots.get(name)
        return f"\n![{name}]({p.relative_to(run_dir)})\n" if p else ""

    parts = [f"# {run.name} — summary\n", *([incomplete_md.banner(done, run_dir)] if not done.complete else []),
             f"Goal: {run.goal or '(none given)'}\n", *([headline(ev)] if ev.workload else [])]
    if ev.slo is not None:
        base = ev.variants.get(ev.baseline)
        cap = base.slo_capacity if base else None
        parts.append(f"SLO: {ev.slo['describe']}; baseline {capacity_text(cap) if cap else 'not measured'}.\n")
    if dx.top is not None:
        partial = "" if done.complete else f" (from {done.done} of {len(done.blocks)} bring-ups)"
        parts.append(f"> **Finding{partial}:** {dx.top.sentence}\n")
        pd = next((f for f in dx.findings if f.rule == "pd" and f is not dx.top), None)
        if pd is not None:
            parts.append(f"> **PD:** {pd.sentence}\n")
    body = {
        "Stack": stack(run, deployments, ev),
        "Workload": workload(ev),
        "Topology and verified placement": placement(deployments),
        "Single-node results": results(ev, "single") + img("throughput") + img("latency") + img("slo")
        + img("telemetry") + img("ttft_breakdown") + img("swimlane"),
        "PD results": results(ev, "pd"),
        "Levers": levers(ev),
        "Roofline": roofline(ev) + img("roofline_gap"),
        "Profile": profile(ev) + img("profile"),
        "Finding": finding(dx, ev),
        "Launch scripts": launch_scripts(deployments),
    }
    for name in SECTIONS:
        parts.append(f"## {name}\n\n{body[name]}")
    parts.append(f"---\n\n{definitions(ev.confidence)}\n")
    return "\n".join(parts)
