"""/metrics of a real server speculating counts drafts as vLLM names them, and agrees exactly with a recount
from the engine's own steps (their StepRecords, crossing from the engine process and out as OTLP step spans);
a bad --speculative-config stops the server with one line that says what and how to fix."""

import subprocess
import time

import pytest
from engine_server import post_json, request, start_engine
from otlp_receiver import Receiver

from rooftop.bench.subproc import python_module

LABEL = '{model_name="tiny"}'
COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total")
K = 3
PROMPTS = ["abcabcabcabcabcabc", "the cat sat. the cat sat. the cat", "1 2 3 1 2 3 1 2 3 1", "hello world"]


def scrape(url: str) -> dict[str, float]:
    text = request(url, "/metrics")[1].decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def per_pos(metrics: dict[str, float]) -> list[float]:
    return [metrics.get(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="tiny",position="{i}"}}', 0.0)
            for i in range(K)]


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.stop()


def test_spec_counters_agree_with_the_steps(receiver):
    spec = f'{{"method": "ngram", "num_speculative_tokens": {K}, "prompt_lookup_min": 1, "prompt_lookup_max": 3}}'
    # the step loop in its own process: the records' new fields cross the pipe, then go out as step spans
    server = start_engine("--context-length", "128", "--page-size", "16", "--kv-cache-tokens", "2048",
                          "--engine-process", "on", "--speculative-config", spec,
                          "--otlp-traces-endpoint", receiver.url)
    try:
        before = scrape(server.url)
        usages = []
        for prompt in PROMPTS:  # one at a time, greedy: the repeating ones draft and keep some
            status, body = post_json(server.url, "/v1/completions", {"prompt": prompt, "max_tokens": 24,
                                                                     "temperature": 0, "ignore_eos": True})
            assert status == 200, body
            usages.append(body["usage"]["completion_tokens"])
        after = scrape(server.url)
        # the warm-up request's steps were counted before `before` and are not sent as spans: every step span
        # is one of these requests'; wait until their tokens are all accounted for
        steps, deadline = [], time.monotonic() + 30
        while time.monotonic() < deadline:
            with receiver.lock:
                steps = [r.attrs for r in receiver.spans if r.name == "engine_step"]
            made = sum(s["rooftop.step.decode_seqs"] + s.get("rooftop.spec.num_accepted_tokens", 0) for s in steps)
            if made + len(PROMPTS) >= sum(usages):
                break
            time.sleep(0.2)
    finally:
        server.stop()
    delta = {name: after[name + LABEL] - before.get(name + LABEL, 0.0) for name in COUNTERS}
    recount = {
        COUNTERS[0]: sum(s.get("rooftop.spec.num_drafts", 0) for s in steps),
        COUNTERS[1]: sum(s.get("rooftop.spec.num_draft_tokens", 0) for s in steps),
        COUNTERS[2]: sum(s.get("rooftop.spec.num_accepted_tokens", 0) for s in steps),
    }
    assert delta == recount
    assert recount[COUNTERS[1]] > 0 and recount[COUNTERS[2]] > 0
    by_pos = [sum(s.get("rooftop.spec.num_accepted_tokens_per_pos", [0] * K)[i] for s in steps) for i in range(K)]
    assert [a - b for a, b in zip(per_pos(after), per_pos(before), strict=True)] == by_pos
    assert sum(by_pos) == recount[COUNTERS[2]]
    # every token was made by a prompt's last chunk or a decode step: one, plus its accepted drafts
    assert sum(usages) == len(PROMPTS) + sum(s["rooftop.step.decode_seqs"] for s in steps) + recount[COUNTERS[2]]


def test_a_bad_speculative_config_stops_the_server_with_one_line():
    done = subprocess.run(python_module("rooftop.engine", "--preset", "tiny", "--port", "0", "--device", "cpu",
                                        "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}'),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--speculative-config: method 'eagle' is not known" in lines[0], done.stderr
    assert "Traceback" not in done.stderr
