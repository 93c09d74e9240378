"""Collapse module paths (M_0/Layer_3/Attn_3/Indexer_3/Linear_7) to component names (indexer).

A path's component is the most specific one found anywhere in it, by priority: the indexer inside
attention is the indexer, a norm inside the indexer is still the indexer, an MLP inside MoE is MoE.
"""

import re

COMPONENTS = ("indexer", "attention", "moe", "mlp", "norm", "embedding", "lm_head", "sampler", "runtime", "cuda_graph",
              "other")

# (component, pattern on one lower-cased path segment), highest priority first.
_SEGMENT_RULES = [
    ("indexer", re.compile(r"indexer")),
    ("sampler", re.compile(r"sampl")),
    ("lm_head", re.compile(r"lm_?head|lmhead|output_?head|logits")),
    # a rotary embedding is part of attention (vLLM's RotaryEmbedding sits inside the attention module)
    ("attention", re.compile(r"rotary|^rope")),
    ("embedding", re.compile(r"embed")),
    ("moe", re.compile(r"moe|expert|router|gate$|moegate")),
    ("attention", re.compile(r"attn|attention|mla|self_attn")),
    ("mlp", re.compile(r"mlp|feedforward|feed_forward|ffn")),
    ("norm", re.compile(r"norm")),
]
_INSTANCE = re.compile(r"_\d+$")
_INDEX = re.compile(r"(?<=[./])\d+(?=[./]|$)|^\d+(?=[./])")


def segment_class(segment: str) -> str:
    """`Indexer_3` -> `Indexer` (Kineto numbers module instances per class)."""
    return _INSTANCE.sub("", segment)


_ROOT_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "Model")


def family_prefix(root: str) -> str:
    """The model family's prefix of a root module class: `Qwen3MoeForCausalLM` -> `Qwen3Moe`."""
    name = segment_class(root)
    for suffix in _ROOT_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return ""


def component_of(path: tuple[str, ...]) -> str:
    """The component name of a module path (a tuple of segments, outermost first). The empty path is
    work in a step outside every module: the engine's own runtime (input preparation, bookkeeping).

    The model family's name is taken off every class first: in `Qwen3MoeAttention` the family says
    "MoE" and the class says attention (`Qwen3MoeDecoderLayer` is no MoE at all)."""
    if not path:
        return "runtime"
    prefix = family_prefix(path[0])
    best = len(_SEGMENT_RULES)
    for segment in path:
        name = segment_class(segment)
        if prefix and name.startswith(prefix) and len(name) > len(prefix):
            name = name[len(prefix):]
        low = name.lower()
        for rank, (_, pattern) in enumerate(_SEGMENT_RULES[:best]):
            if pattern.search(low):
                best = rank
                break
    if best < len(_SEGMENT_RULES):
        return _SEGMENT_RULES[best][0]
    # Kineto names modules by class only: a Linear called directly by the root model is its lm_head.
    if len(path) == 2 and segment_class(path[1]) == "Linear":
        return "lm_head"
    return "other"


def generic_path(path: tuple[str, ...]) -> str:
    """A path with instance and layer numbers removed, so all layers' indexers read the same."""
    return "/".join(_INDEX.sub("*", segment_class(s)) for s in path)
