"""Client worker processes: a level's users split over several event loops, one per process.

One event loop stamps and parses a few tens of thousands of chunks a second before its own queue
shows in the timings (docs/perf/calibration.md). Past that, a level runs as shares (loadgen.split_level)
in N worker processes, each with its own loop and connections. The records come back to the parent
and are merged into one list: every stamp is CLOCK_MONOTONIC (time.perf_counter_ns), one clock for
every process on the host.

Parent and worker speak length-prefixed pickles over the worker's stdin and stdout:

    parent → worker  ("level", spec)    open the share's connections, then answer ("ready",)
                     ("go", start_ns)   start the share at start_ns, the same instant in every worker
                     ("cancel",)        cancel the requests in flight
    worker → parent  ("records", [...]) requests that ended, in batches as the level runs
                     ("end", last_decided_ns, aborted, [...], end_ns) after the level: the requests
                                        cut off (by "cancel"), and when the share stopped issuing and ended

A worker ignores SIGINT (its parent decides when it stops, and collects its records first) and dies
with its parent: PR_SET_PDEATHSIG on Linux, and end of file on its stdin anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import pickle
import signal
import struct
import sys
import time
from collections.abc import Callable

from rooftop.bench.datasets import Prompt
from rooftop.bench.http import Pool
from rooftop.bench.loadgen import (
    LevelPlan,
    LevelRun,
    Share,
    Target,
    level_deadline_ns,
    prepare_bodies,
    run_share,
    split_level,
)
from rooftop.bench.records import RequestRecord
from rooftop.bench.subproc import die_with_parent
from rooftop.errors import RooftopError

_HEADER = struct.Struct("!I")
START_WAIT_S = 60.0  # a worker that has not said hello by then is given up
START_MARGIN_NS = 20_000_000  # "go" names an instant this far ahead, so every worker starts on it
FLUSH_S = 0.05  # a worker sends its finished records this often
CANCEL_WAIT_S = 5.0  # after "cancel", how long the parent waits for a worker's last records
STOP_WAIT_S = 5.0  # after closing a worker's stdin, how long before it is killed


def _frame(msg) -> bytes:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


async def _read_frame(reader: asyncio.StreamReader):
    """The next message, or None at end of file."""
    try:
        (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        return pickle.loads(await reader.readexactly(size))
    except asyncio.IncompleteReadError:
        return None


class Session:
    """A run's client: this process's connection pool, and worker processes once a level needs them."""

    def __init__(self, client_procs: int | None = None):
        self.client_procs = client_procs  # None: loadgen.procs_for decides per level
        self.pool = Pool()
        self.workers = Workers()

    async def close(self) -> None:
        await self.pool.close()
        await self.workers.close()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class _Worker:
    """One worker process, its stdin, and its messages as they arrive (read by one task for its life)."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while (msg := await _read_frame(self.proc.stdout)) is not None:
            self.inbox.put_nowait(msg)
        self.inbox.put_nowait(None)

    def send(self, msg) -> None:
        if self.proc.stdin.is_closing():
            raise self.gone()
        self.proc.stdin.write(_frame(msg))

    async def expect(self, kind: str):
        msg = await self.inbox.get()
        if msg is None:
            raise await self.ended()
        if msg[0] != kind:
            raise RooftopError(f"client worker {self.proc.pid} sent {msg[0]!r} where {kind!r} was due",
                               "this is a bug in rooftop; please report it")
        return msg

    async def ended(self) -> RooftopError:
        """The error for a worker whose output ended: with its exit code once it has one (a moment later)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), 1.0)
        return self.gone()

    def gone(self) -> RooftopError:
        code = self.proc.returncode
        if code is None:
            how = "closed its pipe"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        return RooftopError(f"client worker {self.proc.pid} {how} (its error output, if any, is above)",
                            "run again with --client-procs 1 to keep the load in one process")

    async def stop(self) -> None:
        """Close its stdin (it exits on end of file); kill it if it has not within STOP_WAIT_S."""
        if self.proc.returncode is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), STOP_WAIT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        with contextlib.suppress(asyncio.CancelledError):
            await self.reader

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()


class Workers:
    """Worker processes kept for a whole run (their connections stay open between levels)."""

    def __init__(self):
        self.procs: list[_Worker] = []

    async def ensure(self, n: int) -> None:
        """Start workers until there are `n`; if any fails to start, stop them all and raise."""
        self.procs = [w for w in self.procs if w.proc.returncode is None]
        missing = n - len(self.procs)
        if missing <= 0:
            return
        started = await asyncio.gather(*(self._start() for _ in range(missing)), return_exceptions=True)
        self.procs.extend(w for w in started if isinstance(w, _Worker))
        failed = [e for e in started if not isinstance(e, _Worker)]
        if failed:
            await self.close()
            raise failed[0]

    async def _start(self) -> _Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rooftop.bench.workers", str(os.getpid()),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        worker = _Worker(proc)
        try:
            try:
                await asyncio.wait_for(worker.expect("hello"), START_WAIT_S)
            except TimeoutError:
                raise RooftopError(f"client worker {proc.pid} did not start within {START_WAIT_S:g} s",
                                   "run again with --client-procs 1 to keep the load in one process") from None
        except BaseException:
            worker.kill()
            await proc.wait()
            raise
        return worker

    async def run_level(
        self, procs: int, target: Target, plan: LevelPlan, prompts: list[Prompt], *, repeat: int, warmup: bool,
        seed: int, on_done: Callable[[RequestRecord], None] | None, records: list[RequestRecord],
    ) -> LevelRun:
        """The level over `procs` workers, started and connected before its clock starts."""
        shares = split_level(plan, prompts, seed, procs)
        try:
            await self.ensure(len(shares))
            workers = self.procs[:len(shares)]
            for w, share in zip(workers, shares, strict=True):
                w.send(("level", {"target": target, "plan": plan, "share": share, "repeat": repeat,
                                  "warmup": warmup}))
            await asyncio.gather(*(w.expect("ready") for w in workers))
            start_ns = time.perf_counter_ns() + START_MARGIN_NS
            for w in workers:
                w.send(("go", start_ns))
        except BaseException:
            await self.close()  # a worker half way through a level is no use to the next one
            raise
        collecting = [asyncio.create_task(self._collect(w, records, on_done)) for w in workers]
        interrupted = False
        try:
            await asyncio.wait(collecting, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:
            interrupted = True
        failed = [t.exception() for t in collecting if t.done() and t.exception() is not None]
        if interrupted or failed:
            await self._stop_level(workers, collecting)
            records.sort(key=lambda r: (r.decided_ns, r.index))
            if interrupted:
                raise asyncio.CancelledError
            raise failed[0]
        ends = [t.result() for t in collecting]
        records.sort(key=lambda r: (r.decided_ns, r.index))
        aborted = next((a for _, a, _ in ends if a), None)
        return LevelRun(plan, repeat, records, start_ns, max(e for _, _, e in ends), max(d for d, _, _ in ends),
                        aborted, client_procs=len(workers))

    @staticmethod
    async def _collect(w: _Worker, records: list[RequestRecord], on_done) -> tuple[int, str | None, int]:
        """A worker's records until its level ends: (last decided, why it stopped early, end ns)."""
        while True:
            msg = await w.inbox.get()
            if msg is None:
                raise await w.ended()
            if msg[0] == "records":
                records.extend(msg[1])
                if on_done is not None:
                    for rec in msg[1]:
                        on_done(rec)
                continue
            _, last_decided, aborted, rest, end_ns = msg
            records.extend(rest)
            return last_decided, aborted, end_ns

    async def _stop_level(self, workers: list[_Worker], collecting: list[asyncio.Task]) -> None:
        """Interrupted, or a worker failed: the others cancel their requests and send what they hold
        (a worker that does not within CANCEL_WAIT_S loses its requests in flight); then every worker
        stops, so the next level starts on fresh ones."""
        for w, task in zip(workers, collecting, strict=True):
            if not task.done():
                with contextlib.suppress(RooftopError, OSError):
                    w.send(("cancel",))
        pending = [t for t in collecting if not t.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=CANCEL_WAIT_S)
            for t in late:
                t.cancel()
            await asyncio.gather(*collecting, return_exceptions=True)
        await self.close()

    async def close(self) -> None:
        """Stop every worker; none outlives this call."""
        procs, self.procs = self.procs, []
        await asyncio.gather(*(w.stop() for w in procs))


# The worker process.

async def _serve(out_fd: int) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(out_fd, "wb"))
    inbox: asyncio.Queue = asyncio.Queue()

    async def read_all() -> None:
        while (msg := await _read_frame(reader)) is not None:
            inbox.put_nowait(msg)
        inbox.put_nowait(None)

    reading = asyncio.create_task(read_all())
    out.write(_frame(("hello",)))
    async with Pool() as pool:
        while (msg := await inbox.get()) is not None:
            # A "cancel" that crossed the end of its level is past: only a level starts work here.
            if msg[0] == "level" and not await _level(pool, msg[1], inbox, out):
                break
    reading.cancel()


async def _level(pool: Pool, spec: dict, inbox: asyncio.Queue, out) -> bool:
    """Run one share as the parent says; False when the parent has gone (end of file)."""
    target: Target = spec["target"]
    share: Share = spec["share"]
    bodies = prepare_bodies(target, share)
    with contextlib.suppress(OSError):
        await pool.prewarm(target.url, share.users or 1)
    gc.collect()
    out.write(_frame(("ready",)))
    msg = await inbox.get()
    if msg is None or msg[0] != "go":
        return False
    start_ns = msg[1]
    records: list[RequestRecord] = []
    finished: list[RequestRecord] = []
    sent: set[int] = set()

    def flush() -> None:
        if finished:
            out.write(_frame(("records", finished[:])))
            sent.update(r.index for r in finished)
            finished.clear()

    async def run() -> tuple[int, str | None]:
        await asyncio.sleep(max(0, start_ns - time.perf_counter_ns()) / 1e9)
        return await run_share(pool, target, spec["plan"], share, bodies, start_ns, repeat=spec["repeat"],
                               warmup=spec["warmup"], on_done=finished.append, records=records)

    async def flusher() -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            flush()

    task = asyncio.create_task(run())
    flushing = asyncio.create_task(flusher())
    next_msg = asyncio.create_task(inbox.get())
    await asyncio.wait({task, next_msg}, return_when=asyncio.FIRST_COMPLETED)
    parent_gone = False
    if not task.done():  # "cancel", or the parent went away
        parent_gone = next_msg.result() is None
        task.cancel()
    else:
        next_msg.cancel()
    try:
        last_decided, aborted = await task
    except asyncio.CancelledError:
        last_decided, aborted = max([start_ns, *(r.decided_ns for r in records)]), "interrupted"
    flushing.cancel()
    flush()
    rest = [r for r in records if r.index not in sent]
    end_ns = min(time.perf_counter_ns(), level_deadline_ns(spec["plan"], share, start_ns, target.timeout_s))
    out.write(_frame(("end", last_decided, aborted, rest, end_ns)))
    return not parent_gone


def main() -> None:
    """Entry point of a worker process: `python -m rooftop.bench.workers PARENT_PID`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(int(sys.argv[1]))
    out_fd = os.dup(1)
    os.dup2(2, 1)  # a stray print goes to stderr, never into the frames
    asyncio.run(_serve(out_fd))


if __name__ == "__main__":
    main()
