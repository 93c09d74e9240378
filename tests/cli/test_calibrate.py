"""`rooftop calibrate --output-len 1` calibrates TTFT alone; fewer than one output token is one clear error."""

import json
import os
import subprocess
import sys
import time


def calibrate(*args):
    # 150 columns: wide enough for the table's borders, however the suite's own terminal is set.
    return subprocess.run([sys.executable, "-m", "rooftop", "calibrate", "--concurrency", "1,2", "--ttft-ms", "2",
                           *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "150"})


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
    assert [[c.strip() for c in r][:4] for r in rows] == [["1", "1", "48", "0"], ["2", "1", "48", "0"]]
    assert all([c.strip() for c in r][6:8] == ["-", "-"] for r in rows)  # ITL err p50, p99
    assert "ITL: not measured" in done.stdout


def test_no_output_token_is_one_clear_error():
    for n in (0, -3):
        done = calibrate("--output-len", n)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.count("\n") == 1 and f"--output-len {n}: every request needs at least one" in done.stderr
        assert "--output-len 1 (TTFT only)" in done.stderr


def test_server_nice_outside_0_to_19_is_one_clear_error():
    done = calibrate("--server-nice", 25)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "--server-nice 25: a nice value is 0 to 19" in done.stderr


def level(c: int, ttft: tuple[float, float], itl: tuple[float, float] | None = (0.01, 0.1), failed: int = 0):
    from rooftop.bench.calibrate import CalibrationLevel

    def dist(x):
        return {"median": None, "p99": None, "n": 0} if x is None else {"median": x[0], "p99": x[1], "n": 100}

    return CalibrationLevel(concurrency=c, requests=100, failed=failed, ttft_error_ms=dist(ttft),
                            itl_error_ms=dist(itl), tokens_per_s=1.0, server_late_ms=dist((0.2, 0.5)),
                            server_on_schedule=True)


def test_the_verdict_is_the_highest_level_held_from_the_bottom():
    from rooftop.cli.calibrate import verdict

    levels = [level(1, (0.3, 0.6)), level(16, (0.4, 4.9)), level(64, (0.5, 5.0)), level(256, (0.5, 1.0))]
    assert [lv.holds for lv in levels] == [True, True, False, True]
    line = verdict(levels, output_len=32)
    # 256 holds but 64 below it does not: the targets hold up to 16, and 64 says which figure missed.
    assert "TTFT and ITL" in line and "hold up to C=16; missed at C=64 (TTFT err p99 5.000 ms)." in line
    itl_off = [level(1, (0.3, 0.6)), level(16, (0.3, 0.6), itl=(1.2, 3.0)), level(64, (0.3, 0.6), failed=2)]
    assert verdict(itl_off, 32).endswith("hold up to C=1; missed at C=16 (ITL err p50 1.200 ms).")
    assert verdict([level(1, (0.3, 0.6), failed=2)], 32).endswith("hold at no level; missed at C=1 (2 requests failed).")
    ttft_only = [level(1, (0.3, 0.6), itl=None), level(2, (1.5, 2.0), itl=None)]
    assert verdict(ttft_only, 1).startswith("Targets (client error on TTFT: median < 1 ms, p99 < 5 ms)")
    assert verdict(ttft_only, 1).endswith("hold up to C=1; missed at C=2 (TTFT err p50 1.500 ms).")


def test_json_gives_each_level_its_client_processes_and_the_verdict():
    done = calibrate("--itl-ms", 1, "--output-len", 4, "--client-procs", 2, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    levels = out["levels"]
    # Two processes asked for: C=2 splits one user to each; C=1 has one user, so one process.
    assert [(lv["concurrency"], lv["client_procs"], lv["requests"], lv["failed"]) for lv in levels] == [
        (1, 1, 48, 0), (2, 2, 48, 0)]
    for lv in levels:
        assert lv["ttft_error_ms"]["n"] == 48 and lv["itl_error_ms"]["n"] == 48 * 3
        assert lv["server_late_ms"]["n"] == 48 * 4  # every chunk's lateness against the schedule
        assert lv["server_on_schedule"] == (lv["server_late_ms"]["median"] < 2.0)  # 2 ms: more than a fifth of 1 ms
        figures = (lv["ttft_error_ms"], lv["itl_error_ms"])
        assert lv["holds"] == all(f["median"] < 1 and f["p99"] < 5 for f in figures)
    held = [lv["concurrency"] for lv in levels if lv["holds"]]
    expected = None if not levels[0]["holds"] else (2 if levels[1]["holds"] else 1)
    assert out["holds_up_to_concurrency"] == expected and set(held) >= ({expected} - {None})
    assert out["targets_ms"] == {"median": 1.0, "p99": 5.0, "figures": ["ttft_error_ms", "itl_error_ms"]}
    assert out["schedule"] == {"ttft_ms": 2.0, "itl_ms": 1.0, "output_len": 4, "server_nice": 19}
    assert set(out["machine"]["load_average"]) == {"before", "after"}


def children(pid: int) -> dict[int, bytes]:
    """The live children of `pid` and their command lines, from /proc."""
    out = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out[int(p)] = cmd
    return out


def test_a_killed_calibrate_leaves_no_process_behind():

    proc = subprocess.Popen([sys.executable, "-m", "rooftop", "calibrate", "--concurrency", "8", "--client-procs", "2",
                             "--ttft-ms", "5", "--itl-ms", "50", "--output-len", "40"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the synthetic server and two client workers, mid-level
        kids = children(proc.pid)
        if sum(b"rooftop.bench.workers" in c for c in kids.values()) == 2 and any(
                b"rooftop.bench.fakeserver" in c for c in kids.values()):
            break
        time.sleep(0.05)
    else:
        proc.kill()
        raise AssertionError(f"calibrate did not start its server and workers: {kids}")
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while (left := [p for p in kids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, {p: kids[p] for p in left}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
