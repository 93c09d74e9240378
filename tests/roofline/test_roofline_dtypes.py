"""Bytes per element with scale overhead."""

import pytest

from rooftop.errors import RooftopError
from rooftop.roofline.dtypes import bytes_per_element, latent_kv_bytes, normalize_dtype, tensor_bytes


def test_bytes_per_element():
    assert bytes_per_element("bf16") == 2
    assert bytes_per_element("nvfp4") == 0.5 + 1 / 16  # fp8 scale per 16
    assert bytes_per_element("mxfp4") == 0.5 + 1 / 32  # e8m0 scale per 32
    assert bytes_per_element("int4") == 0.5 + 4 / 128  # fp16 scale + zero per 128
    assert bytes_per_element("fp8") == pytest.approx(1.0, abs=1e-3)


def test_nvfp4_per_tensor_scale_and_aliases():
    assert tensor_bytes(4096 * 4096, "nvfp4") == 4096 * 4096 * 0.5625 + 4
    assert tensor_bytes(1024, "NVFP4", n_tensors=3) == 1024 * 0.5625 + 12
    assert normalize_dtype("bfloat16") == "bf16" and normalize_dtype("FP8-E4M3") == "fp8"
    with pytest.raises(RooftopError, match="unknown dtype"):
        normalize_dtype("fp5")


def test_flashmla_fp8_latent_layout():
    assert latent_kv_bytes(512, 64, "fp8") == 656
    assert latent_kv_bytes(512, 64, "bf16") == 1152


@pytest.mark.parametrize("name", ["fp8_e5m2", "FP8-E5M2", "e5m2", "float8_e5m2", "fp8_e4m3fn"])
def test_vllm_fp8_kv_cache_spellings(name):
    from rooftop.roofline.dtypes import kv_element_bytes

    assert normalize_dtype(name) == "fp8" and kv_element_bytes(name) == 1.0
