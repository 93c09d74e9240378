"""The live vLLM test files' fixtures: the interpreter of .venv-vllm, and the tiny MLA + MoE model it serves."""

from pathlib import Path

import pytest

from rooftop.models import init_model_dir
from tests.adapters.vllm_live import VLLM_PYTHON


@pytest.fixture(scope="module")
def python() -> str:
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm` (`make test` builds it)")
    return str(VLLM_PYTHON)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "dsv2-tiny"
    init_model_dir(path, "deepseek_v2", "tiny")
    return path
