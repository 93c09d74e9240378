"""The weight matrices of a model, layer by layer, tagged with the component that reads them.

params.py counts them and costs.py turns them into bytes and FLOPs, so the two cannot disagree.
"""

from dataclasses import dataclass

from rooftop.roofline.config import ModelShape


@dataclass(slots=True)
class Linear:
    """`count` matrices of d_in x d_out elements; `shard` says how tensor parallelism splits them."""

    name: str
    component: str  # attn_proj | indexer | dense_mlp | shared_experts | router
    d_in: int
    d_out: int
    shard: str  # "col" (output split), "row" (input split), "kv" (split by KV head), "rep" (replicated)
    bias: bool = False
    count: int = 1

    @property
    def params(self) -> int:
        """Elements held, biases included."""
        return self.count * (self.d_in * self.d_out + (self.d_out if self.bias else 0))


def attention_linears(shape: ModelShape, layer: int) -> list[Linear]:
    """Projections of one attention block (query, key/value or latent, output, V4 compressor)."""
    h, heads = shape.hidden_size, shape.num_heads
    if shape.attention == "gqa":
        kv = shape.num_kv_heads * shape.head_dim
        return [
            Linear("q_proj", "attn_proj", h, heads * shape.head_dim, "col", shape.qkv_bias),
            Linear("k_proj", "attn_proj", h, kv, "kv", shape.qkv_bias),
            Linear("v_proj", "attn_proj", h, kv, "kv", shape.qkv_bias),
            Linear("o_proj", "attn_proj", heads * shape.head_dim, h, "row", shape.o_bias),
        ]
    rope, latent = shape.qk_rope_head_dim, shape.kv_lora_rank
    out = []
    if shape.q_lora_rank:
        out.append(Linear("q_a_proj", "attn_proj", h, shape.q_lora_rank, "rep"))
        q_in = shape.q_lora_rank
    else:
        q_in = h
    if shape.attention == "mla":
        out += [
            Linear(
                "q_b_proj" if shape.q_lora_rank else "q_proj",
                "attn_proj",
                q_in,
                heads * (shape.qk_nope_head_dim + rope),
                "col",
            ),
            # The latent down-projection is shared by all heads, so every TP rank holds all of it.
            Linear("kv_a_proj", "attn_proj", h, latent + rope, "rep"),
            Linear(
                "kv_b_proj", "attn_proj", latent, heads * (shape.qk_nope_head_dim + shape.v_head_dim), "col"
            ),
            Linear("o_proj", "attn_proj", heads * shape.v_head_dim, h, "row"),
        ]
        return out
    # DeepSeek-V4: one K=V head, grouped low-rank output projection, a compressor on c4/c128 layers.
    hd = shape.head_dim
    out += [
        Linear("wq_b", "attn_proj", q_in, heads * hd, "col"),
        Linear("wkv", "attn_proj", h, hd, "rep"),
        Linear(
            "wo_a", "attn_proj", heads * hd // shape.o_groups, shape.o_lora_rank, "col", count=shape.o_groups
        ),
        Linear("wo_b", "attn_proj", shape.o_groups * shape.o_lora_rank, h, "row"),
    ]
    ratio = shape.compress_ratio(layer)
    if ratio:
        width = _compressor_width(ratio) * hd
        out += [
            Linear("compressor_wkv", "attn_proj", h, width, "rep"),
            Linear("compressor_wgate", "attn_proj", h, width, "rep"),
        ]
    return out


def _compressor_width(ratio: int) -> int:
    # V4's ratio-4 compressor blends overlapping windows, so it projects to twice the head width.
    return 2 if ratio == 4 else 1


def indexer_linears(shape: ModelShape, layer: int) -> list[Linear]:
    """The lightning indexer's projections (empty for layers without one); replicated under TP."""
    if not shape.layer_has_indexer(layer):
        return []
    h, n, d = shape.hidden_size, shape.index_n_heads, shape.index_head_dim
    q_in = shape.q_lora_rank or h
    out = [
        Linear("index_wq", "indexer", q_in, n * d, "rep"),
        Linear("index_weights_proj", "indexer", h, n, "rep"),
    ]
    if shape.attention == "csa":
        out += [
            Linear("index_compressor_wkv", "indexer", h, 2 * d, "rep"),
            Linear("index_compressor_wgate", "indexer", h, 2 * d, "rep"),
        ]
    else:
        out.append(Linear("index_wk", "indexer", h, d, "rep"))
    return out


def mlp_linears(shape: ModelShape, layer: int) -> list[Linear]:
    """Dense MLP, shared experts and router of one layer (routed experts are counted apart)."""
    h = shape.hidden_size
    if not shape.moe_layers[layer]:
        if not shape.gated_mlp:
            width = shape.intermediate_size
            return [
                Linear("dense_mlp.up", "dense_mlp", h, width, "col", shape.mlp_bias),
                Linear("dense_mlp.down", "dense_mlp", width, h, "row", shape.mlp_bias),
            ]
        return _swiglu("dense_mlp", h, shape.intermediate_size, shape.mlp_bias)
    out = [Linear("router", "router", h, shape.n_routed_experts, "rep", bias=shape.router_bias)]
    if shape.shared_expert_intermediate_size:
        out += _swiglu("shared_experts", h, shape.shared_expert_intermediate_size)
    return out


def _swiglu(component: str, h: int, width: int, bias: bool = False) -> list[Linear]:
    return [
        Linear(f"{component}.gate_up", component, h, 2 * width, "col", bias),
        Linear(f"{component}.down", component, width, h, "row", bias),
    ]


def expert_params(shape: ModelShape) -> int:
    """Elements of one routed expert (gate, up, down)."""
    return 3 * shape.hidden_size * shape.moe_intermediate_size


def layer_small_params(shape: ModelShape, layer: int) -> int:
    """Norm weights and other vectors of one layer (no matmul behind them)."""
    h, hd = shape.hidden_size, shape.head_dim
    n = shape.norms_per_layer * h * (2 if shape.norm_bias else 1)
    if shape.qk_norm:
        n += 2 * hd
    if shape.attention == "mla":
        n += shape.q_lora_rank + shape.kv_lora_rank
        if shape.layer_has_indexer(layer):
            # V3.2 normalises the indexer key with a LayerNorm (weight and bias); the embedded
            # engine with a weight-only norm.
            n += shape.index_head_dim * (1 if shape.model_type == "rooftop_dsa" else 2)
    if shape.attention == "csa":
        n += shape.q_lora_rank + hd + shape.num_heads  # q_norm, kv_norm, attention sinks
        ratio = shape.compress_ratio(layer)
        if ratio:
            n += ratio * _compressor_width(ratio) * hd + hd  # positional bias, norm
        if shape.layer_has_indexer(layer):
            n += 4 * 2 * shape.index_head_dim + shape.index_head_dim
        if shape.hc_mult:
            # Hyper-connections: per sub-block a (2+m)*m x (m*h) mixing matrix, its base and 3 scales.
            m = shape.hc_mult
            n += 2 * ((2 + m) * m * m * h + (2 + m) * m + 3)
    return n


def model_dims(shape: ModelShape) -> set[int]:
    """Every width a weight of the model has (matrix sides, hidden, vocabulary, latent, experts):
    tensor dimensions the model's own size explains, whatever the context capacity."""
    dims = {shape.hidden_size, shape.vocab_size, shape.intermediate_size, shape.moe_intermediate_size,
            2 * shape.moe_intermediate_size, shape.n_routed_experts, shape.num_heads * shape.head_dim,
            shape.kv_lora_rank, shape.kv_lora_rank + shape.qk_rope_head_dim, shape.q_lora_rank,
            shape.index_n_heads * shape.index_head_dim}
    for layer in range(shape.num_layers):
        for lin in attention_linears(shape, layer) + indexer_linears(shape, layer) + mlp_linears(shape, layer):
            dims |= {lin.d_in, lin.d_out}
    return {d for d in dims if d > 1}
