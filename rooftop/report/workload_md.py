"""SUMMARY.md's Workload: what traffic every variant served (its kind, requests and arrivals), the prefix reuse a
trace's hash ids promise, and the prefix-cache hit rate each variant's engine measured at each level."""

from __future__ import annotations

from rooftop.campaign.evidence import Evidence, WorkloadEvidence
from rooftop.report import fmt

TRACE_NAMES = {"mooncake": "Mooncake trace", "burstgpt": "BurstGPT trace", "azure": "Azure LLM inference trace",
               "trace": "rooftop trace"}


def _nums(xs: list) -> str:
    return ", ".join(f"{x:g}" for x in xs)


def kind(w: WorkloadEvidence) -> str:
    """What each request is: 'Mooncake trace `t.jsonl` (hash-id blocks shared as the trace shares them)'."""
    if w.dataset in TRACE_NAMES:
        return f"{TRACE_NAMES[w.dataset]} `{w.dataset_path}`, replayed on its own clock"
    if w.dataset == "sharegpt":
        return f"ShareGPT conversations from `{w.dataset_path}`" + (", each a session of turns" if w.sessions else "")
    if w.dataset == "conversation":
        return f"synthetic conversations: {w.sessions} sessions of {w.turns} turns, each turn sending the history"
    if w.dataset == "prefix":
        return (f"random prompts of {w.input_len} tokens sharing a {w.prefix_len}-token prefix, {w.output_len} "
                "tokens out")
    return f"random prompts of {w.input_len} tokens, {w.output_len} tokens out"


def requests(w: WorkloadEvidence) -> str:
    """How many requests a level sends: the replayed trace's, or the level's count or time."""
    if w.trace is not None:
        t = w.trace
        out = f"{t['requests']} requests over {t['span_s']:.1f} s of replay per level"
        return out + (f" ({t['cut']})" if t.get("cut") else " (the whole trace" + (" window" if w.trace_window_s
                                                                                    else "") + ")")
    if w.duration_s and w.requests_per_level:
        return f"{w.duration_s:g} s (at most {w.requests_per_level} requests) per level"
    if w.duration_s:
        return f"{w.duration_s:g} s per level"
    if w.requests_per_level:
        return f"{w.requests_per_level} requests per level"
    return "every request the workload holds, per level"


def arrivals(w: WorkloadEvidence) -> str:
    """When requests go: a closed loop's users, an open loop's rates and their shape, or the trace's clock."""
    cap = f", at most {w.max_concurrency} in flight" if w.max_concurrency else ""
    if w.dataset in TRACE_NAMES:
        speed = f" divided by {w.trace_speedup:g}" if w.trace_speedup != 1.0 else ""
        window = ""
        if w.trace_window_s:
            end = "its end" if w.trace_window_s[1] == float("inf") else f"{w.trace_window_s[1]:g} s"
            window = f", the window {w.trace_window_s[0]:g} s to {end} of trace time"
        rate = f" (mean {w.trace['mean_rate']:.2f} req/s)" if w.trace and w.trace.get("mean_rate") else ""
        return f"open loop at the trace's own timestamps{speed}{window}{rate}{cap}"
    shape = "Poisson" if w.burstiness == 1.0 else f"gamma (burstiness {w.burstiness:g}, burstier than Poisson)" \
        if w.burstiness < 1.0 else f"gamma (burstiness {w.burstiness:g}, more even than Poisson)"
    if w.ramp:
        return (f"open loop, {shape} arrivals on a {w.ramp[0]} ramp from {w.ramp[1]:g} to {w.ramp[2]:g} req/s over "
                f"the level's requests{cap}")
    if w.request_rate:
        return f"open loop, {shape} arrivals at {_nums(w.request_rate)} req/s (one level each){cap}"
    think = f", {w.think_time_s:g} s between a reply and the next turn" if w.think_time_s else ""
    return (f"closed loop at C = {_nums(w.closed_loop)}: that many users, each sending its next request when the "
            f"last one ends{think}")


def headline(ev: Evidence) -> str:
    """One line under the goal: 'Workload: KIND; REQUESTS; ARRIVALS; expected prefix reuse 42%.'"""
    w = ev.workload
    if w is None:
        return ""
    reuse = w.expected_prefix_reuse
    return (f"Workload: {kind(w)}; {requests(w)}; {arrivals(w)}"
            + (f"; expected prefix reuse {reuse:.0%}" if reuse is not None else "") + ".\n")


def hit_rates(ev: Evidence) -> list[list[str]]:
    """Per variant and level, its measured prefix-cache hit rate with its interval; rows only where one exists."""
    rows = []
    for v in ev.variants.values():
        for lv in v.levels:
            if lv.prefix_hit_rate is None:
                continue
            rate = "0 (prefix caching off)" if v.prefix_caching is False else \
                fmt.with_ci(100 * lv.prefix_hit_rate, _pct(lv.prefix_hit_low), _pct(lv.prefix_hit_high), 1)
            rows.append([v.name, lv.at, rate])
    return rows


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def workload(ev: Evidence) -> str:
    """The Workload section."""
    w = ev.workload
    if w is None:
        return "_The workload is not recorded._\n"
    reuse = w.expected_prefix_reuse
    lines = [f"- **Requests**: {kind(w)}; {requests(w)}.", f"- **Arrivals**: {arrivals(w)}."]
    if reuse is not None:
        lines.append(f"- **Expected prefix reuse**: {reuse:.1%} of prompt tokens lie in blocks an earlier request of "
                     "the replay sent (the trace's hash_ids: tokens in blocks seen before ÷ prompt tokens), what a "
                     "prefix cache large enough would serve.")
    elif w.dataset == "prefix":
        lines.append(f"- **Expected prefix reuse**: a {w.prefix_len}-token prefix shared by every prompt.")
    out = "\n".join(lines) + "\n"
    rows = hit_rates(ev)
    if rows:
        out += ("\nPrefix-cache hit rate measured by each engine over each level (prompt tokens found cached ÷ "
                "prompt tokens looked up, from its /metrics), mean over repeats:\n\n"
                + fmt.table(["variant", "level", f"hit rate % [{fmt.pct(ev.confidence)} CI]"], rows))
    else:
        out += "\n_No engine exported a prefix-cache hit rate (its /metrics has no prefix-cache counters)._\n"
    return out
