"""Nsight Compute's numbers on the roofline: the arithmetic and the command (the report itself is read on a
GPU host; docs/perf/ncu-h200.md checks a kernel of the small preset's decode step by hand)."""

from pathlib import Path

import pytest

from rooftop.errors import RooftopError
from rooftop.hardware.specs import gpu_spec
from rooftop.profile import ncu

H200 = gpu_spec("h200")  # 4800 GB/s, bf16 989 TFLOP/s, fp32 67 TFLOP/s: ridge 206 (tensor), 14 (CUDA core)


@pytest.mark.parametrize(("kernel", "base"), [
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, X> >(at::native::ReduceOp<float, X>)",
     "reduce_kernel"),
    ("_sparse_mla_split_kernel", "_sparse_mla_split_kernel"),
    ("nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_NTN", "nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_NTN"),
    ("void flash::flash_fwd_splitkv_mla_kernel<Traits<576>, true>(Flash_fwd_mla_params)", "flash_fwd_splitkv_mla_kernel"),
    # an anonymous-namespace scope, a lambda in the template arguments, a return type with templates
    ("void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>"
     "(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, long)", "indexSelectSmallIndex"),
    ("void (anonymous namespace)::elementwise_kernel_with_index<int, at::native::arange_cuda_out(c10::Scalar const&)"
     "::{lambda(long)#1}>(int)", "elementwise_kernel_with_index"),
    ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, __nv_bfloat16>(cublasGemvParamsEx<int>)",
     "kernel"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1> >"
     "(int, at::native::FillFunctor<float>, std::array<char*, 1>)", "vectorized_elementwise_kernel"),
])
def test_base_name_is_what_ncu_matches(kernel, base):
    assert ncu.base_name(kernel) == base


def test_a_memory_bound_copy_and_a_compute_bound_matmul():
    # a copy: 8.6 GB in 2 ms, no FLOPs -> 4300 GB/s, 89.6% of the 4800 GB/s roof
    copy = ncu.roofline("copy", [{"time_ns": 2e6, "dram_bytes": 8.6e9}], H200)
    assert copy.bound == "memory" and copy.pct_of_bound == pytest.approx(4300 / 4800 * 100)
    assert copy.tflop_s == 0 and copy.peak_flops_used == "CUDA-core fp32"
    # a 4096^3 bf16 matmul in 231 us moving 174 MB (FACTS: cuBLAS on an H200): 595 TFLOP/s, 60% of 989
    flops = 2 * 4096 ** 3
    mm = ncu.roofline("mm", [{"time_ns": 231e3, "dram_bytes": 174e6, "tensor_bf16": flops, "gmma_pipe_pct": 95.0}],
                      H200)
    assert mm.bound == "compute" and mm.peak_flops_used == "tensor bf16"
    assert mm.tflop_s == pytest.approx(flops / 231e-6 / 1e12) and mm.pct_of_bound == pytest.approx(
        flops / 231e-6 / 989e12 * 100)
    assert mm.intensity == pytest.approx(flops / 174e6) and mm.tensor_pipe_pct == 95.0


def test_cuda_core_flops_count_a_fused_multiply_add_twice_and_launches_average():
    launches = [{"time_ns": 10e3, "dram_bytes": 1e6, "ffma": 1e6, "fadd": 2e6, "fmul": 0},
                {"time_ns": 30e3, "dram_bytes": 3e6, "ffma": 3e6, "fadd": 6e6, "fmul": 0}]
    k = ncu.roofline("elementwise", launches, H200)
    assert k.launches == 2 and k.time_us == pytest.approx(20.0)
    assert k.tflop_s == pytest.approx((2 * 4e6 + 8e6) / 40e-6 / 1e12)
    assert k.intensity == pytest.approx(16e6 / 4e6)  # 4 FLOP/B: below the CUDA-core ridge of ~14 -> memory
    assert k.bound == "memory"


def test_the_command_names_the_kernels_and_only_the_metrics_ncu_knows(tmp_path):
    argv = ncu.ncu_command(Path("/opt/ncu/ncu"), ["python3", "step.py"],
                           ["void at::native::reduce_kernel<4>(X)", "_sparse_mla_split_kernel", "_sparse_mla_split_kernel"],
                           tmp_path / "r", 300, known={"gpu__time_duration", "dram__bytes"})
    assert argv[argv.index("--kernel-name") + 1] == "regex:^(reduce_kernel|_sparse_mla_split_kernel)$"
    assert argv[argv.index("--metrics") + 1] == "gpu__time_duration.sum,dram__bytes.sum"
    assert argv[argv.index("--clock-control") + 1] == "none" and argv[-2:] == ["python3", "step.py"]


def test_no_ncu_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RooftopError, match="Nsight Compute .ncu. is not on this host's PATH"):
        ncu.find_ncu()


def test_each_tensor_dtype_is_held_to_its_own_peak():
    # an fp8 GEMM at 1500 TFLOP/s: 76% of the H200's 1979 fp8 peak (held to bf16's 989 it read 152%)
    fp8 = ncu.roofline("fp8_gemm", [{"time_ns": 10e3, "dram_bytes": 1e6, "tensor_fp8": 1.5e15 * 1e-5}], H200)
    assert fp8.bound == "compute" and fp8.peak_flops_used == "tensor fp8"
    assert fp8.pct_of_bound == pytest.approx(1500 / 1979 * 100)
    # tf32: the spec's dense tf32 peak (494.5)
    tf32 = ncu.roofline("tf32_gemm", [{"time_ns": 10e3, "dram_bytes": 1e6, "tensor_tf32": 4e14 * 1e-5}], H200)
    assert tf32.peak_flops_used == "tensor tf32"
    assert tf32.pct_of_bound == pytest.approx(400 / 494.5 * 100)
    # a GPU whose spec has no tf32 figure: half its bf16 peak, named as such
    import dataclasses

    no_tf32 = dataclasses.replace(H200, dense_tflops={k: v for k, v in H200.dense_tflops.items() if k != "tf32"})
    half = ncu.roofline("tf32_gemm", [{"time_ns": 10e3, "dram_bytes": 1e6, "tensor_tf32": 4e14 * 1e-5}], no_tf32)
    assert half.peak_flops_used == "tensor tf32 (half the bf16 peak)" and half.pct_of_bound == pytest.approx(400 / 494.5 * 100)
    # half the FLOPs in fp8, half in bf16: held to the time they would take at their own peaks
    mixed = ncu.roofline("mixed", [{"time_ns": 10e3, "dram_bytes": 1e6, "tensor_fp8": 5e9, "tensor_bf16": 5e9}], H200)
    assert mixed.peak_flops_used == "tensor bf16+fp8"
    assert mixed.pct_of_bound == pytest.approx((5e9 / 1979e12 + 5e9 / 989e12) / 10e-6 * 100)


def test_the_tensor_pipe_share_is_the_time_weighted_mean_over_launches():
    launches = [{"time_ns": 1000, "dram_bytes": 1e6, "tensor_bf16": 1e6, "gmma_pipe_pct": 90.0}] + \
               [{"time_ns": 1000, "dram_bytes": 1e6, "tensor_bf16": 1e6, "gmma_pipe_pct": 1.0}] * 9
    assert ncu.roofline("k", launches, H200).tensor_pipe_pct == pytest.approx(9.9)  # was the max: 90
    longer = [{"time_ns": 9000, "tensor_pipe_pct": 10.0}, {"time_ns": 1000, "tensor_pipe_pct": 50.0}]
    assert ncu.roofline("k", longer, H200).tensor_pipe_pct == pytest.approx(14.0)
