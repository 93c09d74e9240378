"""`rooftop calibrate --output-len 1` calibrates TTFT alone; fewer than one output token is one clear error."""

import json
import subprocess
import sys


def calibrate(*args):
    return subprocess.run([sys.executable, "-m", "rooftop", "calibrate", "--concurrency", "1,2", "--ttft-ms", "2",
                           *map(str, args)], capture_output=True, text=True, timeout=300)


def test_one_output_token_measures_ttft_only():
    done = calibrate("--output-len", 1, "--json")
    assert done.returncode == 0, done.stderr
    levels = json.loads(done.stdout)["levels"]
    assert [(lv["concurrency"], lv["requests"], lv["failed"]) for lv in levels] == [(1, 48, 0), (2, 48, 0)]
    for lv in levels:
        assert lv["ttft_error_ms"]["n"] == 48 and lv["ttft_error_ms"]["median"] is not None
        assert lv["itl_error_ms"] == {"median": None, "p99": None, "n": 0}  # one token: no gap to time


def test_one_output_token_prints_a_table_without_itl():
    done = calibrate("--output-len", 1)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    rows = [line.split("│")[1:-1] for line in done.stdout.splitlines() if line.startswith("│")]
    assert [[c.strip() for c in r][:3] for r in rows] == [["1", "48", "0"], ["2", "48", "0"]]
    assert all([c.strip() for c in r][5:7] == ["-", "-"] for r in rows)  # ITL err p50, p99
    assert "ITL: not measured" in done.stdout


def test_no_output_token_is_one_clear_error():
    for n in (0, -3):
        done = calibrate("--output-len", n)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.count("\n") == 1 and f"--output-len {n}: every request needs at least one" in done.stderr
        assert "--output-len 1 (TTFT only)" in done.stderr
