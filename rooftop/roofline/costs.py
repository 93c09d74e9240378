"""Bytes moved and FLOPs per component of one prefill or decode step, per GPU, for a dtype and TP/EP layout."""

import numbers
from dataclasses import dataclass, field

from rooftop.errors import RooftopError
from rooftop.roofline.attention import (
    decode_attention,
    decode_indexer,
    kv_heads_per_gpu,
    prefill_attention,
    prefill_indexer,
)
from rooftop.roofline.config import ModelShape
from rooftop.roofline.dtypes import (
    ACT_BYTES,
    compute_dtype,
    kv_element_bytes,
    normalize_dtype,
    tensor_bytes,
)
from rooftop.roofline.experts import expected_distinct_experts
from rooftop.roofline.quant import left_unquantized, module_names
from rooftop.roofline.weights import Linear, attention_linears, expert_params, indexer_linears, mlp_linears

COMPONENTS = (
    "embedding",
    "attn_proj",
    "attn_core",
    "indexer",
    "dense_mlp",
    "shared_experts",
    "routed_experts",
    "norms",
    "lm_head",
    "comm_tp",
    "comm_ep",
)

HEAD_DTYPE = "bf16"  # embeddings, LM head and router stay 16-bit in fp8/fp4/int4 checkpoints


@dataclass(slots=True)
class ComponentCost:
    """Bytes and FLOPs of one component in one step, on one GPU."""

    bytes: float = 0.0
    flops: float = 0.0
    compute_dtype: str = "bf16"  # the peak its FLOPs are held against
    medium: str = "hbm"  # "hbm": device memory; "link": GPU-to-GPU interconnect

    def add(self, bytes_: float, flops: float = 0.0) -> None:
        """Accumulate bytes and FLOPs."""
        self.bytes += bytes_
        self.flops += flops


@dataclass(slots=True)
class StepCost:
    """One step of `phase` ("decode", "verify" or "prefill") on one GPU, by component."""

    phase: str
    batch: int
    tokens: int  # tokens in the step (decode: batch; verify: batch x (k+1); prefill: batch x input_len)
    context: int  # decode: KV length per sequence; prefill: input length
    components: dict[str, ComponentCost] = field(default_factory=dict)
    scored_context: int = 0  # positions the indexer scores per sequence (context or capacity)

    @property
    def bytes(self) -> float:
        """Bytes over all components (device memory and link together)."""
        return sum(c.bytes for c in self.components.values())

    @property
    def flops(self) -> float:
        """FLOPs over all components."""
        return sum(c.flops for c in self.components.values())


@dataclass(slots=True)
class Layout:
    """Dtypes and parallel sizes a step is costed for."""

    weight_dtype: str
    expert_dtype: str
    kv_dtype: str
    tp: int
    ep: int


def decode_costs(
    shape: ModelShape,
    batch: int,
    context: int,
    *,
    weight_dtype: str = "auto",
    kv_dtype: str = "bf16",
    tp: int = 1,
    ep: int = 1,
    context_capacity: int | None = None,
    expert_dtype: str | None = None,
    queries_per_seq: int = 1,
) -> StepCost:
    """One decode step: `batch` sequences, each adding `queries_per_seq` tokens to `context` cached tokens.

    With `context_capacity`, the indexer scores the allocated capacity instead of the actual context,
    as CUDA-graph-safe indexers that size their work by the configured maximum do. `queries_per_seq`
    k+1 is a speculative verify step (k drafted tokens and the last accepted one): the weights are read
    once for batch x (k+1) tokens, every position goes through the LM head, and the queries of a sequence
    share one read of its cache while each does a decode query's arithmetic.
    """
    layout = make_layout(shape, weight_dtype, expert_dtype, kv_dtype, tp, ep)
    _check_positive(batch=batch, context=context, queries_per_seq=queries_per_seq)
    if context_capacity is not None and context_capacity < context:
        raise RooftopError(
            f"context capacity {context_capacity} is below the context {context}",
            "pass a --context-capacity at least as large as --context",
        )
    scored = context_capacity or context
    tokens, queries = batch * queries_per_seq, queries_per_seq
    step = _new_step(shape, "decode" if queries == 1 else "verify", batch, tokens, context, layout)
    step.scored_context = scored
    _weights(shape, step, tokens, layout)
    for layer in range(shape.num_layers):
        bytes_, flops = decode_attention(shape, layer, batch, context, layout.tp, layout.kv_dtype)
        step.components["attn_core"].add(bytes_, flops * queries)
        if shape.layer_has_indexer(layer):
            bytes_, flops = decode_indexer(shape, layer, batch, scored, layout.kv_dtype)
            step.components["indexer"].add(bytes_, flops * queries)
    _edges(shape, step, tokens=tokens, head_tokens=tokens, layout=layout)
    return step


def prefill_costs(
    shape: ModelShape,
    batch: int,
    input_len: int,
    *,
    weight_dtype: str = "auto",
    kv_dtype: str = "bf16",
    tp: int = 1,
    ep: int = 1,
    expert_dtype: str | None = None,
) -> StepCost:
    """One prefill step: `batch` sequences of `input_len` new tokens each, nothing cached before."""
    layout = make_layout(shape, weight_dtype, expert_dtype, kv_dtype, tp, ep)
    _check_positive(batch=batch, input_len=input_len)
    tokens = batch * input_len
    step = _new_step(shape, "prefill", batch, tokens, input_len, layout)
    step.scored_context = input_len
    _weights(shape, step, tokens, layout)
    for layer in range(shape.num_layers):
        step.components["attn_core"].add(
            *prefill_attention(shape, layer, batch, input_len, layout.tp, layout.kv_dtype)
        )
        if shape.layer_has_indexer(layer):
            step.components["indexer"].add(*prefill_indexer(shape, layer, batch, input_len, layout.kv_dtype))
    # Only the last position of each sequence goes through the LM head.
    _edges(shape, step, tokens=tokens, head_tokens=batch, layout=layout)
    return step


def make_layout(
    shape: ModelShape, weight_dtype: str, expert_dtype: str | None, kv_dtype: str, tp: int, ep: int
) -> Layout:
    """The dtypes and parallel sizes a step is costed for ("auto": the checkpoint's), checked."""
    _check_positive(tp=tp, ep=ep)
    if tp % ep:
        raise RooftopError(
            f"--ep {ep} does not divide --tp {tp}",
            "expert parallelism runs inside the tensor-parallel group: pick ep dividing tp",
        )
    if shape.num_heads % tp:
        raise RooftopError(
            f"{shape.num_heads} attention heads do not split over --tp {tp}",
            "pick a TP size that divides the head count",
        )
    weight = shape.weight_dtype if weight_dtype == "auto" else normalize_dtype(weight_dtype)
    if expert_dtype in (None, "auto"):
        expert = shape.expert_dtype if weight_dtype == "auto" else weight
    else:
        expert = normalize_dtype(expert_dtype)
    kv_element_bytes(kv_dtype)  # rejects KV dtypes the model does not cover
    return Layout(weight, expert, normalize_dtype(kv_dtype), tp, ep)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise RooftopError(
                f"{name} must be a positive integer, got {value!r}", f"pass --{name.replace('_', '-')} >= 1"
            )


def _new_step(
    shape: ModelShape, phase: str, batch: int, tokens: int, context: int, layout: Layout
) -> StepCost:
    weights = compute_dtype(layout.weight_dtype)
    experts = compute_dtype(layout.expert_dtype)
    index = "fp8" if layout.kv_dtype == "fp8" else "bf16"
    dtypes = {
        "attn_proj": weights,
        "dense_mlp": weights,
        "shared_experts": weights,
        "routed_experts": experts,
        "indexer": index,
        "norms": "fp32",
    }
    comps = {
        name: ComponentCost(
            compute_dtype=dtypes.get(name, "bf16"), medium="link" if name.startswith("comm_") else "hbm"
        )
        for name in COMPONENTS
    }
    return StepCost(phase, batch, tokens, context, comps)


def _shard(lin: Linear, shape: ModelShape, tp: int) -> tuple[float, float, float]:
    """(count, d_in, d_out) of the slice of `lin` one GPU holds."""
    if lin.shard == "col":
        return (lin.count / tp, lin.d_in, lin.d_out) if lin.count > 1 else (1, lin.d_in, lin.d_out / tp)
    if lin.shard == "row":
        return lin.count, lin.d_in / tp, lin.d_out
    if lin.shard == "kv":
        # KV heads split until each GPU holds one, then they are replicated.
        return lin.count, lin.d_in, lin.d_out / min(tp, shape.num_kv_heads)
    return lin.count, lin.d_in, lin.d_out


def linear_dtype(shape: ModelShape, layer: int, lin: Linear, layout: Layout) -> str:
    """The dtype weight `lin` of `layer` is read in: routers in 16 bits, what the quantization leaves
    alone (modules_to_not_convert / ignore) in the checkpoint's base dtype, the rest in the layout's."""
    if lin.component == "router":
        return HEAD_DTYPE
    if shape.quant_skip and left_unquantized(shape.quant_skip, module_names(lin.name, layer)):
        return shape.base_dtype
    return layout.weight_dtype


def expert_dtype(shape: ModelShape, layer: int, layout: Layout) -> str:
    """The dtype the routed experts of `layer` are read in."""
    if shape.quant_skip and left_unquantized(shape.quant_skip, module_names("experts", layer)):
        return shape.base_dtype
    return layout.expert_dtype


def component_dtypes(shape: ModelShape, layout: Layout) -> dict[str, str]:
    """Stored dtype of each weight-holding component; "a+b" where its layers or matrices differ."""
    seen: dict[str, list[str]] = {}
    for layer in range(shape.num_layers):
        for lin in attention_linears(shape, layer) + indexer_linears(shape, layer) + mlp_linears(shape, layer):
            seen.setdefault(lin.component, []).append(linear_dtype(shape, layer, lin, layout))
        if shape.moe_layers[layer]:
            seen.setdefault("routed_experts", []).append(expert_dtype(shape, layer, layout))
    out = {name: "+".join(dict.fromkeys(dtypes)) for name, dtypes in seen.items()}
    return out | {"embedding": HEAD_DTYPE, "lm_head": HEAD_DTYPE}


def _weights(shape: ModelShape, step: StepCost, tokens: int, layout: Layout) -> None:
    """Every projection and MLP: its weights read once per step, its activations in and out."""
    comps = step.components
    elems_by_dtype: dict[str, dict[str, float]] = {}  # component -> stored dtype -> elements
    for layer in range(shape.num_layers):
        for lin in (
            attention_linears(shape, layer) + indexer_linears(shape, layer) + mlp_linears(shape, layer)
        ):
            count, d_in, d_out = _shard(lin, shape, layout.tp)
            elems = count * d_in * d_out
            dtype = linear_dtype(shape, layer, lin, layout)
            name = "routed_experts" if lin.component == "router" else lin.component
            comps[name].add(
                tensor_bytes(elems, dtype, n_tensors=max(1, round(count)))
                + tokens * count * (d_in + d_out) * ACT_BYTES,
                2.0 * tokens * elems,
            )
            by_dtype = elems_by_dtype.setdefault(name, {})
            by_dtype[dtype] = by_dtype.get(dtype, 0.0) + elems
        if shape.moe_layers[layer]:
            dtype = expert_dtype(shape, layer, layout)
            _routed_experts(shape, step, tokens, layout, dtype)
            by_dtype = elems_by_dtype.setdefault("routed_experts", {})
            by_dtype[dtype] = by_dtype.get(dtype, 0.0) + shape.n_routed_experts * expert_params(shape)
    # A component's matmuls are held to the peak of the dtype most of its weight elements are in
    # (the indexer's to its scoring dtype, set from the KV dtype).
    for name, by_dtype in elems_by_dtype.items():
        if name != "indexer":
            comps[name].compute_dtype = compute_dtype(max(by_dtype, key=by_dtype.get))


def _routed_experts(shape: ModelShape, step: StepCost, tokens: int, layout: Layout, dtype: str) -> None:
    """Experts of one MoE layer: only the distinct experts the batch touches are read.

    EP runs inside the TP group: a GPU holds E/ep experts, each split tp/ep ways, so its expected
    share is distinct/ep experts of 1/(tp/ep) each: distinct/tp expert-equivalents either way.
    """
    k, width = shape.experts_per_token, shape.moe_intermediate_size
    distinct = expected_distinct_experts(shape.n_routed_experts, k, tokens)
    one_expert = tensor_bytes(expert_params(shape), dtype, n_tensors=3)
    act = tokens * k * (2 * shape.hidden_size + 3 * width) * ACT_BYTES
    step.components["routed_experts"].add(
        (distinct * one_expert + act) / layout.tp, 2.0 * tokens * k * expert_params(shape) / layout.tp
    )


def _edges(shape: ModelShape, step: StepCost, tokens: int, head_tokens: int, layout: Layout) -> None:
    """Embedding rows, norms, LM head, and the TP/EP communication."""
    comps, tp, h = step.components, layout.tp, shape.hidden_size
    vocab_g = shape.vocab_size / tp  # vocab-parallel embedding and LM head
    head_bytes = tensor_bytes(1, HEAD_DTYPE)
    # A lookup reads only the rows of the batch's tokens (those in this GPU's vocab shard).
    comps["embedding"].add(tokens / tp * h * head_bytes + tokens * h * ACT_BYTES)
    comps["lm_head"].add(
        vocab_g * h * head_bytes + head_tokens * (h * ACT_BYTES + vocab_g * 4),
        2.0 * head_tokens * vocab_g * h,
    )
    norm_width = h + shape.num_layers * (shape.norms_per_layer * h + _extra_norm_width(shape, tp))  # final + per layer
    # RMSNorm reads and writes its input; V4's hyper-connections read and write hc_mult residual
    # streams around each of the two sub-blocks of a layer.
    hc_width = 2 * shape.hc_mult * h * shape.num_layers
    comps["norms"].add(
        tokens * (norm_width + hc_width) * 2 * ACT_BYTES, tokens * (norm_width + hc_width) * 4.0
    )
    if tp > 1:
        ring = 2.0 * (tp - 1) / tp
        reduces = 1 + sum(1 + (0 if (moe and layout.ep > 1) else 1) for moe in shape.moe_layers)
        comps["comm_tp"].add(
            reduces * ring * tokens * h * ACT_BYTES + head_tokens * shape.vocab_size * 4 * (tp - 1) / tp
        )  # logits all-gather
    if layout.ep > 1:
        ep, k = layout.ep, shape.experts_per_token
        # DeepEP-style: a GPU owns tokens/ep tokens and sends the copies bound for other GPUs, twice.
        per_layer = 2 * (tokens / ep) * k * h * ACT_BYTES * (ep - 1) / ep
        comps["comm_ep"].add(per_layer * sum(shape.moe_layers))


def _extra_norm_width(shape: ModelShape, tp: int) -> float:
    width = 0.0
    if shape.qk_norm:
        width += (shape.num_heads / tp + kv_heads_per_gpu(shape, tp)) * shape.head_dim
    if shape.attention == "mla":
        width += shape.q_lora_rank + shape.kv_lora_rank
    if shape.attention == "csa":
        width += shape.q_lora_rank + shape.head_dim
    return width
