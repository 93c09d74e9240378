"""The evidence a diagnosis reads: plain records built from the store (see `collect.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rooftop.profile.capacity import CapacityFinding


@dataclass(slots=True)
class LevelStat:
    """One level of one variant across its repeats (means with their interval)."""

    concurrency: int  # the store's key: a closed loop's concurrency, an open loop's place in the sweep
    tok_s: float  # output tokens/s, mean over repeats
    tok_s_low: float
    tok_s_high: float
    ttft_ms: float  # mean TTFT, mean over repeats
    tpot_ms: float  # mean TPOT, mean over repeats
    repeats: int
    valid: bool  # every repeat of this level was valid (no errors, achieved load met)
    # the server's own decode step (its step histogram over the level), mean over repeats; None where
    # the engine exports none. TPOT also counts the prefill steps interleaved with decode.
    decode_step_ms: float | None = None
    # where decode_step_ms comes from: "engine_step" (the embedded engine's step histogram: schedule,
    # forward, sampling) or "server_itl" (vLLM's or SGLang's inter-token latency, which like TPOT also
    # counts the prefill steps interleaved with decode); None without one
    decode_step_source: str | None = None
    # the share of the engine's step time spent in prefill steps over the level, and a prefill step's
    # mean time (same histogram, mean over repeats); None where the engine exports none
    prefill_share: float | None = None
    prefill_step_ms: float | None = None
    # intervals across repeats (the confidence of the campaign), as tok/s has; nan where one repeat
    ttft_low: float = float("nan")
    ttft_high: float = float("nan")
    tpot_low: float = float("nan")
    tpot_high: float = float("nan")
    decode_step_low: float | None = None
    decode_step_high: float | None = None
    # with an SLO ([slo]): requests/s that met it and the share that did, means with their intervals
    # across repeats, and per bound the share that met it (which bound the level misses by); None without
    goodput_req_s: float | None = None
    goodput_low: float | None = None
    goodput_high: float | None = None
    slo_attainment: float | None = None
    attainment_low: float | None = None
    attainment_high: float | None = None
    slo_bounds: dict[str, float] | None = None
    # GPU telemetry over the level, repeats pooled (bench.summary.level_telemetry without its raw
    # windows): per GPU and over all, each figure {mean, ci_low, ci_high, ...}; None where none was taken
    telemetry: dict | None = None
    label: str = ""  # the bench's name of the level ("C=8", "rate 4/s", "trace mooncake x2"); "" for C=concurrency
    # the engine's prefix-cache hit rate over the level (cached prompt tokens / prompt tokens looked up, from its
    # /metrics), mean over repeats with their spread; 0 where the variant runs with prefix caching off (the
    # engine then looks nothing up); None where the engine exports none
    prefix_hit_rate: float | None = None
    prefix_hit_low: float | None = None
    prefix_hit_high: float | None = None
    # with the bench's --otlp-receiver: each valid repeat's `server_spans` (bench/latency.py), with that
    # repeat's p99 ITL as `itl_p99_ms`; None where no spans were received
    server_spans: list[dict] | None = None
    # speculative decoding over the level, from the engine's /metrics, pooled over the valid repeats
    # (bench.summary.spec_decode: acceptance_rate, mean_accepted_length, acceptance_by_position, ...); None where the
    # engine did not speculate or exports none
    spec_decode: dict | None = None

    @property
    def at(self) -> str:
        """How a sentence names the level: 'C=8', 'rate 4/s', 'trace mooncake x2'."""
        return self.label or f"C={self.concurrency}"

    def served_step(self) -> tuple[float, float, float, str] | None:
        """The measured decode step (mean, low, high, what it is): the server's own where it exports
        one, else TPOT; None when neither is finite."""
        if self.decode_step_ms:
            low = self.decode_step_low if self.decode_step_low is not None else float("nan")
            high = self.decode_step_high if self.decode_step_high is not None else float("nan")
            what = "server inter-token latency" if self.decode_step_source == "server_itl" else "server decode step"
            return self.decode_step_ms, low, high, what
        if self.tpot_ms == self.tpot_ms:  # not nan
            return self.tpot_ms, self.tpot_low, self.tpot_high, "TPOT"
        return None


@dataclass(slots=True)
class VariantEvidence:
    """What one deployment variant measured."""

    name: str
    levers: list[str]  # levers applied on top of the baseline (empty for the baseline)
    topology: str  # single | pd
    levels: list[LevelStat]
    knee_concurrency: int | None = None  # where more concurrency stops adding throughput beyond noise
    knee_note: str = ""
    # with an SLO: bench.slo.SloCapacity.to_dict() and its "sentence"; None without an SLO or data
    slo_capacity: dict | None = None
    prefix_caching: bool | None = None  # the deployment's prefix_caching (None: the engine's default, on)

    def level(self, concurrency: int) -> LevelStat | None:
        """The closed-loop level at `concurrency` (an open loop's levels are at rates, not at a concurrency)."""
        return next((lv for lv in self.levels if lv.concurrency == concurrency and not lv.label), None)


@dataclass(slots=True)
class LevelEffect:
    """A lever's effect on one metric at one concurrency level, against its baseline."""

    concurrency: int
    metric: str  # output_tok_s | ttft_ms | tpot_ms
    baseline_mean: float
    candidate_mean: float
    ratio: float  # candidate / baseline
    ratio_low: float
    ratio_high: float
    verdict: str  # faster | slower | no difference within noise
    n_baseline: int
    n_candidate: int
    label: str = ""  # the level's name where it is not C=concurrency (an open loop's)

    @property
    def at(self) -> str:
        return self.label or f"C={self.concurrency}"


@dataclass(slots=True)
class LeverEvidence:
    """A lever: what it changed, what it was compared with, and its effects."""

    name: str
    hypothesis: str
    variant: str  # the variant measured with this lever
    base_variant: str  # what it was compared against
    changes: dict  # {"args": {...}, "env": {...}, "topology": "pd", "model": {...}}
    effects: list[LevelEffect] = field(default_factory=list)
    quality: dict | None = None  # quality.QualityResult as a dict
    joined_baseline: bool = False  # cumulative mode: it won and joined the baseline

    def effect(self, metric: str, concurrency: int) -> LevelEffect | None:
        return next((e for e in self.effects if e.metric == metric and e.concurrency == concurrency), None)


@dataclass(slots=True)
class ComponentShare:
    """One component of a profile: its share of GPU (or CPU) time per step."""

    name: str
    share: float
    ms_per_step: float
    path: str = ""
    unit_shares: dict = field(default_factory=dict)


@dataclass(slots=True)
class ProfileEvidence:
    """An attributed profile of one variant (the profile package's JSON, as records)."""

    variant: str
    trace_path: str
    concurrency: int | None
    steps: int
    busy_ms_per_step: float
    idle_share: float | None  # GPU idle share; None where the trace has no device timeline
    tensor_core_share: float | None
    components: list[ComponentShare]  # sorted by share, largest first
    capacity_findings: list[CapacityFinding]  # work sized by the allocated capacity (profile/capacity.py)
    device: str = "gpu"  # gpu | cpu
    attribution_source: str = ""  # nn.Module frames, CPU op names, or "eager map PATH"
    unattributed_share: float | None = None  # share of the step in no component
    notes: list[str] = field(default_factory=list)  # the profile package's notes (how it attributed)
    measured: str = ""  # which steps the trace holds: as served (CUDA graphs, torch.compile) or eagerly

    def component(self, name: str) -> ComponentShare | None:
        return next((c for c in self.components if c.name == name), None)


@dataclass(slots=True)
class RooflineEvidence:
    """The analytic floor of a decode step of one variant, beside the measured step time."""

    variant: str
    hardware: str
    batch: int
    context: int
    floor_ms: float
    component_floor_ms: dict[str, float]
    measured_step_ms: float | None  # the served decode step at that concurrency (else its TPOT)
    context_capacity: int | None = None
    measured_step_low: float = float("nan")  # its interval across repeats
    measured_step_high: float = float("nan")
    notes: list[str] = field(default_factory=list)  # assumptions the model config forced (roofline notes)


@dataclass(slots=True)
class WorkloadEvidence:
    """What traffic the campaign sent every variant ([workload] and [bench], as BenchSettings), and what a
    replayed trace was: its requests, span, mean rate, cut, and the prefix reuse its hash ids promise."""

    dataset: str
    dataset_path: str | None
    input_len: int
    output_len: int
    prefix_len: int
    closed_loop: list[int]  # closed-loop levels (concurrency); empty for an open loop
    request_rate: list[float]  # open-loop levels (requests/s)
    max_concurrency: int | None
    requests_per_level: int | None
    duration_s: float | None
    burstiness: float
    ramp: tuple[str, float, float] | None  # (strategy, start rps, end rps)
    trace_speedup: float
    trace_window_s: tuple[float, float] | None
    sessions: int | None = None  # multi-turn: sessions per level, turns, think time (None: single-turn)
    turns: int | None = None
    think_time_s: float | None = None
    # a replayed trace, as the sweep read it (bench.sweep.trace_meta): requests, span_s, mean_rate, cut,
    # expected_prefix_reuse (tokens in blocks seen before / prompt tokens; None where the trace names no blocks)
    trace: dict | None = None

    @property
    def expected_prefix_reuse(self) -> float | None:
        return (self.trace or {}).get("expected_prefix_reuse")


@dataclass(slots=True)
class Evidence:
    """Everything the diagnosis rules read."""

    campaign: str
    goal: str
    mode: str
    baseline: str
    variants: dict[str, VariantEvidence]
    levers: list[LeverEvidence]
    profiles: dict[str, ProfileEvidence] = field(default_factory=dict)
    rooflines: dict[str, RooflineEvidence] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # variant -> first error of its failed units
    confidence: float = 0.95  # of every interval ([bench] confidence)
    # why evidence is missing, from the store: variant -> stage -> "rN: error" (the first failure of
    # that stage), and the reasons analyses left behind (roofline_missing, profile_error, profiling off)
    stage_errors: dict[str, dict[str, str]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # "roofline:VARIANT" / "profile:VARIANT" -> reason
    profiling: bool = True  # [profile] enabled
    slo: dict | None = None  # the campaign's SLO ([slo]): its bounds, attainment, "describe" and "bounds" (texts)
    telemetry_note: str | None = None  # "GPU telemetry off: why", where the sweeps took none
    workload: WorkloadEvidence | None = None  # what traffic every variant served
    # a speculative variant's verify and draft floors (campaign/speculative_floors.py), by variant
    speculative_rooflines: dict[str, dict] = field(default_factory=dict)

    def why(self, variant: str, *stages: str) -> str | None:
        """The first recorded failure of `variant` in one of `stages` (in that order), else of any stage."""
        errors = self.stage_errors.get(variant, {})
        for stage in stages:
            if stage in errors:
                return f"{stage} {errors[stage]}"
        return next((f"{stage} {e}" for stage, e in errors.items()), None)

    def lever(self, name: str) -> LeverEvidence | None:
        return next((lv for lv in self.levers if lv.name == name), None)


@dataclass(slots=True)
class Finding:
    """One diagnosis: a title, one sentence with its numbers, where the evidence is, and its gain."""

    title: str
    sentence: str
    numbers: dict
    evidence_pointer: str  # e.g. "profile: traces/baseline/...json.gz; levels: baseline C=16"
    expected_gain: float | None  # throughput factor expected from acting on it; None for context
    rule: str = ""
    # "measured": a lever measured that gain (faster beyond noise); "bound": what removing the cost
    # entirely could give at most (Amdahl), not a measurement; "" for context
    gain_kind: str = ""
    # a bound known only within a range (two figures bound what it is judged against, e.g. the GPU idle
    # share against the engine's step and against TPOT): its upper end; expected_gain is the lower,
    # which ranks it. None: one figure
    gain_high: float | None = None

    def gain_text(self) -> str:
        """'×1.44 measured', 'up to ×3.06 (bound)', 'up to ×1.39–1.41 (bound)' or 'context'."""
        if not self.expected_gain:
            return "context"
        if self.gain_kind == "bound":
            return f"up to {bound_text(self.expected_gain, self.gain_high)} (bound)"
        return f"×{self.expected_gain:.2f} measured"


def bound_text(low: float, high: float | None = None) -> str:
    """'×1.39', or '×1.39–1.41' where the bound is itself known only within a range."""
    if high is not None and f"{high:.2f}" != f"{low:.2f}":
        return f"×{low:.2f}–{high:.2f}"
    return f"×{low:.2f}"


@dataclass(slots=True)
class Diagnosis:
    """Findings ranked by expected gain, and what would bind once the top one is fixed."""

    findings: list[Finding]
    binds_next: Finding | None

    @property
    def top(self) -> Finding | None:
        return self.findings[0] if self.findings else None
