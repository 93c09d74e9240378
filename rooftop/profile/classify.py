"""Kernel and CPU-op classification by name: a category, an execution unit, and the rule that fired.

Rules are tried in order; the first whose pattern matches (and whose arch list, if any, holds the
trace's arch) wins. Order matters: `index_elementwise` is an index kernel before it is elementwise.
"""

import re
from dataclasses import dataclass

CATEGORIES = (
    "gemm",
    "attention",
    "moe",
    "communication",
    "elementwise",
    "reduction",
    "copy/cast",
    "index/gather",
    "memcpy/memset",
    "other",
)
TENSOR, CUDA_CORE, UNKNOWN, CPU = "tensor core", "CUDA core", "unknown", "CPU"


@dataclass(slots=True, frozen=True)
class Classification:
    """What a kernel (or CPU op) is, where it runs, and which rule said so."""

    category: str
    unit: str
    rule: str


# (rule name, regex on the kernel name, category, unit, archs where the rule applies or None for all)
_KERNEL_RULES: list[tuple[str, str, str, str, tuple[str, ...] | None]] = [
    # A whole CUDA-graph replay from an nsys export traced without its nodes (nsys.GRAPH_EVENT): not one kernel.
    ("cuda graph (nodes not traced)", r"^CUDA graph \S+ \(nodes not traced\)$", "other", UNKNOWN, None),
    ("memcpy", r"^memcpy|^Memcpy|\bmemcpy", "memcpy/memset", UNKNOWN, None),
    ("memset", r"^memset|^Memset", "memcpy/memset", UNKNOWN, None),
    ("nccl", r"nccl|NCCL", "communication", CUDA_CORE, None),
    # Expert-parallel all-to-all by its library's namespace (DeepEP's `deep_ep::intranode::dispatch<...>`):
    # a bare `combine_kernel` is as likely a local reduction (the embedded MoE's `_combine_kernel`).
    ("custom all-reduce", r"cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|deep_?ep\b|"
     r"\b(intranode|internode|internode_ll)::(dispatch|combine)|pplx|nvshmem",
     "communication", CUDA_CORE, None),
    ("moe gemv (SIMT)", r"(moe|expert|slot).*gemv|gemv.*(moe|expert)", "moe", CUDA_CORE, None),
    ("moe grouped gemm", r"grouped_gemm|group_gemm|GroupedGemm|fused_moe|moe_.*(gemm|mm)|cutlass_moe|deep_gemm.*m_grouped|mxfp4.*moe|moe.*mxfp4",
     "moe", TENSOR, None),
    ("moe routing", r"moe|topk_softmax|topkGating|expert", "moe", CUDA_CORE, None),
    ("sparse mla (triton)", r"sparse.*decode|sparse_mla|sparse_attn|sparse.*attention", "attention", UNKNOWN, None),
    ("flash/fmha", r"flash|fmha|FlashMLA|flashmla|mha_fwd|mla_fwd|cudnn.*sdpa|xformers", "attention", TENSOR, None),
    ("flashinfer", r"flashinfer|BatchDecode|BatchPrefill|BatchMLA", "attention", TENSOR, None),
    ("attention (generic)", r"attention|attn|paged_|decode_kernel|_fwd_kernel", "attention", UNKNOWN, None),
    # Inductor's Triton matmul templates: a gemm; whether it ran on tensor cores its compiled code tells, not its name.
    ("inductor mm template", r"^triton_tem_.*(?:^|_)(?:mm|bmm|addmm)(?:_|$)", "gemm", UNKNOWN, None),
    ("fp32 SIMT gemm", r"sgemm|f32f32_f32f32_f32|gemmSN|gemv|gemvx|dot_kernel", "gemm", CUDA_CORE, None),
    ("sm100 tcgen05 gemm", r"tcgen05|sm100|utcmma|UTCMMA", "gemm", TENSOR, ("sm_100", "sm_103")),
    ("sm120 gemm", r"sm120|mxf4|mxf8|nvfp4", "gemm", TENSOR, ("sm_120", "sm_121")),
    ("sm90 wgmma gemm", r"wgmma|sm90|nvjet|HGMMA|gmma", "gemm", TENSOR, ("sm_90",)),
    ("sm80 mma gemm", r"ampere|sm80|s16816|s1688", "gemm", TENSOR, ("sm_80", "sm_86", "sm_89", "sm_90", "sm_120")),
    ("deep_gemm", r"deep_gemm|fp8_gemm", "gemm", TENSOR, None),
    ("cublas/cutlass gemm", r"gemm|Gemm|GEMM|cutlass|cublas|xmma|nvjet|splitKreduce|_mm_|matmul", "gemm", TENSOR, None),
    ("index/gather", r"index_elementwise|indexSelect|index_select|gather|scatter|embedding|index_put|indexing",
     "index/gather", CUDA_CORE, None),
    ("copy/cast", r"direct_copy|copy_kernel|CatArray|(?<!broad)cast|convert|_to_copy|transpose|permute", "copy/cast", CUDA_CORE, None),
    ("norm", r"norm|Norm", "reduction", CUDA_CORE, None),
    ("softmax", r"softmax|SoftMax", "reduction", CUDA_CORE, None),
    ("reduce", r"reduce_kernel|reduce|Reduce|triton_red_|triton_per_|argmax|sum_kernel", "reduction", CUDA_CORE, None),
    ("topk/sort", r"topk|sort|radix|Sort", "other", CUDA_CORE, None),
    ("elementwise", r"elementwise|triton_poi_|vectorized|unrolled|silu|gelu|act_and_mul|rotary|rope|fill", "elementwise",
     CUDA_CORE, None),
    ("triton (unknown)", r"^triton_|_kernel$", "other", UNKNOWN, None),
]

# CPU ops are matched on their name without the namespace (`aten::mm` -> `mm`, `_C::onednn_mm` ->
# `onednn_mm`), whole name or whole "_"-separated words: `ne` is aten::ne, never the "ne" in "onednn".
_W = r"(?:^|_)"  # a word starts at the beginning or after "_"
_E = r"(?:_|$)"  # and ends at "_" or the end
_OP_RULES: list[tuple[str, str, str]] = [
    # Inductor-generated kernels (cpp_fused_* on CPU, seen with TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1;
    # triton_* on GPU): named after the aten ops they fuse, so a fused reduction is a reduction.
    ("op: generated reduction", rf"{_W}(cpp|triton)_(fused|red|per)_.*{_W}(mean|sum|amax|amin|max|softmax|_softmax|"
     rf"rsqrt|var|norm|argmax|logsumexp){_E}", "reduction"),
    ("op: generated mm template", rf"^triton_tem_.*{_W}(mm|bmm|addmm){_E}", "gemm"),
    ("op: generated elementwise", rf"{_W}(cpp|triton)_(fused|poi)_", "elementwise"),
    ("op: compiled-graph runtime", r"^## Call CompiledFxGraph|^Pregraph bytecode|^AOTDispatcher|^Torch-Compiled Region|"
     r"^CompiledFunction|^TorchDynamo", "other"),
    ("op: communication", rf"^(c10d|nccl|_c10d_functional)::|{_W}(all_?reduce|allreduce|all_?gather|reduce_?scatter|"
     rf"all_?to_?all|broadcast){_E}", "communication"),
    ("op: attention", rf"scaled_dot_product|{_W}(attention|attn|sdpa|flash|fmha|mla|paged|kv_cache|reshape_and_cache|"
     rf"concat_and_cache){_E}", "attention"),
    ("op: moe", rf"{_W}(moe|experts?|grouped_mm|grouped){_E}", "moe"),
    # matmuls of every backend: aten, oneDNN (vLLM on CPU), cuBLAS/CUTLASS scaled mm, Marlin/GPTQ/AWQ gemm
    ("op: gemm", rf"^(mm|bmm|addmm|baddbmm|addbmm|matmul|linear|einsum|dot|mv|addmv|_int_mm|_scaled_mm|"
     rf"_weight_int\w*_mm)$|{_W}(mm|gemm|gemv|matmul|linear){_E}", "gemm"),
    ("op: rotary", rf"{_W}(rotary|rope){_E}", "elementwise"),
    ("op: index/gather", rf"{_W}(index|index_select|index_put|gather|scatter|embedding|take|masked_select|nonzero)"
     rf"(_|$)", "index/gather"),
    ("op: copy/cast", r"^(copy_|_to_copy|to|clone|contiguous|cat|stack|_reshape_copy|_copy_from|_copy_from_and_resize|"
     r"convert_\w+|transpose_copy)$", "copy/cast"),
    ("op: memset", r"^(fill_|zero_|zeros|zeros_like|empty|empty_like|empty_strided|ones|ones_like|full|full_like|"
     r"new_empty|new_zeros|new_full)$", "memcpy/memset"),
    ("op: reduction", rf"^(sum|mean|amax|amin|max|min|_?softmax|_?log_softmax|norm|linalg_vector_norm|topk|sort|argsort|"
     rf"argmax|argmin|cumsum|prod|var|std|logsumexp|all|any|native_layer_norm|layer_norm|group_norm|rms_norm|"
     rf"_fused_rms_norm)$|{_W}(rms_?norm|layer_?norm|norm){_E}", "reduction"),
    ("op: elementwise", r"^(add|sub|rsub|mul|div|relu|gelu|silu|sigmoid|tanh|exp|log|pow|sqrt|rsqrt|clamp|clamp_min|"
     r"clamp_max|neg|abs|masked_fill|cos|sin|where|minimum|maximum|eq|ne|lt|gt|le|ge|reciprocal|square|erf|"
     r"bitwise_\w+|logical_\w+|lerp|addcmul|addcdiv)_?$|^(silu|gelu|gelu_tanh|gelu_fast|fatrelu|swigluoai)_and_mul$|"
     r"^act_and_mul$", "elementwise"),
]

_COMPILED = [(rule, re.compile(pat), cat, unit, archs) for rule, pat, cat, unit, archs in _KERNEL_RULES]
_OP_COMPILED = [(rule, re.compile(pat), cat) for rule, pat, cat in _OP_RULES]


def classify_kernel(name: str, arch: str | None = None, *, kind: int = 0) -> Classification:
    """Category and execution unit of a GPU kernel by its name on `arch` (sm_80/90/100/120)."""
    if kind == 1:
        return Classification("memcpy/memset", UNKNOWN, "memcpy event")
    if kind == 2:
        return Classification("memcpy/memset", UNKNOWN, "memset event")
    for rule, pattern, category, unit, archs in _COMPILED:
        if archs is not None and arch is not None and arch not in archs:
            continue
        if pattern.search(name):
            return Classification(category, unit, rule)
    return Classification("other", UNKNOWN, "no rule")


def classify_op(name: str) -> Classification:
    """Category of a CPU operator by name; its unit is the CPU (traces without kernels)."""
    base = name.rsplit("::", 1)[-1]
    for rule, pattern, category in _OP_COMPILED:
        if pattern.search(base) or pattern.search(name):
            return Classification(category, CPU, rule)
    return Classification("other", CPU, "no rule")
