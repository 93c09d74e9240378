"""The real vLLM refusing what it cannot serve: one clear error each (the engine log's first error and last
lines), nothing left running; and the flags rooftop emits are vLLM's own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rooftop.adapters import vllm as vllm_engine
from rooftop.adapters.processes import build_processes, resolve_ports
from rooftop.deploy.bring_up import bring_up
from rooftop.errors import RooftopError
from tests.adapters.vllm_live import READY_S, SHARED_STORAGE, running_with, spec


def test_flags_rooftop_emits_are_vllms_own(python, model, tmp_path):
    """Every flag of rooftop's argv, single and pd, in the real `vllm serve --help=all`."""
    help_text = subprocess.run([str(Path(python).parent / "vllm"), "serve", "--help=all"], capture_output=True,
                               text=True, timeout=300).stdout
    for deployment in (spec(model, python), spec(model, python, "pd", **{"kv-transfer-config": SHARED_STORAGE})):
        for proc in build_processes(resolve_ports(deployment, vllm_engine.DEFAULT_PORTS), tmp_path):
            if proc.role == "router":
                continue
            for flag in (w for w in proc.argv[3:] if w.startswith("--")):
                assert f"  {flag}" in help_text, flag


def test_a_python_without_vllm_is_one_clear_error(model, tmp_path):
    with pytest.raises(RooftopError, match=rf"vllm is not installed for {sys.executable}.*make vllm"):
        with bring_up(spec(model, sys.executable), tmp_path, READY_S):
            pass
    assert not (tmp_path / "logs").exists()  # nothing was started


def _bad_model(model: Path, tmp_path: Path, **config) -> Path:
    bad = tmp_path / "model"
    bad.mkdir()
    for f in model.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, **config}))
    return bad


@pytest.mark.parametrize(("config", "args", "first_error"), [
    ({"architectures": ["FooBarForCausalLM"]}, {}, r"Model architectures \['FooBarForCausalLM'\] are not supported"),
    ({}, {"max-model-len": 100000}, r"max_model_len"),  # over the config's 2048 positions: vLLM exits
])
def test_a_vllm_that_exits_while_starting_is_one_clear_error(python, model, tmp_path, config, args, first_error):
    bad = _bad_model(model, tmp_path, **config)
    with pytest.raises(RooftopError) as err:
        with bring_up(spec(bad, python, **args), tmp_path / "run", READY_S):
            pass
    text = str(err.value)
    assert "single exited with code" in text and "while starting" in text
    assert "first error in its log: " in text and "last lines of" in text
    assert re.search(first_error, text.split("first error in its log: ")[1].split("; last lines")[0])
    assert running_with(str(tmp_path)) == []


def test_healthy_but_unable_to_serve_is_caught_before_the_bench(python, model, tmp_path):
    """vLLM's CPU MLA takes only a 576-wide latent; another passes /health, then fails every request."""
    bad = _bad_model(model, tmp_path, kv_lora_rank=16)
    with pytest.raises(RooftopError, match=r"healthy but a first completion failed \(HTTP 500.*first error in its "
                                           r"log: ValueError: Head dimension 80 is not supported by MLA"):
        with bring_up(spec(bad, python, **{"enforce-eager": True}), tmp_path / "run", READY_S):
            pass
    assert running_with(str(tmp_path)) == []
