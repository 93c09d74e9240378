"""A deployment's `speculative` as each engine spells it: the embedded engine's and vLLM's --speculative-config (vLLM's
JSON), SGLang's --speculative-algorithm and its step, top-k and draft-token counts; one clear error for what an
engine cannot take and for the same setting given twice."""

import argparse
import json
from pathlib import Path

import pytest

from rooftop.adapters.flags import known_flags
from rooftop.adapters.processes import build_processes
from rooftop.engine.build import add_arguments
from rooftop.engine.spec.config import parse_spec_config
from rooftop.errors import RooftopError
from rooftop.spec import load_deployment
from rooftop.spec.campaign import apply_lever, parse_campaign
from rooftop.spec.speculative import Speculative
from tests.adapters.test_engine_flags import check

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def deployment(example: str, speculative: dict | None, **args):
    spec = load_deployment(EXAMPLES / example)
    return spec.model_copy(update={"speculative": Speculative(**speculative) if speculative else None,
                                   "args": {**spec.args, **args}})


def workers(example: str, speculative: dict | None, tmp_path, **args) -> dict:
    return {p.role: p.argv for p in build_processes(deployment(example, speculative, **args), tmp_path)
            if p.role != "router"}


def after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def spec_words(argv: list[str]) -> list[str]:
    """The speculative flags of an argv with their values."""
    out = []
    for i, word in enumerate(argv):
        if word.startswith("--speculative"):
            out += [word, argv[i + 1]]
    return out


@pytest.mark.parametrize("example", ["vllm-pd.toml", "vllm-pd-2hosts.toml"])
def test_vllm_takes_the_table_as_its_own_json_on_every_worker(example, tmp_path):
    argv = workers(example, NGRAM, tmp_path)
    assert set(argv) == {"prefill", "decode"}
    for role, words in argv.items():
        assert spec_words(words)[0] == "--speculative-config", role
        assert json.loads(after(words, "--speculative-config")) == NGRAM  # vLLM's own key names, nothing added
        assert "--speculative-config" in known_flags("vllm", "server")[0]
        check(spec_words(words), "vllm")
    eagle = {"method": "eagle3", "num_speculative_tokens": 2, "model": "/models/eagle3"}
    assert json.loads(after(workers(example, eagle, tmp_path)["decode"], "--speculative-config")) == eagle
    assert all(not spec_words(w) for w in workers(example, None, tmp_path).values())  # unset: nothing passed


def test_the_embedded_engine_reads_what_its_adapter_passes(tmp_path):
    """Its own parser and spec-config reader take the argv; a pd pair speculates on the decode worker only."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for table in (NGRAM, {"method": "mtp", "num_speculative_tokens": 2}):
        (argv,) = workers("embedded-single.toml", table, tmp_path).values()
        read = parse_spec_config(parser.parse_args(argv[3:]).speculative_config)
        assert (read.method, read.num_speculative_tokens) == (table["method"], table["num_speculative_tokens"])
    assert (read.prompt_lookup_min, read.prompt_lookup_max) == (5, 5)  # mtp: the engine's defaults, unused
    ngram = parse_spec_config(after(workers("embedded-single.toml", NGRAM, tmp_path)["single"], "--speculative-config"))
    assert (ngram.prompt_lookup_min, ngram.prompt_lookup_max) == (2, 4)
    pd = workers("pd-embedded.toml", NGRAM, tmp_path)
    assert spec_words(pd["prefill"]) == []  # a prefill worker makes one token a request (and refuses the flag)
    assert json.loads(after(pd["decode"], "--speculative-config")) == NGRAM


@pytest.mark.parametrize(("table", "expected"), [
    ({"method": "mtp", "num_speculative_tokens": 2},
     ["--speculative-algorithm", "NEXTN", "--speculative-num-draft-tokens", "3", "--speculative-num-steps", "2",
      "--speculative-eagle-topk", "1"]),
    ({"method": "eagle", "num_speculative_tokens": 3, "model": "/models/eagle"},
     ["--speculative-algorithm", "EAGLE", "--speculative-num-draft-tokens", "4", "--speculative-num-steps", "3",
      "--speculative-eagle-topk", "1", "--speculative-draft-model-path", "/models/eagle"]),
    ({"method": "eagle3", "num_speculative_tokens": 1, "model": "/models/eagle3"},
     ["--speculative-algorithm", "EAGLE3", "--speculative-num-draft-tokens", "2", "--speculative-num-steps", "1",
      "--speculative-eagle-topk", "1", "--speculative-draft-model-path", "/models/eagle3"]),
    ({"method": "ngram", "num_speculative_tokens": 3},
     ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4",
      "--speculative-ngram-max-bfs-breadth", "1"]),
])
def test_sglang_drafts_a_chain_of_k_tokens_in_its_own_flags(table, expected, tmp_path):
    """k drafts a step: num_steps = k with top-k 1 (a chain), num_draft_tokens = k + 1 (SGLang counts the verified
    token); every flag one its recorded ServerArgs defines; both pd workers get the same."""
    for example in ("sglang-single.toml", "sglang-pd.toml"):
        argv = workers(example, table, tmp_path)
        for words in argv.values():
            assert spec_words(words) == expected, example
            check(spec_words(words), "sglang")
            assert set(expected[::2]) <= known_flags("sglang", "server")[0]
    assert set(workers("sglang-pd.toml", table, tmp_path)) == {"prefill", "decode"}


@pytest.mark.parametrize(("example", "table", "message"), [
    ("sglang-single.toml", NGRAM, r"sglang: speculative prompt_lookup_min/max have no SGLang flag.*drop "
                                  r"prompt_lookup_min/max from speculative"),
    ("embedded-single.toml", {"method": "eagle", "num_speculative_tokens": 2, "model": "/e"},
     r"embedded: speculative method 'eagle': the embedded engine drafts with ngram .* or mtp"),
    ("embedded-single.toml", {"method": "mtp", "num_speculative_tokens": 1, "model": "/m"},
     r"embedded: speculative.model: the embedded engine loads no separate draft"),
    ("pd-embedded.toml", {"method": "mtp", "num_speculative_tokens": 1},
     r"embedded: speculative method \"mtp\" in a pd deployment.*use method \"ngram\" for pd"),
])
def test_what_an_engine_cannot_take_is_one_clear_error(example, table, message, tmp_path):
    with pytest.raises(RooftopError, match=message):
        build_processes(deployment(example, table), tmp_path)


@pytest.mark.parametrize(("example", "args", "names"), [
    ("vllm-pd.toml", {"speculative-config": '{"method": "ngram"}'}, "prefill: speculative \\(ngram 2-4, k=3\\) and "
     "args.speculative-config both"),
    ("embedded-single.toml", {"speculative-config": '{"method": "mtp"}'}, "single: .* args.speculative-config"),
    ("sglang-pd.toml", {"speculative-num-steps": 5}, "prefill: speculative \\(mtp, k=2\\) and "
     "args.speculative-num-steps both set the engine's speculative decoding"),
    ("sglang-single.toml", {"speculative-draft-model": "/x"}, "remove speculative-draft-model from args"),
])
def test_speculative_and_the_same_flag_in_args_is_one_clear_error(example, args, names, tmp_path):
    table = NGRAM if not example.startswith("sglang") else {"method": "mtp", "num_speculative_tokens": 2}
    with pytest.raises(RooftopError, match=names):
        build_processes(deployment(example, table, **args), tmp_path)
    workers(example, None, tmp_path, **args)  # the flag alone, without `speculative`, is the user's own


def test_a_speculative_lever_reaches_every_engine(tmp_path):
    """One lever, engine-neutral, over each engine's baseline: its flags in the lever's argv, none in the base's."""
    for engine, flag in (("embedded", "--speculative-config"), ("vllm", "--speculative-config"),
                         ("sglang", "--speculative-algorithm")):
        spec = parse_campaign(f'[campaign]\nname = "c"\n[model]\npath = "/m"\n[deployment]\nengine = "{engine}"\n'
                              '[[lever]]\nname = "mtp"\nspeculative = { method = "mtp", num_speculative_tokens = 1 }\n')
        (base,) = build_processes(spec.deployment, tmp_path)
        (lever,) = build_processes(apply_lever(spec.deployment, spec.levers), tmp_path)
        assert flag not in base.argv and lever.argv.count(flag) == 1, engine


def test_the_example_campaign_loads_and_each_lever_becomes_the_embedded_flag(tmp_path):
    from rooftop.spec.campaign import load_campaign

    spec = load_campaign(EXAMPLES / "speculative.toml")
    assert [lv.quality_check for lv in spec.levers] == [True, True]
    for lv in spec.levers:
        (proc,) = build_processes(apply_lever(spec.deployment, [lv]), tmp_path)
        assert json.loads(after(proc.argv, "--speculative-config")) == lv.changes()["speculative"]
