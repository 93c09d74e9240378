"""The offset between an engine's span clock (time.time_ns(), unix epoch) and rooftop's client stamps
(time.perf_counter_ns(), CLOCK_MONOTONIC): measured on this host, and checked against each request's stamps."""

from __future__ import annotations

import time
from dataclasses import dataclass

PAIRS = 64  # clock reads; the tightest bracket wins


@dataclass(slots=True, frozen=True)
class ClockOffset:
    """engine ns − offset_ns = client ns; the offset is known to ± uncertainty_ns."""

    offset_ns: int
    uncertainty_ns: int
    method: str

    def to_json(self) -> dict:
        return {"offset_ns": self.offset_ns, "uncertainty_ns": self.uncertainty_ns, "method": self.method}


def measure_local(pairs: int = PAIRS) -> ClockOffset:
    """time.time_ns() − time.perf_counter_ns() on this host: each wall-clock read bracketed by two monotonic
    reads; the tightest bracket's midpoint, to ± half its width."""
    best = None
    for _ in range(pairs):
        before = time.perf_counter_ns()
        wall = time.time_ns()
        after = time.perf_counter_ns()
        if best is None or after - before < best[0]:
            best = (after - before, wall - (before + after) // 2)
    width, offset = best
    return ClockOffset(offset, (width + 1) // 2, f"this host: time_ns read between two perf_counter_ns reads, "
                                                 f"the tightest of {pairs}")


def bounds_from_requests(pairs: list[tuple[int, int, int, int]]) -> tuple[int, int] | None:
    """Offsets the requests allow, as NTP bounds a peer's: each (client sent, engine arrival, engine had the
    first token, client got it) says sent ≤ arrival − offset and token − offset ≤ got, so the offset lies in
    [max(token − got), min(arrival − sent)]. None without a request; (low, high) with low > high when the
    stamps contradict each other."""
    if not pairs:
        return None
    low = max(token - got for _, _, token, got in pairs)
    high = min(arrival - sent for sent, arrival, _, _ in pairs)
    return low, high


def choose(local: ClockOffset, bounds: tuple[int, int] | None) -> ClockOffset:
    """The local measurement when the requests' stamps agree with it (the engine on this host); else the
    middle of what the requests allow (an engine on another host, whose wall clock differs from this one's)."""
    if bounds is None:
        return local
    low, high = bounds
    if low - local.uncertainty_ns <= local.offset_ns <= high + local.uncertainty_ns:
        return local
    mid = (low + high) // 2
    return ClockOffset(mid, abs(high - low) // 2,
                       f"from the requests' stamps (the engine's clock is {(mid - local.offset_ns) / 1e6:+.3f} ms off "
                       "this host's): the middle of the offsets every request's send, arrival, reply and receipt "
                       "allow, as NTP does")
