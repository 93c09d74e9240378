"""Service-level objectives: which requests met them (goodput), and the highest load at which enough of
them did (SLO capacity). Pure functions over records and per-repeat figures.

- An SLO is a latency bound on TTFT, TPOT and/or E2E latency, each in ms (`--goodput ttft:500 tpot:50`,
  the spelling of `vllm bench serve`). A request meets it when it succeeded and every given bound
  holds; TPOT is not defined for a one-token answer, which then meets a TPOT bound (as in vLLM), nor for
  one not streamed, which then does not (`rooftop bench` refuses a TPOT bound with --no-stream).
- Goodput: requests that met the SLO per second of the level's wall time. Attainment: the share of the
  level's requests (failed ones included) that met it; where the server stopped answering, the share
  of the requests the level planned.
- SLO capacity: the highest load level at which the mean attainment is at least the target (default
  90%), every lower level meeting it too; a level the server stopped answering in is a miss. Its
  interval follows each level's attainment interval across repeats (the one the level's row shows):
  a level is met when its whole interval is at or above the target, missed when it is wholly below,
  else undecided; the low end is the highest level met with every lower one, the high end the level
  below the first missed one. It is known only on the tested grid: the true capacity lies between the
  level found and the next one tested.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rooftop.bench import stats
from rooftop.bench.metrics import e2e_ms, tpot_ms, ttft_ms
from rooftop.bench.records import RequestRecord
from rooftop.errors import RooftopError

# `--goodput` key -> (Slo field, what it bounds)
KEYS = {"ttft": ("ttft_ms", "TTFT"), "tpot": ("tpot_ms", "TPOT"), "e2el": ("e2el_ms", "E2E latency")}
_FIGURE = {"ttft": ttft_ms, "tpot": tpot_ms, "e2el": e2e_ms}  # each bound's figure of a record, in ms
DEFAULT_ATTAINMENT = 0.9


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency bounds in ms (None: not bounded) and the share of requests that must meet them."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    attainment: float = DEFAULT_ATTAINMENT

    def bounds(self) -> dict[str, str]:
        """Each bound given, by its `--goodput` key: {'ttft': 'TTFT ≤ 500 ms', ...}."""
        return {key: f"{label} ≤ {getattr(self, name):g} ms" for key, (name, label) in KEYS.items()
                if getattr(self, name) is not None}

    def describe(self) -> str:
        """'TTFT ≤ 500 ms, TPOT ≤ 50 ms for 90% of requests'."""
        return f"{', '.join(self.bounds().values())} for {share_text(self.attainment)} of requests"

    def to_dict(self) -> dict:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2el_ms": self.e2el_ms,
                "attainment": self.attainment}


def share_text(share: float) -> str:
    """A target share as a percentage with the decimals it has: 0.9 -> '90%', 0.955 -> '95.5%'."""
    return f"{round(100 * share, 2):g}%"


def parse_goodput(items: list[str], attainment: float = DEFAULT_ATTAINMENT) -> Slo:
    """`["ttft:500", "tpot:50"]` (each item may also hold several, comma- or space-separated) -> Slo."""
    if not 0 < attainment <= 1:
        raise RooftopError(f"--slo-attainment {attainment} is not a share in (0, 1]", "e.g. --slo-attainment 0.9")
    bounds: dict[str, float] = {}
    for item in (part for text in items for part in text.replace(",", " ").split()):
        key, sep, value = item.partition(":")
        if not sep or key not in KEYS:
            raise RooftopError(f"--goodput {item!r} is not KEY:MS with KEY one of {', '.join(KEYS)}",
                               "e.g. --goodput ttft:500 tpot:50")
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if not ms > 0:
            raise RooftopError(f"--goodput {item!r}: the bound must be a positive number of ms",
                               "e.g. --goodput ttft:500")
        if KEYS[key][0] in bounds:
            raise RooftopError(f"--goodput names {key} twice", "give each of ttft, tpot, e2el at most once")
        bounds[KEYS[key][0]] = ms
    if not bounds:
        raise RooftopError("--goodput needs at least one bound", "e.g. --goodput ttft:500 tpot:50")
    return Slo(**bounds, attainment=attainment)


def bounds_met(r: RequestRecord, slo: Slo) -> dict[str, bool]:
    """Per bound the SLO gives (`ttft`, `tpot`, `e2el`), whether this request met it; a failed request
    meets none."""
    out = {}
    for key, (name, _) in KEYS.items():
        bound = getattr(slo, name)
        if bound is None:
            continue
        if not r.ok:
            out[key] = False
            continue
        v = _FIGURE[key](r)
        # no TPOT for a one-token answer: it meets a TPOT bound (as in vLLM); no TTFT or E2E: it does not;
        # an answer not streamed has no TPOT to judge (the CLI refuses a TPOT bound without a stream)
        out[key] = (key == "tpot" and r.streamed) if v is None else v <= bound
    return out


def meets(r: RequestRecord, slo: Slo) -> bool:
    """Whether one request succeeded within every bound of the SLO."""
    return r.ok and all(bounds_met(r, slo).values())


def bound_shares(records: list[RequestRecord], slo: Slo) -> dict[str, float | None]:
    """Per bound, the share of the records that met it (which bound a level misses by); None without
    records."""
    met = [bounds_met(r, slo) for r in records]
    return {key: (sum(m[key] for m in met) / len(met) if met else None)
            for key, (name, _) in KEYS.items() if getattr(slo, name) is not None}


@dataclass(slots=True)
class SloCapacity:
    """The highest tested load meeting the SLO (None: not even the lowest did), its interval from the
    levels' attainment intervals (None ends: no bound within the tested levels, see `high_open`), and
    what the figure is."""

    load: float | None
    low: float | None  # None: below the lowest level tested
    high: float | None  # None: above the highest level tested (high_open) or below the lowest
    kind: str  # "concurrency" | "request_rate"
    tested: list[float]  # the levels with data, ascending
    method: str
    high_open: bool = False  # no level certainly missed it: the upper end lies above the levels tested
    stopped: list[float] = field(default_factory=list)  # levels the server stopped answering in: misses

    @property
    def reached(self) -> bool:
        """False when the highest level tested still met the SLO: the capacity is at least that."""
        return self.load is None or self.load < self.tested[-1]

    @property
    def next_tested(self) -> float | None:
        """The lowest tested level above `load`: the capacity lies below it."""
        above = [x for x in self.tested if self.load is None or x > self.load]
        return above[0] if above and self.reached else None

    def to_dict(self) -> dict:
        return {"load": self.load, "low": self.low, "high": self.high, "kind": self.kind, "reached": self.reached,
                "next_tested": self.next_tested, "tested": self.tested, "method": self.method,
                "high_open": self.high_open, "stopped": self.stopped}


def _capacity_index(means: np.ndarray, target: float) -> np.ndarray:
    """Per row of attainment means (R x L, levels ascending): the index of the highest level such that
    it and every lower level meet the target; -1 when the lowest does not."""
    failing = means < target - 1e-12
    first_fail = np.where(failing.any(axis=1), failing.argmax(axis=1), means.shape[1])
    return first_fail - 1


def level_decision(attainment: list[float], target: float, *, confidence: float = 0.95, seed: int = 0) -> str:
    """Whether a level's attainment interval across repeats (stats.bootstrap_ci, as the level's own
    `slo_attainment` interval) lies wholly at or above the target ("met"), wholly below ("missed"), or
    across it ("undecided"); one repeat is decided by its value."""
    ci = stats.bootstrap_ci(attainment, confidence=confidence, seed=seed, floor=0.0)
    if ci.low >= target - 1e-12:
        return "met"
    if min(ci.high, 1.0) < target - 1e-12:
        return "missed"
    return "undecided"


def capacity(levels: list[float], attainment_by_level: list[list[float]], target: float, *,
             kind: str = "concurrency", confidence: float = 0.95, seed: int = 0,
             stopped: list[float] | None = None) -> SloCapacity:
    """SLO capacity of a sweep: the levels and, per level, the attainment of each repeat. `stopped`: levels
    the server stopped answering in, each a miss whatever its attainment.

    The point is the highest level whose mean attainment, and every lower level's, meets the target.
    Its interval follows each level's attainment interval (the one its table shows): the low end is the
    highest level that, with every lower one, certainly met the target; the high end is the level below
    the first that certainly missed it (none: above the levels tested)."""
    stop = {float(x) for x in stopped or []}
    pairs = sorted(((float(x), np.asarray(a, dtype=float).ravel()) for x, a in
                    zip(levels, attainment_by_level, strict=True)), key=lambda p: p[0])
    pairs = [(x, a[~np.isnan(a)]) for x, a in pairs]
    pairs = [(x, a) for x, a in pairs if a.size or x in stop]
    if not pairs:
        return SloCapacity(None, None, None, kind, [], "no level with data")
    xs = [x for x, _ in pairs]
    gone = [x for x in xs if x in stop]
    means = [0.0 if x in stop else float(a.mean()) for x, a in pairs]
    top = len(xs) - 1
    k = int(_capacity_index(np.array([means]), target)[0])

    def load(i: int) -> float | None:
        return xs[i] if i >= 0 else None

    if any(a.size < 2 for x, a in pairs if x not in stop):
        return SloCapacity(load(k), None, None, kind, xs, "single repeat at some level: no interval",
                           high_open=k == top, stopped=gone)
    decided = ["missed" if x in stop else level_decision(list(a), target, confidence=confidence, seed=seed)
               for x, a in pairs]
    lo = next((i for i, d in enumerate(decided) if d != "met"), len(xs)) - 1
    hi = next((i for i, d in enumerate(decided) if d == "missed"), len(xs)) - 1
    lo, hi = min(lo, k), max(hi, k)
    method = f"each level's {share_text(confidence)} attainment interval across repeats"
    return SloCapacity(load(k), load(lo), load(hi) if hi < top else None, kind, xs, method,
                       high_open=hi == top, stopped=gone)


def capacity_doc(levels: list[float], attainment_by_level: list[list[float]], slo: Slo, *,
                 kind: str = "concurrency", confidence: float = 0.95, seed: int = 0,
                 stopped: list[float] | None = None) -> dict:
    """The SLO capacity against `slo`'s attainment as summary.json and the campaign keep it: the
    SloCapacity's fields and its `sentence`."""
    c = capacity(levels, attainment_by_level, slo.attainment, kind=kind, confidence=confidence, seed=seed,
                 stopped=stopped)
    return {**c.to_dict(), "sentence": describe_capacity(c, slo)}


def _interval_text(c: dict) -> str:
    """A capacity's interval as ' [8, 32]', ' [<1, 1]', ' [16, not reached]'; '' where there is none."""
    if c["method"].startswith(("single", "no level")):
        return ""
    below = f"<{c['tested'][0]:g}"
    low = below if c["low"] is None else f"{c['low']:g}"
    high_open = c.get("high_open", c["high"] is None and c["load"] is not None)
    high = f"{c['high']:g}" if c["high"] is not None else ("not reached" if high_open else below)
    return f" [{low}, {high}]"


def describe_capacity(c: SloCapacity, slo: Slo) -> str:
    """One sentence, e.g. 'SLO capacity C=16 [8, 32]: TTFT ≤ 500 ms for 90% of requests; between
    the levels tested it lies in [16, 32) (each level's 95% attainment interval ...)'."""
    if not c.tested:
        return f"no SLO capacity: no level had data ({slo.describe()})"

    def at(x: float) -> str:
        return f"C={x:g}" if c.kind == "concurrency" else f"{x:g} req/s"

    interval = _interval_text(c.to_dict())
    if c.load is None:
        head = f"SLO capacity below {at(c.tested[0])}{interval}: even the lowest level tested missed it"
    elif not c.reached:
        head = f"SLO capacity at least {at(c.load)}{interval}, the highest level tested (not reached)"
    else:
        head = f"SLO capacity {at(c.load)}{interval}"
    grid = (f"; between the levels tested it lies in [{c.load:g}, {c.next_tested:g})"
            if c.load is not None and c.next_tested is not None else "")
    gone = (f"; {', '.join(at(x) for x in c.stopped)} stopped early (the server stopped answering) and "
            f"count{'s' if len(c.stopped) == 1 else ''} as a miss" if c.stopped else "")
    return f"{head}: {slo.describe()}{grid}{gone} ({c.method})"


def short(c: dict | None) -> str:
    """An SLO capacity (SloCapacity.to_dict()) in a few characters: 'C=16 [8, 32]', 'C=64 or more
    [32, not reached]', 'below C=1 [<1, 1]', '–'."""
    if not c or not c.get("tested"):
        return "–"
    unit = (lambda x: f"C={x:g}") if c["kind"] == "concurrency" else (lambda x: f"{x:g} req/s")
    interval = _interval_text(c)
    if c["load"] is None:
        return f"below {unit(c['tested'][0])}{interval}"
    if not c["reached"]:
        return f"{unit(c['load'])} or more{interval or ' (not reached)'}"
    return f"{unit(c['load'])}{interval or ' (no interval)'}"
