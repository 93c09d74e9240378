"""Traces in their published layouts (samples in tests/data/traces/): parsed, windowed, sped up and cut; a bad
line is one error naming the file, the line and the field."""

from pathlib import Path

import pytest

from rooftop.bench.traces import BLOCK_TOKENS, expected_reuse, read_trace, replay
from rooftop.errors import RooftopError

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


def test_mooncake_jsonl():
    t = read_trace(DATA / "mooncake.jsonl", "mooncake")
    assert [r.at_ms for r in t.requests] == [0, 0, 250, 1250, 2750, 3000]
    assert [r.input_len for r in t.requests] == [1100, 700, 1500, 600, 300, 1024]
    assert t.requests[2].hash_ids == (0, 1, 5) and t.requests[2].output_len == 10 and t.requests[2].line == 3
    rep = replay(t)
    assert rep.offsets_ns == [0, 0, 250_000_000, 1_250_000_000, 2_750_000_000, 3_000_000_000]
    assert rep.cut is None and rep.mean_rate == pytest.approx(5 / 3.0)
    # leading blocks seen before: line 3 reuses 0, 1 (1024 tokens), line 4 reuses 0 (512), line 6 reuses 3 (512)
    # and of 4 the 188 tokens line 2 held (its prompt of 700 ends there; line 6's block 4 is a full 512)
    assert expected_reuse(rep) == pytest.approx((1024 + 512 + 512 + 188) / (1100 + 700 + 1500 + 600 + 300 + 1024),
                                                abs=1e-6)


def test_burstgpt_csv_leaves_out_failed_rows_and_counts_them():
    t = read_trace(DATA / "burstgpt.csv", "burstgpt")
    assert [(r.at_ms, r.input_len, r.output_len) for r in t.requests] == [
        (0, 472, 18), (113_000, 417, 276), (117_000, 1360, 198), (132_000, 223, 57)]
    assert t.skipped == {"no_response_tokens": 1} and t.requests[1].line == 4


def test_azure_csv_times_from_the_first_request():
    t = read_trace(DATA / "azure.csv", "azure")
    assert [r.input_len for r in t.requests] == [374, 396, 879, 1606]
    assert [round(r.at_ms, 3) for r in t.requests] == [0, 4314.579, 4372.996, 6447.794]
    assert t.skipped == {"no_generated_tokens": 1}


def test_rooftops_own_jsonl():
    t = read_trace(DATA / "rooftop.jsonl", "trace")
    assert [r.at_ms for r in t.requests] == [0, 120.5, 300, 310]
    assert t.requests[2].prompt == "Say hello in three words." and t.requests[2].input_len is None
    assert t.requests[1].hash_ids == (7, 8) and t.requests[0].hash_ids is None


def test_window_speedup_and_a_cut_that_is_said():
    t = read_trace(DATA / "mooncake.jsonl", "mooncake")
    rep = replay(t, speedup=2.0, window_s=(0.2, 3.0))
    assert [r.line for r in rep.requests] == [3, 4, 5]  # [0.2 s, 3.0 s) of trace time
    assert rep.offsets_ns == [0, 500_000_000, 1_250_000_000]  # from the window's first, halved
    assert rep.cut is None
    cut = replay(t, num_requests=4)
    assert len(cut.requests) == 4 and cut.cut == ("trace cut to its first 4 of 6 requests by --num-requests 4: "
                                                  "1.2 s of its 3.0 s replayed")
    by_time = replay(t, speedup=2.0, duration_s=1.0)
    assert [r.line for r in by_time.requests] == [1, 2, 3, 4] and "--duration 1" in by_time.cut
    with pytest.raises(RooftopError, match="no request in the window 10:20 s"):
        replay(t, window_s=(10.0, 20.0))


BAD = [
    ("mooncake", '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n{"timestamp": 5, '
                 '"input_length": 10\n', 2, None, "is not JSON"),
    ("mooncake", '{"timestamp": -5, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n', 1, "timestamp",
     "a timestamp is 0 or more"),
    ("mooncake", '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n\n'
                 '{"timestamp": 1, "output_length": 2, "hash_ids": [1]}\n', 3, "input_length", "is missing"),
    ("mooncake", '{"timestamp": 1, "input_length": 10, "output_length": 2}\n', 1, "hash_ids", "is missing"),
    ("mooncake", f'{{"timestamp": 1, "input_length": {BLOCK_TOKENS}, "output_length": 2, "hash_ids": [1, 2]}}\n', 1,
     "hash_ids", "names 2 blocks"),
    ("trace", '{"timestamp_ms": 0, "input_len": 3, "output_len": "many"}\n', 1, "output_len", "not a number"),
    ("trace", '[1, 2]\n', 1, None, "not an object"),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,x\n"
                 "6,ChatGPT,,18,490,x\n", 3, "Request tokens", "is missing"),
    ("burstgpt", "Timestamp,Model,Request tokens,Total tokens\n5,ChatGPT,472,490\n", 1, "Response tokens",
     "not a column"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\nyesterday,1,1\n", 3,
     "TIMESTAMP", "not a date and time"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,-3,44\n", 2, "ContextTokens",
     "at least 0"),
]


@pytest.mark.parametrize("fmt,text,line,field,why", BAD)
def test_a_bad_line_is_one_error_naming_file_line_and_field(tmp_path, fmt, text, line, field, why):
    path = tmp_path / "t.txt"
    path.write_text(text)
    with pytest.raises(RooftopError) as err:
        read_trace(path, fmt)
    problem = err.value.problem
    assert problem.startswith(f"{path}, line {line}" + (f", field {field!r}" if field else " ")), problem
    assert why in problem and "nothing was sent" in problem
    assert f"--dataset {fmt}" in err.value.fix
