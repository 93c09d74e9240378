"""Why the latency tail is what it is: findings from the server's spans joined to the bench's requests (each
level summary's `server_spans`, bench/latency.py): what makes p99 TTFT (its largest part, with its share of the
p99 request's TTFT across repeats) and p99 ITL (what the engine ran in the gaps over 2x the median), and the
levers that act on it. Context findings: a latency cause is not a throughput gain."""

from __future__ import annotations

from rooftop.bench import stats
from rooftop.bench.latency import PARTS
from rooftop.campaign.evidence import Evidence, Finding, LevelStat

# what each TTFT part is, and what acts on it (engine flags as vLLM spells them)
TTFT_PART = {
    "queue": ("queued (arrival to its first prompt chunk launched: the scheduler's waiting queue behind other "
              "requests' work)",
              "priority scheduling (--scheduling-policy priority) to let short prompts ahead, a larger "
              "--max-num-batched-tokens to admit more prompt tokens per step, fewer requests in flight, or PD "
              "(prefill on workers of its own)"),
    "prefill": ("in its own prompt chunks' steps",
                "PD (a prefill worker of its own) or a faster prefill; a larger --max-num-batched-tokens or "
                "chunked-prefill size runs its prompt in fewer steps"),
    "prefill_wait": ("between its own prompt chunks (other work the engine ran meanwhile)",
                     "a larger chunked-prefill size / --max-num-batched-tokens (fewer chunks, so fewer waits), "
                     "or PD, where no decode runs between them"),
    "kv_transfer": ("in the KV transfer from the prefill to the decode worker",
                    "a faster transfer path between the workers, or no PD split at this load"),
    "emission": ("between the engine's first token and the client's first chunk (hand-out, SSE write, network)",
                 "the front end: its event loop and detokenizing, or a client nearer the server"),
    "client_to_server": ("between the client's send and the server's arrival (connection, request bytes, accept)",
                         "connection reuse and a less loaded front end"),
    "client_wait": ("in the client before the send (a slot, the client's loop)",
                    "more client processes (--client-procs): this is the bench, not the server"),
}
ITL_CAUSE = {
    "prefill_chunk": ("co-scheduled prompt chunks of other requests",
                      "a smaller chunked-prefill size / --max-num-batched-tokens bounds a step's prompt tokens "
                      "(trading TTFT), or PD keeps prefill off the decode steps"),
    "preemption": ("preemptions of the request", "more KV memory (--gpu-memory-utilization) or a smaller "
                   "--max-num-seqs, so running requests are not evicted"),
    "batch_grew": ("steps that grew the batch", "a smaller --max-num-seqs, or PD (sequences join after prefill "
                   "elsewhere)"),
    "host_stall": ("host stalls (no step running)", "less host work between steps (CUDA graphs, async "
                   "scheduling), a less loaded host"),
    "delivery": ("delivery (the engine was on time; the delay came on the way to the client)",
                 "the front end and the network, not the engine"),
}


def _interval(values: list[float], confidence: float) -> tuple[float, float] | None:
    """The interval of the mean across repeats; None from one repeat."""
    if len(values) < 2:
        return None
    ci = stats.bootstrap_ci(values, confidence=confidence, seed=0, floor=0.0)
    return max(0.0, ci.low), min(1.0, ci.high)


def _share_text(mean: float, ci: tuple[float, float] | None) -> str:
    return f"{mean:.0%}" + (f" [{ci[0]:.0%}, {ci[1]:.0%}]" if ci else "")


def _p99s(lv: LevelStat) -> list[dict]:
    return [b["p99"] for s in lv.server_spans or [] if (b := s.get("ttft_breakdown")) and b["p99"]["ttft_ms"] > 0]


def _worst_level(ev: Evidence, key) -> tuple[str, LevelStat] | None:
    """The baseline's level with the largest `key` (else any variant's), among those with server spans."""
    for name in [ev.baseline] + sorted(v for v in ev.variants if v != ev.baseline):
        levels = [lv for lv in ev.variants[name].levels if lv.server_spans and key(lv) is not None]
        if levels:
            return name, max(levels, key=key)
    return None


def rule_ttft_tail(ev: Evidence) -> list[Finding]:
    """The part that makes the p99 request's TTFT at the level where that TTFT is largest: its share per
    repeat (each repeat's p99 request), their mean and interval, and what acts on that part."""
    found = _worst_level(ev, lambda lv: (sum(p["ttft_ms"] for p in p99) / len(p99)) if (p99 := _p99s(lv)) else None)
    if found is None:
        return []
    variant, lv = found
    p99 = _p99s(lv)
    shares = {part: [p[f"{part}_ms"] / p["ttft_ms"] for p in p99] for part in PARTS}
    top = max(PARTS, key=lambda part: sum(shares[part]))
    ttft = sum(p["ttft_ms"] for p in p99) / len(p99)
    mean = sum(shares[top]) / len(p99)
    ci = _interval(shares[top], ev.confidence)
    what, levers = TTFT_PART[top]
    chunks = sum(p["prefill_chunks"] for p in p99) / len(p99)
    sentence = f"p99 TTFT {ttft:.0f} ms at {lv.at}: {_share_text(mean, ci)} {what}"
    if top in ("prefill", "prefill_wait"):
        sentence += f", its prompt in {chunks:.0f} chunk{'s' if round(chunks) != 1 else ''}"
    others = sorted(((sum(shares[p]) / len(p99), p) for p in PARTS if p != top), reverse=True)[:2]
    sentence += "; then " + ", ".join(f"{p.replace('_', ' ')} {s:.0%}" for s, p in others if s > 0)
    sentence += f" (the p99 request of each of {len(p99)} repeat{'s' if len(p99) > 1 else ''}). Levers: {levers}"
    return [Finding(f"p99 TTFT: {top.replace('_', ' ')} {mean:.0%}", sentence + ".",
                    {"variant": variant, "concurrency": lv.concurrency, "p99_ttft_ms": ttft, "part": top,
                     "share": mean, "share_low": ci[0] if ci else None, "share_high": ci[1] if ci else None,
                     "shares": {p: sum(shares[p]) / len(p99) for p in PARTS}, "repeats": len(p99)},
                    f"levels {variant} {lv.at}: server_spans.ttft_breakdown.p99", None, "ttft_tail")]


def _outliers(lv: LevelStat) -> list[dict]:
    return [o for s in lv.server_spans or [] if (o := s.get("itl_outliers")) and o["count"]]


def rule_itl_tail(ev: Evidence) -> list[Finding]:
    """What the engine ran in the ITL outliers (gaps over 2x the median: what p99 ITL is made of) at the
    level with the most of them: the leading cause's share of them per repeat, mean and interval."""
    found = _worst_level(ev, lambda lv: sum(o["count"] for o in out) if (out := _outliers(lv)) else None)
    if found is None:
        return []
    variant, lv = found
    outs = _outliers(lv)
    total = sum(o["count"] for o in outs)
    causes = {c for o in outs for c in o["causes"]}
    top = max(causes, key=lambda c: sum(o["causes"].get(c, 0) for o in outs))
    shares = [o["causes"].get(top, 0) / o["count"] for o in outs]
    mean, ci = sum(shares) / len(shares), _interval(shares, ev.confidence)
    what, levers = ITL_CAUSE.get(top, (top.replace("_", " "), "none known: read the timeline's gaps"))
    thresholds = [t for s in lv.server_spans for t in s.get("itl_threshold_ms") or [] if t]
    p99 = lv_itl_p99(lv)
    head = f"p99 ITL {p99:.1f} ms at {lv.at}" if p99 else f"ITL tail at {lv.at}"
    sentence = (f"{head}: {total} gaps over 2x the median ITL"
                + (f" ({min(thresholds):.1f}–{max(thresholds):.1f} ms)" if thresholds else "")
                + f", {_share_text(mean, ci)} of them {what}")
    tokens = [o["prefill_tokens_median"] for o in outs if o.get("prefill_tokens_median")]
    if top == "prefill_chunk" and tokens:
        sentence += f" ({sum(tokens) / len(tokens):.0f} prompt tokens in such a gap, median)"
    sentence += f". Levers: {levers}"
    return [Finding(f"p99 ITL: {top.replace('_', ' ')} {mean:.0%} of outliers", sentence + ".",
                    {"variant": variant, "concurrency": lv.concurrency, "outliers": total, "cause": top,
                     "share": mean, "share_low": ci[0] if ci else None, "share_high": ci[1] if ci else None,
                     "itl_p99_ms": p99, "repeats": len(outs)},
                    f"levels {variant} {lv.at}: server_spans.itl_outliers", None, "itl_tail")]


def lv_itl_p99(lv: LevelStat) -> float | None:
    """The level's p99 ITL, mean over its repeats with spans (collect keeps it beside each repeat's spans)."""
    values = [p for s in lv.server_spans or [] if (p := s.get("itl_p99_ms"))]
    return sum(values) / len(values) if values else None


def latency_findings(ev: Evidence) -> list[Finding]:
    """Every latency-tail finding the evidence allows (none without server spans)."""
    return rule_ttft_tail(ev) + rule_itl_tail(ev)
