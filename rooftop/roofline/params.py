"""Total and active parameters, with embeddings, LM head, tied embeddings and MTP layers apart."""

from dataclasses import dataclass

from rooftop.roofline.config import ModelShape
from rooftop.roofline.weights import (
    attention_linears,
    expert_params,
    indexer_linears,
    layer_small_params,
    mlp_linears,
)


@dataclass(slots=True)
class Params:
    """Parameter counts in elements. `total` and `active` are the main model; MTP is apart."""

    total: int
    active: int  # per token: everything but the routed experts not chosen (embedding table included)
    active_non_embedding: int  # `active` less the input embedding table (a token reads one row)
    embedding: int
    lm_head: int  # 0 when tied to the embedding
    tied_embeddings: bool
    mtp: int  # next-token-prediction layers, with the embedding and head copies the checkpoint stores
    attention: int
    indexer: int
    dense_mlp: int
    routed_experts: int
    routed_experts_active: int
    shared_experts: int
    router: int
    norms: int


def count_params(shape: ModelShape) -> Params:
    """Count the parameters of `shape` by component."""
    sums = {"attn_proj": 0, "indexer": 0, "dense_mlp": 0, "shared_experts": 0, "router": 0}
    norms = shape.hidden_size * (2 if shape.norm_bias else 1)  # final norm
    routed = routed_active = 0
    for layer in range(shape.num_layers):
        for lin in (
            attention_linears(shape, layer) + indexer_linears(shape, layer) + mlp_linears(shape, layer)
        ):
            sums[lin.component] += lin.params
        norms += layer_small_params(shape, layer)
        if shape.moe_layers[layer]:
            routed += shape.n_routed_experts * expert_params(shape)
            routed_active += shape.experts_per_token * expert_params(shape)
    embedding = shape.vocab_size * shape.hidden_size
    lm_head = 0 if shape.tie_word_embeddings else embedding
    total = sum(sums.values()) + norms + routed + embedding + lm_head
    active = total - routed + routed_active
    return Params(
        total=total,
        active=active,
        active_non_embedding=active - (0 if shape.tie_word_embeddings else embedding),
        embedding=embedding,
        lm_head=lm_head,
        tied_embeddings=shape.tie_word_embeddings,
        mtp=_mtp_params(shape),
        attention=sums["attn_proj"],
        indexer=sums["indexer"],
        dense_mlp=sums["dense_mlp"],
        routed_experts=routed,
        routed_experts_active=routed_active,
        shared_experts=sums["shared_experts"],
        router=sums["router"],
        norms=norms,
    )


def _mtp_params(shape: ModelShape) -> int:
    """One MTP module: a decoder layer like the last one, eh_proj, three norms, embedding and head copies."""
    if not shape.mtp_layers:
        return 0
    last = shape.num_layers - 1
    layer = sum(
        lin.params
        for lin in attention_linears(shape, last) + indexer_linears(shape, last) + mlp_linears(shape, last)
    )
    layer += layer_small_params(shape, last)
    if shape.moe_layers[last]:
        layer += shape.n_routed_experts * expert_params(shape)
    h = shape.hidden_size
    extra = 2 * h * h + 3 * h + 2 * shape.vocab_size * h
    return shape.mtp_layers * (layer + extra)
