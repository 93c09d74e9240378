"""The step loop: a background thread that schedules, runs and samples; requests in and tokens out by queue.

The loop overlaps the host with the device: it launches step N+1 before it reads step N's picks back,
so scheduling, batch building and the hand-out of tokens run while the GPU works. Step N+1's inputs
take step N's picks on the device (the host holds PENDING_TOKEN there until they come back); a
sequence whose next token is its last by length is not scheduled again; one that ends by its
end-of-sequence token or a stop string is seen a step late, and that step's pick for it is dropped.
"""

import codecs
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from rooftop.engine.kv.block_manager import BlockManager, blocks_for
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.config import EOS_ID
from rooftop.engine.model_runner import ModelRunner, Picks, RunnerConfig
from rooftop.engine.profiling import StepProfiler
from rooftop.engine.scheduler import Scheduler, SchedulerConfig
from rooftop.engine.sequence import PENDING_TOKEN, SamplingParams, Sequence


@dataclass(slots=True)
class TokenEvent:
    """One generated token of a request, as the server streams it."""

    token_id: int
    text: str  # text this token releases ("" while a UTF-8 character or a possible stop string is incomplete)
    logprob: float
    top: list[tuple[int, float]]  # top-N (token id, logprob) of this position, when asked for
    num_prompt_tokens: int
    num_completion_tokens: int
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" on the last event
    error: str | None = None
    seq_id: int = -1  # the engine's id of the request (what its StepRecord batches name)


@dataclass(slots=True)
class StepRecord:
    """What one engine step did and how long it took.

    `seconds` is the step's share of the engine's wall time: from its launch, or from the previous
    step's end if that came later (steps overlap), to the moment its picks were on the host. Over a
    busy stretch the steps' seconds add up to its wall time."""

    kind: str  # "prefill" (prompt chunks, and the running requests' next tokens with them) | "decode"
    num_seqs: int
    num_tokens: int
    seconds: float
    num_preemptions: int  # preemptions the scheduler made to form this step
    # prompt tokens computed for sequences whose KV came from a prefill worker (PD decode): 0 unless preempted
    num_imported_prompt_tokens: int = 0
    # tokens of sequences decoding in this step: all of a decode step's, and those riding in a prefill step
    num_decode_tokens: int = 0
    # the step's forward on the device, between CUDA events around it (graph replay or eager kernels;
    # the graph's input copy-in and sampling not included): set beside `seconds` on a GPU where the
    # step sampled, else None. Over the same steps, seconds / device_seconds is what the served step
    # costs past its forward.
    device_seconds: float | None = None
    # prefix cache, in tokens, over the sequences this step admitted: looked up, and found cached
    num_prefix_query_tokens: int = 0
    num_prefix_hit_tokens: int = 0
    # the step's number (from 0, in launch order) and its launch and read-back, time.time_ns() (the clock
    # OTLP spans carry; steps overlap, so a step starts before the previous one ends)
    step_id: int = 0
    start_ns: int = 0
    end_ns: int = 0
    # with Engine.trace_steps only (--otlp-traces-endpoint), else None: each sequence of the step as
    # (seq_id, tokens cached before the step, tokens it computes, whether a prompt chunk); the sequences
    # this step's scheduling preempted; those queued since the previous step, as (seq_id, time.time_ns())
    batch: list[tuple[int, int, int, bool]] | None = None
    preempted: list[int] | None = None
    queued: list[tuple[int, int]] | None = None
    # with speculation (--speculative-config), as vLLM counts it: sequences that brought drafts, draft tokens
    # scored, drafts accepted, and accepted drafts by position (index 0: the first draft); num_tokens and
    # num_decode_tokens count the drafts too
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] | None = None


@dataclass(slots=True)
class _Launched:
    """A step whose work is queued on the device; its picks are read after the next step is launched."""

    record: StepRecord  # its seconds are set when its picks are read
    started: float
    sampled: list[Sequence]
    positions: list[int]  # where each sampled sequence's PENDING_TOKEN stands in its token_ids
    picks: Picks | None


@dataclass(slots=True)
class _Request:
    seq: Sequence
    sink: Callable[[TokenEvent], None]
    stops: list[str]
    decoder: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    text: str = ""
    num_sent_chars: int = 0
    # PD prefill: called on the engine thread when the request ends, before its pages are freed
    export_kv: Callable[[Sequence], None] | None = None


class Engine:
    """Continuous-batching engine over one model and one paged KV cache; thread-safe submit/abort/call."""

    dead: str | None = None  # in the server's own process the engine ends with it (EngineProcess may die alone)
    # fill StepRecord.batch/preempted/queued for request spans (tracing.py); off, a step pays one test for it
    trace_steps: bool = False

    def __init__(self, model: torch.nn.Module, cache: KVCache, context_length: int,
                 indexer_bound: str = "actual", max_running_requests: int = 64, chunked_prefill_size: int = 512,
                 cuda_graphs: bool = True, enable_prefix_caching: bool = True):
        self.context_length = context_length
        self.runner = ModelRunner(
            model, cache, RunnerConfig(cache.block_size, context_length, indexer_bound, cuda_graphs, max_running_requests,
                                       chunked_prefill_size),
            cache.device,
        )
        usable_blocks = cache.num_blocks - self.runner.reserved_blocks
        if blocks_for(context_length, cache.block_size) > usable_blocks:
            raise ValueError(f"KV cache of {usable_blocks * cache.block_size} usable tokens cannot hold one "
                             f"{context_length}-token context: raise --kv-cache-tokens/--num-blocks or lower "
                             "--context-length")
        self.block_manager = BlockManager(usable_blocks, cache.block_size, enable_prefix_caching)
        self.scheduler = Scheduler(SchedulerConfig(max_running_requests, chunked_prefill_size), self.block_manager)
        self.step_listeners: list[Callable[[StepRecord], None]] = []
        self._requests: dict[int, _Request] = {}
        self._inbox: queue.Queue = queue.Queue()
        self._stopping = threading.Event()
        self._launched: _Launched | None = None  # the step on the device whose picks are not read yet
        self._last_done = 0.0  # perf_counter when the last step's picks were read
        self._num_steps = 0
        self._queued: list[tuple[int, int]] = []  # with trace_steps: requests queued since the last step
        self._profiler = StepProfiler(self)
        self._thread = threading.Thread(target=self._loop, name="rooftop-engine", daemon=True)

    # ---- called from any thread -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)

    def submit(self, prompt_ids: list[int], params: SamplingParams, stops: list[str],
               sink: Callable[[TokenEvent], None], export_kv: Callable[[Sequence], None] | None = None) -> int:
        """Queue a request; sink gets its TokenEvents on the engine thread. Returns the request's id.

        export_kv(seq), when given, runs on the engine thread as the request ends, while its pages still hold
        its KV (PD prefill reads them out there)."""
        seq = Sequence(prompt_ids, params, arrival_ns=time.perf_counter_ns())
        self._inbox.put(("add", _Request(seq, sink, stops, export_kv=export_kv)))
        return seq.seq_id

    def adopt(self, seq: Sequence, stops: list[str], sink: Callable[[TokenEvent], None],
              write_kv: Callable[[Sequence], None], first: tuple[int, float, list[tuple[int, float]]]) -> Future:
        """Take over a sequence prefilled elsewhere (PD decode): pages for its prompt, write_kv(seq) fills them,
        then its first token (id, logprob, top) is delivered and it decodes on. The future fails when the
        cache has no room; the prompt is never recomputed here."""

        def take_over() -> int:
            n = seq.num_prompt_tokens
            if not self.block_manager.can_grow(seq, n + 1):
                raise RuntimeError(f"KV cache full: {blocks_for(n + 1, self.block_manager.block_size)} pages "
                                   f"needed, {self.block_manager.num_free_blocks} free")
            seq.imported = True
            self.block_manager.adopt(seq, n)
            try:
                write_kv(seq)
            except BaseException:
                self.block_manager.free(seq)
                raise
            self._requests[seq.seq_id] = _Request(seq, sink, stops)
            self.scheduler.add_running(seq)
            seq.append_token(first[0])
            self._deliver(seq, seq.num_tokens - 1, *first)
            return seq.seq_id

        return self.call(take_over)

    def abort(self, seq_id: int) -> None:
        """Drop a request (client gone); its pages are freed before the next step."""
        self._inbox.put(("abort", seq_id))

    def call(self, fn: Callable[[], object]) -> Future:
        """Run fn on the engine thread between two steps (e.g. start a profiler there)."""
        fut: Future = Future()
        self._inbox.put(("call", (fn, fut)))
        return fut

    def start_profile(self, path, eager: bool = False) -> Future:
        """Profile the steps from the next one on; the future says whether they run as CUDA graphs.
        Raises RuntimeError if a profile is already running."""
        return self._profiler.start(path, eager)

    def stop_profile(self) -> Future:
        """Stop the profile and write its trace; the future gives the trace's path."""
        return self._profiler.stop()

    @property
    def vocab_size(self) -> int:
        return self.runner.model.config.vocab_size

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of KV-cache pages held by requests (0..1)."""
        return self.block_manager.usage

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # ---- the engine thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self._iterate()
            except Exception as exc:  # a bug must not leave clients waiting forever: fail them, go on
                traceback.print_exc(file=sys.stderr)
                self._launched = None
                for req in list(self._requests.values()):
                    self._fail(req.seq, f"engine error: {type(exc).__name__}: {exc}")

    def _iterate(self) -> None:
        """One pass: take requests in, launch the next step, then read back the one before it."""
        self._drain_inbox(block=self._launched is None and not self.scheduler.has_work())
        previous, self._launched = self._launched, None
        launched = self._launch(previous) if self.scheduler.has_work() else None
        if previous is not None:
            self._complete(previous)
        self._launched = launched

    def _flush(self) -> None:
        """Read back the step on the device, if any (before work that must see every token)."""
        if self._launched is not None:
            launched, self._launched = self._launched, None
            self._complete(launched)

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.2) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, arg) -> None:
        if kind == "add":
            self._requests[arg.seq.seq_id] = arg
            self.scheduler.add(arg.seq)
            if self.trace_steps:
                self._queued.append((arg.seq.seq_id, time.time_ns()))
        elif kind == "abort":
            req = self._requests.pop(arg, None)
            if req is not None:
                self.scheduler.finish(req.seq, "abort")
        elif kind == "call":
            fn, fut = arg
            if not fut.set_running_or_notify_cancel():
                return
            try:
                self._flush()
            except BaseException as exc:  # the caller learns of it too; the loop fails the flushed requests
                fut.set_exception(exc)
                raise
            try:
                fut.set_result(fn())
            except BaseException as exc:  # the caller gets it; the loop goes on
                fut.set_exception(exc)

    def _launch(self, previous: _Launched | None) -> _Launched | None:
        """Schedule the next step and queue its work on the device; its inputs may take `previous`'s picks."""
        scheduled = self._schedule()
        if scheduled is None:
            return None
        seqs, is_prefill, record, start = scheduled
        try:
            sampled, picks = self.runner.run(seqs, is_prefill, previous.picks if previous else None)
        except Exception as exc:  # e.g. out of memory: fail this step's prompts, keep serving
            self._step_failed(seqs, is_prefill, exc)
            return None
        self.scheduler.postprocess(seqs)
        positions = []
        for seq in sampled:
            positions.append(seq.num_tokens)
            seq.append_token(PENDING_TOKEN)
            if self._ends_by_length(seq, seq.num_tokens - 1):
                self.scheduler.retire(seq)  # this pick is its last: no step after it
        self._number(record)
        return _Launched(record, start, sampled, positions, picks)

    def _schedule(self) -> tuple[list[Sequence], bool, StepRecord, float] | None:
        """The next step's sequences, whether it prefills, its record and perf_counter start (None: no step)."""
        start, start_ns = time.perf_counter(), time.time_ns()
        sched = self.scheduler
        before = (sched.num_preemptions, sched.num_prefix_query_tokens, sched.num_prefix_hit_tokens)
        seqs, is_prefill = sched.schedule()
        if not seqs:
            return None
        preempted, sched.preempted = sched.preempted, []
        record = StepRecord("prefill" if is_prefill else "decode", len(seqs),
                            sum(s.num_scheduled_tokens for s in seqs), 0.0, sched.num_preemptions - before[0],
                            # prompt tokens recomputed for sequences whose KV a prefill worker sent (after a preemption)
                            sum(s.num_scheduled_tokens for s in seqs if s.imported and s.is_prefilling),
                            sum(not s.is_prefilling for s in seqs),
                            num_prefix_query_tokens=sched.num_prefix_query_tokens - before[1],
                            num_prefix_hit_tokens=sched.num_prefix_hit_tokens - before[2], start_ns=start_ns)
        if self.trace_steps:  # before the run: postprocess moves num_cached_tokens on
            record.batch = [(s.seq_id, s.num_cached_tokens, s.num_scheduled_tokens, s.is_prefilling) for s in seqs]
            record.preempted = preempted
        return seqs, is_prefill, record, start

    def _number(self, record: StepRecord) -> None:
        """Give a step that ran its id (launch order), and with trace_steps the requests queued before it."""
        record.step_id = self._num_steps
        self._num_steps += 1
        if record.batch is not None:
            record.queued, self._queued = self._queued, []

    def _step_failed(self, seqs: list[Sequence], is_prefill: bool, exc: Exception) -> None:
        traceback.print_exc(file=sys.stderr)
        # the decodes riding in a prefill step go on next step; a decode step's own failure fails them
        failed = [s for s in seqs if s.is_prefilling] if is_prefill else seqs
        for seq in seqs:
            seq.num_scheduled_tokens = 0
        for seq in failed:
            self._fail(seq, f"engine step failed: {type(exc).__name__}: {exc}")

    def _read_back(self, record: StepRecord, started: float, device_seconds: float | None) -> None:
        """Close a step's record as its tokens reach the host; tell the listeners before the tokens go out."""
        done = time.perf_counter()
        record.end_ns = time.time_ns()
        record.seconds = done - max(started, self._last_done)
        record.device_seconds = device_seconds
        self._last_done = done
        for listener in self.step_listeners:
            listener(record)

    def _complete(self, step: _Launched) -> None:
        """Wait for a launched step's picks, put them in place of its pending tokens and hand them out."""
        out = step.picks.sample.result() if step.picks is not None else None
        self._read_back(step.record, step.started, step.picks.forward_seconds() if step.picks is not None else None)
        for i, seq in enumerate(step.sampled):
            seq.token_ids[step.positions[i]] = out.token_ids[i]
            n_top = seq.params.logprobs or 0  # the batch's top-N is the largest any request asked for
            top = list(zip(out.top_ids[i][:n_top], out.top_logprobs[i][:n_top], strict=True)) if n_top else []
            self._deliver(seq, step.positions[i], out.token_ids[i], out.logprobs[i], top)

    def _deliver(self, seq: Sequence, position: int, token_id: int, logprob: float,
                 top: list[tuple[int, float]]) -> None:
        """Hand out the token at `position` of seq (already in its token_ids); end the request if it ends."""
        req = self._requests.get(seq.seq_id)
        if req is None:  # aborted, failed, or ended by an earlier token: this pick is dropped
            return
        n, p = position + 1 - seq.num_prompt_tokens, seq.params
        # a stop token ends the request without its text, as vLLM's (the sampler bars it before min_tokens)
        stop_token = token_id in p.stop_token_ids
        text_before = len(req.text)
        if token_id < 256 and not stop_token:
            req.text += req.decoder.decode(bytes([token_id]))
        reason, cut = None, None
        if (token_id == EOS_ID and not p.ignore_eos) or stop_token:
            reason = "stop"
        elif req.stops and n >= p.min_tokens:
            cut = _find_stop(req.text, req.stops, text_before)
            if cut is not None:
                req.text = req.text[:cut]
                reason = "stop"
        if reason is None and self._ends_by_length(seq, position):
            reason = "length"
        if reason is not None and cut is None:
            req.text += req.decoder.decode(b"", final=True)  # a cut-off UTF-8 character shows as U+FFFD
        # hold back what could still become a stop string, so a stop never streams out
        hold = 0 if reason else max((len(s) for s in req.stops), default=1) - 1
        release_to = max(req.num_sent_chars, len(req.text) - hold)
        piece = req.text[req.num_sent_chars:release_to]
        req.num_sent_chars = release_to
        if reason is not None:
            if req.export_kv is not None:
                req.export_kv(seq)
            self.scheduler.finish(seq, reason)
            del self._requests[seq.seq_id]
        req.sink(TokenEvent(token_id, piece, logprob, top, seq.num_prompt_tokens, n, reason, seq_id=seq.seq_id))

    def _ends_by_length(self, seq: Sequence, position: int) -> bool:
        """Whether the token at `position` of seq is its last by max_tokens or the context length."""
        return position + 1 - seq.num_prompt_tokens >= seq.params.max_tokens or position + 1 >= self.context_length

    def _fail(self, seq: Sequence, message: str) -> None:
        self.scheduler.finish(seq, "error")
        req = self._requests.pop(seq.seq_id, None)
        if req is not None:
            made = seq.num_completion_tokens - seq.token_ids[seq.num_prompt_tokens:].count(PENDING_TOKEN)
            req.sink(TokenEvent(-1, "", 0.0, [], seq.num_prompt_tokens, made, "error", message, seq.seq_id))


def _find_stop(text: str, stops: list[str], new_from: int) -> int | None:
    """Index where the earliest stop string that ends in text[new_from:] begins, or None."""
    longest = max(len(s) for s in stops)
    start = max(0, new_from - longest + 1)
    hits = [i for i in (text.find(s, start) for s in stops) if i != -1]
    return min(hits) if hits else None
