"""The calibration server, run as a real subprocess and driven over HTTP on 127.0.0.1."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from rooftop.bench.fakeserver import start_fake_server


def _spawn(*flags: str):
    proc = subprocess.Popen([sys.executable, "-m", "rooftop.bench.fakeserver", "--port", "0", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line.startswith("fakeserver ready on http://127.0.0.1:"), (line, proc.stderr.read())
    return proc, line.rsplit(" ", 1)[1]


@pytest.fixture(scope="module")
def server():
    proc, url = _spawn("--ttft-ms", "20", "--itl-ms", "4", "--usage-skew", "3", "--model", "fake-x")
    yield url
    proc.terminate()
    proc.wait(timeout=10)
    assert "Traceback" not in proc.stderr.read()  # a client hanging up is not a server error


@pytest.fixture(scope="module")
def eos_server():
    proc, url = _spawn("--ttft-ms", "1", "--itl-ms", "1", "--eos-after", "5")
    yield url
    proc.terminate()
    proc.wait(timeout=10)


async def _stream(url: str, path: str, body: dict) -> list[dict]:
    """POST a streamed request, return the parsed SSE chunks (and 'DONE' for the terminator)."""
    chunks = []
    async with aiohttp.ClientSession() as session, session.post(url + path, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        buf = b""
        async for data in resp.content.iter_any():
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                assert event.startswith(b"data: ")
                payload = event[len(b"data: "):]
                chunks.append("DONE" if payload == b"[DONE]" else json.loads(payload))
    return chunks


async def _post(url: str, path: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.post(url + path, json=body) as resp:
        return resp.status, await resp.json()


def test_streamed_completion_has_one_stamped_chunk_per_token(server):
    body = {"model": "fake-x", "prompt": "héllo", "max_tokens": 12, "stream": True,
            "stream_options": {"include_usage": True}}
    chunks = asyncio.run(_stream(server, "/v1/completions", body))
    assert chunks[-1] == "DONE"
    usage_chunk = chunks[-2]
    tokens = chunks[:-2]
    assert len(tokens) == 12
    assert "".join(c["choices"][0]["text"] for c in tokens) == "abcdefghijkl"
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 11 + ["length"]
    assert {c["model"] for c in tokens} == {"fake-x"}
    sent = [c["rooftop_timing"]["sent_ns"] for c in tokens]
    received = {c["rooftop_timing"]["received_ns"] for c in chunks[:-1]}
    assert len(received) == 1
    assert all(b > a for a, b in zip(sent, sent[1:], strict=False))
    # The schedule is a floor: nothing is sent before received + ttft + i * itl.
    (received_ns,) = received
    for i, s in enumerate(sent):
        assert s >= received_ns + 20_000_000 + i * 4_000_000
    # Behind or not, two tokens of one stream are never closer than 0.9 of the gap: a late server slips
    # as an engine whose steps run long, never sending the tokens it owes back to back.
    assert all(b - a >= 3_600_000 for a, b in zip(sent, sent[1:], strict=False))
    # Byte tokenizer: "héllo" is 6 bytes; completion tokens carry the configured skew of 3.
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 6, "completion_tokens": 15, "total_tokens": 21}


def test_streamed_chat_without_usage(server):
    body = {"messages": [{"role": "system", "content": "ab"}, {"role": "user", "content": "cde"}],
            "max_tokens": 3, "stream": True}
    chunks = asyncio.run(_stream(server, "/v1/chat/completions", body))
    assert chunks[-1] == "DONE"
    tokens = chunks[:-1]
    assert len(tokens) == 3  # no usage chunk when include_usage is not asked for
    assert tokens[0]["choices"][0]["delta"] == {"role": "assistant", "content": "a"}
    assert [c["choices"][0]["delta"]["content"] for c in tokens] == ["a", "b", "c"]
    assert tokens[-1]["object"] == "chat.completion.chunk"


def test_non_streamed_chat_reports_usage_and_text(server):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "four"}]}], "max_tokens": 5}
    status, reply = asyncio.run(_post(server, "/v1/chat/completions", body))
    assert status == 200
    assert reply["choices"][0]["message"]["content"] == "abcde"
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"] == {"prompt_tokens": 4, "completion_tokens": 8, "total_tokens": 12}
    timing = reply["rooftop_timing"]
    assert timing["sent_ns"] >= timing["received_ns"] + 20_000_000 + 4 * 4_000_000


def test_tokenize_round_trip_and_models(server):
    text = "rooftop — ceiling ✓"
    status, tok = asyncio.run(_post(server, "/tokenize", {"prompt": text}))
    assert status == 200
    assert tok["tokens"] == list(text.encode())
    assert tok["count"] == len(text.encode()) == 23
    status, detok = asyncio.run(_post(server, "/detokenize", {"tokens": tok["tokens"]}))
    assert (status, detok["prompt"]) == (200, text)

    async def get(path):
        async with aiohttp.ClientSession() as session, session.get(server + path) as resp:
            return resp.status, await resp.text()

    status, models = asyncio.run(get("/v1/models"))
    assert status == 200 and [m["id"] for m in json.loads(models)["data"]] == ["fake-x"]
    assert asyncio.run(get("/health"))[0] == 200


def test_client_hanging_up_mid_stream_leaves_the_server_serving(server):
    async def hang_up():
        async with aiohttp.ClientSession() as session:
            resp = await session.post(server + "/v1/completions", json={"prompt": "x", "max_tokens": 500, "stream": True})
            first = await resp.content.readuntil(b"\n\n")
            resp.close()  # drop the connection with ~500 tokens still to come
            return first

    assert asyncio.run(hang_up()).startswith(b"data: ")
    chunks = asyncio.run(_stream(server, "/v1/completions", {"prompt": "x", "max_tokens": 2, "stream": True}))
    assert len(chunks) == 3


def test_bad_requests_get_400(server):
    assert asyncio.run(_post(server, "/v1/completions", {"prompt": "x", "max_tokens": 0}))[0] == 400
    assert asyncio.run(_post(server, "/v1/chat/completions", {"messages": []}))[0] == 400
    assert asyncio.run(_post(server, "/detokenize", {"tokens": [300]}))[0] == 400


def test_eos_after_stops_early_unless_forbidden(eos_server):
    base = {"prompt": "x", "max_tokens": 10, "stream": True}
    early = asyncio.run(_stream(eos_server, "/v1/completions", base))[:-1]
    assert len(early) == 5 and early[-1]["choices"][0]["finish_reason"] == "stop"
    forced = asyncio.run(_stream(eos_server, "/v1/completions", {**base, "ignore_eos": True}))[:-1]
    assert len(forced) == 10 and forced[-1]["choices"][0]["finish_reason"] == "length"
    floor = asyncio.run(_stream(eos_server, "/v1/completions", {**base, "min_tokens": 7}))[:-1]
    assert len(floor) == 7 and floor[-1]["choices"][0]["finish_reason"] == "stop"


def test_in_process_server_serves_many_concurrent_streams():
    async def run():
        runner, port = await start_fake_server(ttft_ms=5, itl_ms=2, model="m")
        try:
            url = f"http://127.0.0.1:{port}"
            body = {"prompt": "p", "max_tokens": 8, "stream": True}
            results = await asyncio.gather(*(_stream(url, "/v1/completions", body) for _ in range(200)))
        finally:
            await runner.cleanup()
        return results

    results = asyncio.run(run())
    assert len(results) == 200
    assert all(len(r) == 9 and r[-1] == "DONE" for r in results)


def test_nice_lowers_the_process_and_its_autogroup(tmp_path):
    """--nice (calibration: the client under test runs first) lowers the server's priority, and on Linux
    with autogroup its session's group too, since the server runs in a session of its own."""
    proc = subprocess.Popen([sys.executable, "-m", "rooftop.bench.fakeserver", "--port", "0", "--nice", "7"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().startswith("fakeserver ready on http://127.0.0.1:")
        stat = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
        assert int(stat[16]) == 7  # the nice field
        autogroup = Path(f"/proc/{proc.pid}/autogroup")
        if autogroup.exists() and Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
            assert autogroup.read_text().split()[-1] == "7"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
