"""Service-level objectives: which requests met them (goodput), and the highest load at which enough of
them did (SLO capacity). Pure functions over records and per-repeat figures.

- An SLO is a latency bound on TTFT, TPOT and/or E2E latency, each in ms (`--goodput ttft:500 tpot:50`,
  the spelling of `vllm bench serve`). A request meets it when it succeeded and every given bound
  holds; TPOT is not defined for a one-token answer, which then meets a TPOT bound (as in vLLM).
- Goodput: requests that met the SLO per second of the level's wall time. Attainment: the share of the
  level's requests (failed ones included) that met it.
- SLO capacity: the highest load level at which the attainment is at least the target (default 90%),
  every lower level meeting it too. Its interval: the same rule over resampled repeats (as the knee),
  the central `confidence` share of the capacities found. It is known only on the tested grid: the
  true capacity lies between the level found and the next one tested.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rooftop.bench.metrics import e2e_ms, tpot_ms, ttft_ms
from rooftop.bench.records import RequestRecord
from rooftop.errors import RooftopError

# `--goodput` key -> (Slo field, what it bounds)
KEYS = {"ttft": ("ttft_ms", "TTFT"), "tpot": ("tpot_ms", "TPOT"), "e2el": ("e2el_ms", "E2E latency")}
_FIGURE = {"ttft": ttft_ms, "tpot": tpot_ms, "e2el": e2e_ms}  # each bound's figure of a record, in ms
DEFAULT_ATTAINMENT = 0.9
N_RESAMPLES = 2000


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
        return f"{', '.join(self.bounds().values())} for {self.attainment:.0%} of requests"

    def to_dict(self) -> dict:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2el_ms": self.e2el_ms,
                "attainment": self.attainment}


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
        # no TPOT for a one-token answer: it meets a TPOT bound (as in vLLM); no TTFT or E2E: it does not
        out[key] = key == "tpot" if v is None else v <= bound
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
    """The highest tested load meeting the SLO (None: not even the lowest did), its interval over
    resampled repeats (None ends: no bound within the tested levels), and what the figure is."""

    load: float | None
    low: float | None
    high: float | None
    kind: str  # "concurrency" | "request_rate"
    tested: list[float]  # the levels with data, ascending
    method: str

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
                "next_tested": self.next_tested, "tested": self.tested, "method": self.method}


def _capacity_index(means: np.ndarray, target: float) -> np.ndarray:
    """Per row of attainment means (R x L, levels ascending): the index of the highest level such that
    it and every lower level meet the target; -1 when the lowest does not."""
    failing = means < target - 1e-12
    first_fail = np.where(failing.any(axis=1), failing.argmax(axis=1), means.shape[1])
    return first_fail - 1


def capacity(levels: list[float], attainment_by_level: list[list[float]], target: float, *,
             kind: str = "concurrency", confidence: float = 0.95, seed: int = 0) -> SloCapacity:
    """SLO capacity of a sweep: the levels and, per level, the attainment of each repeat."""
    pairs = sorted(((float(x), np.asarray(a, dtype=float).ravel()) for x, a in
                    zip(levels, attainment_by_level, strict=True)), key=lambda p: p[0])
    pairs = [(x, a[~np.isnan(a)]) for x, a in pairs]
    pairs = [(x, a) for x, a in pairs if a.size]
    if not pairs:
        return SloCapacity(None, None, None, kind, [], "no level with data")
    xs = [x for x, _ in pairs]
    samples = [a for _, a in pairs]
    top = len(xs) - 1
    k = int(_capacity_index(np.array([[a.mean() for a in samples]]), target)[0])

    def load(i: int) -> float | None:
        return xs[i] if i >= 0 else None

    if min(a.size for a in samples) < 2:
        return SloCapacity(load(k), None, None, kind, xs, "single repeat at some level: no interval")
    rng = np.random.default_rng(seed)
    boot = np.column_stack([a[rng.integers(0, a.size, (N_RESAMPLES, a.size))].mean(axis=1) for a in samples])
    ks = _capacity_index(boot, target)
    q = (1 - confidence) / 2
    lo = int(min(np.quantile(ks, q, method="lower"), k))
    hi = int(max(np.quantile(ks, 1 - q, method="higher"), k))
    method = f"bootstrap over repeats ({N_RESAMPLES} resamples, {confidence:.0%})"
    # An upper end at the top level is "still met there" in those resamples: no bound within the sweep.
    return SloCapacity(load(k), load(lo), load(hi) if hi < top else None, kind, xs, method)


def capacity_doc(levels: list[float], attainment_by_level: list[list[float]], slo: Slo, *,
                 kind: str = "concurrency", confidence: float = 0.95, seed: int = 0) -> dict:
    """The SLO capacity against `slo`'s attainment as summary.json and the campaign keep it: the
    SloCapacity's fields and its `sentence`."""
    c = capacity(levels, attainment_by_level, slo.attainment, kind=kind, confidence=confidence, seed=seed)
    return {**c.to_dict(), "sentence": describe_capacity(c, slo)}


def describe_capacity(c: SloCapacity, slo: Slo) -> str:
    """One sentence, e.g. 'SLO capacity C=16 [8, 32]: TTFT ≤ 500 ms for 90% of requests; between
    the levels tested it lies in [16, 32) (bootstrap over repeats ...)'."""
    if not c.tested:
        return f"no SLO capacity: no level had data ({slo.describe()})"

    def at(x: float) -> str:
        return f"C={x:g}" if c.kind == "concurrency" else f"{x:g} req/s"

    def end(x: float | None, missing: str) -> str:
        return missing if x is None else f"{x:g}"

    interval = "" if c.method.startswith(("single", "no level")) else \
        f" [{end(c.low, 'below ' + at(c.tested[0]))}, {end(c.high, 'not reached')}]"
    if c.load is None:
        head = f"SLO capacity below {at(c.tested[0])}: even the lowest level tested missed it"
    elif not c.reached:
        head = f"SLO capacity at least {at(c.load)}, the highest level tested (not reached)"
    else:
        head = f"SLO capacity {at(c.load)}{interval}"
    grid = (f"; between the levels tested it lies in [{c.load:g}, {c.next_tested:g})"
            if c.load is not None and c.next_tested is not None else "")
    return f"{head}: {slo.describe()}{grid} ({c.method})"


def short(c: dict | None) -> str:
    """An SLO capacity (SloCapacity.to_dict()) in a few characters: 'C=16 [8, 32]', 'C≥64 (not reached)',
    'below C=1', '–'."""
    if not c or not c.get("tested"):
        return "–"
    unit = (lambda x: f"C={x:g}") if c["kind"] == "concurrency" else (lambda x: f"{x:g} req/s")
    if c["load"] is None:
        return f"below {unit(c['tested'][0])}"
    if not c["reached"]:
        return f"{unit(c['load'])} or more (not reached)"
    if c["method"].startswith("single"):
        return f"{unit(c['load'])} (no interval)"
    low = f"{c['low']:g}" if c["low"] is not None else f"<{c['tested'][0]:g}"
    high = f"{c['high']:g}" if c["high"] is not None else "not reached"
    return f"{unit(c['load'])} [{low}, {high}]"
