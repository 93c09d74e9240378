"""The engine's step loop in a process of its own, apart from the HTTP front end.

In one process the front end's Python work (request parsing, an SSE chunk per token, socket writes)
takes the GIL from the step loop: on an H200 at 64 streams the served decode step was 4.1 ms where
the same loop without HTTP took 3.0 ms (`benchmarks/engine_loop_gpu.py`). Here the front end keeps
`EngineProcess`, which offers the part of `Engine` the server uses (submit, abort, the step records,
the queue figures, profiling), and the engine runs in a child started with `spawn`. They talk over
one pipe: requests and aborts go down; token events and step records come up in batches, one per
burst (a decode step hands out a token for every running request at once).

The child ends when the front end says so, when the pipe closes (the front end exited or died), and
with the front end's process group. It ignores Ctrl-C: the front end gets it and stops the child.
"""

import itertools
import multiprocessing
import os
import signal
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import fields
from pathlib import Path

from rooftop.engine.build import ServeConfig, build_engine, resolve_device
from rooftop.engine.engine import Engine, StepRecord, TokenEvent
from rooftop.engine.profiling import warm_profiler
from rooftop.engine.sequence import SamplingParams
from rooftop.engine.tokenizer import ByteTokenizer

# how often the child sends the queue figures (running, waiting, KV usage) when nothing else happens
FIGURES_EVERY_S = 0.25
STOP_TIMEOUT_S = 10
# a StepRecord crosses the pipe as the tuple of its fields, in this order (a TokenEvent too, spelt out: there
# are a step's worth of them per step)
STEP_FIELDS = tuple(f.name for f in fields(StepRecord))


class EngineProcess:
    """An engine in a child process, driven like an in-process `Engine`. The constructor returns once
    the child's engine is built and warmed up, or raises RuntimeError with the child's reason."""

    def __init__(self, cfg: ServeConfig):
        ctx = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
        self._conn, child_end = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=_child_main, args=(cfg, child_end), name="rooftop-engine-core",
                                 daemon=True)
        self._proc.start()
        child_end.close()
        self._send_lock = threading.Lock()
        self._sinks: dict[int, Callable[[TokenEvent], None]] = {}
        self._calls: dict[int, Future] = {}
        self._ids = itertools.count()
        self.step_listeners: list[Callable[[StepRecord], None]] = []
        # the child's figures as of its last message
        self.num_running = 0
        self.num_waiting = 0
        self.kv_cache_usage = 0.0
        self.dead: str | None = None
        try:
            kind, info = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(5)
            code = self._proc.exitcode
            raise RuntimeError("the engine process exited while starting"
                               + ("" if code is None else f" (exit code {code})")) from None
        if kind != "ready":
            self.stop()
            raise RuntimeError(info)
        self.vocab_size: int = info["vocab_size"]
        self.pid = self._proc.pid
        self._reader = threading.Thread(target=self._read, name="rooftop-engine-reader", daemon=True)
        self._reader.start()

    # ---- Engine's interface, as the server uses it ------------------------------------------
    def submit(self, prompt_ids: list[int], params: SamplingParams, stops: list[str],
               sink: Callable[[TokenEvent], None], export_kv=None) -> int:
        if export_kv is not None:
            raise ValueError("export_kv reads the cache: it needs the engine in the server's process")
        if self.dead:
            raise RuntimeError(self.dead)
        rid = next(self._ids)
        self._sinks[rid] = sink  # before the request goes: its first event may come at once
        self._send(("add", rid, prompt_ids, params, stops))
        return rid

    def abort(self, rid: int) -> None:
        self._sinks.pop(rid, None)
        try:
            self._send(("abort", rid))
        except RuntimeError:  # the child is gone: nothing left to abort
            pass

    def start_profile(self, path: Path, eager: bool = False) -> Future:
        return self._call("start_profile", str(path), eager)

    def stop_profile(self) -> Future:
        return self._call("stop_profile")

    def stop(self) -> None:
        """Ask the child to stop; kill it if it does not within STOP_TIMEOUT_S."""
        try:
            self._send(("stop",))
        except RuntimeError:
            pass
        self._proc.join(STOP_TIMEOUT_S)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._conn.close()

    # ---- the pipe -------------------------------------------------------------------------------
    def _send(self, msg: tuple) -> None:
        try:
            with self._send_lock:
                self._conn.send(msg)
        except (OSError, ValueError) as exc:  # BrokenPipe, or closed
            raise RuntimeError(self.dead or f"the engine process is gone: {exc}") from None

    def _call(self, name: str, *args) -> Future:
        fut: Future = Future()
        cid = next(self._ids)
        self._calls[cid] = fut
        self._send(("call", cid, name, args))
        return fut

    def _read(self) -> None:
        try:
            while True:
                msg = self._conn.recv()
                if msg[0] == "batch":
                    self._on_batch(*msg[1:])
                elif msg[0] == "reply":
                    _, cid, ok, value = msg
                    fut = self._calls.pop(cid)
                    fut.set_result(value) if ok else fut.set_exception(RuntimeError(value))
        except (EOFError, OSError):
            pass
        except Exception as exc:  # noqa: BLE001 - a reader that stops must not leave clients waiting
            traceback.print_exc(file=sys.stderr)
            self._died(f"the engine process's events could not be read: {type(exc).__name__}: {exc}")
            self._proc.kill()
            return
        self._proc.join(1)
        code = self._proc.exitcode
        self._died("the engine process exited" + ("" if code is None else f" (exit code {code})"))

    def _on_batch(self, records: list[tuple], events: list[tuple], figures: tuple[int, int, float]) -> None:
        # the figures and the records first: a client that scrapes after its reply sees its steps and end
        self.num_running, self.num_waiting, self.kv_cache_usage = figures
        for values in records:
            record = StepRecord(*values)
            for listener in self.step_listeners:
                listener(record)
        for rid, *values in events:
            ev = TokenEvent(*values)
            sink = self._sinks.pop(rid, None) if ev.finish_reason is not None else self._sinks.get(rid)
            if sink is not None:
                sink(ev)

    def _died(self, why: str) -> None:
        self.dead = why
        for sink in list(self._sinks.values()):
            sink(TokenEvent(-1, "", 0.0, [], 0, 0, "error", why))
        self._sinks.clear()
        for fut in list(self._calls.values()):
            fut.set_exception(RuntimeError(why))
        self._calls.clear()


# ---- the child ----------------------------------------------------------------------------------
def log(msg: str) -> None:
    """A line of the engine's start-up log, on stderr."""
    print(f"rooftop-engine: {msg}", file=sys.stderr, flush=True)


def start_engine(cfg: ServeConfig, before_start: Iterable[Callable[[Engine], None]] = ()) -> Engine:
    """Build the engine, hand it to each of before_start (step listeners, gauges), start its loop and
    warm it up: in the server's process, or in the engine process's child."""
    engine = build_engine(cfg, log=log)
    for hook in before_start:
        hook(engine)
    engine.start()
    warm_up(engine)
    return engine


def warm_up(engine: Engine) -> None:
    """One short greedy request through the whole step path, so a broken setup fails before 'ready'."""
    done = threading.Event()
    errors = []

    def sink(ev: TokenEvent) -> None:
        if ev.error:
            errors.append(ev.error)
        if ev.finish_reason is not None:
            done.set()

    engine.submit([ByteTokenizer.bos_id, ord("a")], SamplingParams(max_tokens=2, temperature=0.0,
                                                                   ignore_eos=True), [], sink)
    if not done.wait(timeout=600):
        raise RuntimeError("warm-up request did not finish in 600 s")
    if errors:
        raise RuntimeError(errors[0])


def _child_main(cfg: ServeConfig, conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the front end stops us
    try:
        if cfg.profile_dir:
            warm_profiler(resolve_device(cfg.device))
        engine = start_engine(cfg)
    except Exception as exc:  # noqa: BLE001 - the reason goes to the front end, which reports it
        try:
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
        return
    _Core(engine, conn).serve()


class _Core:
    """The child's side of the pipe: requests into the engine, its events and steps out in batches."""

    def __init__(self, engine: Engine, conn):
        self.engine, self.conn = engine, conn
        self.send_lock = threading.Lock()
        self.outbox: deque = deque()  # (None, StepRecord) and (rid, TokenEvent), in the engine's order
        self.wake = threading.Event()
        self.seq_ids: dict[int, int] = {}  # the front end's request id -> the engine's, while it runs
        self.ids_lock = threading.Lock()  # a request may end before submit() returns its id
        engine.step_listeners.append(self._on_step)

    def _on_step(self, record: StepRecord) -> None:
        self.outbox.append((None, record))
        self.wake.set()

    def _sink(self, rid: int) -> Callable[[TokenEvent], None]:
        def sink(ev: TokenEvent) -> None:
            if ev.finish_reason is not None:
                with self.ids_lock:
                    self.seq_ids.pop(rid, None)
            self.outbox.append((rid, ev))
            self.wake.set()

        return sink

    def send(self, msg: tuple) -> None:
        with self.send_lock:
            self.conn.send(msg)

    def serve(self) -> None:
        self.send(("ready", {"vocab_size": self.engine.vocab_size}))
        threading.Thread(target=self._write, name="rooftop-engine-writer", daemon=True).start()
        try:
            while True:
                msg = self.conn.recv()
                if msg[0] == "add":
                    _, rid, prompt_ids, params, stops = msg
                    with self.ids_lock:
                        self.seq_ids[rid] = self.engine.submit(prompt_ids, params, stops, self._sink(rid))
                elif msg[0] == "abort":
                    with self.ids_lock:
                        seq_id = self.seq_ids.pop(msg[1], None)
                    if seq_id is not None:
                        self.engine.abort(seq_id)
                elif msg[0] == "call":
                    self._call(*msg[1:])
                elif msg[0] == "stop":
                    break
        except (EOFError, OSError):  # the front end is gone
            pass
        self.engine.stop()

    def _call(self, cid: int, name: str, args: tuple) -> None:
        def reply(fut: Future) -> None:
            exc = fut.exception()
            self.send(("reply", cid, exc is None, fut.result() if exc is None else str(exc)))

        try:
            if name == "start_profile":
                fut = self.engine.start_profile(Path(args[0]), args[1])
            elif name == "stop_profile":
                fut = self.engine.stop_profile()
            else:
                raise RuntimeError(f"unknown call {name!r}")
        except RuntimeError as exc:
            self.send(("reply", cid, False, str(exc)))
            return
        fut.add_done_callback(reply)

    def _write(self) -> None:
        """Send what the engine handed out, a batch per wake-up; the queue figures at least every
        FIGURES_EVERY_S when they change."""
        engine, last = self.engine, None
        while True:
            self.wake.wait(FIGURES_EVERY_S)
            self.wake.clear()
            records, events = [], []
            while self.outbox:
                rid, item = self.outbox.popleft()
                if rid is None:
                    records.append(tuple([getattr(item, name) for name in STEP_FIELDS]))
                else:
                    events.append((rid, item.token_id, item.text, item.logprob, item.top, item.num_prompt_tokens,
                                   item.num_completion_tokens, item.finish_reason, item.error, item.seq_id))
            figures = (engine.num_running, engine.num_waiting, engine.kv_cache_usage)
            if records or events or figures != last:
                try:
                    self.send(("batch", records, events, figures))
                except OSError:  # the front end is gone
                    return
                except Exception:  # noqa: BLE001 - without its writer the child would serve no one: end it
                    traceback.print_exc(file=sys.stderr)
                    os._exit(1)
                last = figures
