"""Multi-turn sessions live against the real vLLM, its prefix-cache hit rate and its n-gram speculation's
acceptance read from its own counters, and its several-token chunks counted token by token."""

from __future__ import annotations

import json

import pytest

from rooftop.deploy.bring_up import bring_up
from rooftop.models import init_model_dir
from rooftop.spec.deployment import DeploymentSpec
from tests.adapters.vllm_live import CPU_ENV, MODEL_ARGS, READY_S, conversations, running_with

# n-gram speculation: drafts looked up in the request's own tokens, no draft model (docs/vllm.md: what ran)
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2})


@pytest.fixture(scope="module")
def llama_turns(python, tmp_path_factory) -> dict:
    """A Llama (no MLA: vLLM's CPU platform turns prefix caching off for MLA models, dsv2-tiny's included),
    eager, serving multi-turn sessions with vLLM's default prefix caching and n-gram speculation: one bring-up
    for both (the random model soon repeats itself, and its history holds the n-grams its drafts come from)."""
    model = tmp_path_factory.mktemp("models") / "llama-tiny"
    init_model_dir(model, "llama", "tiny")
    run_dir = tmp_path_factory.mktemp("llama-turns")
    deployment = DeploymentSpec.model_validate({
        "engine": "vllm", "model": str(model), "python": python, "env": CPU_ENV, "single": {"port": 0},
        "args": {**MODEL_ARGS, "served-model-name": "llama-tiny", "enforce-eager": True, "speculative-config": NGRAM}})
    with bring_up(deployment, run_dir, READY_S) as live:
        out = {"summary": conversations(live.url, live.url + "/metrics", run_dir / "bench")}
    out["left"] = running_with(str(run_dir))
    out["records"] = [json.loads(line) for line in (run_dir / "bench" / "requests.jsonl").read_text().splitlines()]
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



def test_ngram_speculation_accepts_drafts_and_its_chunks_are_counted_token_by_token(llama_turns):
    """vLLM's spec_decode counters over the level give its acceptance; the chunks that carried a verified
    draft's tokens are counted by the usage vLLM puts in every chunk, and add up to each request's usage."""
    (level,) = llama_turns["summary"]["levels"]
    spec = level["spec_decode"]
    assert spec["source"] == "vllm:spec_decode_*" and spec["drafts"] > 0 and 0 < spec["accepted_tokens"]
    assert spec["accepted_tokens"] <= spec["draft_tokens"] <= 3 * spec["drafts"]
    per_pos = spec["accepted_per_position"]
    assert len(per_pos) == 3 and sum(per_pos) == spec["accepted_tokens"]
    assert per_pos == sorted(per_pos, reverse=True)  # position i+1 is accepted only after position i
    assert spec["acceptance_rate"] == pytest.approx(spec["accepted_tokens"] / spec["draft_tokens"])
    assert spec["mean_accepted_length"] == pytest.approx(1 + spec["accepted_tokens"] / spec["drafts"])
    records = [r for r in llama_turns["records"] if not r["warmup"]]
    assert all(sum(r["chunk_tokens"]) == r["completion_tokens_server"] == 8 for r in records)
    assert any(n > 1 for r in records for n in r["chunk_tokens"])  # a draft's tokens came in one chunk
    assert level["itl_ms"]["n"] == sum(len(r["chunk_ns"]) - 1 for r in records)  # one ITL a chunk, not a token
