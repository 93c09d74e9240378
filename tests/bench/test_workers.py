"""A level split over client worker processes: one stream of records on one clock, the open loop's
schedule kept to the nanosecond, a dead worker one clear error with the records kept, and no worker
outliving its parent however the parent ends."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rooftop.bench.datasets import Prompt
from rooftop.bench.loadgen import LevelPlan, Target, arrival_offsets_ns, split_level
from rooftop.bench.records import ERR_CANCELLED
from rooftop.bench.workers import Session
from rooftop.errors import RooftopError

PROMPTS = [Prompt("hello " * 4, 24, 4), Prompt("other " * 4, 24, 6)]


def target(url: str) -> Target:
    return Target(url, "fake", timeout_s=60)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    """The pids still alive after up to timeout_s."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_split_deals_every_request_once():
    closed = split_level(LevelPlan(concurrency=5, num_requests=12), PROMPTS, seed=0, procs=2)
    assert [s.users for s in closed] == [3, 2]
    # Request i goes with user i mod 5, and users 0, 2, 4 run in the first process.
    assert [s.indices for s in closed] == [[0, 2, 4, 5, 7, 9, 10], [1, 3, 6, 8, 11]]
    assert all(p is PROMPTS[i % 2] for s in closed for i, p in zip(s.indices, s.prompts, strict=True))
    assert len(split_level(LevelPlan(concurrency=1, num_requests=12), PROMPTS, seed=0, procs=4)) == 1
    opened = split_level(LevelPlan(request_rate=50, max_concurrency=5, num_requests=7), PROMPTS, seed=3, procs=2)
    arrivals = arrival_offsets_ns(50, 7, seed=3)
    assert [s.indices for s in opened] == [[0, 2, 4, 6], [1, 3, 5]] and [s.users for s in opened] == [3, 2]
    assert [s.arrivals_ns for s in opened] == [arrivals[0::2], arrivals[1::2]]


def test_a_level_over_two_workers_is_one_stream(fake_server):
    srv = fake_server("--ttft-ms", "3", "--itl-ms", "1")
    done = []

    async def main():
        async with Session(client_procs=2) as session:
            from rooftop.bench.level import run_level

            first = await run_level(session, target(srv.url), LevelPlan(concurrency=8, num_requests=40), PROMPTS,
                                    repeat=1, on_done=done.append)
            pids = [w.proc.pid for w in session.workers.procs]
            second = await run_level(session, target(srv.url), LevelPlan(concurrency=8, num_requests=16), PROMPTS)
            assert [w.proc.pid for w in session.workers.procs] == pids, "workers live for the whole run"
            return first, second, pids

    run, second, pids = asyncio.run(main())
    assert run.client_procs == 2 and second.client_procs == 2 and len(set(pids)) == 2
    recs = run.records
    assert sorted(r.index for r in recs) == list(range(40)) and len(done) == 40
    assert [r.decided_ns for r in recs] == sorted(r.decided_ns for r in recs)  # one stream, in decision order
    for r in recs:
        assert r.ok and r.repeat == 1 and r.concurrency == 8 and not r.warmup
        assert len(r.chunk_ns) == r.expected_output_len == PROMPTS[r.index % 2].output_len
        # One clock across processes: the server's stamps fall inside the client's, as causality requires.
        assert run.start_ns <= r.decided_ns <= r.sent_ns < r.server_received_ns
        assert r.server_sent_ns[0] < r.chunk_ns[0] and r.server_sent_ns[-1] < r.chunk_ns[-1] <= r.end_ns <= run.end_ns
    assert run.last_decided_ns == max(r.decided_ns for r in recs)
    assert not wait_gone(pids), "the session's end stops its workers"


def test_the_open_loop_keeps_its_schedule_over_workers(fake_server):
    srv = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    plan = LevelPlan(request_rate=400, num_requests=24)

    async def main():
        async with Session(client_procs=3) as session:
            from rooftop.bench.level import run_level

            return await run_level(session, target(srv.url), plan, PROMPTS, seed=11)

    run = asyncio.run(main())
    assert run.client_procs == 3
    due = arrival_offsets_ns(400, 24, seed=11)
    # Every request is decided at its scheduled arrival on the level's clock, whichever process sent it.
    assert {r.index: r.decided_ns - run.start_ns for r in run.records} == dict(enumerate(due))
    assert all(r.ok for r in run.records)


def test_a_killed_worker_is_one_clear_error_and_keeps_the_records(fake_server):
    srv = fake_server("--ttft-ms", "5", "--itl-ms", "20")  # 20 tokens: 0.4 s a request
    prompts = [Prompt("slow " * 4, 20, 20)]
    done = []
    records = []

    async def main():
        async with Session(client_procs=2) as session:
            from rooftop.bench.level import run_level

            level = asyncio.create_task(run_level(session, target(srv.url), LevelPlan(concurrency=4, num_requests=24),
                                                  prompts, on_done=done.append, records=records))
            while not done:  # the first requests have ended and come back
                await asyncio.sleep(0.02)
            pids = [w.proc.pid for w in session.workers.procs]
            os.kill(pids[0], signal.SIGKILL)
            with pytest.raises(RooftopError) as err:
                await level
            return err.value, pids, list(done)

    err, pids, ended_before = asyncio.run(main())
    assert f"client worker {pids[0]} was killed by SIGKILL" in err.problem and "--client-procs 1" in err.fix
    kept = {id(r) for r in records}
    assert all(id(r) in kept for r in ended_before), "records already collected are kept"
    assert len({r.index for r in records}) == len(records) < 24
    # The surviving worker was told to stop: its requests cut off are recorded as cancelled.
    assert any(r.error_class == ERR_CANCELLED for r in records)
    assert all(r.ok or r.error_class == ERR_CANCELLED for r in records)
    assert not wait_gone(pids)


def test_a_worker_that_cannot_start_is_one_clear_error(fake_server, monkeypatch):
    srv = fake_server("--ttft-ms", "1", "--itl-ms", "1")
    monkeypatch.setattr(sys, "executable", "/bin/false")  # every worker exits at once, code 1

    async def main():
        async with Session(client_procs=2) as session:
            from rooftop.bench.level import run_level

            with pytest.raises(RooftopError) as err:
                await run_level(session, target(srv.url), LevelPlan(concurrency=4, num_requests=8), PROMPTS)
            return err.value, session.workers.procs

    err, left = asyncio.run(main())
    assert "exited with code 1" in err.problem and left == []


PARENT = textwrap.dedent("""
    import asyncio, sys
    from rooftop.bench.datasets import Prompt
    from rooftop.bench.level import run_level
    from rooftop.bench.loadgen import LevelPlan, Target
    from rooftop.bench.workers import Session

    async def main():
        records = []
        async with Session(client_procs=2) as session:
            level = asyncio.create_task(run_level(session, Target(sys.argv[1], "fake", timeout_s=60),
                                                  LevelPlan(concurrency=4, num_requests=400),
                                                  [Prompt("slow " * 4, 20, 50)], records=records))
            while len(session.workers.procs) < 2 or not records:
                await asyncio.sleep(0.02)
            print(*(w.proc.pid for w in session.workers.procs), flush=True)
            try:
                await level
            finally:
                print(len(records), sum(r.error_class == "cancelled" for r in records), flush=True)

    asyncio.run(main())
""")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_no_worker_outlives_its_parent(fake_server, how):
    srv = fake_server("--ttft-ms", "5", "--itl-ms", "20")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, srv.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2 and all(alive(p) for p in pids), parent.stderr.read()
    parent.send_signal(how)
    out, err = parent.communicate(timeout=30)
    assert not wait_gone(pids), f"workers outlived a parent ended by {how.name}"
    if how == signal.SIGINT:  # Ctrl-C: the parent collects what its workers hold, then ends with KeyboardInterrupt
        collected, cancelled = map(int, out.split())
        assert "KeyboardInterrupt" in err and collected > cancelled >= 1, (out, err)


def test_rooftop_bench_runs_its_levels_over_workers(fake_server, tmp_path):
    import json

    from rooftop.bench.sweep import BenchConfig, run_bench

    srv = fake_server("--ttft-ms", "3", "--itl-ms", "1")
    cfg = BenchConfig(base_url=srv.url, input_len=24, output_len=5, concurrency=[1, 6], num_requests=18, warmup=2,
                      repeats=2, out_dir=tmp_path, client_procs=2)
    out = asyncio.run(run_bench(cfg))
    assert [(run.plan.concurrency, run.client_procs) for run in out.level_runs] == [(1, 1), (6, 2), (1, 1), (6, 2)]
    lines = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    for c in (1, 6):
        for repeat in (0, 1):
            recs = [x for x in lines if not x["warmup"] and x["concurrency"] == c and x["repeat"] == repeat]
            assert sorted(x["index"] for x in recs) == list(range(18)) and all(x["status"] == "ok" for x in recs)
            assert all(len(x["chunk_ns"]) == 5 == x["completion_tokens_client"] for x in recs)
            assert all(x["prompt_tokens_client"] == 24 for x in recs)
    levels = {lv["concurrency"]: lv for lv in out.summary["levels"]}
    assert levels[6]["valid"] and levels[6]["completed"] == 36 and levels[6]["failed"] == 0
    assert (levels[1]["client_procs"], levels[6]["client_procs"]) == (1, 2)  # summary.json says which ran it


def worker_pids() -> list[int]:
    """This process's client workers, from /proc."""
    pids = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if ppid == os.getpid() and b"rooftop.bench.workers" in cmd:
            pids.append(int(p))
    return pids


def test_a_dead_worker_in_rooftop_bench_keeps_the_level_records(fake_server, tmp_path):
    import json

    from rooftop.bench.sweep import BenchConfig, run_bench

    srv = fake_server("--ttft-ms", "5", "--itl-ms", "20")
    cfg = BenchConfig(base_url=srv.url, input_len=24, output_len=20, concurrency=[4], num_requests=24, warmup=1,
                      out_dir=tmp_path, client_procs=2)
    killed = []

    def on_done(rec) -> None:
        if not rec.warmup and not killed:
            killed.append(worker_pids()[0])
            os.kill(killed[0], signal.SIGKILL)

    with pytest.raises(RooftopError) as err:
        asyncio.run(run_bench(cfg, on_request_done=on_done))
    assert f"client worker {killed[0]} was killed by SIGKILL" in err.value.problem
    measured = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    measured = [x for x in measured if not x["warmup"]]
    assert measured and any(x["status"] == "ok" for x in measured), "the records collected are written"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert not summary["complete"] and f"client worker {killed[0]} was killed" in summary["aborted"]
    assert not wait_gone(killed + worker_pids())
