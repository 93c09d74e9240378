"""`rooftop bench --backend` takes the names `vllm bench serve` and `sglang.bench_serving` take, with their
meaning: each loads the API those tools load with it, or is refused in one line naming what to use instead."""

import json
import subprocess
import sys

import pytest
import typer
from fake_server_child import start_fake_server
from typer.testing import CliRunner

from rooftop.cli import bench
from rooftop.errors import RooftopError

# What each name loads in vLLM's vllm/benchmarks (endpoint_request_func.py, backend_request_func.py) and in
# sglang/bench_serving.py. `sglang` is vLLM's meaning; SGLang's own tool sends it to /generate.
LOADS = {
    "openai": "/v1/completions", "vllm": "/v1/completions", "sglang": "/v1/completions",
    "sglang-oai": "/v1/completions", "lmdeploy": "/v1/completions", "scalellm": "/v1/completions",
    "llama.cpp": "/v1/completions",
    "openai-chat": "/v1/chat/completions", "vllm-chat": "/v1/chat/completions",
    "sglang-oai-chat": "/v1/chat/completions", "lmdeploy-chat": "/v1/chat/completions",
}
# Names for APIs rooftop does not speak, and a word of the fix each error must give.
REFUSED = {
    "sglang-native": "--backend sglang-oai", "tgi": "--backend openai-chat", "trt": "trtllm-serve",
    "tensorrt-llm": "trtllm-serve", "deepspeed-mii": "--backend openai", "truss": "--backend openai",
    "gserver": "--backend openai", "openai-audio": "vllm bench serve",
    **{name: "vllm bench serve" for name in (
        "openai-embeddings", "openai-embeddings-chat", "openai-embeddings-clip", "openai-embeddings-vlm2vec",
        "infinity-embeddings", "infinity-embeddings-clip", "vllm-pooling", "vllm-rerank")},
}


def bench_in_process(*args, env: dict | None = None):
    app = typer.Typer()
    app.command()(bench.command)
    return CliRunner().invoke(app, [str(a) for a in args], env=env, catch_exceptions=False)


@pytest.fixture(scope="module")
def server():
    with start_fake_server("--ttft-ms", "1", "--itl-ms", "1") as s:  # dies with this run, however it ends
        yield s


def run(server, tmp_path, *flags) -> dict:
    done = bench_in_process("--base-url", server.url, "--input-len", 8, "--output-len", 3, "--num-requests", 2,
                            "--warmup", 0, "--out", tmp_path, *flags)
    assert done.exit_code == 0, done.output
    return json.loads((tmp_path / "summary.json").read_text())


@pytest.mark.parametrize("name", list(LOADS))
def test_backend_loads_the_api_the_tools_load(server, tmp_path, name):
    summary = run(server, tmp_path, "--backend", name)
    assert summary["endpoint"] == LOADS[name]
    records = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert all(len(r["chunk_ns"]) == 3 for r in records)  # the stream was read in the API's own format


def test_endpoint_takes_vllm_paths_and_must_agree_with_backend(server, tmp_path):
    assert run(server, tmp_path, "--endpoint", "/v1/chat/completions")["endpoint"] == "/v1/chat/completions"
    assert run(server, tmp_path, "--backend", "vllm-chat", "--endpoint", "chat")["endpoint"] == "/v1/chat/completions"
    assert run(server, tmp_path)["endpoint"] == "/v1/completions"
    with pytest.raises(RooftopError, match="--backend vllm-chat loads /v1/chat/completions but --endpoint"):
        bench_in_process("--port", 9, "--backend", "vllm-chat", "--endpoint", "/v1/completions")
    with pytest.raises(RooftopError, match="openai-chat is a backend name: --backend openai-chat"):
        bench_in_process("--port", 9, "--endpoint", "openai-chat")


@pytest.mark.parametrize("name", list(REFUSED))
def test_an_api_rooftop_does_not_speak_is_one_clear_error(name):
    with pytest.raises(RooftopError) as err:
        bench_in_process("--port", 9, "--backend", name)  # refused before any connection is tried
    assert err.value.problem.startswith(f"--backend {name} ") and REFUSED[name] in err.value.fix


def test_refusal_and_unknown_name_exit_2_without_traceback():
    for name, words in (("tgi", "use --backend openai-chat"), ("nonesuch", "use one of openai, vllm, sglang")):
        done = subprocess.run([sys.executable, "-m", "rooftop", "bench", "--port", "9", "--backend", name],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert words in " ".join(done.stderr.split())


def test_sglang_says_which_of_its_two_meanings_it_takes(server, tmp_path):
    done = subprocess.run([sys.executable, "-m", "rooftop", "bench", "--base-url", server.url, "--backend", "sglang",
                           "--input-len", "8", "--output-len", "2", "--num-requests", "1", "--warmup", "0", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--backend sglang: loading /v1/completions" in done.stderr and "native /generate" in done.stderr
    assert json.loads(done.stdout)["endpoint"] == "/v1/completions"


def test_help_lists_every_name():
    done = bench_in_process("--help", env={"COLUMNS": "200"})
    words = {w.strip(",.()") for w in done.output.split()}
    assert set(LOADS) | set(REFUSED) <= words
