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
