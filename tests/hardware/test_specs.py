"""The GPU table, lenient lookups, and the measured CPU entry."""

import pytest

from rooftop.errors import RooftopError
from rooftop.hardware import gpu_spec, known_names
from rooftop.hardware.specs import cpu_spec


@pytest.mark.parametrize("name", ["h200", "H200", "NVIDIA H200", "h200-sxm", "H200_SXM"])
def test_lenient_names(name):
    assert gpu_spec(name).name == "H200 SXM"


def test_torch_device_names():
    assert gpu_spec("NVIDIA H100 80GB HBM3").arch == "sm_90"
    assert gpu_spec("NVIDIA A100-SXM4-80GB").sms == 108
    assert gpu_spec("NVIDIA RTX PRO 6000 Blackwell Server Edition").arch == "sm_120"
    assert gpu_spec("rtx-pro-6000").sms == 188
    assert gpu_spec("L40S").hbm_bandwidth_gb_s == 864


def test_dense_figures_from_facts():
    h200, h100, b200 = gpu_spec("h200"), gpu_spec("h100"), gpu_spec("b200")
    assert h200.bandwidth_bytes_s == 4.8e12 and h100.hbm_bandwidth_gb_s == 3350
    assert h100.peak_flops("bf16") == 989e12  # dense, not the sparse 1979
    assert h100.peak_flops("fp8") == 1979e12
    assert b200.peak_flops("fp4") == 9000e12
    assert gpu_spec("l40s").peak_flops("bf16") == 362e12  # datasheet dense figure (733 is sparse)


def test_missing_units_fall_back():
    assert gpu_spec("h100").peak_flops("fp4") == 1979e12  # no fp4 on Hopper: fp8 tensor cores
    assert gpu_spec("a100").peak_flops("fp8") == 312e12  # no fp8 on Ampere: bf16


def test_unknown_gpu_lists_known_names():
    with pytest.raises(RooftopError) as err:
        gpu_spec("h300")
    for name in known_names():
        assert name in str(err.value)


def test_cpu_is_measured_once_per_process():
    cpu = gpu_spec("cpu")
    assert cpu is cpu_spec() is gpu_spec("CPU")
    assert cpu.measured and cpu.hbm_bandwidth_gb_s > 0.1 and cpu.peak_flops("bf16") > 1e8


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H20", "H20"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA B300 SXM6 AC", "B300"),
        ("b300", "B300"),
        ("AMD Instinct MI300X", "MI300X"),
        ("mi325x", "MI325X"),
    ],
)
def test_trace_device_names_of_the_added_gpus(name, canonical):
    assert gpu_spec(name).name == canonical


def test_added_gpus_dense_datasheet_figures():
    # Dense = half the datasheets' sparse (*) figures.
    assert gpu_spec("h100 pcie").peak_flops("bf16") == 756e12 and gpu_spec("h100-pcie").hbm_bandwidth_gb_s == 2000
    assert gpu_spec("h100 nvl").peak_flops("fp8") == 1670.5e12 and gpu_spec("h100nvl").memory_gb == 94
    assert gpu_spec("h20").peak_flops("bf16") == 148e12 and gpu_spec("h20").hbm_bandwidth_gb_s == 4000
    assert gpu_spec("a100-40gb").hbm_bandwidth_gb_s == 1555 and gpu_spec("a100-pcie").hbm_bandwidth_gb_s == 1935
    assert gpu_spec("l4").peak_flops("fp8") == 242.5e12 and gpu_spec("l4").hbm_bandwidth_gb_s == 300
    assert gpu_spec("gb200").peak_flops("fp4") == 10000e12 and gpu_spec("gb200").peak_flops("bf16") == 2500e12
    assert gpu_spec("b300").peak_flops("fp4") == 13500e12 and gpu_spec("b300").memory_gb == 288
    mi300x = gpu_spec("mi300x")
    assert (mi300x.peak_flops("bf16"), mi300x.peak_flops("fp8"), mi300x.hbm_bandwidth_gb_s) == (1307.4e12, 2614.9e12, 5300)
    assert gpu_spec("mi325x").hbm_bandwidth_gb_s == 6000 and gpu_spec("mi325x").memory_gb == 256


@pytest.mark.parametrize(
    ("name", "tf32"),
    [("h100", 494.5), ("h200", 494.5), ("h100-pcie", 378), ("b200", 1125), ("a100", 156), ("l40s", 183),
     ("l4", 60), ("mi300x", 653.7)],
)  # fmt: skip
def test_every_gpu_has_a_dense_tf32_peak(name, tf32):
    assert gpu_spec(name).peak_flops("tf32") == tf32 * 1e12
    assert all("tf32" in gpu_spec(key).dense_tflops for key in known_names())


def test_ncu_tensor_peak_takes_the_tf32_figure():
    from rooftop.profile.ncu import tensor_peak

    assert tensor_peak(gpu_spec("h100"), "tf32") == (494.5e12, "tensor tf32")
    assert tensor_peak(gpu_spec("b200"), "tf32") == (1125e12, "tensor tf32")
