"""Multi-turn sessions against the synthetic server: each turn sends the history (the model's own replies
included), sessions interleave under closed and open loops, and TTFT is reported per turn."""

import asyncio
import json

import pytest

from rooftop.bench.conversations import TURN_SEPARATOR, turn_body
from rooftop.bench.datasets import Prompt
from rooftop.bench.loadgen import Target
from rooftop.bench.sweep import BenchConfig, run_bench
from rooftop.bench.table import summary_notes
from rooftop.errors import RooftopError


def run(url, tmp_path, **kw):
    cfg = BenchConfig(base_url=url, dataset="conversation", num_requests=None, warmup=1, telemetry=False,
                      out_dir=tmp_path, **{"turn_input_len": 20, "turn_output_len": 6, **kw})
    return asyncio.run(run_bench(cfg))


def test_closed_loop_sessions_send_their_history(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    out = run(srv.url, tmp_path, concurrency=[2], sessions=3, turns=3, repeats=2, think_time_s=0.01)
    recs = [r for r in out.records if not r.warmup]
    assert len(recs) == 2 * 3 * 3 and all(r.ok for r in recs)
    for repeat in (0, 1):
        mine = [r for r in recs if r.repeat == repeat]
        assert sorted((r.session, r.turn) for r in mine) == [(s, t) for s in range(3) for t in (1, 2, 3)]
        for s in range(3):
            t1, t2, t3 = sorted((r for r in mine if r.session == s), key=lambda r: r.turn)
            # context grows by the turn's own 20 tokens, the reply's 6 and the separator's 2 bytes, turn by turn
            assert t1.prompt_tokens_server == 20
            assert t2.prompt_tokens_server == 20 + 6 + 2 + 20 and t3.prompt_tokens_server == 2 * 28 + 20
            # the next turn waits for the reply and the think time
            assert t2.decided_ns >= t1.end_ns + 10_000_000 and t3.decided_ns >= t2.end_ns + 10_000_000
        # two sessions in flight at a time: never more than two requests overlap
        edges = sorted([(r.sent_ns, 1) for r in mine] + [(r.end_ns, -1) for r in mine])
        now = most = 0
        for _, step in edges:
            now += step
            most = max(most, now)
        assert most == 2
    lv = out.summary["levels"][0]
    turns = lv["ttft_ms_by_turn"]
    assert turns["first"]["n"] == 6 and turns["later"]["n"] == 12 and set(turns["by_turn"]) == {"1", "2", "3"}
    assert turns["first"]["ci_method"] != "single"  # two repeats: an interval
    assert any(n.startswith("C=2: TTFT of first turns") for n in summary_notes(out.summary))
    lines = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert {(x["session"], x["turn"]) for x in lines if not x["warmup"]} == {(s, t) for s in range(3) for t in (1, 2, 3)}


def test_turn_k_plus_1_contains_turn_ks_reply_chat(fake_server, tmp_path):
    """The server answers 'abcdef' to every turn: the chat history carries it back as the assistant's message."""
    srv = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    out = run(srv.url, tmp_path, concurrency=[1], sessions=1, turns=3, chat=True)
    t1, t2, t3 = sorted((r for r in out.records if not r.warmup), key=lambda r: r.turn)
    assert t1.output_text == t2.output_text == "abcdef"
    # chat: the synthetic server counts the messages' contents: turn, reply, turn, reply, turn
    assert t3.prompt_tokens_server == 3 * 20 + 2 * 6


def test_the_history_body_holds_the_reply():
    hist = [("first question", "first reply"), ("second", "reply two")]
    chat = turn_body(Target("http://x", "m", chat=True), hist, Prompt("third", 2, 4))
    assert [m["content"] for m in chat["messages"]] == ["first question", "first reply", "second", "reply two", "third"]
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant"] * 2 + ["user"]
    text = turn_body(Target("http://x", "m"), hist, Prompt("third", 2, 4))["prompt"]
    assert text == "first questionfirst reply" + TURN_SEPARATOR + "secondreply two" + TURN_SEPARATOR + "third"
    assert chat["max_tokens"] == 4


def test_open_loop_sessions_start_on_the_schedule(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    out = run(srv.url, tmp_path, concurrency=[], request_rate=[50.0], sessions=4, turns=2)
    recs = [r for r in out.records if not r.warmup]
    firsts = sorted((r for r in recs if r.turn == 1), key=lambda r: r.session)
    assert len(recs) == 8 and all(r.ok for r in recs)
    assert all(r.scheduled_ns == r.decided_ns <= r.sent_ns for r in recs)
    # sessions start in the order of the seeded schedule; a second turn follows its own first turn's reply
    assert [r.scheduled_ns for r in firsts] == sorted(r.scheduled_ns for r in firsts)
    for r in (r for r in recs if r.turn == 2):
        assert r.decided_ns >= next(f for f in firsts if f.session == r.session).end_ns


def test_sharegpt_multi_turn(fake_server, tmp_path):
    data = [
        {"conversations": [{"from": "human", "value": "What is a cache?"}, {"from": "gpt", "value": "A store."},
                           {"from": "human", "value": "And a prefix cache?"}, {"from": "gpt", "value": "Shared."}]},
        {"conversations": [{"from": "human", "value": "One turn only"}, {"from": "gpt", "value": "Yes."}]},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    srv = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    cfg = BenchConfig(base_url=srv.url, dataset="sharegpt", dataset_path=str(path), multi_turn=True, sessions=2,
                      num_requests=None, output_len=5, warmup=0, telemetry=False, concurrency=[2])
    out = asyncio.run(run_bench(cfg))
    recs = sorted(out.records, key=lambda r: (r.session, r.turn))
    assert [(r.session, r.turn) for r in recs] == [(0, 1), (0, 2), (1, 1), (1, 2)]  # the two-exchange one, twice
    q1, q2 = len("What is a cache?"), len("And a prefix cache?")
    assert recs[1].prompt_tokens_server == q1 + 5 + len(TURN_SEPARATOR) + q2
    assert out.summary["dataset_filter"]["dropped"]["single_turn"] == 1


def test_multi_turn_needs_sharegpt():
    with pytest.raises(RooftopError, match="--multi-turn reads ShareGPT"):
        BenchConfig(base_url="http://x", multi_turn=True).check()
