"""GPU telemetry over a bench level: each GPU's utilization, SM clock, memory, power and energy, sampled
through NVML or read from a dcgm-exporter, and reduced to one JSON-ready dict per level.

- NVML (nvidia-ml-py, imported as `pynvml` only when a sampler is opened): a daemon thread reads every
  GPU each `interval_s` (0.1 s): nvmlDeviceGetUtilizationRates, the SM clock, memory used, power
  (mW) and the energy counter (mJ since the driver loaded; Volta and later).
- dcgm-exporter: its Prometheus text polled each `interval_s` (1 s). The exporter refreshes its values
  every --collect-interval (30 s unless set), so polls in between repeat the last values: run it with
  `-c 1000` or less for a level's figures to mean anything.

What the figures are. "SM utilization" is NVML's and DCGM's GPU utilization: the share of the last
sample period in which any kernel ran, not how busy the SMs were (one small kernel reads 100%); memory
utilization the share in which device memory was read or written. Energy is the counter's rise over
the window where the GPU has one, else the power integrated over it; on Ampere (but GA100) and later
NVML's power is a 1-second average, so the integral lags the load by about half a second at each end
of the window.

Without a source, `open_sampler` says why in one line and the bench goes on without telemetry; a
sampler never raises out of a level: a failed read is skipped and kept in `Sampler.note`, which also
counts each (GPU, NVML call) that failed over the window. A figure over all GPUs is taken over the GPUs
that gave it, and the note says which did not. A gap between readings longer than GAP_WARN_FACTOR
intervals is noted too, and the time it leaves unobserved is taken off the window's coverage.
"""

from __future__ import annotations

import http.client
import math
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from itertools import pairwise

from rooftop.spec.bench import dcgm_url_problem

NVML_INTERVAL_S = 0.1
UTIL_PERIOD_S = 1.0  # windows shorter than this get no utilization: the driver's sample period is up to 1 s
DCGM_INTERVAL_S = 1.0
DCGM_TIMEOUT_S = 2.0
GAP_WARN_FACTOR = 5.0  # a gap between readings longer than this many intervals is noted and not covered
# NVML call -> what it reads, in a note
NVML_CALLS = {"nvmlDeviceGetUtilizationRates": "utilization", "nvmlDeviceGetClockInfo": "SM clock",
              "nvmlDeviceGetMemoryInfo": "memory used", "nvmlDeviceGetPowerUsage": "power",
              "nvmlDeviceGetTotalEnergyConsumption": "energy counter"}

# dcgm-exporter series (etc/default-counters.csv) -> (Sample field, factor to its unit)
DCGM_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("sm_util_pct", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util_pct", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_j", 1e-3),  # mJ
}
# DCGM's "no value" sentinels: DCGM_FP64_BLANK is 2**47, the int64 ones sit just under 2**63.
_DCGM_BLANK = 2.0**47
# name{labels} value [timestamp]; labels up to the last "}" (a quoted value may hold one)
_SERIES = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(slots=True)
class Sample:
    """One reading of one GPU at `t_ns` (time.perf_counter_ns, the clock of the request records); a field
    is None where the source does not give it."""

    t_ns: int
    gpu: int
    sm_util_pct: float | None = None
    mem_util_pct: float | None = None
    sm_clock_mhz: float | None = None
    mem_used_mib: float | None = None
    power_w: float | None = None
    energy_j: float | None = None  # the GPU's cumulative energy counter


@dataclass(slots=True)
class Readings:
    """What a sampler read over one level of one repeat, and the first read that failed there."""

    source: str  # "nvml" | "dcgm"
    samples: list[Sample]
    note: str | None = None
    interval_s: float | None = None  # the sampler's interval (gaps are measured against it)


def parse_dcgm(text: str, t_ns: int) -> list[Sample]:
    """One Sample per whole GPU (`gpu` label) in a dcgm-exporter scrape, sorted by GPU; MIG instances'
    series (a GPU_I_ID label) are skipped, a blank value is None, a series repeated per pod counts once."""
    by_gpu: dict[int, Sample] = {}
    for line in text.splitlines():
        m = _SERIES.match(line.strip())
        if not m:
            continue
        name, labels, value = m.groups()
        field = DCGM_FIELDS.get(name.removesuffix("_total"))  # OpenMetrics names counters NAME_total
        if field is None:
            continue
        label = dict(_LABEL.findall(labels or ""))
        gpu = label.get("gpu", "")
        if "GPU_I_ID" in label or not gpu.isdigit():
            continue
        sample = by_gpu.setdefault(int(gpu), Sample(t_ns, int(gpu)))
        try:
            v = float(value)
        except ValueError:
            continue
        if not math.isfinite(v) or v >= _DCGM_BLANK:
            continue
        attr, factor = field
        if getattr(sample, attr) is None:
            setattr(sample, attr, v * factor)
    return [by_gpu[g] for g in sorted(by_gpu)]


class NvmlReader:
    """Reads GPUs through NVML, which it holds initialised until close()."""

    source = "nvml"

    def __init__(self, nvml, gpus: list[int]):
        self.nvml = nvml
        self.gpus = gpus
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(g) for g in gpus]
        # a call this GPU does not support (the energy counter before Volta) is not tried again
        self.unsupported: set[tuple[int, str]] = set()
        self._permanent = {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND}
        self.reads = 0  # read() calls since reset()
        self.failures: dict[tuple[int, str], tuple[int, str]] = {}  # (gpu, call) -> (times, first reason)

    def reset(self) -> None:
        """Start counting failed calls afresh (a new window)."""
        self.reads, self.failures = 0, {}

    def failure_note(self) -> str | None:
        """Each (GPU, call) that failed since reset(), e.g. 'GPU 1 power failed in 12 of 12 reads (Unknown
        Error)'; None when none did."""
        if not self.failures:
            return None
        return "; ".join(f"GPU {gpu} {NVML_CALLS.get(name, name)} failed in {n} of {self.reads} reads ({why})"
                         for (gpu, name), (n, why) in sorted(self.failures.items()))

    def _call(self, gpu: int, name: str, *args):
        if (gpu, name) in self.unsupported:
            return None
        try:
            return getattr(self.nvml, name)(*args)
        except self.nvml.NVMLError as e:
            if e.value in self._permanent:
                self.unsupported.add((gpu, name))
            else:  # a transient error (GPU lost, unknown, timeout): counted, said in the window's note
                n, why = self.failures.get((gpu, name), (0, _reason(e)))
                self.failures[gpu, name] = (n + 1, why)
            return None

    def read(self) -> list[Sample]:
        """One Sample per GPU, each stamped just before its reads."""
        nv = self.nvml
        self.reads += 1
        samples = []
        for gpu, h in zip(self.gpus, self.handles, strict=True):
            t_ns = time.perf_counter_ns()
            util = self._call(gpu, "nvmlDeviceGetUtilizationRates", h)
            clock_mhz = self._call(gpu, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM)
            memory = self._call(gpu, "nvmlDeviceGetMemoryInfo", h)
            power_mw = self._call(gpu, "nvmlDeviceGetPowerUsage", h)
            energy_mj = self._call(gpu, "nvmlDeviceGetTotalEnergyConsumption", h)
            samples.append(Sample(
                t_ns, gpu,
                sm_util_pct=None if util is None else float(util.gpu),
                mem_util_pct=None if util is None else float(util.memory),
                sm_clock_mhz=None if clock_mhz is None else float(clock_mhz),
                mem_used_mib=None if memory is None else memory.used / (1 << 20),
                power_w=None if power_mw is None else power_mw / 1e3,
                energy_j=None if energy_mj is None else energy_mj / 1e3,
            ))
        return samples

    def close(self) -> None:
        self.nvml.nvmlShutdown()


class DcgmReader:
    """Reads GPUs from a dcgm-exporter's /metrics (all it exports, or only `gpus`)."""

    source = "dcgm"

    def __init__(self, url: str, gpus: list[int] | None, timeout_s: float = DCGM_TIMEOUT_S):
        self.url = url
        self.gpus = gpus
        self.timeout_s = timeout_s

    def read(self) -> list[Sample]:
        """The exporter's current values, stamped when they arrived; OSError or HTTPException if it does
        not answer."""
        with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:
            text = resp.read().decode("utf-8", "replace")
        samples = parse_dcgm(text, time.perf_counter_ns())
        return samples if self.gpus is None else [s for s in samples if s.gpu in self.gpus]

    def close(self) -> None:
        pass


class Sampler:
    """Samples from a reader every `interval_s` in a daemon thread, from start() to stop(); start and
    stop again for each level, close() once at the end (or use it as a context manager)."""

    def __init__(self, reader: NvmlReader | DcgmReader, interval_s: float):
        self.reader = reader
        self.source = reader.source
        self.interval_s = interval_s
        self.note: str | None = None  # the first failed read of the last window, and the calls that failed
        self._samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> None:
        try:
            self._samples.extend(self.reader.read())
        except Exception as e:  # telemetry never stops a benchmark: a failed read is noted and skipped
            if self.note is None:
                self.note = f"{self.source} read failed: {_reason(e)}"

    def _run(self) -> None:
        next_s = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_s - time.monotonic())):
            self._read()
            # a read slower than the interval delays the next one; missed readings are not made up in a burst
            next_s = max(next_s + self.interval_s, time.monotonic())

    def start(self) -> None:
        """Begin a window: a reading now, in the caller's thread (so that one precedes whatever the caller
        starts next), then one every interval_s in the sampler's."""
        if self._thread is not None:
            return
        self._samples, self.note = [], None
        if isinstance(self.reader, NvmlReader):
            self.reader.reset()
        self._stop.clear()
        self._read()
        self._thread = threading.Thread(target=self._run, name=f"telemetry-{self.source}", daemon=True)
        self._thread.start()

    def stop(self) -> list[Sample]:
        """End the window with one last reading; its samples in time order ([] if never started)."""
        if self._thread is None:
            return []
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._read()
        calls = self.reader.failure_note() if isinstance(self.reader, NvmlReader) else None
        if calls:
            self.note = f"{self.note}; {calls}" if self.note else f"{self.source} reads failed: {calls}"
        return self._samples

    def close(self) -> None:
        self.stop()
        self.reader.close()

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _reason(e: BaseException) -> str:
    """An exception in a few words: a URLError's reason rather than its wrapper."""
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        e = e.reason if isinstance(e.reason, BaseException) else e
    return str(e) or type(e).__name__


def visible_gpus(nvml, count: int, env: str | None) -> tuple[list[int], str | None]:
    """The NVML indexes CUDA_VISIBLE_DEVICES (`env`) names: every GPU when it is unset; integer entries
    taken as NVML's indexes, GPU-UUID entries looked up; like CUDA, the list ends at the first entry that
    names no GPU (a MIG instance's "MIG-..." among them). (indexes, None), or ([], why)."""
    if env is None:
        return list(range(count)), None
    out: list[int] = []
    for item in (x.strip() for x in env.split(",")):
        if item.isdigit() and int(item) < count:
            index = int(item)
        elif item.startswith("GPU-"):
            try:
                index = nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(item))
            except nvml.NVMLError:
                break
        else:
            break
        if index not in out:
            out.append(index)
    return out, None if out else f"CUDA_VISIBLE_DEVICES={env!r} names no GPU NVML knows (pass the GPUs to sample)"


def _open_nvml(gpus: list[int] | None) -> tuple[NvmlReader | None, str | None]:
    try:
        import pynvml  # nvidia-ml-py: imported here so rooftop runs without it
    except ImportError:
        return None, "no NVML: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        if e.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            return None, "no NVML: libnvidia-ml.so.1 not found (no NVIDIA driver on this host)"
        return None, f"no NVML: nvmlInit failed: {e}"
    why = None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if gpus is None:
            wanted, why = visible_gpus(pynvml, count, os.environ.get("CUDA_VISIBLE_DEVICES"))
        else:
            wanted = list(gpus)
        missing = [g for g in wanted if not 0 <= g < count]
        if why:
            why = f"no NVML telemetry: {why}"
        elif not wanted:
            why = "no NVML telemetry: " + ("NVML sees no GPUs" if count == 0 else "no GPUs asked for")
        elif missing:
            why = f"no NVML telemetry: no GPU {missing} (NVML sees {count})"
        else:
            return NvmlReader(pynvml, wanted), None
    except pynvml.NVMLError as e:
        why = f"no NVML telemetry: {e}"
    pynvml.nvmlShutdown()
    return None, why



def open_sampler(gpus: list[int] | None = None, dcgm_url: str | None = None,
                 interval_s: float | None = None) -> tuple[Sampler | None, str | None]:
    """(a sampler of `gpus`, None), or (None, why there is none) in one line. `gpus` are NVML indexes
    (None: those CUDA_VISIBLE_DEVICES names, else every GPU the driver shows); with `dcgm_url` the exporter is read instead of NVML, and asked
    once here so that a wrong URL is said now. interval_s defaults to 0.1 s for NVML, 1 s for DCGM."""
    if dcgm_url:
        problem = dcgm_url_problem(dcgm_url)
        if problem:
            return None, f"no DCGM telemetry: {dcgm_url}: {problem}"
        reader = DcgmReader(dcgm_url, gpus)
        try:
            first = reader.read()
        except (OSError, http.client.HTTPException, ValueError) as e:
            return None, f"no DCGM telemetry: {dcgm_url}: {_reason(e)}"
        missing = sorted(set(gpus or []) - {s.gpu for s in first})
        if not first or missing:
            what = f"GPU {missing}" if missing else "DCGM_FI_DEV_* series of a whole GPU"
            return None, f"no DCGM telemetry: {dcgm_url} exports no {what}"
        return Sampler(reader, interval_s or DCGM_INTERVAL_S), None
    reader, why = _open_nvml(gpus)
    if reader is None:
        return None, why
    return Sampler(reader, interval_s or NVML_INTERVAL_S), None


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _max(xs: list[float]) -> float | None:
    return max(xs) if xs else None


def _values(samples: list[Sample], attr: str) -> list[float]:
    return [v for s in samples if (v := getattr(s, attr)) is not None]


def _series(samples: list[Sample], attr: str) -> list[tuple[int, float]]:
    return [(s.t_ns, v) for s in samples if (v := getattr(s, attr)) is not None]


def _clip(points: list[tuple[int, float]], lo_ns: int, hi_ns: int) -> list[tuple[int, float]]:
    """A series read as piecewise linear between its readings, cut to [lo, hi]: the readings inside, and
    its value at lo and at hi where readings lie on both sides of them."""

    def at(a: tuple[int, float], b: tuple[int, float], t: int) -> tuple[int, float]:
        return t, a[1] + (b[1] - a[1]) * (t - a[0]) / (b[0] - a[0])

    before = [p for p in points if p[0] < lo_ns]
    after = [p for p in points if p[0] > hi_ns]
    out = [p for p in points if lo_ns <= p[0] <= hi_ns]
    if before and (out or after):
        out.insert(0, at(before[-1], (out or after)[0], lo_ns))
    if after and out:
        out.append(at(out[-1], after[0], hi_ns))
    return out


def _counter_delta_j(points: list[tuple[int, float]]) -> float | None:
    """The energy counter's rise from the first reading to the last; None without two readings, or when
    it did not rise (a driver reload reset it, or a stale exporter repeated it)."""
    if len(points) < 2 or points[-1][1] <= points[0][1]:
        return None
    return points[-1][1] - points[0][1]


def _power_integral_j(points: list[tuple[int, float]]) -> float | None:
    """Power integrated over time by trapezoids between consecutive readings; None without two."""
    if len(points) < 2:
        return None
    return sum((t1 - t0) / 1e9 * (p0 + p1) / 2 for (t0, p0), (t1, p1) in pairwise(points))


def _gaps_s(times_ns: list[int], lo_ns: int, hi_ns: int) -> list[float]:
    """The stretches of [lo, hi] between consecutive readings (and before the first or after the last
    where no reading lies beyond that edge), in s."""
    out = []
    if times_ns and times_ns[0] > lo_ns:
        out.append((min(times_ns[0], hi_ns) - lo_ns) / 1e9)
    for a, b in pairwise(times_ns):
        span = min(b, hi_ns) - max(a, lo_ns)
        if span > 0:
            out.append(span / 1e9)
    if times_ns and times_ns[-1] < hi_ns:
        out.append((hi_ns - max(times_ns[-1], lo_ns)) / 1e9)
    return out


def _typical_interval_s(times_ns: list[int]) -> float | None:
    """The median step between readings (where the sampler's own interval is not known)."""
    steps = sorted((b - a) / 1e9 for a, b in pairwise(times_ns))
    return steps[len(steps) // 2] if steps else None


def _gpu_summary(gpu: int, samples: list[Sample], lo_ns: int, hi_ns: int, output_tokens: int | None,
                 interval_s: float | None = None) -> dict:
    energy = _clip(_series(samples, "energy_j"), lo_ns, hi_ns)
    power = _clip(_series(samples, "power_w"), lo_ns, hi_ns)
    # gauges: the readings inside the window, or all of them where none falls inside (a window shorter
    # than the interval)
    inside = [s for s in samples if lo_ns <= s.t_ns <= hi_ns] or samples
    counter_j = _counter_delta_j(energy)
    integral_j = _power_integral_j(power)
    energy_j, energy_source = ((counter_j, "counter") if counter_j is not None
                               else (integral_j, "power_integral") if integral_j is not None else (None, None))
    spans = [p[-1][0] - p[0][0] for p in (energy, power) if len(p) >= 2]
    window_s = max(spans) / 1e9 if spans else 0.0
    times = [s.t_ns for s in samples]
    gaps = _gaps_s(times, lo_ns, hi_ns) if hi_ns > lo_ns else []
    interval_s = interval_s or _typical_interval_s(times)
    # a gap longer than GAP_WARN_FACTOR intervals left the GPU unobserved but for one interval's worth
    lost_s = (sum(g - interval_s for g in gaps if g > GAP_WARN_FACTOR * interval_s) if interval_s else 0.0)
    # Utilization is the share of the driver's last sample period (1/6 s to 1 s) a kernel ran: a shorter
    # window cannot be told from what ran before it, so it gets none.
    short = window_s < UTIL_PERIOD_S
    gauge_w = _mean(_values(inside, "power_w"))
    return {
        "gpu": gpu,
        "samples": len(inside),
        "window_s": window_s,
        "covered_s": max(window_s - lost_s, 0.0),
        "max_gap_s": max(gaps) if gaps else None,
        "gap_warned": bool(interval_s) and any(g > GAP_WARN_FACTOR * interval_s for g in gaps),
        "interval_s": interval_s,
        "short_window": short,
        "sm_util_mean_pct": None if short else _mean(_values(inside, "sm_util_pct")),
        "sm_util_max_pct": None if short else _max(_values(inside, "sm_util_pct")),
        "mem_util_mean_pct": None if short else _mean(_values(inside, "mem_util_pct")),
        "sm_clock_mean_mhz": _mean(_values(inside, "sm_clock_mhz")),
        "mem_used_max_mib": _max(_values(inside, "mem_used_mib")),
        # the window's mean power: the energy counter's rise over it where there is one (NVML's power
        # reading is a 1-second average on Hopper and lags a load by about that), else the readings' mean
        "power_mean_w": counter_j / window_s if counter_j is not None and window_s > 0 else gauge_w,
        "power_gauge_mean_w": gauge_w,
        "power_max_w": _max(_values(inside, "power_w")),
        "energy_j": energy_j,
        "energy_source": energy_source,
        "energy_counter_j": counter_j,
        "energy_power_integral_j": integral_j,
        "j_per_output_token": energy_j / output_tokens if energy_j is not None and output_tokens else None,
    }


def summarize(samples: list[Sample], output_tokens: int | None, wall_s: float, source: str | None = None, *,
              start_ns: int | None = None, end_ns: int | None = None, note: str | None = None,
              interval_s: float | None = None) -> dict:
    """One window's telemetry (a level's repeat): per GPU and over all of them (keys in
    docs/bench-output.md), with the energy per output token (J: every GPU's energy over the window /
    `output_tokens`). The window is [start_ns, end_ns] (default: the samples' own span): gauges are the
    readings inside it; energy is the counter (or power) read as linear between readings and taken at
    its edges, so readings just outside it count for the part inside. `wall_s` is the level's duration,
    against which the window's coverage is given (less any gap between readings over GAP_WARN_FACTOR
    times `interval_s`, the sampler's interval, else the readings' median step); `note` says why readings
    are missing, and gets what summarize finds: such gaps, and GPUs left out of an all-GPU figure."""
    by_gpu: dict[int, list[Sample]] = {}
    for s in sorted(samples, key=lambda s: (s.gpu, s.t_ns)):
        by_gpu.setdefault(s.gpu, []).append(s)
    gpus = [_gpu_summary(g, ss, ss[0].t_ns if start_ns is None else start_ns,
                         ss[-1].t_ns if end_ns is None else end_ns, output_tokens, interval_s)
            for g, ss in sorted(by_gpu.items())]

    def each(key: str) -> list[float]:
        return [g[key] for g in gpus if g[key] is not None]

    def over(key: str) -> list[int]:
        return [g["gpu"] for g in gpus if g[key] is not None]

    # power and energy over all GPUs: summed over the GPUs that gave them (named in `power_gpus`,
    # `energy_gpus`), one GPU's missing reads must not blank the others'
    energy_j = sum(each("energy_j")) if each("energy_j") else None
    sources = {g["energy_source"] for g in gpus if g["energy_j"] is not None}
    power = each("power_mean_w")
    windows = [g for g in gpus if g["window_s"] > 0]
    window_s = _max([g["window_s"] for g in windows])
    covered_s = min((g["covered_s"] for g in windows), default=None)
    gaps = each("max_gap_s")
    notes = [note] if note else []
    for figure, key in (("power", "power_mean_w"), ("energy", "energy_j")):
        missing = [g["gpu"] for g in gpus if g[key] is None]
        if missing and len(missing) < len(gpus):
            notes.append(f"{figure} over all GPUs sums GPU {', '.join(map(str, over(key)))} only "
                         f"(GPU {', '.join(map(str, missing))} gave none)")
    gapped = [g for g in gpus if g["gap_warned"]]
    if gapped:
        worst = max(gapped, key=lambda g: g["max_gap_s"])
        notes.append(f"no reading for {worst['max_gap_s']:.1f} s at a stretch (GPU "
                     f"{', '.join(str(g['gpu']) for g in gapped)}; readings every {worst['interval_s']:.2g} s): "
                     "the gauges miss that time and coverage leaves it out")
    return {
        "source": source,
        "wall_s": wall_s,
        "output_tokens": output_tokens,
        "note": "; ".join(notes) or None,
        "gpus": gpus,
        "all": {
            "gpus": len(gpus),
            "samples": sum(g["samples"] for g in gpus),
            "window_s": window_s,
            "coverage": covered_s / wall_s if covered_s is not None and wall_s > 0 else None,
            "max_gap_s": max(gaps) if gaps else None,
            "sm_util_mean_pct": _mean(each("sm_util_mean_pct")),
            "sm_util_max_pct": _max(each("sm_util_max_pct")),
            "mem_util_mean_pct": _mean(each("mem_util_mean_pct")),
            "sm_clock_mean_mhz": _mean(each("sm_clock_mean_mhz")),
            "mem_used_max_mib": _max(each("mem_used_max_mib")),
            "power_total_w": sum(power) if power else None,
            "power_gpus": over("power_mean_w"),
            "energy_j": energy_j,
            "energy_gpus": over("energy_j"),
            "energy_source": (None if energy_j is None else sources.pop() if len(sources) == 1 else "mixed"),
            "j_per_output_token": (energy_j / output_tokens
                                   if energy_j is not None and output_tokens else None),
        },
    }
