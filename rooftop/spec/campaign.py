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
    [bench]
    concurrency = [1, 8, 16]
    [slo]                               # optional: the goal as an SLO (goodput, SLO capacity)
    ttft_ms = 2000
    tpot_ms = 50
    attainment = 0.9
    [[lever]]
    name = "context-8k"
    hypothesis = "indexer work scales with the allocated context"
    args = { context-length = 8192 }

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


class BenchSection(BaseModel):
    """The campaign's [bench]: pydantic checks each key's type, BenchSettings.check every rule on the values
    (the rules and wording `rooftop bench` uses, naming keys instead of flags)."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = "random"  # random | sharegpt | prefix
    dataset_path: str | None = None
    input_len: int = 256
    output_len: int = 256  # 0: sharegpt only, each conversation's own answer length
    prefix_len: int = 0
    concurrency: list[int] = Field(default_factory=lambda: [1, 8, 16])  # sorted and deduplicated when read
    requests_per_level: int | None = None  # default 64, unless duration_s is given
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

    @model_validator(mode="after")
    def _rules(self) -> BenchSection:
        if self.requests_per_level is None and self.duration_s is None:
            self.requests_per_level = 64
        self.concurrency = sorted(set(self.concurrency))
        try:
            self.settings().check(KEYS)
        except SettingError as exc:  # raised as pydantic's own error, so that it names bench.<key>
            raise ValidationError.from_exception_data("BenchSection", [InitErrorDetails(
                type=PydanticCustomError("bench_setting", "{problem} ({fix})", {"problem": exc.problem,
                                                                                 "fix": exc.fix}),
                loc=(KEYS.name(exc.setting),), input=getattr(self, KEYS.name(exc.setting), None))]) from None
        return self

    def settings(self) -> BenchSettings:
        """These keys as the settings a bench run takes; the seed and tokenizer come from [campaign] and [model]."""
        return BenchSettings(
            dataset=self.dataset, dataset_path=self.dataset_path, input_len=self.input_len,
            output_len=self.output_len, prefix_len=self.prefix_len, concurrency=list(self.concurrency),
            num_requests=self.requests_per_level, duration_s=self.duration_s, repeats=self.repeats,
            warmup=self.warmup, confidence=self.confidence, timeout_s=self.timeout_s, telemetry=self.telemetry,
            dcgm_url=self.dcgm_url)


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
    args: dict[str, ArgValue] = Field(default_factory=dict)
    env: dict[str, ArgValue] = Field(default_factory=dict)
    single: Role | None = None
    prefill: Role | None = None
    decode: Role | None = None
    router: Role | None = None
    quality_check: bool = False

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
        return self

    @property
    def profile_concurrency(self) -> int:
        return self.profile.concurrency or max(self.bench.concurrency)


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
