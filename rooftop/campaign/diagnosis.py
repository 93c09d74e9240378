"""Diagnosis: pure rules over an `Evidence` record, each yielding findings ranked by expected gain."""

from __future__ import annotations

import math

from rooftop.bench.slo import short as capacity_text
from rooftop.campaign.evidence import (
    Diagnosis,
    Evidence,
    Finding,
    LevelEffect,
    LeverEvidence,
    ProfileEvidence,
    RooflineEvidence,
    bound_text,
)
from rooftop.campaign.latency_rules import latency_findings
from rooftop.campaign.quality import ties_note
from rooftop.campaign.speculative_rules import speculative_findings
from rooftop.campaign.verdicts import capacity_change
from rooftop.profile.capacity import CapacityFinding

# Engine arguments whose change bounds work by the allocated capacity (context, pages, batch).
CAPACITY_ARGS = ("context-length", "context_length", "max-model-len", "max_model_len", "indexer-bound",
                 "indexer_bound", "max-total-tokens", "max_total_tokens", "page-size", "page_size")

TPOT_GROWTH_FLAG = 1.5  # TPOT at the top level over TPOT at the lowest: a batch that does not batch
IDLE_SHARE_FLAG = 0.25  # GPU idle share past which the step is host-bound
PREFILL_SHARE_FLAG = 0.3  # prefill steps' share of the engine's step time past which TPOT is mostly prefill
TPOT_OVER_STEP_FLAG = 1.25  # TPOT over the engine's decode step past which TPOT counts interleaved prefills
TENSOR_CORE_FLAG = 0.3  # tensor-core share below which the GPU mostly runs CUDA-core kernels


def ratio_text(e: LevelEffect) -> str:
    """'5.12× [4.60, 5.71]'; '5.12× (one repeat: no interval)' where none could be computed."""
    if not (math.isfinite(e.ratio_low) and math.isfinite(e.ratio_high)):
        return f"{e.ratio:.2f}× (one repeat: no interval)" if min(e.n_baseline, e.n_candidate) < 2 \
            else f"{e.ratio:.2f}× (no interval)"
    return f"{e.ratio:.2f}× [{e.ratio_low:.2f}, {e.ratio_high:.2f}]"


def effect_text(e: LevelEffect) -> str:
    """'5.12× [4.60, 5.71] at C=16 (faster)'."""
    return f"{ratio_text(e)} at {e.at} ({e.verdict})"


def family(name: str) -> str:
    """Collapse a profile or roofline component name to a family both sides share."""
    n = name.lower()
    for key, fam in (("index", "indexer"), ("expert", "moe"), ("moe", "moe"), ("lm_head", "lm_head"),
                     ("head", "lm_head"), ("attn", "attention"), ("attention", "attention"),
                     ("mla", "attention"), ("kv", "attention"), ("mlp", "mlp"), ("dense", "mlp"),
                     ("norm", "norm"), ("embed", "embedding"), ("sampl", "sampler"),
                     ("comm", "communication"), ("all_reduce", "communication"),
                     ("allreduce", "communication"), ("all_to_all", "communication")):
        if key in n:
            return fam
    return n


def _headline_effect(lever: LeverEvidence, prefer_concurrency: int | None) -> LevelEffect | None:
    """The tok/s effect a sentence cites: at the profiled concurrency if measured, else the highest."""
    effects = [e for e in lever.effects if e.metric == "output_tok_s"]
    if not effects:
        return None
    if prefer_concurrency is not None:
        hit = next((e for e in effects if e.concurrency == prefer_concurrency), None)
        if hit:
            return hit
    return max(effects, key=lambda e: e.concurrency)


def _gain(e: LevelEffect | None) -> float | None:
    return e.ratio if e is not None and e.verdict == "faster" else None


def touches_capacity(lever: LeverEvidence) -> bool:
    return any(k in lever.changes.get("args", {}) for k in CAPACITY_ARGS)


def _baseline_profile(ev: Evidence) -> ProfileEvidence | None:
    return ev.profiles.get(ev.baseline)


def rule_capacity(ev: Evidence, cited: set[str]) -> list[Finding]:
    """Work sized by the allocated capacity: the profile's capacity findings, and the levers that cap it."""
    prof = _baseline_profile(ev)
    if prof is None or not prof.capacity_findings:
        return []
    findings = []
    by_component: dict[str, list[CapacityFinding]] = {}
    for cf in prof.capacity_findings:
        by_component.setdefault(cf.component or "unattributed", []).append(cf)
    for comp_name, cfs in by_component.items():
        comp = prof.component(comp_name)
        sized_ms = sum(c.ms_per_step for c in cfs)
        share = comp.share if comp else sized_ms / max(prof.busy_ms_per_step, 1e-9)
        ms = comp.ms_per_step if comp else sized_ms
        dims = sorted({str(c.dim) for c in cfs})
        derived = sorted({str(c.derived_from) for c in cfs})
        ops = sorted({op for c in cfs for op in c.ops})
        cited_effects = []
        for lv in ev.levers:
            e = _headline_effect(lv, prof.concurrency) if touches_capacity(lv) else None
            if e is not None:
                cited_effects.append((lv, e))
        cited_effects.sort(key=lambda le: -le[1].ratio)
        numbers = {"component": comp_name, "share": share, "ms_per_step": ms, "sized_ms_per_step": sized_ms,
                   "step_ms": prof.busy_ms_per_step, "dims": dims, "derived_from": derived, "ops": ops,
                   "profile_variant": prof.variant, "profile_concurrency": prof.concurrency}
        # The ops on the capacity dim and the component that holds them are two figures: say both.
        sentence = (f"The {comp_name} does work sized by the allocated capacity, not by the requests' "
                    f"context: ops ({', '.join(ops[:6]) or 'unnamed'}) on dim {', '.join(dims)} "
                    f"(= {', '.join(derived)}) take {sized_ms:.2f} ms per step, and the {comp_name} "
                    f"{share:.0%} of the step ({ms:.2f} of {prof.busy_ms_per_step:.2f} ms) in the "
                    f"{prof.variant} profile" + (f" at C={prof.concurrency}" if prof.concurrency else ""))
        gain = 1.0 / max(1.0 - share, 1e-3)  # Amdahl: the component removed entirely
        gain_kind = "bound"
        pointer = f"profile {prof.trace_path}"
        for i, (lv, e) in enumerate(cited_effects):
            cited.add(lv.name)
            changed = ", ".join(f"{k} = {v}" for k, v in lv.changes.get("args", {}).items())
            sentence += f"; lever {lv.name} ({changed}) measured output tok/s {effect_text(e)}"
            tpot = lv.effect("tpot_ms", e.concurrency)
            if e.verdict != "faster" and tpot is not None and tpot.verdict == "faster":
                # Throughput too noisy to call, but the decode step itself clearly shorter: say so.
                sentence += f" and TPOT {effect_text(tpot)}"
            sentence += slo_lever_text(ev, lv)
            pointer += f"; levels {lv.variant} vs {lv.base_variant}"
            if i == 0:  # the strongest capacity lever carries the finding's numbers and gain
                numbers.update({"lever": lv.name, "lever_ratio": e.ratio, "lever_ratio_low": e.ratio_low,
                                "lever_ratio_high": e.ratio_high, "lever_verdict": e.verdict,
                                "lever_concurrency": e.concurrency})
                if _gain(e) is not None:
                    gain, gain_kind = _gain(e), "measured"
        numbers["levers"] = [lv.name for lv, _ in cited_effects]
        if cited_effects and gain_kind == "bound":
            sentence += "; " + _no_gain_meaning(ev, prof, [lv for lv, _ in cited_effects], gain)
        numbers["gain_kind"] = gain_kind
        findings.append(Finding(f"Capacity-bound {comp_name}", sentence + ".", numbers, pointer, gain,
                                "capacity", gain_kind))
    return findings


def _no_gain_meaning(ev: Evidence, prof: ProfileEvidence, levers: list[LeverEvidence], bound: float) -> str:
    """What it means that the levers which remove a cost measured no gain: the cost was not what bound
    throughput, or the time it freed went elsewhere (where the lever's own profile or the idle GPU says)."""
    names = ", ".join(lv.name for lv in levers)
    out = (f"the lever(s) that remove it ({names}) measured no gain beyond noise, so ×{bound:.2f} is a bound "
           f"this deployment does not reach")
    fixed = ev.profiles.get(levers[0].variant)
    if fixed is not None and fixed.components:
        top = fixed.components[0]
        out += (f": with {levers[0].name} the profiled step takes {fixed.busy_ms_per_step:.2f} ms (from "
                f"{prof.busy_ms_per_step:.2f}) and the {top.name} leads at {top.share:.0%}")
        idle = served_idle(ev, fixed)
        if idle is not None and idle[0] >= IDLE_SHARE_FLAG:
            out += f", and the GPU idles {idle[0]:.0%} of the served step: the time moved to the host (host-bound)"
        else:
            out += ": the time the cost took moved elsewhere, or the gain is inside the noise (more repeats tell)"
        return out
    idle = served_idle(ev, prof)
    if idle is not None and idle[0] >= IDLE_SHARE_FLAG:
        return out + f": the GPU already idles {idle[0]:.0%} of the served step, so the step is host-bound"
    return out + ": either the step is bound elsewhere or the gain is inside the noise (more repeats tell)"


def interval_text(low: float | None, high: float | None, digits: int = 2) -> str:
    """' [7.70, 8.00]' where both ends are finite and apart, else '' (one repeat, or none computed)."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)) or low == high:
        return ""
    return f" [{low:.{digits}f}, {high:.{digits}f}]"


def _times_digits(ratio: float) -> int:
    """Decimals of a 'N× the floor' figure: one below 10 (7.6× [6.5, 8.3]), none above (141× [128, 155])."""
    return 1 if ratio < 10 else 0


def rule_roofline_gap(ev: Evidence) -> list[Finding]:
    """Measured decode step against the analytic floor, and the component family where the gap sits.

    A component's measured time is its share of the profile's GPU time laid onto the served step (the
    two sides of the gap then sum to the same step); the sentence says so, and gives the profile's own
    GPU time per step beside it."""
    roof: RooflineEvidence | None = ev.rooflines.get(ev.baseline)
    if roof is None or not roof.measured_step_ms or roof.floor_ms <= 0:
        return []
    ratio = roof.measured_step_ms / roof.floor_ms
    numbers = {"measured_step_ms": roof.measured_step_ms, "measured_step_low": roof.measured_step_low,
               "measured_step_high": roof.measured_step_high, "floor_ms": roof.floor_ms, "ratio": ratio,
               "batch": roof.batch, "context": roof.context, "hardware": roof.hardware}
    base = ev.variants.get(roof.variant)
    level = base.level(roof.batch) if base is not None else None
    served = level.served_step() if level is not None else None
    what = f" ({served[3]})" if served is not None and served[0] == roof.measured_step_ms else ""
    nd = _times_digits(ratio)
    ratio_interval = interval_text(roof.measured_step_low / roof.floor_ms, roof.measured_step_high / roof.floor_ms, nd)
    sentence = (f"A decode step at batch {roof.batch}, context {roof.context} takes "
                f"{roof.measured_step_ms:.2f} ms{interval_text(roof.measured_step_low, roof.measured_step_high)}"
                f"{what} against a roofline floor of {roof.floor_ms:.3f} ms on {roof.hardware} ({ratio:.{nd}f}×"
                f"{ratio_interval} the floor)")
    prof = _baseline_profile(ev)
    if prof is not None and prof.components:
        measured: dict[str, float] = {}
        shares: dict[str, float] = {}
        own: dict[str, float] = {}
        for c in prof.components:
            # Profile shares laid onto the served step, so both sides of the gap are of the same step.
            shares[family(c.name)] = shares.get(family(c.name), 0.0) + c.share
            own[family(c.name)] = own.get(family(c.name), 0.0) + c.ms_per_step
        measured = {f: share * roof.measured_step_ms for f, share in shares.items()}
        floors: dict[str, float] = {}
        for name, ms in roof.component_floor_ms.items():
            floors[family(name)] = floors.get(family(name), 0.0) + ms
        gaps = {f: measured[f] - floors.get(f, 0.0) for f in measured}
        where = max(gaps, key=gaps.get)
        numbers.update({"gap_component": where, "gap_ms": gaps[where], "component_share": shares[where],
                        "component_measured_ms": measured[where], "component_profile_ms": own[where],
                        "component_floor_ms": floors.get(where, 0.0)})
        dev = "GPU" if prof.device == "gpu" else "CPU"
        sentence += (f"; the largest gap sits in the {where}: ≈{measured[where]:.2f} ms, its {shares[where]:.0%} "
                     f"share of the {dev} time laid onto that step ({own[where]:.2f} ms of {dev} time per step in the "
                     f"{prof.variant} profile{f' at C={prof.concurrency}' if prof.concurrency else ''}), against a "
                     f"{floors.get(where, 0.0):.3f} ms floor")
    # Context, not a fix: closing a gap to the floor takes work the evidence cannot price.
    return [Finding("Measured step against the roofline", sentence + ".", numbers,
                    f"roofline {roof.variant}; levels {roof.variant} C={roof.batch}", None, "roofline")]


# A knee whose next level still gains more than this (on the means) is reported as unclear.
KNEE_UNCLEAR_GAIN_PCT = 10.0


def measured_levels(v) -> list:
    """A variant's levels with a valid repeat (throughput measured); a level kept only for its SLO
    figures (every repeat invalid for failed requests) has none."""
    return [lv for lv in v.levels if math.isfinite(lv.tok_s)] if v is not None else []


def rule_knee(ev: Evidence) -> list[Finding]:
    """Where throughput stops scaling with concurrency, and the plateau it reaches."""
    base = ev.variants.get(ev.baseline)
    levels = measured_levels(base)
    if len(levels) < 2 or any(lv.label for lv in levels):  # open-loop levels: the arrivals set the load
        return []
    top = levels[-1]
    if base.knee_concurrency is None or base.knee_concurrency == top.concurrency:
        sentence = (f"Throughput still grows at the highest level tested: {top.tok_s:.1f} tok/s "
                    f"[{top.tok_s_low:.1f}, {top.tok_s_high:.1f}] at C={top.concurrency}; "
                    f"higher concurrency may add more")
        numbers = {"knee": None, "top_concurrency": top.concurrency, "top_tok_s": top.tok_s}
        title = "No knee within the tested levels"
    else:
        knee = base.level(base.knee_concurrency)
        gain_pct = (top.tok_s / knee.tok_s - 1.0) * 100 if knee.tok_s else 0.0
        measured = (f"C={knee.concurrency} gives {knee.tok_s:.1f} tok/s [{knee.tok_s_low:.1f}, "
                    f"{knee.tok_s_high:.1f}], C={top.concurrency} {top.tok_s:.1f} [{top.tok_s_low:.1f}, "
                    f"{top.tok_s_high:.1f}] ({gain_pct:+.0f}%)")
        if gain_pct > KNEE_UNCLEAR_GAIN_PCT:
            # The means still climb; only the spread hides it. Say that, not "stops scaling".
            sentence = (f"No knee can be placed yet: {measured}, but the repeats are too noisy to tell the "
                        f"levels apart; more repeats or requests per level would settle it")
            title = "Knee unclear: too noisy to place"
        else:
            sentence = (f"Throughput stops scaling at C={knee.concurrency}: {measured}, while mean TTFT goes "
                        f"from {knee.ttft_ms:.0f} to {top.ttft_ms:.0f} ms")
            title = f"Knee at C={knee.concurrency}"
        numbers = {"knee": knee.concurrency, "knee_tok_s": knee.tok_s, "plateau_tok_s": top.tok_s,
                   "top_concurrency": top.concurrency}
    if base.knee_note:
        sentence += f" ({base.knee_note})"
    return [Finding(title, sentence + ".", numbers, f"levels {base.name}", None, "knee")]


def rule_tpot_growth(ev: Evidence) -> list[Finding]:
    """TPOT that grows with concurrency: per-step work that grows with the batch instead of batching.

    Judged on the ratio's interval, not its means: the top level's TPOT interval over the lowest's
    (its low end the top's low over the lowest's high, and the reverse), a conservative interval. The
    finding fires only where that low end passes the flag; without intervals (one repeat) it cannot."""
    base = ev.variants.get(ev.baseline)
    levels = measured_levels(base)
    if len(levels) < 2 or any(lv.label for lv in levels):  # grows with concurrency: closed-loop levels only
        return []
    lo, hi = levels[0], levels[-1]
    if lo.tpot_ms <= 0 or not all(math.isfinite(x) and x > 0 for x in (lo.tpot_low, lo.tpot_high, hi.tpot_low)):
        return []
    growth = hi.tpot_ms / lo.tpot_ms
    low, high = hi.tpot_low / lo.tpot_high, hi.tpot_high / lo.tpot_low
    if low < TPOT_GROWTH_FLAG:
        return []
    sentence = (f"TPOT grows {growth:.1f}× [{low:.1f}, {high:.1f}] from C={lo.concurrency} ({lo.tpot_ms:.1f} ms "
                f"[{lo.tpot_low:.1f}, {lo.tpot_high:.1f}]) to C={hi.concurrency} ({hi.tpot_ms:.1f} ms "
                f"[{hi.tpot_low:.1f}, {hi.tpot_high:.1f}]; the ratio's interval from the two levels' intervals): "
                f"each decode step's work grows with the batch, so decode is bound by compute or by per-request "
                f"work, not by reading the weights once")
    return [Finding("TPOT grows with concurrency", sentence + ".",
                    {"tpot_low_ms": lo.tpot_ms, "tpot_high_ms": hi.tpot_ms, "growth": growth, "growth_low": low,
                     "growth_high": high, "c_low": lo.concurrency, "c_high": hi.concurrency},
                    f"levels {base.name}", None, "tpot_growth")]


def rule_prefill_share(ev: Evidence) -> list[Finding]:
    """Prefill steps that take much of the engine's time, read from its own step histogram (the
    embedded engine's), at the baseline level where their share is largest. Where TPOT is well above
    the decode step, continuous batching runs other requests' prefills between a request's decode
    steps and TPOT counts them; else they show in TTFT and throughput. Context, not a ranked gain:
    prefill is work that must be done, and how much of it a faster prefill, smaller prefill chunks
    or a prefill/decode split save is for a lever to measure."""
    base = ev.variants.get(ev.baseline)
    levels = [lv for lv in (base.levels if base else []) if lv.prefill_share is not None and lv.decode_step_ms
              and math.isfinite(lv.tpot_ms)]
    if not levels:
        return []
    lv = max(levels, key=lambda x: x.prefill_share)
    if lv.prefill_share < PREFILL_SHARE_FLAG:
        return []
    ratio = lv.tpot_ms / lv.decode_step_ms
    head = (f"At {lv.at} prefill steps ({lv.prefill_step_ms:.1f} ms each) take {lv.prefill_share:.0%} "
            f"of the engine's step time")
    if ratio >= TPOT_OVER_STEP_FLAG:
        sentence = (f"{head}, and TPOT ({lv.tpot_ms:.2f} ms) is {ratio:.1f}× the engine's own decode step "
                    f"({lv.decode_step_ms:.2f} ms): a request's TPOT counts the prefills the scheduler runs between "
                    f"its decode steps, so faster prefill, smaller prefill chunks or a prefill/decode split would "
                    f"bring TPOT toward the decode step")
    else:
        sentence = (f"{head}; they show in TTFT ({lv.ttft_ms:.1f} ms) and in throughput, not in TPOT "
                    f"({lv.tpot_ms:.2f} ms against a {lv.decode_step_ms:.2f} ms decode step): the level's requests "
                    f"prefill before they decode. Were prefill free, the engine would take "
                    f"{1 - lv.prefill_share:.0%} of the time (a bound, not a lever's gain)")
    return [Finding(f"Prefill takes {lv.prefill_share:.0%} of the engine's time", sentence + ".",
                    {"concurrency": lv.concurrency, "prefill_share": lv.prefill_share,
                     "prefill_step_ms": lv.prefill_step_ms, "decode_step_ms": lv.decode_step_ms, "tpot_ms": lv.tpot_ms,
                     "tpot_over_step": ratio},
                    f"levels {base.name} {lv.at}", None, "prefill_share")]


def rule_profile(ev: Evidence) -> list[Finding]:
    """The profile's shape: top component, GPU idle share, tensor-core share."""
    prof = _baseline_profile(ev)
    if prof is None or not prof.components:
        return []
    out = []
    top = prof.components[0]
    where = "GPU" if prof.device == "gpu" else "CPU"
    out.append(Finding(
        f"Largest component: {top.name}",
        f"The {top.name} takes {top.share:.0%} of {where} time per step ({top.ms_per_step:.2f} ms of "
        f"{prof.busy_ms_per_step:.2f} ms)"
        + (f"; then {', '.join(f'{c.name} {c.share:.0%}' for c in prof.components[1:4])}"
           if len(prof.components) > 1 else "") + ".",
        {"component": top.name, "share": top.share, "ms_per_step": top.ms_per_step},
        f"profile {prof.trace_path}", None, "profile"))
    idle = served_idle(ev, prof)
    if idle is not None and idle[0] >= IDLE_SHARE_FLAG:
        share, sentence, pointer, high = idle
        low_gain, high_gain = 1.0 / max(1.0 - share, 1e-3), 1.0 / max(1.0 - high, 1e-3)
        out.append(Finding("GPU idle between kernels", sentence,
                           {"idle_share": share, "idle_share_high": high, "gain_high": high_gain,
                            "profile_variant": prof.variant, "graphed": in_cuda_graphs(prof)}, pointer,
                           low_gain, "idle", "bound", high_gain if high > share else None))
    if prof.device == "gpu" and prof.tensor_core_share is not None and prof.tensor_core_share < TENSOR_CORE_FLAG:
        out.append(Finding(
            "Little tensor-core work",
            f"Only {prof.tensor_core_share:.0%} of GPU time runs on tensor cores; the rest is CUDA-core "
            f"work (elementwise, reductions, copies, gathers) that a fused or tensor-core kernel would shrink.",
            {"tensor_core_share": prof.tensor_core_share}, f"profile {prof.trace_path}", None, "tensor_core"))
    return out


def rule_ranks(ev: Evidence) -> list[Finding]:
    """A rank that lags the others, or a component uneven across ranks, in the baseline's per-rank profiles
    (profile/ranks.py, in its notes): every synchronous step runs at the slowest rank's pace."""
    from rooftop.profile.ranks import is_rank_note

    out = []
    for name, prof in ev.profiles.items():
        if name == ev.baseline or name.startswith(ev.baseline + "/"):
            for note in filter(is_rank_note, prof.notes):
                title = "A rank lags the others" if note.startswith("Rank ") else "Work uneven across ranks"
                out.append(Finding(title, note, {}, f"profile {prof.trace_path} (every rank)", None, "ranks"))
    return out


def in_cuda_graphs(prof: ProfileEvidence) -> bool:
    """Whether the profiled steps ran as CUDA-graph replays (the campaign's 'measured' line says so)."""
    return "CUDA graphs" in (prof.measured or "")


def served_idle(ev: Evidence, prof: ProfileEvidence) -> tuple[float, str, str, float] | None:
    """The GPU's idle share of a served decode step, its sentence, its evidence pointer, and the upper
    end of that share where two figures bound it (else the share itself).

    The profile's own idle share describes the profiled steps: few, and with the profiler recording
    every op on the host, which lengthens the host's part of each (the embedded engine's profiled steps
    are its served ones, CUDA-graph replays; only the eager map, /start_profile {"eager": true}, runs
    them eagerly). So it is judged against the served step at the profiled concurrency: idle = 1 - GPU
    busy per step / served step, never above the profile's own share. Two figures bound the served
    step. The engine's own decode step (its /metrics histogram, read around each level) is schedule,
    forward and sampling, but not the hand-out of its tokens: host time at least. TPOT adds that
    hand-out and the streaming, and also the prefill steps interleaved with decode (GPU work): host time
    at most. vLLM and SGLang export no step time, only inter-token latency, which counts those prefills
    as TPOT does: an upper bound too. What removing the host's share would give is a bound (a leaner
    loop removes part of it), known within the range of those two figures; the lower ranks it.
    """
    if prof.device != "gpu" or prof.idle_share is None:
        return None
    served = ev.variants.get(prof.variant)  # the profiled variant's own served step
    level = served.level(prof.concurrency) if served is not None and prof.concurrency else None
    pointer = f"profile {prof.trace_path}"
    tpot = level.tpot_ms if level is not None and math.isfinite(level.tpot_ms) and level.tpot_ms > 0 else None
    step = level.decode_step_ms if level is not None and level.decode_step_ms else None

    def gain(share: float) -> float:
        return 1 / max(1 - share, 1e-3)

    if (step is None and tpot is None) or prof.busy_ms_per_step <= 0:
        how = "a leaner step loop (the steps already ran in CUDA graphs)" if in_cuda_graphs(prof) \
            else "CUDA graphs or a leaner step loop"
        return (prof.idle_share, f"The GPU is idle {prof.idle_share:.0%} of each profiled step: the host "
                f"(scheduler, Python, launches) binds; {how} could recover up to "
                f"{bound_text(gain(prof.idle_share))} (a bound: the host's whole share removed).", pointer,
                prof.idle_share)

    def idle(ms: float) -> float:
        return min(max(0.0, 1.0 - prof.busy_ms_per_step / ms), prof.idle_share)

    where = f"{pointer}; levels {prof.variant} C={level.concurrency}"
    if step is not None and level.decode_step_source == "server_itl":  # vLLM/SGLang: ITL counts prefills too
        share = idle(step)
        return (share, f"The GPU is busy {prof.busy_ms_per_step:.2f} ms per decode step against the server's "
                f"inter-token latency of {step:.2f} ms at C={level.concurrency} (idle up to {share:.0%}; "
                f"{prof.idle_share:.0%} in the profiled steps). Inter-token latency, like TPOT, also counts prefill "
                f"steps interleaved with decode, so host time (scheduler, sampling, streaming) is at most that "
                f"share; up to {bound_text(gain(share))} (a bound: the host's whole share removed).", where, share)
    if step is not None:
        share = idle(step)
        high = idle(tpot) if tpot is not None and idle(tpot) > share + 0.005 else share
        upper = f"; up to {high:.0%} against TPOT ({tpot:.2f} ms), which adds the token hand-out, streaming " \
                "and interleaved prefills" if high > share else ""
        return (share, f"The GPU is busy {prof.busy_ms_per_step:.2f} ms of each {step:.2f} ms served decode step "
                f"(the engine's own step time at C={level.concurrency}: schedule, forward, sampling; idle "
                f"{share:.0%}{upper}; {prof.idle_share:.0%} in the profiled steps): the host takes the rest; a "
                f"leaner step loop could recover up to {bound_text(gain(share), gain(high))} (a bound: the host's "
                f"whole share removed" + (", judged against the engine's step and against TPOT" if high > share
                                          else "") + ").", where, high)
    share = idle(tpot)
    return (share, f"The GPU is busy {prof.busy_ms_per_step:.2f} ms per decode step against a TPOT of {tpot:.2f} ms "
            f"at C={level.concurrency} (idle up to {share:.0%}; {prof.idle_share:.0%} in the profiled steps). TPOT "
            f"also counts prefill steps interleaved with decode, so host time (scheduler, sampling, streaming) "
            f"is at most that share; up to {bound_text(gain(share))} (a bound: the host's whole share removed).",
            where, share)


def rule_pd(ev: Evidence, cited: set[str]) -> list[Finding]:
    """PD against single node, with intervals at every level."""
    out = []
    for lv in ev.levers:
        if lv.changes.get("topology") != "pd" or lv.name in cited:
            continue
        effects = sorted((e for e in lv.effects if e.metric == "output_tok_s"), key=lambda e: e.concurrency)
        if not effects:
            why = ev.failures.get(lv.variant) or ev.failures.get(lv.base_variant) or "no valid levels on both sides"
            out.append(Finding("PD not measured", f"PD (lever {lv.name}) could not be compared with "
                               f"{lv.base_variant}: {why}.", {"lever": lv.name, "said": "not measured"},
                               f"units of {lv.variant}", None, "pd"))
            cited.add(lv.name)
            continue
        cited.add(lv.name)
        verdicts = {e.verdict for e in effects}
        if verdicts == {"faster"}:
            said = "helped"
        elif "faster" in verdicts:
            said = "helped at some levels only"
        elif verdicts == {"slower"}:
            said = "hurt"
        elif "slower" in verdicts:
            said = "did not help and hurt at some levels"
        else:
            said = "did not help"
        sentence = (f"PD (lever {lv.name}: prefill and decode on separate workers) {said}: output tok/s "
                    + "; ".join(effect_text(e) for e in effects))
        if said == "did not help":
            # No cause is claimed: "no difference within noise" does not say what binds instead.
            sentence += " — no gain beyond noise from separating prefill and decode"
        best = max(effects, key=lambda e: e.ratio)
        out.append(Finding(f"PD {said}", sentence + ".",
                           {"lever": lv.name, "said": said,
                            "effects": [{"concurrency": e.concurrency, "ratio": e.ratio, "low": e.ratio_low,
                                         "high": e.ratio_high, "verdict": e.verdict} for e in effects]},
                           f"levels {lv.variant} vs {lv.base_variant}", _gain(best), "pd",
                           "measured" if _gain(best) else ""))
    return out


def rule_levers(ev: Evidence, cited: set[str]) -> list[Finding]:
    """Every other lever's measured effect on tok/s, TTFT and TPOT, and its quality check."""
    out = []
    for lv in ev.levers:
        if lv.name in cited:
            continue
        e = _headline_effect(lv, None)
        if e is None:
            continue
        parts = [f"output tok/s {effect_text(e)}"]
        verdicts = [("tok/s", e.verdict)]
        for metric, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
            m = lv.effect(metric, e.concurrency)
            if m is not None:
                parts.append(f"{label} {ratio_text(m)} ({m.verdict})")
                verdicts.append((label, m.verdict))
        hits = prefix_hit_rates(ev, lv, e.concurrency)
        sentence = (f"Lever {lv.name} ({lv.hypothesis or 'no hypothesis given'}): " + ", ".join(parts)
                    + slo_lever_text(ev, lv) + (prefix_hit_text(hits, e.at) if hits else ""))
        numbers = {"lever": lv.name, "ratio": e.ratio, "low": e.ratio_low, "high": e.ratio_high,
                   "verdict": e.verdict, "concurrency": e.concurrency}
        if hits:
            numbers["prefix_hit_rate"] = {"base": hits[0], "lever": hits[1]}
        if lv.quality and lv.quality.get("flagged"):
            sentence += (f"; quality flagged: token agreement {lv.quality.get('agreement', 0):.0%}"
                         + ties_note(lv.quality.get("tie_flips") or 0, lv.quality.get("prompts"),
                                     lv.quality.get("agreement_ties_as_agreeing"))
                         + (f", mean KL {lv.quality['mean_kl']:.3g}" if lv.quality.get("mean_kl") is not None
                            else ""))
            numbers["quality_flagged"] = True
        out.append(Finding(f"Lever {lv.name}: {verdict_title(verdicts)}", sentence + ".", numbers,
                           f"levels {lv.variant} vs {lv.base_variant}", _gain(e), "lever",
                           "measured" if _gain(e) else ""))
    return out


def _level_keyed(ev: Evidence, variant: str, key: int):
    """A variant's level stored under `key` (a closed loop's concurrency, an open loop's place)."""
    v = ev.variants.get(variant)
    return next((lv for lv in v.levels if lv.concurrency == key), None) if v is not None else None


def prefix_hit_rates(ev: Evidence, lv: LeverEvidence, key: int) -> tuple[float | None, float | None] | None:
    """(base's, lever's) prefix-cache hit rate at the level `key`, where the lever turns prefix caching on or off
    or either side found at least 1% of its prompt tokens cached; None where neither says or it is noise-free 0."""
    b, c = _level_keyed(ev, lv.base_variant, key), _level_keyed(ev, lv.variant, key)
    hits = (b.prefix_hit_rate if b else None, c.prefix_hit_rate if c else None)
    if hits == (None, None):
        return None
    return hits if "prefix_caching" in lv.changes or max(h or 0.0 for h in hits) >= 0.01 else None


def prefix_hit_text(hits: tuple[float | None, float | None], at: str) -> str:
    """'; prefix-cache hit rate 41% → 0% at trace mooncake'."""
    def pct(h: float | None) -> str:
        return "not exported" if h is None else f"{h:.0%}"

    return f"; prefix-cache hit rate {pct(hits[0])} → {pct(hits[1])} at {at}"


def _share_interval(low: float | None, high: float | None) -> str:
    """' [38%, 41%]' where both ends are finite and apart, else ''."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)) or low == high:
        return ""
    return f" [{low:.0%}, {high:.0%}]"


REUSE_SHORTFALL = 0.05  # measured hit rate this far under the trace's expected reuse is said


def rule_prefix_reuse(ev: Evidence) -> list[Finding]:
    """The prefix reuse a trace's hash ids promise against the hit rate the baseline's engine measured: context,
    and, where the engine found well under what the trace shares, what that means."""
    w, base = ev.workload, ev.variants.get(ev.baseline)
    expected = w.expected_prefix_reuse if w is not None else None
    measured = [lv for lv in (base.levels if base else []) if lv.prefix_hit_rate is not None]
    if expected is None or not measured:
        return []
    lv = measured[-1]
    sentence = (f"The trace promises {expected:.0%} prefix reuse (prompt tokens in blocks an earlier request sent, "
                f"from its hash_ids) and the {base.name}'s engine found {lv.prefix_hit_rate:.0%}"
                f"{_share_interval(lv.prefix_hit_low, lv.prefix_hit_high)} of its "
                f"prompt tokens cached at {lv.at}")
    if base.prefix_caching is False:
        sentence += ": prefix caching is off in this deployment, so none of that reuse is served"
    elif lv.prefix_hit_rate < expected - REUSE_SHORTFALL:
        sentence += (": under what the trace shares, so cached blocks were evicted before their reuse (a cache "
                     "too small for the trace's working set) or the engine's pages do not line up with its blocks")
    else:
        sentence += ": the engine serves the reuse the trace holds"
    return [Finding(f"Prefix reuse: {lv.prefix_hit_rate:.0%} found of {expected:.0%} expected", sentence + ".",
                    {"expected_prefix_reuse": expected, "prefix_hit_rate": lv.prefix_hit_rate,
                     "prefix_hit_low": lv.prefix_hit_low, "prefix_hit_high": lv.prefix_hit_high, "level": lv.at},
                    f"levels {base.name} {lv.at}; workload", None, "prefix_reuse")]


NO_DIFFERENCE = "no difference within noise"


def verdict_title(verdicts: list[tuple[str, str]]) -> str:
    """The verdicts of one lever's figures as a title that cannot contradict them: 'faster' where all
    agree, else each difference beyond noise named first ('TTFT slower; tok/s, TPOT no difference
    within noise')."""
    said = dict.fromkeys(v for _, v in verdicts)
    if len(said) == 1:
        return verdicts[0][1]
    # Differences first (a difference outside the interval is the news), then what stayed within noise.
    order = sorted(said, key=lambda v: v == NO_DIFFERENCE)
    return "; ".join(", ".join(label for label, v in verdicts if v == verdict) + f" {verdict}" for verdict in order)


def slo_lever_text(ev: Evidence, lv: LeverEvidence) -> str:
    """'; capacity under the SLO C=2 [1, 4] → C=8 [4, 8] (higher)' where the campaign states an SLO."""
    if ev.slo is None:
        return ""
    base, cand = ev.variants.get(lv.base_variant), ev.variants.get(lv.variant)
    b, c = (base.slo_capacity if base else None), (cand.slo_capacity if cand else None)
    if not b and not c:
        return ""
    return f"; capacity under the SLO {capacity_text(b)} → {capacity_text(c)} ({capacity_change(b, c)})"


def rule_slo(ev: Evidence) -> list[Finding]:
    """The baseline's capacity under the campaign's SLO, and which bound it misses by above it."""
    base = ev.variants.get(ev.baseline)
    cap = base.slo_capacity if base is not None and ev.slo is not None else None
    if not cap or not cap.get("tested"):
        return []
    sentence = cap["sentence"][0].upper() + cap["sentence"][1:]
    numbers = {"slo": {k: ev.slo[k] for k in ("ttft_ms", "tpot_ms", "e2el_ms", "attainment")}, "capacity": cap["load"],
               "low": cap["low"], "high": cap["high"], "reached": cap["reached"]}
    # The first level that missed: the one above the capacity, or the lowest when none met it.
    missed_at = cap["next_tested"] if cap["load"] is not None else cap["tested"][0]
    missed = base.level(int(missed_at)) if missed_at is not None else None
    if missed is not None and missed.slo_bounds and missed.slo_attainment is not None:
        labels = ev.slo["bounds"]
        worst, share = min(missed.slo_bounds.items(), key=lambda kv: kv[1])
        others = ", ".join(f"{labels[k]} {v:.0%}" for k, v in missed.slo_bounds.items() if k != worst)
        interval = (f" [{missed.attainment_low:.0%}, {missed.attainment_high:.0%}]"
                    if missed.attainment_low is not None and missed.attainment_high is not None
                    and not missed.attainment_low == missed.attainment_high == missed.slo_attainment else "")
        sentence += (f". At C={missed.concurrency} {missed.slo_attainment:.0%}{interval} of requests met it; the bound "
                     f"missed most is {labels[worst]} ({share:.0%} met" + (f"; {others}" if others else "") + ")")
        numbers.update({"missed_at": missed.concurrency, "missed_attainment": missed.slo_attainment,
                        "limiting_bound": worst, "limiting_share": share})
    if cap["load"] is None:
        title = f"SLO missed at every level (from C={cap['tested'][0]:g})"
    elif not cap["reached"]:
        title = f"SLO met up to the highest level tested (C={cap['load']:g})"
    else:
        title = f"SLO capacity C={cap['load']:g}"
    return [Finding(title, sentence + ".", numbers, f"levels {base.name}", None, "slo")]


def rule_what_bounds(ev: Evidence, findings: list[Finding]) -> list[Finding]:
    """The answer to the campaign's goal when no lever measured a gain: what the baseline's decode step
    is spent on (its largest component and share), the served step against its roofline floor with its
    interval, then the levers that did not raise tok/s. Nothing where a lever gained (that finding
    leads) or where neither a profile nor a roofline of the baseline says anything."""
    if any(f.gain_kind == "measured" and f.expected_gain for f in findings):
        return []
    prof = _baseline_profile(ev)
    prof = prof if prof is not None and prof.components else None
    roof = ev.rooflines.get(ev.baseline)
    roof = roof if roof is not None and roof.measured_step_ms and roof.floor_ms > 0 else None
    if prof is None and roof is None:
        return []
    clauses, numbers, pointers = [], {}, []
    if prof is not None:
        top = prof.components[0]
        dev = "GPU" if prof.device == "gpu" else "CPU"
        title = f"The {top.name} bounds the decode step"
        clauses.append(f"the {top.name} takes {top.share:.0%} of each decode step ({top.ms_per_step:.2f} of "
                       f"{prof.busy_ms_per_step:.2f} ms of {dev} time per step in the {prof.variant} profile"
                       + (f" at C={prof.concurrency})" if prof.concurrency else ")"))
        numbers.update({"component": top.name, "share": top.share, "ms_per_step": top.ms_per_step,
                        "busy_ms_per_step": prof.busy_ms_per_step, "profile_variant": prof.variant})
        pointers.append(f"profile {prof.trace_path}")
    if roof is not None:
        ratio = roof.measured_step_ms / roof.floor_ms
        low, high = roof.measured_step_low / roof.floor_ms, roof.measured_step_high / roof.floor_ms
        nd = _times_digits(ratio)
        base = ev.variants.get(roof.variant)
        level = base.level(roof.batch) if base is not None else None
        served = level.served_step() if level is not None else None
        what = f" ({served[3]})" if served is not None and served[0] == roof.measured_step_ms else ""
        one = " (one repeat: no interval)" if level is not None and level.repeats < 2 else ""
        clause = (f"the served step of {roof.measured_step_ms:.2f} ms"
                  f"{interval_text(roof.measured_step_low, roof.measured_step_high)}{what}{one} at C={roof.batch} is "
                  f"{ratio:.{nd}f}×{interval_text(low, high, nd)} its roofline floor of {roof.floor_ms:.3f} ms on "
                  f"{roof.hardware}")
        if prof is not None:
            floor = sum(ms for name, ms in roof.component_floor_ms.items() if family(name) == family(top.name))
            if floor > 0:
                clause += f", {floor:.3f} ms of which is the {top.name}'s"
                numbers["component_floor_ms"] = floor
        if math.isfinite(low) and low < high and low <= 1.0:
            clause += " (its interval reaches the floor: these repeats cannot tell the step from it)"
        clauses.append(clause)
        numbers.update({"measured_step_ms": roof.measured_step_ms, "floor_ms": roof.floor_ms, "floor_ratio": ratio,
                        "floor_ratio_low": low, "floor_ratio_high": high})
        pointers.append(f"roofline {roof.variant}; levels {roof.variant} C={roof.batch}")
        if prof is None:
            title = f"The decode step is {ratio:.{nd}f}× its roofline floor"
    sentence = "; ".join(clauses)
    sentence = sentence[0].upper() + sentence[1:]
    prefer = prof.concurrency if prof is not None else roof.batch
    unmoved = [(lv, e) for lv in ev.levers if (e := _headline_effect(lv, prefer)) is not None]
    if unmoved:
        gained = any(e.metric == "output_tok_s" and e.verdict == "faster" for lv, _ in unmoved for e in lv.effects)
        sentence += ((". Levers, output tok/s: " if gained else ". No lever raised tok/s beyond noise at any level: ")
                     + "; ".join(f"{lv.name} {effect_text(e)}" for lv, e in unmoved))
        numbers["levers"] = {lv.name: {"concurrency": e.concurrency, "ratio": e.ratio, "low": e.ratio_low,
                                       "high": e.ratio_high, "verdict": e.verdict} for lv, e in unmoved}
    return [Finding(title, sentence + ".", numbers, "; ".join(pointers), None, "what_bounds")]


def rank(findings: list[Finding]) -> list[Finding]:
    """Measured gains first, largest first; then bounds (what removing a cost could give at most),
    largest first; then context, in rule order. A bound never outranks a measurement."""
    order = {id(f): i for i, f in enumerate(findings)}
    tier = {"measured": 0, "bound": 1}
    return sorted(findings, key=lambda f: (tier.get(f.gain_kind, 2) if f.expected_gain else 2,
                                           -(f.expected_gain or 0.0), order[id(f)]))


def _variant_profile(ev: Evidence, variant: str) -> ProfileEvidence | None:
    """A variant's profile: its own, else (pd) its decode worker's, where the decode steps run."""
    prof = ev.profiles.get(variant) or ev.profiles.get(f"{variant}/decode")
    return prof if prof is not None and prof.components else None


def binds_next(ev: Evidence, top: Finding | None) -> Finding | None:
    """What binds once the top finding is fixed: the profile of the variant its lever measured (and that
    variant's roofline), else the baseline profile without the component the finding removes. None
    where the top finding is not a fix (no gain, or a gain that removes no component, as the idle
    GPU's) or no profile says what is left."""
    if top is None or not top.expected_gain:
        return None
    lever = ev.lever(top.numbers.get("lever") or "") if top.gain_kind == "measured" else None
    prof = _variant_profile(ev, lever.variant) if lever is not None else None
    roof = None
    if prof is not None:
        dev = "GPU" if prof.device == "gpu" else "CPU"
        nxt = prof.components[0]
        worker = " (its decode worker)" if prof.variant != lever.variant else ""
        sentence = (f"With {lever.name} applied{worker}, the {dev} is busy {prof.busy_ms_per_step:.2f} ms per profiled "
                    f"step and the {nxt.name} binds next at {nxt.share:.0%} of that busy time "
                    f"({nxt.ms_per_step:.2f} ms)")
        numbers = {"variant": prof.variant, "component": nxt.name, "share": nxt.share,
                   "busy_ms": prof.busy_ms_per_step}
        pointer = f"profile {prof.trace_path}"
        roof = ev.rooflines.get(lever.variant)  # the same deployment's served step and floor
    else:
        comp = top.numbers.get("component")
        base = _baseline_profile(ev)
        if comp is None or base is None or not base.components:
            return None
        rest = [c for c in base.components if c.name != comp]
        if not rest:
            return None
        dev = "GPU" if base.device == "gpu" else "CPU"
        remaining_ms = sum(c.ms_per_step for c in rest)
        nxt = rest[0]
        sentence = (f"Without the {comp}, the {dev} would be busy about {remaining_ms:.2f} ms per step (the "
                    f"{base.variant} profile less the {comp}) and the {nxt.name} would bind next at "
                    f"{nxt.ms_per_step / max(remaining_ms, 1e-9):.0%} of it")
        numbers = {"variant": base.variant, "component": nxt.name, "remaining_ms": remaining_ms}
        pointer = f"profile {base.trace_path} (with {comp} removed)"
    if roof is not None and roof.measured_step_ms and roof.floor_ms > 0:
        ratio = roof.measured_step_ms / roof.floor_ms
        nd = _times_digits(ratio)
        sentence += (f"; {lever.variant}'s served decode step of {roof.measured_step_ms:.2f} ms"
                     f"{interval_text(roof.measured_step_low, roof.measured_step_high)} at C={roof.batch} is "
                     f"{ratio:.{nd}f}×{interval_text(roof.measured_step_low / roof.floor_ms, roof.measured_step_high / roof.floor_ms, nd)} "
                     f"the roofline floor of {roof.floor_ms:.3f} ms")
        numbers.update({"roofline_variant": roof.variant, "floor_ms": roof.floor_ms,
                        "measured_step_ms": roof.measured_step_ms, "measured_step_low": roof.measured_step_low,
                        "measured_step_high": roof.measured_step_high, "floor_ratio": ratio})
        pointer += f"; roofline {roof.variant}"
    return Finding(f"What binds next: {nxt.name}", sentence + ".", numbers, pointer, None, "binds_next")


def diagnose(ev: Evidence) -> Diagnosis:
    """Run every rule over the evidence; rank the findings; say what binds once the top one is fixed."""
    cited: set[str] = set()
    findings = rule_capacity(ev, cited) + rule_pd(ev, cited) + speculative_findings(ev, cited) + rule_levers(ev, cited)
    findings += rule_roofline_gap(ev) + rule_profile(ev) + rule_prefill_share(ev) + rule_tpot_growth(ev)
    findings += rule_slo(ev) + rule_knee(ev) + rule_prefix_reuse(ev) + rule_ranks(ev) + latency_findings(ev)
    answer = rule_what_bounds(ev, findings)
    if answer:  # first of the context findings: the goal's answer; it says what "Largest component" said
        findings = answer + [f for f in findings if f.rule != "profile"]
    ranked = rank(findings)
    return Diagnosis(ranked, binds_next(ev, ranked[0] if ranked else None))
