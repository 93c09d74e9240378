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
    ("memcpy", r"^memcpy|^Memcpy|\bmemcpy", "memcpy/memset", UNKNOWN, None),
    ("memset", r"^memset|^Memset", "memcpy/memset", UNKNOWN, None),
    ("nccl", r"nccl|NCCL", "communication", CUDA_CORE, None),
    ("custom all-reduce", r"cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|deepep|dispatch_kernel|combine_kernel",
     "communication", CUDA_CORE, None),
    ("moe gemv (SIMT)", r"(moe|expert|slot).*gemv|gemv.*(moe|expert)", "moe", CUDA_CORE, None),
    ("moe grouped gemm", r"grouped_gemm|group_gemm|GroupedGemm|fused_moe|moe_.*(gemm|mm)|cutlass_moe|deep_gemm.*m_grouped|mxfp4.*moe|moe.*mxfp4",
     "moe", TENSOR, None),
    ("moe routing", r"moe|topk_softmax|topkGating|expert", "moe", CUDA_CORE, None),
    ("sparse mla (triton)", r"sparse.*decode|sparse_mla|sparse_attn|sparse.*attention", "attention", UNKNOWN, None),
    ("flash/fmha", r"flash|fmha|FlashMLA|flashmla|mha_fwd|mla_fwd|cudnn.*sdpa|xformers", "attention", TENSOR, None),
    ("flashinfer", r"flashinfer|BatchDecode|BatchPrefill|BatchMLA", "attention", TENSOR, None),
    ("attention (generic)", r"attention|attn|paged_|decode_kernel|_fwd_kernel", "attention", UNKNOWN, None),
    ("fp32 SIMT gemm", r"sgemm|f32f32_f32f32_f32|gemmSN|gemv|gemvx|dot_kernel", "gemm", CUDA_CORE, None),
    ("sm100 tcgen05 gemm", r"tcgen05|sm100|utcmma|UTCMMA", "gemm", TENSOR, ("sm_100", "sm_103")),
    ("sm120 gemm", r"sm120|mxf4|mxf8|nvfp4", "gemm", TENSOR, ("sm_120", "sm_121")),
    ("sm90 wgmma gemm", r"wgmma|sm90|nvjet|HGMMA|gmma", "gemm", TENSOR, ("sm_90",)),
    ("sm80 mma gemm", r"ampere|sm80|s16816|s1688", "gemm", TENSOR, ("sm_80", "sm_86", "sm_89", "sm_90", "sm_120")),
    ("deep_gemm", r"deep_gemm|fp8_gemm", "gemm", TENSOR, None),
    ("cublas/cutlass gemm", r"gemm|Gemm|GEMM|cutlass|cublas|xmma|nvjet|splitKreduce|_mm_|matmul", "gemm", TENSOR, None),
    ("index/gather", r"index_elementwise|indexSelect|index_select|gather|scatter|embedding|index_put|indexing",
     "index/gather", CUDA_CORE, None),
    ("copy/cast", r"direct_copy|copy_kernel|CatArray|cast|convert|_to_copy|transpose|permute", "copy/cast", CUDA_CORE, None),
    ("norm", r"norm|Norm", "reduction", CUDA_CORE, None),
    ("softmax", r"softmax|SoftMax", "reduction", CUDA_CORE, None),
    ("reduce", r"reduce_kernel|reduce|Reduce|triton_red_|triton_per_|argmax|sum_kernel", "reduction", CUDA_CORE, None),
    ("topk/sort", r"topk|sort|radix|Sort", "other", CUDA_CORE, None),
    ("elementwise", r"elementwise|triton_poi_|vectorized|unrolled|silu|gelu|act_and_mul|rotary|rope|fill", "elementwise",
     CUDA_CORE, None),
    ("triton (unknown)", r"^triton_|_kernel$", "other", UNKNOWN, None),
]

_OP_RULES: list[tuple[str, str, str]] = [
    ("op: communication", r"c10d|nccl|all_reduce|allreduce|all_gather|reduce_scatter|all_to_all|broadcast", "communication"),
    ("op: attention", r"scaled_dot_product|attention|flash", "attention"),
    ("op: moe", r"moe|grouped_mm|_grouped", "moe"),
    ("op: gemm", r"aten::(mm|bmm|addmm|baddbmm|matmul|linear|_scaled_mm|einsum|dot|mv|addmv)$", "gemm"),
    ("op: index/gather", r"index|gather|scatter|embedding|take|masked_select|nonzero|where", "index/gather"),
    ("op: copy/cast", r"copy_|_to_copy|aten::to$|clone|contiguous|cat$|stack|_reshape_copy", "copy/cast"),
    ("op: memset", r"fill_|zero_|zeros|empty|ones", "memcpy/memset"),
    ("op: reduction", r"aten::(sum|mean|amax|amin|max|min|_?softmax|_?log_softmax|norm|linalg_vector_norm|topk|sort|"
     r"argmax|argmin|cumsum|prod|var|std|logsumexp|all|any)$|norm", "reduction"),
    ("op: elementwise", r"add|sub|mul|div|relu|gelu|silu|sigmoid|tanh|exp|log|pow|sqrt|rsqrt|clamp|neg|abs|"
     r"masked_fill|cos|sin|where|minimum|maximum|eq|ne|lt|gt|le|ge", "elementwise"),
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
    for rule, pattern, category in _OP_COMPILED:
        if pattern.search(name):
            return Classification(category, CPU, rule)
    return Classification("other", CPU, "no rule")
