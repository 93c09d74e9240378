import pytest

from rooftop.profile.classify import CUDA_CORE, TENSOR, UNKNOWN, classify_kernel, classify_op


@pytest.mark.parametrize(
    ("name", "arch", "category", "unit", "rule"),
    [
        ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", "sm_90", "gemm", TENSOR, "sm90 wgmma gemm"),
        ("sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_cublas", "sm_90", "gemm", CUDA_CORE, "fp32 SIMT gemm"),
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn", "sm_80", "gemm", TENSOR, "sm80 mma gemm"),
        ("void cutlass::Kernel2<cutlass_tcgen05_gemm_sm100>", "sm_100", "gemm", TENSOR, "sm100 tcgen05 gemm"),
        ("_mxfp4_slot_gemv_kernel", "sm_120", "moe", CUDA_CORE, "moe gemv (SIMT)"),
        ("fused_moe_kernel", "sm_90", "moe", TENSOR, "moe grouped gemm"),
        ("_tiled_sparse_decode_kernel", "sm_120", "attention", UNKNOWN, "sparse mla (triton)"),
        ("void flash::flash_fwd_splitkv_mla_kernel<...>", "sm_90", "attention", TENSOR, "flash/fmha"),
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "sm_90", "communication", CUDA_CORE, "nccl"),
        ("void at::native::index_elementwise_kernel<128, 4>", "sm_90", "index/gather", CUDA_CORE, "index/gather"),
        ("void at::native::vectorized_gather_kernel<16, long>", "sm_90", "index/gather", CUDA_CORE, "index/gather"),
        ("void at::native::vectorized_elementwise_kernel<4, MulFunctor>", "sm_90", "elementwise", CUDA_CORE, "elementwise"),
        ("void at::native::reduce_kernel<512, 1, ReduceOp<float, sum_functor>>", "sm_90", "reduction", CUDA_CORE, "reduce"),
        ("void at::native::direct_copy_kernel_cuda<float>", "sm_90", "copy/cast", CUDA_CORE, "copy/cast"),
        ("some_mystery", "sm_90", "other", UNKNOWN, "no rule"),
        # expert-parallel all-to-all by its library's namespace; a local combine is not communication
        ("void deep_ep::intranode::dispatch<8, 768, 6144>(int4*, float*)", "sm_90", "communication", CUDA_CORE,
         "custom all-reduce"),
        ("void deep_ep::internode_ll::combine<false, 7168>(void*)", "sm_90", "communication", CUDA_CORE,
         "custom all-reduce"),
        ("_combine_kernel", "sm_90", "other", UNKNOWN, "triton (unknown)"),
        ("_sparse_mla_combine_kernel", "sm_90", "attention", UNKNOWN, "sparse mla (triton)"),
    ],
)
def test_kernel_rules(name, arch, category, unit, rule):
    c = classify_kernel(name, arch)
    assert (c.category, c.unit, c.rule) == (category, unit, rule)


def test_arch_gates_rules():
    # a wgmma-style name on sm_120 does not claim the sm90 rule; it falls to the generic gemm rule
    assert classify_kernel("sm90_xmma_gemm_bf16bf16_bf16f32", "sm_120").rule == "cublas/cutlass gemm"
    assert classify_kernel("sm90_xmma_gemm_bf16bf16_bf16f32", "sm_90").rule == "sm90 wgmma gemm"


def test_memcpy_memset_kinds():
    assert classify_kernel("Memcpy DtoD (Device -> Device)", "sm_90", kind=1).category == "memcpy/memset"
    assert classify_kernel("Memset (Device)", "sm_90", kind=2).rule == "memset event"


@pytest.mark.parametrize(
    ("name", "category"),
    [("aten::bmm", "gemm"), ("aten::addmm", "gemm"), ("aten::clamp_min", "elementwise"), ("aten::relu", "elementwise"),
     ("aten::sum", "reduction"), ("aten::_softmax", "reduction"), ("aten::topk", "reduction"),
     ("aten::copy_", "copy/cast"), ("aten::index", "index/gather"), ("aten::gather", "index/gather"),
     ("aten::fill_", "memcpy/memset"), ("c10d::allreduce_", "communication"), ("aten::view", "other")],
)
def test_op_rules(name, category):
    assert classify_op(name).category == category
