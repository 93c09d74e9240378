"""A campaign as the user writes it: goal, model, hardware, the baseline deployment, bench and profile
plans, quality check, and the levers to test against the baseline.

    [campaign]
    name = "dsv4-flash"
    goal = ">= 300 tok/s at C=16"
    mode = "cumulative"                 # independent | cumulative
    [model]
    path = "/models/DeepSeek-V4-Flash"  # or preset = "tiny" for the embedded engine
    [deployment]                        # the baseline: a DeploymentSpec (rooftop/spec/deployment.py)
    engine = "sglang"
    [workload]                          # what traffic every variant serves (BenchSettings' keys)
    dataset = "mooncake"
    dataset_path = "traces/conversation_trace.jsonl"
    trace_speedup = 2.0
    [bench]                             # how it is measured: levels, repeats, confidence
    repeats = 3
    [profile]
    concurrency = 16
    [slo]                               # optional: the goal as an SLO (goodput, SLO capacity)
    ttft_ms = 2000
    tpot_ms = 50
    attainment = 0.9
    [[lever]]
    name = "context-8k"
    hypothesis = "indexer work scales with the allocated context"
    args = { context-length = 8192 }
    [[lever]]
    name = "no-prefix-cache"
    prefix_caching = false              # each engine's own flag (rooftop/adapters/)
    [[lever]]
    name = "ngram"
    speculative = { method = "ngram", num_speculative_tokens = 3 }  # quality-checked unless quality_check = false

Pydantic only at this boundary; everything after loading works on these models.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from rooftop.errors import RooftopError
from rooftop.spec import load
from rooftop.spec.bench import KEYS, BenchSettings, SettingError
from rooftop.spec.deployment import ArgValue, DeploymentSpec, Role
from rooftop.spec.speculative import Speculative

BASELINE = "baseline"


class CampaignSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    goal: str = ""
    mode: Literal["independent", "cumulative"] = "independent"
    seed: int = 0


class ModelSection(BaseModel):
    """The model: an HF directory (config.json for the roofline, tokenizer), or an embedded preset."""

    model_config = ConfigDict(extra="forbid")

    path: str | None = None
    preset: str | None = None
    config: str | None = None  # config.json for the roofline; default <path>/config.json
    tokenizer: str | None = None  # local HF tokenizer dir for the bench; default: the server's /tokenize

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        if self.path and self.preset:
            raise ValueError("give either `path` or `preset`, not both")
        return self

    @property
    def served(self) -> str | None:
        """What a deployment serves when it names no model of its own."""
        return self.path or self.preset


class HardwareSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu: str | None = None  # name in the roofline hardware table (h100, h200, ...); None: CPU or detect
    cpu_bandwidth_gbps: float | None = Field(default=None, gt=0)  # for a CPU roofline


class WorkloadSection(BaseModel):
    """The campaign's [workload]: what traffic every variant serves — the requests (a dataset, a trace replayed on
    its own clock, multi-turn sessions) and how their arrivals are shaped (burstiness, a ramp). Keys are
    BenchSettings' own names; one left out takes its default (or, for the five [bench] held before [workload]
    existed, the value given there)."""

    model_config = ConfigDict(extra="forbid")

    dataset: str | None = None  # random | sharegpt | prefix | mooncake | burstgpt | azure | trace | conversation
    dataset_path: str | None = None  # a ShareGPT file, or the trace file
    input_len: int | None = None
    output_len: int | None = None
    prefix_len: int | None = None
    burstiness: float | None = None  # open loop: gamma shape of the gaps; 1 Poisson, under 1 burstier
    ramp_up_strategy: str | None = None  # linear | exponential: one open-loop level from start to end rps
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None
    trace_speedup: float | None = None  # a trace's gaps divided by this
    trace_window_s: list[float] | None = None  # [start, end) seconds of trace time; end may be inf
    multi_turn: bool | None = Field(default=None, strict=True)  # sharegpt: whole conversations
    sessions: int | None = None  # conversation: sessions per level
    turns: int | None = None
    turn_input_len: int | None = None
    turn_output_len: int | None = None
    think_time_s: float | None = None

    def given(self) -> dict[str, Any]:
        """The keys the file gave, as BenchSettings fields."""
        out = {k: getattr(self, k) for k in self.model_fields_set if getattr(self, k) is not None}
        if "trace_window_s" in out:
            out["trace_window_s"] = tuple(out["trace_window_s"])
        return out


# The [bench] keys that say what traffic: read there as before [workload] existed; a campaign gives each in one
# of the two tables.
BENCH_TRAFFIC_KEYS = ("dataset", "dataset_path", "input_len", "output_len", "prefix_len")
DEFAULT_CONCURRENCY = [1, 8, 16]  # a closed-loop sweep's levels when [bench] gives none


class BenchSection(BaseModel):
    """The campaign's [bench]: how each variant is measured — the load levels swept (closed-loop concurrency, or
    open-loop request rates with an optional cap), how long a level lasts, repeats, warm-up, confidence,
    telemetry. Pydantic checks each key's type here; BenchSettings' rules check the values, with [workload],
    when the campaign loads (`CampaignSpec.bench_settings`)."""

    model_config = ConfigDict(extra="forbid")

    # what traffic: [workload]'s keys, still read here (older campaigns); a key given in both is refused
    dataset: str = "random"
    dataset_path: str | None = None
    input_len: int = 256
    output_len: int = 256  # 0: sharegpt only, each conversation's own answer length
    prefix_len: int = 0
    # the levels: closed-loop concurrency (default [1, 8, 16] where the workload is not open-loop), or
    # open-loop request rates; sorted and deduplicated when read
    concurrency: list[int] | None = None
    request_rate: list[float] | None = None
    max_concurrency: int | None = None  # open loop: cap on requests in flight
    requests_per_level: int | None = None  # default 64, unless duration_s is given or a trace or sessions bound it
    # with a duration and no requests_per_level, a level issues requests for duration_s, however many
    duration_s: float | None = None
    repeats: int = 3
    warmup: int = 4
    timeout_s: float = 600.0
    confidence: float = 0.95
    # GPU telemetry per level (NVML on this host, over the deployment's GPUs), or a dcgm-exporter's
    # /metrics where the GPUs are elsewhere
    telemetry: bool = Field(default=True, strict=True)  # true or false: "yes" is refused, not read as true
    dcgm_url: str | None = None
    client_procs: int | None = None  # client processes per level; default one per 256 streams

    @model_validator(mode="after")
    def _sorted(self) -> BenchSection:
        if self.concurrency is not None:
            self.concurrency = sorted(set(self.concurrency))
        return self

    def measuring(self) -> dict[str, Any]:
        """The keys that say how to measure, as BenchSettings fields (the levels only where given)."""
        out = {"num_requests": self.requests_per_level, "duration_s": self.duration_s, "repeats": self.repeats,
               "warmup": self.warmup, "confidence": self.confidence, "timeout_s": self.timeout_s,
               "telemetry": self.telemetry, "dcgm_url": self.dcgm_url, "client_procs": self.client_procs,
               "max_concurrency": self.max_concurrency}
        if self.concurrency is not None:
            out["concurrency"] = list(self.concurrency)
        if self.request_rate is not None:
            out["request_rate"] = list(self.request_rate)
        return out


def settings_of(workload: WorkloadSection, bench: BenchSection) -> BenchSettings:
    """The settings every variant's sweep runs: [workload]'s traffic (else [bench]'s older traffic keys) and
    [bench]'s measuring; the levels default to DEFAULT_CONCURRENCY for a closed loop, none for an open one (a
    trace, a ramp, request rates), and a level's count to 64 where neither a duration, a trace nor sessions
    bound it. Unchecked: `CampaignSpec` checks it when the campaign loads."""
    traffic = {k: getattr(bench, k) for k in BENCH_TRAFFIC_KEYS if k in bench.model_fields_set}
    s = BenchSettings(**traffic | workload.given() | bench.measuring())
    if bench.concurrency is None:
        s.concurrency = [] if (s.trace or s.ramp_up_strategy or s.request_rate) else list(DEFAULT_CONCURRENCY)
    if s.num_requests is None and s.duration_s is None and not (s.trace or s.conversations):
        s.num_requests = 64
    return s


class SloSection(BaseModel):
    """The campaign's goal as a service-level objective: latency bounds in ms (any of the three) that
    `attainment` of the requests must meet. With one, every level gets its goodput and attainment, each
    variant its SLO capacity (the highest concurrency meeting it), and levers are judged by it too."""

    model_config = ConfigDict(extra="forbid")

    ttft_ms: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    tpot_ms: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    e2el_ms: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    attainment: float = Field(default=0.9, gt=0, le=1)

    @model_validator(mode="after")
    def _some_bound(self) -> SloSection:
        if self.ttft_ms is None and self.tpot_ms is None and self.e2el_ms is None:
            raise ValueError("an SLO needs at least one of ttft_ms, tpot_ms, e2el_ms")
        return self


class ProfileSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    concurrency: int | None = Field(default=None, ge=1)  # default: the highest bench level
    steps: int = Field(default=20, ge=1)
    requests: int | None = Field(default=None, ge=1)  # requests to keep in flight while capturing
    # Where the engine runs the step compiled or from graphs (vLLM by default), also profile the same
    # deployment run eagerly (vLLM --enforce-eager): its module paths are the map of the compiled step's.
    eager_map: bool = True


class QualitySection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompts: int = Field(default=8, ge=1)
    max_tokens: int = Field(default=16, ge=1)
    logprobs: int = Field(default=5, ge=0, le=20)
    kl_threshold: float = Field(default=0.05, ge=0)  # mean KL (nats) past which a lever is flagged
    agreement_threshold: float = Field(default=0.9, ge=0, le=1)  # token agreement below which it is flagged
    # A prompt whose outputs part where each side's logprobs of the two tokens are within this many nats
    # parts at a near-tie (rounding, not quality): counted as agreeing for the flag; 0 turns it off.
    # Twice bf16's ~0.1 logit error, as the two tokens' logits each carry one.
    tie_margin: float = Field(default=0.2, ge=0)


class Lever(BaseModel):
    """One change to the baseline deployment, with the hypothesis it tests."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    hypothesis: str = ""
    engine: Literal["embedded", "sglang", "vllm"] | None = None
    model: str | None = None
    python: str | None = None
    topology: Literal["single", "pd"] | None = None
    prefix_caching: bool | None = Field(default=None, strict=True)  # the engine's prefix cache on or off
    speculative: Speculative | None = None  # speculative decoding (rooftop/spec/speculative.py)
    args: dict[str, ArgValue] = Field(default_factory=dict)
    env: dict[str, ArgValue] = Field(default_factory=dict)
    single: Role | None = None
    prefill: Role | None = None
    decode: Role | None = None
    router: Role | None = None
    # Decode the quality prompts greedily and compare with the base's. On by default for a lever that sets
    # `speculative`: speculation must leave greedy outputs unchanged, so a difference beyond a near-tie is a bug in
    # its verification (campaign/quality.py); `quality_check = false` turns it off.
    quality_check: bool = False

    @model_validator(mode="after")
    def _speculation_checked(self) -> Lever:
        if self.speculative is not None and "quality_check" not in self.model_fields_set:
            self.quality_check = True
        return self

    @field_validator("name")
    @classmethod
    def _not_baseline(cls, value: str) -> str:
        if value == BASELINE or "+" in value:
            raise ValueError(f"{value!r} is reserved; name the lever after what it changes")
        return value

    def changes(self) -> dict[str, Any]:
        """What the lever changes, as plain data (for the store and the report)."""
        return self.model_dump(exclude={"name", "hypothesis", "quality_check"}, exclude_none=True,
                               exclude_defaults=True)


class CampaignSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    campaign: CampaignSection
    model: ModelSection = Field(default_factory=ModelSection)
    hardware: HardwareSection = Field(default_factory=HardwareSection)
    deployment: DeploymentSpec
    workload: WorkloadSection = Field(default_factory=WorkloadSection)
    bench: BenchSection = Field(default_factory=BenchSection)
    profile: ProfileSection = Field(default_factory=ProfileSection)
    quality: QualitySection = Field(default_factory=QualitySection)
    slo: SloSection | None = None
    levers: list[Lever] = Field(default_factory=list, alias="lever")

    @model_validator(mode="after")
    def _check(self) -> CampaignSpec:
        names = [lv.name for lv in self.levers]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"lever name(s) used twice: {', '.join(dup)}")
        if self.deployment.model is None and self.model.served:
            self.deployment.model = self.model.served
        for lv in self.levers:
            try:
                apply_lever(self.deployment, [lv])  # a lever that makes an impossible deployment fails now
            except RooftopError as exc:
                raise ValueError(exc.problem) from None
        self._check_settings()
        return self

    def _check_settings(self) -> None:
        """BenchSettings' rules over [workload] and [bench], each problem raised as pydantic's own error naming
        the table and key it starts with (`workload.trace_speedup`, `bench.requests_per_level`)."""
        both = [k for k in BENCH_TRAFFIC_KEYS if k in self.bench.model_fields_set and k in self.workload.given()]
        if both:
            _raise("bench", both[0], getattr(self.bench, both[0]), "is given in [workload] too: a campaign "
                   "says what traffic once", "keep it in [workload] and drop it from [bench]")
        settings = self.bench_settings()
        try:
            settings.check(KEYS)
        except SettingError as exc:
            key = KEYS.name(exc.setting)
            table = self._table_of(key)
            source = self.workload if table == "workload" else self.bench
            _raise(table, key, getattr(source, key, None), exc.problem, exc.fix)
        if self.profile.concurrency is None and not settings.concurrency:
            _raise("profile", "concurrency", None, "an open-loop workload (a trace, request rates, a ramp) has no "
                   "concurrency level to profile at, nor a batch for the roofline",
                   "give [profile] concurrency, e.g. the requests the workload keeps in flight")

    def _table_of(self, key: str) -> str:
        """Where a problem with setting `key` is named: the table that gave it; one given nowhere, the table that
        says what traffic (a traffic key: [workload], unless only [bench] gives the traffic) or [bench]."""
        if key in self.workload.given():
            return "workload"
        if key in self.bench.model_fields_set or key not in WorkloadSection.model_fields:
            return "bench"
        old_style = not self.workload.given() and any(k in self.bench.model_fields_set for k in BENCH_TRAFFIC_KEYS)
        return "bench" if old_style and key in BENCH_TRAFFIC_KEYS else "workload"

    def bench_settings(self) -> BenchSettings:
        """The settings every variant's sweep runs (settings_of): [workload]'s traffic, [bench]'s measuring."""
        return settings_of(self.workload, self.bench)

    @property
    def profile_concurrency(self) -> int:
        """The batch the profile and the roofline are taken at: [profile] concurrency, else the highest level."""
        return self.profile.concurrency or max(self.bench_settings().concurrency)


def _raise(table: str, key: str, value: object, problem: str, fix: str) -> None:
    """A campaign-wide rule's problem as pydantic's own error, so that it names `table.key` as any other does."""
    raise ValidationError.from_exception_data("CampaignSpec", [InitErrorDetails(
        type=PydanticCustomError("campaign_setting", "{problem} ({fix})", {"problem": problem, "fix": fix}),
        loc=(table, key), input=value)])


def apply_lever(base: DeploymentSpec, levers: list[Lever]) -> DeploymentSpec:
    """The baseline with each lever's changes laid over it in order (spec/load.py's merge rules)."""
    spec = base
    for lv in levers:
        spec = load.apply_changes(spec, lv.changes(), lv.name)
    return spec


def variant_name(levers: list[str]) -> str:
    """A variant's name: `baseline`, a lever's name, or `baseline+a+b` for a cumulative base."""
    return BASELINE if not levers else "+".join(levers) if len(levers) == 1 else "+".join([BASELINE, *levers])


def _key_path(loc: tuple, data: dict) -> str:
    """A pydantic error location as the user wrote it: `bench.concurrency[1]`, `lever "pd".args`."""
    parts: list[str] = []
    i = 0
    while i < len(loc):
        p = loc[i]
        if p == "lever" and i + 1 < len(loc) and isinstance(loc[i + 1], int):
            levers = data.get("lever") or []
            idx = loc[i + 1]
            name = levers[idx].get("name") if idx < len(levers) and isinstance(levers[idx], dict) else None
            parts.append(f'lever #{idx + 1}' + (f' "{name}"' if name else ""))
            i += 2
            continue
        if isinstance(p, int):
            parts[-1:] = [f"{parts[-1] if parts else ''}[{p}]"]
        elif p in ("function-after[_parse_cpus(), list[int]]",) or str(p).startswith(("function-", "literal")):
            pass  # pydantic's validator wrappers, not keys the user wrote
        else:
            parts.append(str(p))
        i += 1
    return ".".join(parts)


def _reason(err: dict) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    got = err.get("input")
    if kind.endswith("_type") or kind.endswith("_parsing") or kind == "literal_error":
        return f"{msg} (got {got!r})"
    return msg


def validation_message(path: Path | str, exc: ValidationError, data: dict) -> str:
    """One line per mistake: `file: key: reason`, at most three, then how many more."""
    errs = exc.errors()
    lines = []
    for err in errs[:3]:
        key = _key_path(tuple(err["loc"]), data)
        lines.append(f"{path}: {key}: {_reason(err)}" if key else f"{path}: {_reason(err)}")
    more = f" (and {len(errs) - 3} more)" if len(errs) > 3 else ""
    return "; ".join(lines) + more


def parse_campaign(text: str, path: Path | str = "<campaign>") -> CampaignSpec:
    """Parse and validate campaign TOML text; a RooftopError naming file, key and reason on any mistake."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RooftopError(f"{path}: not valid TOML: {exc}", "fix the syntax at that line") from None
    try:
        return CampaignSpec.model_validate(data)
    except ValidationError as exc:
        raise RooftopError(validation_message(path, exc, data),
                           "compare with the built-in example, rooftop/campaign/demo.toml") from None


def load_campaign(path: Path | str) -> CampaignSpec:
    """Read and validate a campaign file."""
    p = Path(path)
    if not p.is_file():
        raise RooftopError(f"{p}: no such campaign file", "pass the path of a campaign .toml")
    return parse_campaign(p.read_text(), p)
