"""Build the `Evidence` record from a run's store: level statistics, lever effects, profiles, rooflines."""

from __future__ import annotations

from rooftop.bench import knee as knee_mod
from rooftop.bench import stats
from rooftop.bench.slo import Slo, capacity_doc
from rooftop.bench.summary import level_telemetry, spec_decode
from rooftop.campaign.evidence import (
    ComponentShare,
    Evidence,
    LevelStat,
    LeverEvidence,
    ProfileEvidence,
    RooflineEvidence,
    VariantEvidence,
    WorkloadEvidence,
)
from rooftop.campaign.store import Store
from rooftop.campaign.stored_profile import StoredProfile
from rooftop.campaign.verdicts import level_label, lever_effects, per_repeat, ran_to_end
from rooftop.spec.campaign import BASELINE, CampaignSpec, parse_campaign

COMPARISON = "comparison"  # decision kind: a lever measured against a base variant (written by the runner)
JOINED = "joined_baseline"  # decision kind: cumulative mode, a winning lever joins the baseline
KEPT = "kept_baseline"  # decision kind: cumulative mode, a lever that did not win
TELEMETRY_NOTE_SUBJECT = "*"  # analyses row of the run's "GPU telemetry off" note (kind telemetry_note)
TRACE_REPLAY = "trace_replay"  # analyses kind (subject "*"): what a sweep replayed of the workload's trace


def level_stats(rows, confidence: float, seed: int = 0, cache_off: bool = False) -> list[LevelStat]:
    """Per level: tok/s, TTFT, TPOT, the server's decode step and its prefix-cache hit rate, each a mean with
    its interval across repeats (`cache_off`: the variant runs with prefix caching off, so its hit rate is 0)."""
    tok = per_repeat(rows, "output_tok_s")
    ttft = per_repeat(rows, "ttft_ms")
    tpot = per_repeat(rows, "tpot_ms")
    step = per_repeat(rows, "engine_decode_step_ms")
    goodput = per_repeat(rows, "goodput_req_s")
    attainment = per_repeat(rows, "slo_attainment")
    prefill = _prefill_per_repeat(rows)

    def ci(values: list[float] | None) -> tuple[float, float]:
        if not values or len(values) < 2:
            v = values[0] if values else float("nan")
            return v, v
        interval = stats.bootstrap_ci(values, confidence=confidence, seed=seed, floor=0.0)
        return interval.low, interval.high

    out = []
    for conc in sorted({r.concurrency for r in rows}):
        level_rows = [r for r in rows if r.concurrency == conc]
        values = tok.get(conc, [])
        if not values and not attainment.get(conc):
            continue  # a level with SLO figures stays, though no repeat was valid: it lost goodput
        tok_low, tok_high = ci(values)
        step_values = step.get(conc) if _all_repeats(step.get(conc), tpot.get(conc)) else None
        step_low, step_high = ci(step_values) if step_values else (None, None)
        out.append(LevelStat(
            concurrency=conc, tok_s=_mean(values), tok_s_low=tok_low, tok_s_high=tok_high,
            ttft_ms=_mean(ttft.get(conc)), tpot_ms=_mean(tpot.get(conc)),
            repeats=len(values) or len(attainment[conc]), valid=bool(values) and all(r.valid for r in level_rows),
            decode_step_ms=_mean(step_values) if step_values else None,
            decode_step_source=_step_source(level_rows) if step_values else None,
            prefill_share=_mean_if_all([share for share, _ in prefill.get(conc, [])], tpot.get(conc)),
            prefill_step_ms=_mean_if_all([ms for _, ms in prefill.get(conc, [])], tpot.get(conc)),
            ttft_low=ci(ttft.get(conc))[0], ttft_high=ci(ttft.get(conc))[1],
            tpot_low=ci(tpot.get(conc))[0], tpot_high=ci(tpot.get(conc))[1],
            decode_step_low=step_low, decode_step_high=step_high, label=level_label(level_rows, conc),
        ))
        hits = [h for r in level_rows if r.valid and (h := prefix_hit_rate(r.summary)) is not None]
        if hits:
            out[-1].prefix_hit_rate = _mean(hits)
            out[-1].prefix_hit_low, out[-1].prefix_hit_high = ci(hits)
        elif cache_off:
            out[-1].prefix_hit_rate = out[-1].prefix_hit_low = out[-1].prefix_hit_high = 0.0
        spans = [{**s, "itl_p99_ms": (r.summary.get("itl_ms") or {}).get("p99")} for r in level_rows
                 if r.valid and (s := r.summary.get("server_spans"))]
        out[-1].server_spans = spans or None
        out[-1].spec_decode = spec_decode([r.summary.get("spec_decode") for r in level_rows if r.valid])
        windows = [w for r in level_rows if r.valid for w in ((r.summary.get("telemetry") or {}).get("windows") or [])]
        pooled = level_telemetry(windows, confidence, seed)
        if pooled is not None:
            out[-1].telemetry = {k: v for k, v in pooled.items() if k != "windows"}
        if attainment.get(conc):
            g, a = goodput.get(conc, []), attainment[conc]
            (g_low, g_high), (a_low, a_high) = ci(g), ci(a)
            bounds = [r.summary["slo_bounds"] for r in level_rows if ran_to_end(r) and r.summary.get("slo_bounds")]
            out[-1].goodput_req_s, out[-1].goodput_low, out[-1].goodput_high = _mean(g), g_low, g_high
            out[-1].slo_attainment, out[-1].attainment_low, out[-1].attainment_high = _mean(a), a_low, min(a_high, 1.0)
            out[-1].slo_bounds = {k: _mean([b[k] for b in bounds if b.get(k) is not None])
                                  for k in bounds[0]} if bounds else None
    return out


def prefix_hit_rate(summary: dict) -> float | None:
    """One repeat's prefix-cache hit rate (bench.engine_metrics: cached / looked-up prompt tokens), else None."""
    cache = (summary.get("engine_server") or {}).get("prefix_cache_hit_rate")
    return float(cache["mean"]) if cache and cache.get("mean") is not None else None


def workload_evidence(spec: CampaignSpec, trace: dict | None) -> WorkloadEvidence:
    """The traffic every variant served, from the campaign's settings, and `trace`: what a sweep replayed."""
    s = spec.bench_settings()
    multi = s.conversations
    return WorkloadEvidence(
        dataset=s.dataset, dataset_path=s.dataset_path, input_len=s.input_len, output_len=s.output_len,
        prefix_len=s.prefix_len, closed_loop=list(s.concurrency), request_rate=list(s.request_rate),
        max_concurrency=s.max_concurrency, requests_per_level=s.num_requests, duration_s=s.duration_s,
        burstiness=s.burstiness, trace_speedup=s.trace_speedup, trace_window_s=s.trace_window_s,
        ramp=(s.ramp_up_strategy, s.ramp_up_start_rps, s.ramp_up_end_rps) if s.ramp_up_strategy else None,
        sessions=s.sessions if multi else None, turns=s.turns if multi else None,
        think_time_s=s.think_time_s if multi else None, trace=trace)


def slo_capacity(rows, slo: Slo, confidence: float, seed: int = 0) -> dict | None:
    """A variant's SLO capacity over its concurrency levels, from each repeat's attainment: levels that ran
    to their end count, also those invalid for failed requests (a failed request missed the SLO), and a
    level the server stopped answering in counts as a miss."""
    if any(r.summary.get("request_rate") is not None for r in rows):
        return None  # a capacity is a concurrency; open-loop levels are at rates
    per_level: dict[int, list[float]] = {}
    stopped: set[int] = set()
    for row in sorted(rows, key=lambda r: (r.concurrency, r.repeat)):
        a = row.summary.get("slo_attainment")
        if not a or a.get("mean") is None:
            continue
        if ran_to_end(row):
            per_level.setdefault(row.concurrency, []).append(float(a["mean"]))
        else:
            stopped.add(row.concurrency)
    if not per_level and not stopped:
        return None
    levels = sorted(set(per_level) | stopped)
    return capacity_doc(levels, [per_level.get(x, []) for x in levels], slo, confidence=confidence, seed=seed,
                        stopped=sorted(stopped))


def _layout_text(r: dict) -> str:
    """', per GPU at TP 8 (EP 8), KV fp8' where the stored floor was costed off the defaults (TP 1, bf16 KV)."""
    parts = []
    if (r.get("tp") or 1) > 1 or (r.get("ep") or 1) > 1:
        parts.append(f"per GPU at TP {r.get('tp') or 1}" + (f" (EP {r['ep']})" if (r.get("ep") or 1) > 1 else ""))
    if r.get("kv_dtype") not in (None, "bf16"):
        parts.append(f"KV {r['kv_dtype']}")
    return "".join(f", {p}" for p in parts)


def _step_source(rows) -> str:
    """What a level's engine_decode_step_ms is (bench.summary): the engine's own decode step where its
    step histogram has one, else the server's inter-token latency (vLLM, SGLang)."""
    if any("decode" in (r.summary.get("engine_steps") or {}) for r in rows if r.valid):
        return "engine_step"
    return "server_itl"


def _all_repeats(xs: list[float] | None, tpot: list[float] | None) -> bool:
    """Whether a server-exported figure is there on every valid repeat (so it rests on the same repeats
    as TPOT)."""
    return bool(xs) and len(xs) == len(tpot or [])


def _mean_if_all(xs: list[float] | None, tpot: list[float] | None) -> float | None:
    """The mean of a server-exported figure where every valid repeat has it; else None."""
    return _mean(xs) if _all_repeats(xs, tpot) else None


def _prefill_per_repeat(rows) -> dict[int, list[tuple[float, float]]]:
    """Per concurrency, each valid repeat's (prefill share of the engine's step time, ms a prefill
    step) from its `engine_steps` (the server's step histogram over the level), where it has both kinds."""
    out: dict[int, list[tuple[float, float]]] = {}
    for row in sorted(rows, key=lambda r: (r.concurrency, r.repeat)):
        steps = (row.summary.get("engine_steps") or {}) if row.valid else {}
        dec, pre = steps.get("decode"), steps.get("prefill")
        if not dec or not pre:
            continue
        pre_ms = pre["steps"] * pre["ms_per_step"]
        total = pre_ms + dec["steps"] * dec["ms_per_step"]
        if total > 0:
            out.setdefault(row.concurrency, []).append((pre_ms / total, pre["ms_per_step"]))
    return out


def _mean(xs: list[float] | None) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _knee(rows, confidence: float) -> tuple[int | None, str]:
    if any(r.summary.get("request_rate") is not None for r in rows):
        return None, "open-loop levels: the arrivals set the load, so there is no knee in concurrency"
    tok = per_repeat(rows, "output_tok_s")
    levels = sorted(tok)
    if len(levels) < 2:
        return None, "one level: no knee can be found"
    k = knee_mod.find_knee(levels, [tok[c] for c in levels], confidence=confidence, seed=0)
    if k.concurrency is None:
        return None, f"not reached within C≤{levels[-1]}; {k.method}"
    high = k.high if k.high is not None else "not reached"
    note = f"interval C in [{k.low}, {high}]; {k.method}"
    return k.concurrency, note


def profile_evidence(variant: str, path: str, concurrency: int | None, stored: StoredProfile) -> ProfileEvidence:
    """A stored profile (the profile package's summary and the campaign's role, measured line and ranks) as
    the record the diagnosis reads."""
    s = stored.summary
    comps = [ComponentShare(c.name, c.share, c.ms_per_step, c.path, c.unit_shares) for c in s.components]
    comps.sort(key=lambda c: c.share, reverse=True)
    return ProfileEvidence(
        variant=variant, trace_path=path, concurrency=concurrency, steps=s.steps,
        busy_ms_per_step=s.gpu_busy_ms_per_step, idle_share=s.gpu_idle_share, tensor_core_share=s.tensor_core_share,
        components=comps, capacity_findings=list(s.capacity_findings),
        # the profile says which timeline it read: kernels (GPU) or CPU ops (a CPU-only trace)
        device="cpu" if s.basis == "cpu_ops" else "gpu",
        attribution_source=s.attribution_source, unattributed_share=s.unattributed_share, notes=list(s.notes),
        measured=stored.measured,
    )


def comparisons(store: Store, spec: CampaignSpec) -> list[dict]:
    """Which variant each lever was measured as, against which base, in which series."""
    found = {d.subject: d.payload for d in store.decisions(COMPARISON)}
    out = []
    for lv in spec.levers:
        out.append(found.get(lv.name, {"lever": lv.name, "variant": lv.name, "base_variant": BASELINE,
                                       "series": "main"}))
    return out


def collect(store: Store, spec: CampaignSpec | None = None) -> Evidence:
    """Everything the diagnosis and the documents need, from the store alone."""
    run = store.run()
    spec = spec or parse_campaign(run.spec_toml, run.spec_path or "store")
    conf = spec.bench.confidence
    rows = store.levels()
    slo = Slo(**spec.slo.model_dump()) if spec.slo is not None else None
    deployed = {d.variant: d for d in store.deployments()}
    variants: dict[str, VariantEvidence] = {}
    for name in sorted({r.variant for r in rows}, key=lambda v: (v != BASELINE, v)):
        vrows = [r for r in rows if r.variant == name]
        knee, note = _knee(vrows, conf)
        dep = deployed.get(name)
        topology = (dep.spec.get("topology") if dep else None) or (
            next((lv.topology for lv in spec.levers if lv.name == name and lv.topology), None)
            or spec.deployment.topology)
        caching = dep.spec.get("prefix_caching") if dep else None
        variants[name] = VariantEvidence(name, dep.levers if dep else ([] if name == BASELINE else [name]),
                                         topology, level_stats(vrows, conf, cache_off=caching is False), knee, note,
                                         slo_capacity(vrows, slo, conf) if slo is not None else None, caching)
    joined = {d.subject for d in store.decisions(JOINED)}
    quality = store.analyses("quality")
    levers = []
    for cmp in comparisons(store, spec):
        lv = next(x for x in spec.levers if x.name == cmp["lever"])
        series = cmp.get("series")
        base_rows = [r for r in rows if r.variant == cmp["base_variant"] and (series is None or r.series == series)]
        cand_rows = [r for r in rows if r.variant == cmp["variant"] and (series is None or r.series == series)]
        levers.append(LeverEvidence(
            name=lv.name, hypothesis=lv.hypothesis, variant=cmp["variant"], base_variant=cmp["base_variant"],
            changes=lv.changes(), effects=lever_effects(base_rows, cand_rows, conf, spec.campaign.seed),
            quality=quality.get(cmp["variant"]), joined_baseline=lv.name in joined,
        ))
    profiles = {}
    for t in store.traces():
        profiles[t.variant] = profile_evidence(t.variant, t.path, t.concurrency,
                                               StoredProfile.from_json_dict(t.analysis))
    rooflines = {}
    for variant, r in store.analyses("roofline").items():
        v = variants.get(variant)
        lvl = v.level(r["batch"]) if v else None
        served = lvl.served_step() if lvl else None
        rooflines[variant] = RooflineEvidence(
            variant=variant, hardware=r.get("hardware", "?") + _layout_text(r), batch=r["batch"], context=r["context"],
            floor_ms=float(r["floor_ms"]), component_floor_ms=dict(r.get("components", {})),
            measured_step_ms=served[0] if served else None, context_capacity=r.get("context_capacity"),
            measured_step_low=served[1] if served else float("nan"),
            measured_step_high=served[2] if served else float("nan"),
            notes=list(r.get("notes") or []),
        )
    failures: dict[str, str] = {}
    stage_errors: dict[str, dict[str, str]] = {}
    for key, error in sorted(store.unit_errors().items()):
        parts = key.split("/")
        if len(parts) == 4:
            failures.setdefault(parts[1], f"{parts[3]} r{parts[2][1:]}: {one_line(error)}")
            stage_errors.setdefault(parts[1], {}).setdefault(parts[3], f"r{parts[2][1:]}: {one_line(error)}")
    missing = {f"roofline:{v}": a["reason"] for v, a in store.analyses("roofline_missing").items()}
    missing.update({f"profile:{v}": a["error"] for v, a in store.analyses("profile_error").items()})
    missing.update({f"speculative_roofline:{v}": a["reason"]
                    for v, a in store.analyses("speculative_roofline_missing").items()})
    # stores written before pd was profiled recorded why it was not ("pd: capture cannot yet ...")
    missing.update({f"profile:{v}": f"not profiled ({a['reason']})" for v, a in store.analyses("profile_skipped").items()})
    return Evidence(
        campaign=spec.campaign.name, goal=spec.campaign.goal, mode=spec.campaign.mode, baseline=BASELINE,
        variants=variants, levers=levers, profiles=profiles, rooflines=rooflines, failures=failures,
        confidence=conf, stage_errors=stage_errors, missing=missing, profiling=spec.profile.enabled,
        slo={**slo.to_dict(), "describe": slo.describe(), "bounds": slo.bounds()} if slo is not None else None,
        telemetry_note=("GPU telemetry off: not asked for ([bench] telemetry = false)" if not spec.bench.telemetry
                        else (store.analysis(TELEMETRY_NOTE_SUBJECT, "telemetry_note") or {}).get("note")),
        workload=workload_evidence(spec, store.analysis(TELEMETRY_NOTE_SUBJECT, TRACE_REPLAY)),
        speculative_rooflines=store.analyses("speculative_roofline"),
    )


def one_line(text: str | None, limit: int = 300) -> str:
    """An error as one line of at most `limit` characters: its first line and its last, where a quoted
    log tail keeps the process's own error."""
    lines = [" ".join(line.split()) for line in (text or "").splitlines() if line.strip()]
    flat = f"{lines[0]} … {lines[-1]}" if len(lines) > 1 else (lines[0] if lines else "")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
