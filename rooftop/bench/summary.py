"""summary.json: per-level figures with spread across repeats, the knee, and token-count checks.

The schema is documented in docs/bench-output.md; keep the two in step.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from rooftop.bench import knee as knee_mod
from rooftop.bench import stats
from rooftop.bench.client import OUT_OF_FILES_HINT
from rooftop.bench.engine_metrics import spec_figures
from rooftop.bench.latency import level_breakdown
from rooftop.bench.loadgen import LevelPlan, LevelRun
from rooftop.bench.metrics import RunFigures, run_figures, token_check, ttft_ms
from rooftop.bench.records import RequestRecord
from rooftop.bench.slo import Slo, bound_shares, capacity_doc, meets
from rooftop.bench.telemetry import Readings, summarize

SCHEMA = "rooftop.bench.summary/1"
SHORTFALL_TOLERANCE = 0.10


def _num(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), nd)


def _interval(per_repeat: list[float], confidence: float, seed: int, nd: int = 4) -> dict:
    ci = stats.bootstrap_ci(per_repeat, confidence=confidence, seed=seed, floor=0.0)
    return {
        "mean": _num(float(np.mean(per_repeat)), nd) if per_repeat else None,
        "ci_low": _num(ci.low, nd), "ci_high": _num(ci.high, nd), "ci_method": ci.method,
        "per_repeat": [_num(v, nd) for v in per_repeat],
    }


def _share(per_repeat: list[float], confidence: float, seed: int) -> dict:
    """An interval of a share across repeats, kept within [0, 1]."""
    out = _interval(per_repeat, confidence, seed)
    if out["ci_high"] is not None:
        out["ci_high"] = min(out["ci_high"], 1.0)
    return out


def _latency(pooled: list[float], per_repeat_means: list[float], confidence: float, seed: int) -> dict:
    d = stats.describe(pooled)
    out = {
        "mean": _num(d.mean), "median": _num(d.median), "p90": _num(d.p90), "p99": _num(d.p99),
        "n": d.n, "thin": list(d.thin),
    }
    means = [m for m in per_repeat_means if not math.isnan(m)]
    # The keys are there whatever the samples: null bounds (ci_method "empty") without any, and from one
    # repeat bounds equal to the mean with ci_method "single" (no interval).
    ci = stats.bootstrap_ci(means, confidence=confidence, seed=seed, floor=0.0)
    out.update(ci_low=_num(ci.low), ci_high=_num(ci.high), ci_method=ci.method)
    return out


def level_summary(runs: list[LevelRun], *, confidence: float, seed: int, forced_length: bool, planned_repeats: int,
                  slo: Slo | None = None, readings: list[Readings | None] | None = None) -> dict:
    """One level across its repeats; with an SLO, its goodput and attainment too; with `readings` (one per
    run, None where none was taken), its GPU telemetry."""
    meets_slo = (lambda rec: meets(rec, slo)) if slo is not None else None
    figs: list[RunFigures] = [run_figures(r.records, r.start_ns, r.end_ns, r.last_decided_ns, meets_slo) for r in runs]
    windows = [summarize(rd.samples, f.output_tokens, f.wall_s, rd.source, start_ns=r.start_ns, end_ns=r.end_ns,
                         note=rd.note, interval_s=rd.interval_s)
               for r, f, rd in zip(runs, figs, readings or [None] * len(runs), strict=True) if rd is not None]
    plan = runs[0].plan
    records = [rec for r in runs for rec in r.records]
    tc = token_check(records, forced_length)
    failed = sum(f.failed for f in figs)
    errors: dict[str, int] = {}
    for f in figs:
        for k, v in f.error_classes.items():
            errors[k] = errors.get(k, 0) + v
    aborted = [r.aborted for r in runs if r.aborted]
    cut = sum(f.cut_off for f in figs)
    reasons = invalid_reasons(runs, figs, records, errors, planned_repeats)
    out = {
        "label": plan.label,
        "concurrency": plan.concurrency if plan.request_rate is None else plan.max_concurrency,
        "request_rate": plan.request_rate,
        "valid": not reasons,
        "invalid_reason": "; ".join(reasons) or None,
        "stopped_early": bool(aborted),
        "repeats_run": len(runs),
        "client_procs": max(r.client_procs for r in runs),  # event loops (processes) the load came from
        "completed": sum(f.completed for f in figs),
        "failed": failed,
        "error_classes": errors,
        # still in flight at the level's deadline (--duration plus its grace): cut by the bench, left out
        # of `failed` and of every latency; a share of them biases the latencies low
        "cut_off": cut,
        "output_tok_s": _interval([f.output_tok_s for f in figs], confidence, seed),
        "total_tok_s": _interval([f.total_tok_s for f in figs], confidence, seed),
        "request_s": _interval([f.request_s for f in figs], confidence, seed),
        "ttft_ms": _latency([v for f in figs for v in f.ttft_ms], [_mean_of(f.ttft_ms) for f in figs], confidence, seed),
        "tpot_ms": _latency([v for f in figs for v in f.tpot_ms], [_mean_of(f.tpot_ms) for f in figs], confidence, seed),
        "itl_ms": _latency([v for f in figs for v in f.itl_ms], [_mean_of(f.itl_ms) for f in figs], confidence, seed),
        "e2e_ms": _latency([v for f in figs for v in f.e2e_ms], [_mean_of(f.e2e_ms) for f in figs], confidence, seed),
        # time to first output token: the answer's first token, after any reasoning (TTFT counts the first thought)
        "ttfot_ms": _latency([v for f in figs for v in f.ttfot_ms], [_mean_of(f.ttfot_ms) for f in figs], confidence,
                             seed),
        "reasoning_tokens": sum(f.reasoning_tokens for f in figs),
        "token_check": {
            "output_len_mismatch": tc.output_len_mismatch,
            "usage_vs_client_output": tc.usage_vs_client_output,
            "usage_vs_client_input": tc.usage_vs_client_input,
            "no_usage": tc.no_usage,
            "examples": tc.examples,
        },
    }
    if slo is not None:
        out["goodput_req_s"] = _interval([f.slo_met / f.wall_s for f in figs], confidence, seed)
        out["slo_attainment"] = _share([f.slo_met / max(planned_requests(r, f), 1) for r, f in zip(runs, figs, strict=True)],
                                       confidence, seed)
        out["slo_met"] = sum(f.slo_met for f in figs)
        out["slo_bounds"] = bound_shares(records, slo)  # per bound, the share of all repeats' requests
    steps = engine_steps([r.engine_steps for r in runs])
    if steps:
        out["engine_steps"] = steps
        if "decode" in steps:  # the served decode step, apart from the prefills TPOT also counts
            out["engine_decode_step_ms"] = _num(steps["decode"]["ms_per_step"])
    server = engine_server([r.engine_server for r in runs])
    if server:
        out["engine_server"] = server
        if "engine_decode_step_ms" not in out and "itl_ms" in server:  # vLLM/SGLang: server-side ITL
            out["engine_decode_step_ms"] = _num(server["itl_ms"]["mean"])
    spec = spec_decode([r.spec_decode for r in runs])
    if spec is not None:  # the engine speculated (engine_metrics.spec_decode_delta)
        out["spec_decode"] = spec
    spans = level_breakdown(records, [r.server_spans for r in runs])
    if spans is not None:  # --otlp-receiver: the TTFT in parts and the ITL outliers' causes (latency.py)
        out["server_spans"] = spans
    by_turn = ttft_by_turn(runs, confidence, seed)
    if by_turn is not None:
        out["ttft_ms_by_turn"] = by_turn
    out["telemetry"] = level_telemetry(windows, confidence, seed)
    out.update(offered_and_achieved(plan, figs))
    return out


def ttft_by_turn(runs: list[LevelRun], confidence: float, seed: int) -> dict | None:
    """Multi-turn levels: TTFT of first turns, of later turns (whose history a prefix cache may hold), and of
    each turn index, as the level's TTFT is given (percentiles pooled, an interval of the mean across repeats);
    None where no request had a turn."""
    turns = sorted({rec.turn for r in runs for rec in r.records if rec.turn is not None})
    if not turns:
        return None

    def of(keep) -> dict:
        per_run = [[v for rec in r.records if rec.turn is not None and keep(rec.turn) and (v := ttft_ms(rec)) is not None]
                   for r in runs]
        return _latency([v for xs in per_run for v in xs], [_mean_of(xs) for xs in per_run], confidence, seed)

    return {"first": of(lambda t: t == 1), "later": of(lambda t: t >= 2),
            "by_turn": {str(t): of(lambda x, t=t: x == t) for t in turns}}


def _mean_of(xs: list[float]) -> float:
    return float(np.mean(xs)) if xs else float("nan")


def invalid_reasons(runs: list[LevelRun], figs: list[RunFigures], records: list[RequestRecord],
                    errors: dict[str, int], planned_repeats: int) -> list[str]:
    """Why a level's figures are not to be trusted (stopped early, failed or cut requests, missing repeats);
    empty when they are."""
    reasons = []
    aborted = [r.aborted for r in runs if r.aborted]
    if aborted:
        reasons.append(f"level stopped early ({aborted[0]})")
    failed = sum(f.failed for f in figs)
    if failed:
        reasons.append(f"{failed} request(s) failed: " + ", ".join(f"{k} x{v}" for k, v in sorted(errors.items())))
        out_of_files = next((rec.error for rec in records if rec.error and OUT_OF_FILES_HINT in rec.error), None)
        if out_of_files:
            reasons.append(OUT_OF_FILES_HINT)
    cut = sum(f.cut_off for f in figs)
    if cut and not any(f.completed for f in figs):
        reasons.append(f"no request completed: {cut} cut at the level's deadline")
    if len(runs) < planned_repeats:
        reasons.append(f"only {len(runs)} of {planned_repeats} repeats ran")
    return reasons


def offered_and_achieved(plan: LevelPlan, figs: list[RunFigures]) -> dict:
    """The load a level offered and the load it achieved, and whether it fell short: in requests in flight
    for a closed loop, in requests/s for an open one."""
    if plan.request_rate is None:
        achieved = _mean_of([f.achieved_concurrency for f in figs])
        return {"offered_concurrency": plan.concurrency, "achieved_concurrency": _num(achieved),
                "load_shortfall": bool(plan.concurrency
                                       and knee_mod.shortfall(plan.concurrency, achieved, SHORTFALL_TOLERANCE))}
    # Judged against the schedule that was drawn: a Poisson draw of n arrivals runs faster or slower
    # than the nominal rate by chance (about 1/sqrt(n)), and a client that kept to it fell short of nothing.
    scheduled = [f.scheduled_rate for f in figs]
    achieved_rates = [f.achieved_rate for f in figs]
    return {
        "offered_request_rate": plan.request_rate,
        "scheduled_request_rate": _num(_mean_of(scheduled)),
        "achieved_request_rate": _num(_mean_of(achieved_rates)),
        "send_lag_ms_max": _num(max(f.send_lag_ms_max for f in figs), 3),
        "load_shortfall": any(s > 0 and knee_mod.shortfall(s, a, SHORTFALL_TOLERANCE)
                              for s, a in zip(scheduled, achieved_rates, strict=True)),
    }


def planned_requests(run: LevelRun, figs: RunFigures) -> int:
    """The requests a level-run's attainment is a share of: those it sent, or where the server stopped
    answering (the run aborted), those the level planned (a request never sent missed the SLO too)."""
    sent = figs.completed + figs.failed + figs.cut_off
    if run.aborted and run.plan.num_requests is not None and run.plan.duration_s is None:
        return max(sent, run.plan.num_requests)
    return sent


# A level's telemetry figures (keys of telemetry.summarize's per-GPU and "all" dicts), each given as an
# interval across repeats; J per output token keeps 6 decimals.
TELEMETRY_GPU_FIGURES = ("sm_util_mean_pct", "sm_util_max_pct", "mem_util_mean_pct", "sm_clock_mean_mhz",
                         "mem_used_max_mib", "power_mean_w", "power_max_w", "energy_j", "j_per_output_token")
TELEMETRY_ALL_FIGURES = ("sm_util_mean_pct", "sm_util_max_pct", "mem_util_mean_pct", "sm_clock_mean_mhz",
                         "mem_used_max_mib", "power_total_w", "energy_j", "j_per_output_token")


def _figure(per_repeat: list[float | None], confidence: float, seed: int, nd: int) -> dict:
    """_interval over the repeats that have the figure; per_repeat keeps a None where one has not."""
    got = [v for v in per_repeat if v is not None]
    out = (_interval(got, confidence, seed, nd) if got
           else {"mean": None, "ci_low": None, "ci_high": None, "ci_method": "empty"})
    out["per_repeat"] = [_num(v, nd) for v in per_repeat]
    return out


def level_telemetry(windows: list[dict], confidence: float, seed: int) -> dict | None:
    """A level's GPU telemetry across repeats from each repeat's telemetry.summarize() (its `windows`): every
    figure per GPU and over all GPUs as {mean, ci_low, ci_high, ci_method, per_repeat}. None without a
    window. A campaign that runs repeats apart pools them with level_telemetry(all their windows)."""
    if not windows:
        return None

    def fig(per_repeat: list[float | None], key: str) -> dict:
        return _figure(per_repeat, confidence, seed, 6 if key == "j_per_output_token" else 4)

    gpus = sorted({g["gpu"] for w in windows for g in w["gpus"]})
    per_gpu = []
    for gpu in gpus:
        rows = [next((g for g in w["gpus"] if g["gpu"] == gpu), None) for w in windows]
        per_gpu.append({"gpu": gpu, "samples": sum(r["samples"] for r in rows if r),
                        **{k: fig([r[k] if r else None for r in rows], k) for k in TELEMETRY_GPU_FIGURES}})
    coverage = [w["all"]["coverage"] for w in windows]
    gaps = [g for w in windows if (g := w["all"].get("max_gap_s")) is not None]
    notes = [w["note"] for w in windows if w["note"]]
    energy_sources = {w["all"]["energy_source"] for w in windows} - {None}
    return {
        "source": windows[0]["source"],
        "gpus": gpus,
        "repeats": len(windows),
        "samples": sum(w["all"]["samples"] for w in windows),
        "coverage": None if None in coverage else _num(min(coverage)),
        "max_gap_s": _num(max(gaps)) if gaps else None,
        "energy_source": (energy_sources.pop() if len(energy_sources) == 1 else "mixed" if energy_sources else None),
        "note": (notes[0] + (f" (and notes in {len(notes) - 1} more repeat{'s' if len(notes) > 2 else ''})"
                             if len(notes) > 1 else "")) if notes else None,
        "all": {k: fig([w["all"][k] for w in windows], k) for k in TELEMETRY_ALL_FIGURES},
        "per_gpu": per_gpu,
        "windows": windows,
    }


def engine_steps(per_run: list[dict | None]) -> dict:
    """The server's own steps over a level's repeats, by kind: steps taken and the mean of the
    repeats' ms per step (only repeats whose server exported them); where the engine timed its
    forward on the device, the same for device_ms_per_step and the wall/device ratio of those repeats."""
    out = {}
    for kind in sorted({k for d in per_run if d for k in d}):
        got = [d[kind] for d in per_run if d and kind in d]
        out[kind] = {"steps": sum(g["steps"] for g in got),
                     "ms_per_step": float(np.mean([g["ms_per_step"] for g in got])), "repeats": len(got)}
        dev = [g for g in got if "device_ms_per_step" in g]
        if dev:
            out[kind] |= {
                "device_ms_per_step": float(np.mean([g["device_ms_per_step"] for g in dev])),
                "wall_over_device": float(np.mean([g["ms_per_step"] / g["device_ms_per_step"] for g in dev])),
                "device_repeats": len(dev),
            }
    return out


def engine_server(per_run: list[dict | None]) -> dict:
    """The engine's own histograms over a level's repeats: per metric the mean of the repeats' means,
    the observations counted, the repeats that had it, and the series it came from."""
    out = {}
    for metric in sorted({m for d in per_run if d for m in d}):
        got = [d[metric] for d in per_run if d and metric in d]
        out[metric] = {"mean": float(np.mean([g["mean"] for g in got])), "count": sum(g["count"] for g in got),
                       "repeats": len(got), "source": got[0]["source"]}
    return out


def spec_decode(per_run: list[dict | None]) -> dict | None:
    """Speculative decoding over a level's repeats (those whose server reported it): vLLM's counts added up
    and its figures taken from the sums; SGLang's gauges averaged. None where no repeat had any."""
    got = [d for d in per_run if d]
    if not got:
        return None
    if got[0]["drafts"] is not None:
        width = max(len(d["accepted_per_position"]) for d in got)
        per_pos = [sum(d["accepted_per_position"][i] for d in got if i < len(d["accepted_per_position"]))
                   for i in range(width)]
        out = spec_figures(sum(d["drafts"] for d in got), sum(d["draft_tokens"] for d in got),
                           sum(d["accepted_tokens"] for d in got), per_pos)
    else:
        rates = [d["acceptance_rate"] for d in got if d["acceptance_rate"] is not None]
        out = {k: None for k in got[0]} | {
            "acceptance_rate": float(np.mean(rates)) if rates else None,
            "mean_accepted_length": float(np.mean([d["mean_accepted_length"] for d in got]))}
    return out | {"repeats": len(got), "source": got[0]["source"]}


def build_summary(
    level_runs: list[LevelRun], *, meta: dict, confidence: float, seed: int, forced_length: bool,
    planned_repeats: int, aborted: str | None, slo: Slo | None = None,
    readings: dict[tuple[str, int], Readings] | None = None, telemetry_note: str | None = None,
) -> dict:
    """The whole summary.json document, levels in the order they were planned; with an SLO, each
    level's goodput and attainment, and the sweep's SLO capacity; with `readings` (by level label and
    repeat), each level's GPU telemetry. `telemetry_note`: why there is none, in one line."""
    groups: OrderedDict[str, list[LevelRun]] = OrderedDict()
    for run in level_runs:
        groups.setdefault(run.plan.label, []).append(run)
    readings = readings or {}
    levels = [
        level_summary(runs, confidence=confidence, seed=seed, forced_length=forced_length,
                      planned_repeats=planned_repeats, slo=slo,
                      readings=[readings.get((r.plan.label, r.repeat)) for r in runs])
        for runs in groups.values()
    ]
    doc = {"schema": SCHEMA, **meta, "confidence": confidence, "complete": aborted is None,
           "aborted": aborted, "telemetry_note": telemetry_note, "levels": levels, "knee": None}
    if slo is not None:
        doc["slo"] = slo.to_dict()
        doc["slo_capacity"] = sweep_capacity(levels, slo, confidence, seed)
    closed = [lv for lv in levels if lv["request_rate"] is None and lv["valid"]]
    if len(closed) >= 2:
        k = knee_mod.find_knee(
            [lv["concurrency"] for lv in closed],
            [[v for v in lv["output_tok_s"]["per_repeat"] if v is not None] for lv in closed],
            confidence=confidence, seed=seed,
        )
        doc["knee"] = {
            "concurrency": k.concurrency, "low": k.low, "high": k.high,
            "plateau_tok_s": _num(k.plateau_tok_s), "plateau_low": _num(k.plateau_low),
            "plateau_high": _num(k.plateau_high), "best_concurrency": k.best_concurrency, "method": k.method,
        }
    return doc


def sweep_capacity(levels: list[dict], slo: Slo, confidence: float, seed: int) -> dict | None:
    """The SLO capacity over the levels (closed-loop concurrency, else open-loop rates), from each
    repeat's attainment; None when no level has one. A level invalid for its failed requests counts (a
    failed request is one that missed the SLO), and a level the server stopped answering in is a miss."""
    ran = [lv for lv in levels if "slo_attainment" in lv]
    closed = [lv for lv in ran if lv["request_rate"] is None]
    rated = [lv for lv in ran if lv["request_rate"] is not None]
    use, kind, key = (closed, "concurrency", "concurrency") if closed else (rated, "request_rate", "request_rate")
    if not use:
        return None
    return capacity_doc([lv[key] for lv in use],
                        [[v for v in lv["slo_attainment"]["per_repeat"] if v is not None] for lv in use],
                        slo, kind=kind, confidence=confidence, seed=seed,
                        stopped=[lv[key] for lv in use if lv["stopped_early"]])
