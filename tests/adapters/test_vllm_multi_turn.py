"""Multi-turn sessions live against the real vLLM, its prefix-cache hit rate read from its own counters."""

from __future__ import annotations

import pytest

from rooftop.deploy.bring_up import bring_up
from rooftop.models import init_model_dir
from rooftop.spec.deployment import DeploymentSpec
from tests.adapters.vllm_live import CPU_ENV, MODEL_ARGS, READY_S, conversations, running_with


@pytest.fixture(scope="module")
def llama_turns(python, tmp_path_factory) -> dict:
    """A Llama (no MLA: vLLM's CPU platform turns prefix caching off for MLA models, dsv2-tiny's included),
    eager, serving multi-turn sessions with vLLM's default prefix caching."""
    model = tmp_path_factory.mktemp("models") / "llama-tiny"
    init_model_dir(model, "llama", "tiny")
    run_dir = tmp_path_factory.mktemp("llama-turns")
    deployment = DeploymentSpec.model_validate({
        "engine": "vllm", "model": str(model), "python": python, "env": CPU_ENV, "single": {"port": 0},
        "args": {**MODEL_ARGS, "served-model-name": "llama-tiny", "enforce-eager": True}})
    with bring_up(deployment, run_dir, READY_S) as live:
        out = {"summary": conversations(live.url, live.url + "/metrics", run_dir / "bench")}
    out["left"] = running_with(str(run_dir))
    return out


def test_multi_turn_sessions_read_vllms_prefix_cache_hit_rate(llama_turns):
    """Later turns resend the history: vLLM finds part of it cached, and rooftop reads that from vLLM's counters."""
    assert llama_turns["left"] == []
    (level,) = llama_turns["summary"]["levels"]
    assert level["completed"] == 4 * 3 and level["failed"] == 0
    by_turn = level["ttft_ms_by_turn"]
    assert by_turn["first"]["n"] == 4 and by_turn["later"]["n"] == 8
    cache = level["engine_server"]["prefix_cache_hit_rate"]
    assert cache["source"] == "vllm:prefix_cache_hits_total"
    # every prompt token of the level looked up once (the warm-up's before the level's first reading)
    assert cache["count"] >= 4 * 3 * 140
    assert 0 < cache["mean"] < 1
    # the later turns find their history: more of the level's prompt tokens than the first turns' are new
    assert cache["mean"] * cache["count"] >= 140
