"""The end-of-run table and the notes under it, from a summary dict."""

from __future__ import annotations

import math

from rich.table import Table

from rooftop.bench.latency import breakdown_line


def _f(x, nd=1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _sig3(x: float | None) -> int:
    """Decimals that give x three significant digits (J per token runs from tenths to ten-thousandths)."""
    return 2 if not x or x <= 0 else max(0, 2 - math.floor(math.log10(x)))


def _no_interval(d: dict) -> bool:
    """Whether a figure has no interval: one repeat (bootstrap method "single") or none computed. A
    zero-width interval from one repeat would read as a certainty it is not."""
    return d.get("ci_method") in ("single", "empty") or d.get("ci_low") is None or d.get("ci_high") is None


def _ci(d: dict, nd: int = 1, scale: float = 1.0, unit: str = "", said: bool = False) -> str:
    """'405.2 (398.0–411.9)', '405.2 (no interval)' from one repeat (bare '405.2' where the column's
    header already `said` so), '-' without a mean."""
    if d.get("mean") is None:
        return "-"
    mean = _f(scale * d["mean"], nd) + unit
    if _no_interval(d):
        return mean if said else f"{mean} (no interval)"
    return f"{mean} ({_f(scale * d['ci_low'], nd)}–{_f(scale * d['ci_high'], nd)}{unit})"


def summary_table(summary: dict) -> Table:
    t = Table(title=f"rooftop bench · {summary.get('model')} @ {summary.get('base_url')}", title_justify="left")
    steps = any(lv.get("engine_decode_step_ms") is not None for lv in summary["levels"])
    forward = any(_decode_forward_ms(lv) is not None for lv in summary["levels"])
    slo = summary.get("slo") is not None
    gpu = any(lv.get("telemetry") for lv in summary["levels"])
    thinks = any(lv.get("reasoning_tokens") for lv in summary["levels"])  # a reasoning model: its answer's TTFT too
    spec = any(lv.get("spec_decode") for lv in summary["levels"])  # the engine speculated: its drafts' acceptance
    # One repeat everywhere: the headers say there is no interval, once; a level without one among
    # levels with one says so in its cell.
    none = all(_no_interval(lv["output_tok_s"]) for lv in summary["levels"])
    ci = "(no interval)" if none else "(CI)"
    for col in ("level", "ok/failed", f"out tok/s {ci}", *([f"goodput req/s {ci}", f"SLO met {ci}"] if slo else []),
                "TTFT ms p50/p99", *(["TTFOT ms p50/p99"] if thinks else []), "TPOT ms p50/p99",
                *(["engine decode step ms"] if steps else []),
                *(["its forward on the device ms"] if forward else []), "ITL ms p50/p99", "E2E ms p50",
                *(["draft accept %", "accepted length"] if spec else []),
                *(["GPU util %", "power W", f"J/tok {ci}"] if gpu else []), "flags"):
        t.add_column(col, justify="right" if col not in ("level", "flags") else "left")
    for lv in summary["levels"]:
        o = lv["output_tok_s"]
        flags = []
        if not lv["valid"]:
            flags.append("[red]INVALID[/]")
        if lv.get("load_shortfall"):
            flags.append("[yellow]load short[/]")
        if lv["ttft_ms"].get("thin"):
            flags.append("thin " + "/".join(lv["ttft_ms"]["thin"]))
        tc = lv["token_check"]
        if tc["output_len_mismatch"] or tc["usage_vs_client_output"] or tc["usage_vs_client_input"]:
            flags.append("[yellow]token mismatch[/]")
        t.add_row(
            lv["label"], f"{lv['completed']}/{lv['failed']}",
            _ci(o, said=none),
            *(_slo_cells(lv, none) if slo else []),
            f"{_f(lv['ttft_ms']['median'])}/{_f(lv['ttft_ms']['p99'])}",
            *([f"{_f(lv['ttfot_ms']['median'])}/{_f(lv['ttfot_ms']['p99'])}"] if thinks else []),
            f"{_f(lv['tpot_ms']['median'], 2)}/{_f(lv['tpot_ms']['p99'], 2)}",
            *([_f(lv.get("engine_decode_step_ms"), 2)] if steps else []),
            *([_f(_decode_forward_ms(lv), 3)] if forward else []),
            f"{_f(lv['itl_ms']['median'], 2)}/{_f(lv['itl_ms']['p99'], 2)}",
            _f(lv["e2e_ms"]["median"]), *(_spec_cells(lv.get("spec_decode")) if spec else []),
            *(_telemetry_cells(lv.get("telemetry"), none) if gpu else []), " ".join(flags),
        )
    return t


def _decode_forward_ms(level: dict) -> float | None:
    """The decode step's forward on the device (rooftop's engine on a GPU: engine_steps), or None."""
    return ((level.get("engine_steps") or {}).get("decode") or {}).get("device_ms_per_step")


def _spec_cells(spec: dict | None) -> list[str]:
    """Speculative decoding: the share of draft tokens accepted, and the mean tokens a verify step gives."""
    if not spec:
        return ["-", "-"]
    rate = spec["acceptance_rate"]
    return [_f(None if rate is None else 100 * rate), _f(spec["mean_accepted_length"], 2)]


def _telemetry_cells(tel: dict | None, said: bool = False) -> list[str]:
    """All GPUs together: mean GPU utilization (the share of time a kernel ran), total power, energy per
    output token with its interval."""
    if not tel:
        return ["-", "-", "-"]
    a = tel["all"]
    j = a["j_per_output_token"]
    nd = _sig3(j["mean"])
    return [_f(a["sm_util_mean_pct"]["mean"], 0), _f(a["power_total_w"]["mean"], 0), _ci(j, nd, said=said)]


def _slo_cells(lv: dict, said: bool = False) -> list[str]:
    g, a = lv.get("goodput_req_s"), lv.get("slo_attainment")
    if not g or not a:
        return ["-", "-"]
    return [_ci(g, 2, said=said), _ci(a, 0, 100.0, "%", said=said)]


def summary_notes(summary: dict) -> list[str]:
    """Sentences for what the table cannot show: the SLO capacity, the knee, invalid levels, token
    mismatches."""
    notes = []
    if summary["levels"] and all(_no_interval(lv["output_tok_s"]) for lv in summary["levels"]):
        notes.append("No intervals: one repeat per level. --repeats 3 (or more) gives each figure its interval "
                     "across repeats.")
    if summary.get("slo") is not None:
        cap = summary.get("slo_capacity")
        notes.append(cap["sentence"] + "." if cap else "No SLO capacity: no valid level.")
    k = summary.get("knee")
    if k:
        if k["concurrency"] is None:
            notes.append("Knee: not reached — throughput still rises at the highest level.")
        else:
            span = f" (interval C={k['low']}–{k['high']})" if k["low"] != k["high"] else ""
            one = max((lv.get("repeats_run") or 0 for lv in summary["levels"]), default=0) <= 1
            plateau = "(no interval: one repeat)" if one or k.get("plateau_low") is None else \
                f"({_f(k['plateau_low'])}–{_f(k['plateau_high'])})"
            notes.append(f"Knee at C={k['concurrency']}{span}: plateau {_f(k['plateau_tok_s'])} tok/s {plateau}.")
    tel = [lv["telemetry"] for lv in summary["levels"] if lv.get("telemetry")]
    if tel:
        gpus = ",".join(str(g) for g in sorted({g for t in tel for g in t["gpus"]}))
        energy = {t["energy_source"] for t in tel}
        how = ("the GPUs' energy counters" if energy == {"counter"} else "power integrated over time"
               if energy == {"power_integral"} else "energy counters where the GPU has one, else power integrated")
        notes.append(f"GPU telemetry from {tel[0]['source'].upper()} over GPU {gpus} during each level: GPU util is "
                     "the share of time a kernel ran (NVML's and DCGM's utilization, not SM occupancy), power W the "
                     f"GPUs' total, J/tok their energy ({how}) per output token."
                     + (" GPU util is not given for a level under 1 s: the driver's utilization period is up to 1 s."
                        if any(t["all"]["sm_util_mean_pct"]["mean"] is None for t in tel) else ""))
        for lv in summary["levels"]:
            t = lv.get("telemetry")
            if t and t["note"]:
                notes.append(f"{lv['label']}: {t['note']}; telemetry from the readings that succeeded.")
            if t and t["coverage"] is not None and t["coverage"] < 0.9:
                notes.append(f"{lv['label']}: telemetry covers {100 * t['coverage']:.0f}% of the level.")
    for lv in summary["levels"]:
        if lv.get("server_spans") is not None:  # --otlp-receiver
            notes.append(breakdown_line(lv["label"], lv["server_spans"]))
    for lv in summary["levels"]:
        turns = lv.get("ttft_ms_by_turn")
        if turns:
            notes.append(f"{lv['label']}: TTFT of first turns {_ci(turns['first'])} ms, of later turns (with their "
                         f"history) {_ci(turns['later'])} ms (means).")
    if any(lv.get("reasoning_tokens") for lv in summary["levels"]):
        notes.append("Reasoning counted apart: TTFT is the first token of any kind (a thought included), TTFOT the "
                     "first token of the answer; " + ", ".join(f"{lv['label']} {lv['reasoning_tokens']}" for lv in
                                                                summary["levels"]) + " reasoning tokens.")
    metrics_url = (summary.get("config") or {}).get("metrics_url")
    if metrics_url and not any(lv.get("engine_steps") or lv.get("engine_server") or lv.get("spec_decode")
                               for lv in summary["levels"]):
        notes.append(f"No engine-side figures: {metrics_url} did not answer or exports none of the histograms "
                     "rooftop reads (rooftop_engine_step_seconds, vLLM's or SGLang's latency histograms, the "
                     "prefix-cache counters).")
    for lv in summary["levels"]:
        server = lv.get("engine_server")
        if server:
            parts = [f"{k.removesuffix('_ms')} {v['mean']:.2f} ms" for k, v in server.items() if k.endswith("_ms")]
            if "tokens_per_iteration" in server:
                parts.append(f"{server['tokens_per_iteration']['mean']:.1f} tokens per engine step")
            if parts:
                source = next(v for k, v in server.items() if k != "prefix_cache_hit_rate")["source"].split(":")[0]
                notes.append(f"{lv['label']}: {source} reports " + ", ".join(parts) + " (means over the level).")
            cache = server.get("prefix_cache_hit_rate")
            if cache:
                notes.append(f"{lv['label']}: prefix cache hit rate {100 * cache['mean']:.1f}% of "
                             f"{cache['count']} prompt tokens looked up ({cache['source']}).")
    notes += [spec_line(lv["label"], lv["spec_decode"]) for lv in summary["levels"] if lv.get("spec_decode")]
    for lv in summary["levels"]:
        if not lv["valid"]:
            notes.append(f"{lv['label']} is invalid: {lv['invalid_reason']}.")
        tc = lv["token_check"]
        if tc["usage_vs_client_output"] or tc["usage_vs_client_input"] or tc["output_len_mismatch"]:
            ex = tc["examples"][0] if tc["examples"] else {}
            notes.append(
                f"{lv['label']}: token counts disagree — server usage vs client tokenizer: "
                f"{tc['usage_vs_client_output']} output, {tc['usage_vs_client_input']} input; "
                f"output length vs requested: {tc['output_len_mismatch']} (e.g. {ex}). Not resolved: "
                "figures use the server's usage."
            )
        if lv.get("cut_off"):
            notes.append(f"{lv['label']}: {lv['cut_off']} request(s) still in flight at the level's deadline were "
                         "cut (cut_off): not failures of the server, and in no figure (latencies leave out the "
                         "slowest).")
        if tc.get("no_usage"):
            notes.append(f"{lv['label']}: {tc['no_usage']} responses had no usage; client counts were used.")
    return notes


def spec_line(label: str, spec: dict) -> str:
    """One level's speculative decoding in a sentence: what was drafted and accepted, by position where known."""
    if spec["drafts"] is None:  # SGLang: gauges over its last decode log interval
        rate = "" if spec["acceptance_rate"] is None else f", acceptance rate {100 * spec['acceptance_rate']:.1f}%"
        return (f"{label}: speculative decoding (SGLang's gauges over its last decode log interval): mean accepted "
                f"length {spec['mean_accepted_length']:.2f}{rate}.")
    if not spec["drafts"]:
        return f"{label}: speculative decoding on, no draft made in the level ({spec['source']})."
    by_pos = ", ".join(f"{100 * a:.0f}%" for a in spec["acceptance_by_position"])
    return (f"{label}: speculative decoding accepted {spec['accepted_tokens']} of {spec['draft_tokens']} draft tokens "
            f"({100 * spec['acceptance_rate']:.1f}%) in {spec['drafts']} drafts: mean accepted length "
            f"{spec['mean_accepted_length']:.2f} tokens per verify (the target's own token included); accepted by "
            f"draft position {by_pos} ({spec['source']}).")
