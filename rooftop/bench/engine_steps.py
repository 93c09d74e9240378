"""An engine's own step times, read from its /metrics around a bench level.

TPOT counts every step between two tokens of a request, including the prefill steps continuous
batching interleaves with decode for other requests; the engine's step histogram tells decode
steps and prefill steps apart. Read before and after a level, its sums and counts give the mean
decode step over the level (ramp-up and drain steps with smaller batches included). The embedded
engine exports `rooftop_engine_step_seconds` with a `kind` label (prefill | decode); a step there
is schedule, forward and sampling, not the hand-out of its tokens to the HTTP side, so host time
lies between what this step and TPOT leave over. An engine without it gives nothing here.
"""

from __future__ import annotations

import math
import re

import aiohttp

STEP_METRIC = "rooftop_engine_step_seconds"
# name_sum{labels} value [timestamp]; labels up to the last "}" (a quoted value may hold one)
_SERIES = re.compile(rf'^{STEP_METRIC}_(sum|count)\{{(.*)\}}\s+(\S+)(?:\s+-?\d+)?$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_step_totals(text: str) -> dict[str, tuple[float, float]]:
    """{kind: (seconds, steps)} summed over the histogram's series in Prometheus text."""
    totals: dict[str, list[float]] = {}
    for line in text.splitlines():
        m = _SERIES.match(line.strip())
        if not m:
            continue
        kind = dict(_LABEL.findall(m.group(2))).get("kind")
        if kind is None:
            continue
        pair = totals.setdefault(kind, [0.0, 0.0])
        pair[0 if m.group(1) == "sum" else 1] += float(m.group(3))
    return {k: (s, n) for k, (s, n) in totals.items()}


async def scrape_step_totals(http: aiohttp.ClientSession, url: str,
                             timeout_s: float = 5.0) -> dict[str, tuple[float, float]] | None:
    """The step totals at `url`, or None when it does not answer or exports no step histogram."""
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return None
            totals = parse_step_totals(await resp.text())
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return None
    return totals or None


def step_delta(before: dict[str, tuple[float, float]] | None,
               after: dict[str, tuple[float, float]] | None) -> dict | None:
    """{kind: {"steps": n, "ms_per_step": x}} of the steps taken between two scrapes (kinds with any)."""
    if not before or not after:
        return None
    out = {}
    for kind, (seconds, steps) in after.items():
        s0, n0 = before.get(kind, (0.0, 0.0))
        n = steps - n0
        if n > 0 and seconds >= s0 and math.isfinite(seconds - s0):  # less than before: the server restarted
            out[kind] = {"steps": int(n), "ms_per_step": (seconds - s0) / n * 1e3}
    return out or None
