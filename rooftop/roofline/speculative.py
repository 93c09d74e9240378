"""Speculative decoding on the roofline: a verify step of k+1 tokens per sequence plus the draft, over the
tokens a step is expected to yield, against plain decode; and the batches where that turns."""

import dataclasses
import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from rooftop.errors import RooftopError
from rooftop.hardware.specs import GPUSpec, gpu_spec
from rooftop.roofline.config import ModelShape
from rooftop.roofline.costs import HEAD_DTYPE, ComponentCost, StepCost, decode_costs
from rooftop.roofline.dtypes import ACT_BYTES, tensor_bytes
from rooftop.roofline.floors import StepFloor, floors

DRAFTS = ("mtp", "ngram")  # mtp: the model's own next-token layer(s); ngram: prompt lookup on the host
MAX_BATCH = 1 << 16  # the crossover searches stop here


def acceptance_rates(k: int, acceptance: float | Sequence[float]) -> tuple[float, ...]:
    """Per-position acceptance a_1..a_k, each the share of drafts whose position i was accepted.

    That is vLLM's `spec_decode_num_accepted_tokens_per_pos[i] / spec_decode_num_drafts`: position i
    counts only when every earlier one was accepted too, so the rates never rise. A single rate A is
    taken as independent per position given the ones before: a_i = A^i.
    """
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise RooftopError(
            f"speculative tokens must be a positive integer, got {k!r}", "pass --speculative-tokens >= 1"
        )
    if isinstance(acceptance, numbers.Real):
        _check_rate(float(acceptance), "acceptance")
        return tuple(float(acceptance) ** i for i in range(1, k + 1))
    rates = tuple(float(a) for a in acceptance)
    if len(rates) != k:
        raise RooftopError(
            f"{len(rates)} per-position acceptance rates for {k} speculative tokens",
            f"give one rate per draft position ({k}), or a single rate",
        )
    for i, rate in enumerate(rates, start=1):
        _check_rate(rate, f"acceptance at position {i}")
    for i in range(1, k):
        if rates[i] > rates[i - 1]:
            raise RooftopError(
                f"per-position acceptance rises at position {i + 1} ({rates[i]:g} after {rates[i - 1]:g})",
                "give vLLM's num_accepted_tokens_per_pos / num_drafts: a position counts only when every "
                "earlier one was accepted, so the rates never rise",
            )
    return rates


def _check_rate(rate: float, name: str) -> None:
    if not 0.0 <= rate <= 1.0:  # NaN fails too
        raise RooftopError(f"{name} {rate:g} is outside [0, 1]", "pass a rate between 0 and 1")


def expected_tokens(k: int, acceptance: float | Sequence[float]) -> float:
    """Tokens a verify step yields per sequence on average: 1 + sum of a_i (the bonus token always comes);
    for a single rate A, (1 - A^(k+1)) / (1 - A)."""
    return 1.0 + sum(acceptance_rates(k, acceptance))


def mtp_draft_shape(shape: ModelShape) -> ModelShape:
    """The draft of a DeepSeek-style MTP module as a one-layer model like the main model's last layer."""
    last = shape.num_layers - 1

    def one(per_layer: tuple) -> tuple:
        return (per_layer[last],) if per_layer else ()

    return dataclasses.replace(
        shape,
        num_layers=1,
        moe_layers=one(shape.moe_layers),
        indexer_layers=one(shape.indexer_layers),
        layer_windows=one(shape.layer_windows),
        compress_ratios=one(shape.compress_ratios),
        notes=[],
    )


def draft_step_costs(shape: ModelShape, batch: int, context: int, **layout) -> StepCost:
    """One MTP draft step of `batch` sequences: embedding, one decoder layer like the last, eh_proj, head.

    `layout` is decode_costs's keywords (dtypes, tp, ep, context_capacity). The module's eh_proj (2h -> h,
    replicated, 16-bit) and its two input norms go in a component of their own, "mtp_proj".
    """
    step = decode_costs(mtp_draft_shape(shape), batch, context, **layout)
    h = shape.hidden_size
    proj = ComponentCost(compute_dtype="bf16")
    proj.add(tensor_bytes(2 * h * h, HEAD_DTYPE) + batch * 3 * h * ACT_BYTES, 2.0 * batch * 2 * h * h)
    proj.add(batch * 2 * h * 2 * ACT_BYTES, batch * 2 * h * 4.0)  # enorm, hnorm: read and write
    step.components["mtp_proj"] = proj
    return step


@dataclass(slots=True, frozen=True)
class Speculation:
    """What is speculated: `k` draft tokens a step, their acceptance (one rate, or vLLM's per-position
    rates), and who drafts them ("mtp" or "ngram")."""

    k: int
    acceptance: float | tuple[float, ...]
    draft: str = "mtp"


@dataclass(slots=True)
class SpecEstimate:
    """Floors of plain and speculative decode at one batch; times in ms, per GPU."""

    batch: int
    k: int
    draft: str
    acceptance: tuple[float, ...]  # per position (vLLM's per-position rate)
    expected_tokens: float  # per sequence per verify step
    plain_step_ms: float  # one decode step: one token per sequence
    verify_step_ms: float  # one step of batch x (k+1) tokens
    draft_ms: float  # the k draft steps (0 for ngram)
    verify_compute_ms: float  # FLOPs over peak, summed over components
    verify_memory_ms: float  # bytes over device bandwidth, summed (communication apart)

    @property
    def plain_ms_per_token(self) -> float:
        """Plain decode: the step floor is the time per output token of each sequence."""
        return self.plain_step_ms

    @property
    def spec_ms_per_token(self) -> float:
        """(verify step + draft) / expected tokens per step."""
        return (self.verify_step_ms + self.draft_ms) / self.expected_tokens

    @property
    def gain(self) -> float:
        """Plain floor per token over the speculative one: above 1, speculation pays."""
        return self.plain_ms_per_token / self.spec_ms_per_token

    @property
    def verify_bound(self) -> str:
        """compute when the verify step's FLOP time reaches its read time, else memory."""
        return "compute" if self.verify_compute_ms >= self.verify_memory_ms else "memory"

    @property
    def plain_tok_s(self) -> float:
        """Plain decode ceiling of the batch, tokens/s."""
        return self.batch / self.plain_ms_per_token * 1e3

    @property
    def spec_tok_s(self) -> float:
        """Speculative decode ceiling of the batch, tokens/s."""
        return self.batch / self.spec_ms_per_token * 1e3


@dataclass(slots=True)
class Crossover:
    """Batches (sequences per step) where speculation turns; None where it does not up to `max_batch`."""

    k: int
    compute_bound_batch: int | None  # first batch whose verify step's FLOP time reaches its read time
    plain_compute_bound_batch: int | None  # the same for a plain decode step
    first_paying_batch: int | None  # first batch where the gain is above 1 (None: it never is)
    break_even_batch: int | None  # first batch past which the gain stays at most 1 (None: still paying)
    max_batch: int


@dataclass(slots=True)
class SpecReport:
    """Speculation at several concurrencies, where it turns, and what the estimate assumed."""

    draft: str
    acceptance: tuple[float, ...]  # per position (vLLM's per-position rate)
    expected_tokens: float  # per sequence per verify step
    levels: list[SpecEstimate]
    crossover: Crossover
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Setup:
    """One model, GPU, context and layout, and the speculation priced on them."""

    shape: ModelShape
    gpu: GPUSpec
    context: int
    k: int
    rates: tuple[float, ...]
    draft: str
    layout: dict

    def plain(self, batch: int) -> StepFloor:
        return floors(decode_costs(self.shape, batch, self.context, **self.layout), self.gpu)

    def verify(self, batch: int) -> StepFloor:
        cost = decode_costs(self.shape, batch, self.context, queries_per_seq=self.k + 1, **self.layout)
        return floors(cost, self.gpu)

    def draft_ms(self, batch: int) -> float:
        if self.draft == "ngram":
            return 0.0
        # vLLM runs the one MTP layer k times in sequence when k exceeds the layers the model has.
        return (
            self.k
            * floors(draft_step_costs(self.shape, batch, self.context, **self.layout), self.gpu).floor_ms
        )

    def estimate(self, batch: int) -> SpecEstimate:
        verify = self.verify(batch)
        compute_ms, memory_ms = compute_and_memory_ms(verify)
        return SpecEstimate(
            batch, self.k, self.draft, self.rates, 1.0 + sum(self.rates), self.plain(batch).floor_ms,
            verify.floor_ms, self.draft_ms(batch), compute_ms, memory_ms,
        )  # fmt: skip


def _setup(
    shape: ModelShape,
    gpu: GPUSpec | str,
    k: int,
    acceptance: float | Sequence[float],
    context: int,
    draft: str,
    layout: dict,
) -> _Setup:
    if draft not in DRAFTS:
        raise RooftopError(f"unknown draft {draft!r}", f"use one of: {', '.join(DRAFTS)}")
    rates = acceptance_rates(k, acceptance)
    gpu = gpu_spec(gpu) if isinstance(gpu, str) else gpu
    return _Setup(shape, gpu, context, k, rates, draft, layout)


def compute_and_memory_ms(step: StepFloor) -> tuple[float, float]:
    """(FLOP time, device-memory time) of a step, each summed over its components; links left out."""
    compute = sum(c.compute_ms for c in step.components.values())
    memory = sum(c.memory_ms for name, c in step.components.items() if not name.startswith("comm_"))
    return compute, memory


def speculative_gain(
    shape: ModelShape,
    gpu: GPUSpec | str,
    batch: int,
    k: int,
    acceptance: float | Sequence[float],
    *,
    context: int,
    draft: str = "mtp",
    **layout,
) -> SpecEstimate:
    """Plain and speculative floors per output token at `batch` sequences of `context` cached tokens.

    `acceptance`: one rate (independent per position) or vLLM's per-position rates; `layout`:
    decode_costs's keywords (weight_dtype, kv_dtype, expert_dtype, tp, ep, context_capacity).
    """
    return _setup(shape, gpu, k, acceptance, context, draft, layout).estimate(batch)


def crossover_batch(
    shape: ModelShape,
    gpu: GPUSpec | str,
    k: int,
    acceptance: float | Sequence[float],
    *,
    context: int,
    draft: str = "mtp",
    max_batch: int = MAX_BATCH,
    **layout,
) -> Crossover:
    """Where the verify step (and plain decode) turns compute-bound, and the batches between which
    speculation pays (gain > 1).

    Compute-bound: doubling, then bisection (FLOP time grows linearly with the batch, read time no
    faster). The gain need not fall monotonically (an MoE verify step touches more experts at small
    batches), so it is read on the powers of two up to `max_batch` and each end refined by bisection.
    """
    s = _setup(shape, gpu, k, acceptance, context, draft, layout)

    def bound(step_floor: Callable[[int], StepFloor]) -> Callable[[int], bool]:
        def crossed(batch: int) -> bool:
            compute_ms, memory_ms = compute_and_memory_ms(step_floor(batch))
            return compute_ms >= memory_ms

        return crossed

    def pays(batch: int) -> bool:
        return s.estimate(batch).gain > 1.0

    grid = [1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch] + [max_batch]
    paying = [i for i, batch in enumerate(grid) if pays(batch)]
    first = last = None
    if paying:
        i = paying[0]
        first = grid[i] if i == 0 else _bisect(pays, grid[i - 1], grid[i])
        j = paying[-1]
        last = None if j == len(grid) - 1 else _bisect(lambda b: not pays(b), grid[j], grid[j + 1])
    return Crossover(
        k,
        first_batch(bound(s.verify), max_batch),
        first_batch(bound(s.plain), max_batch),
        first,
        last if paying else 1,
        max_batch,
    )


def first_batch(crossed: Callable[[int], bool], max_batch: int) -> int | None:
    """Smallest batch in [1, max_batch] where `crossed` holds, for a `crossed` that stays true once true."""
    low, high = 0, 1  # crossed(low) is false (0 stands for "none tried"), crossed(high) unknown
    while not crossed(high):
        if high >= max_batch:
            return None
        low, high = high, min(2 * high, max_batch)
    return _bisect(crossed, low, high)


def _bisect(crossed: Callable[[int], bool], low: int, high: int) -> int:
    """Smallest batch in (low, high] where `crossed` holds, given it fails at low and holds at high."""
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if crossed(mid) else (mid, high)
    return high


def speculative_report(
    shape: ModelShape,
    gpu: GPUSpec | str,
    concurrencies: Iterable[int],
    k: int,
    acceptance: float | Sequence[float],
    *,
    context: int,
    draft: str = "mtp",
    max_batch: int = MAX_BATCH,
    **layout,
) -> SpecReport:
    """speculative_gain at each concurrency (one sequence per concurrent request), the crossovers, notes."""
    s = _setup(shape, gpu, k, acceptance, context, draft, layout)
    concurrencies = list(concurrencies)
    for c in concurrencies:
        if isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 1:
            raise RooftopError(f"concurrency must be a positive integer, got {c!r}", "pass --concurrency >= 1")
    levels = [s.estimate(c) for c in concurrencies]
    cross = crossover_batch(
        shape, s.gpu, k, s.rates, context=context, draft=draft, max_batch=max_batch, **layout
    )
    notes = speculation_notes(shape, k, draft, context)
    return SpecReport(draft, s.rates, 1.0 + sum(s.rates), levels, cross, notes)


def speculation_notes(shape: ModelShape, k: int, draft: str, context: int) -> list[str]:
    """What the estimate assumed for this model and draft."""
    notes = []
    if draft == "ngram":
        notes.append("ngram drafts are prompt lookups on the host: no device time is counted for the draft")
    elif not shape.mtp_layers:
        notes.append(
            "the config has no num_nextn_predict_layers: the draft is costed as a DeepSeek MTP module "
            "(one decoder layer like the last, eh_proj, the LM head), run once per draft token"
        )
    elif shape.mtp_layers < k:
        notes.append(
            f"{shape.mtp_layers} MTP layer(s) draft {k} tokens: the layer runs {k} times, as vLLM reuses it"
        )
    if shape.indexer_layers and any(shape.indexer_layers) and context > shape.index_topk > 0:
        notes.append(
            f"DSA: the {k + 1} queries of a sequence are taken to pick the same top-{shape.index_topk} "
            "positions (one cache read); disjoint picks would read up to k+1 times as much"
        )
    return notes
