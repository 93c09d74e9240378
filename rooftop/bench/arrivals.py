"""An open loop's schedule: when each request is due, in ns from the level's start (pure functions, seeded).

Spelled as `vllm bench serve` spells it (vllm/benchmarks/serve.py, `get_request`):

- burstiness B: the gap before request i is Gamma(shape B, scale 1 / (rate_i x B)), mean 1 / rate_i;
  B = 1 is the exponential gap of a Poisson process, B < 1 burstier (coefficient of variation 1/sqrt(B)),
  B > 1 more even;
- a ramp-up: request i's rate moves from `start` to `end` over the level's n requests, with
  progress p = i / max(n - 1, 1): linear, start + (end - start) x p; exponential, start x (end/start)^p.

Two differences, both on purpose: the first request is due at 0 (vLLM waits one gap first), and the gaps
are not rescaled so that n requests span exactly n / rate (vLLM does so without a ramp): a level is judged
against the arrivals it drew (summary's scheduled_request_rate), not the nominal rate.
"""

from __future__ import annotations

import random

RAMP_STRATEGIES = ("linear", "exponential")


def ramp_rate(strategy: str, start_rps: float, end_rps: float, index: int, n: int) -> float:
    """Request `index`'s rate (requests/s) on a ramp from start_rps to end_rps over n requests, as vLLM's
    `_get_current_request_rate`."""
    progress = index / max(n - 1, 1)
    if strategy == "linear":
        return start_rps + (end_rps - start_rps) * progress
    if strategy == "exponential":
        return start_rps * (end_rps / start_rps) ** progress
    raise ValueError(f"unknown ramp-up strategy {strategy!r} (one of {', '.join(RAMP_STRATEGIES)})")


def _gap_s(rng: random.Random, rate: float, burstiness: float) -> float:
    """One inter-arrival gap in seconds, mean 1/rate. B = 1 draws the exponential directly, so a Poisson
    schedule keeps the draws it always had for a seed."""
    if burstiness == 1.0:
        return rng.expovariate(rate)
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def gamma_offsets_ns(rate: float, n: int | None, seed: int, until_s: float | None = None,
                     burstiness: float = 1.0) -> list[int]:
    """Arrivals at `rate`/s with gamma gaps of shape `burstiness` (1: Poisson), the first at 0; n of them,
    or (with `until_s`) those before until_s, at most n."""
    rng = random.Random(seed)
    out, t = [], 0
    end = None if until_s is None else int(until_s * 1e9)
    while (n is None or len(out) < n) and (end is None or t < end):
        out.append(t)
        t += int(_gap_s(rng, rate, burstiness) * 1e9)
    return out


def ramp_offsets_ns(strategy: str, start_rps: float, end_rps: float, n: int, seed: int,
                    until_s: float | None = None, burstiness: float = 1.0) -> list[int]:
    """n arrivals on a ramp-up (the gap before request i drawn at request i's rate), the first at 0; with
    `until_s`, those before it."""
    rng = random.Random(seed)
    out, t = [], 0
    end = None if until_s is None else int(until_s * 1e9)
    for i in range(n):
        if i:
            t += int(_gap_s(rng, ramp_rate(strategy, start_rps, end_rps, i, n), burstiness) * 1e9)
        if end is not None and t >= end:
            break
        out.append(t)
    return out


def ramp_mean_rate(strategy: str, start_rps: float, end_rps: float, n: int) -> float:
    """The rate a ramp offers on the whole: its n - 1 gaps over their expected span (requests/s)."""
    if n < 2:
        return start_rps
    return (n - 1) / sum(1.0 / ramp_rate(strategy, start_rps, end_rps, i, n) for i in range(1, n))
