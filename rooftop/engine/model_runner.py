"""One step on the device: scheduled sequences -> ForwardBatch -> model -> sampled next tokens."""

from dataclasses import dataclass

import torch
from torch import nn

from rooftop.engine.cuda_graphs import mark_start
from rooftop.engine.kernels import dispatch
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import ForwardBatch, build_batch, capacity_pages, host_to_device
from rooftop.engine.model.config import EOS_ID
from rooftop.engine.sampler import PendingSample, Sampler, make_generator
from rooftop.engine.sequence import PENDING_TOKEN, Sequence

# below this a temperature is greedy: logits / 1e-9 overflow the softmax
GREEDY_BELOW_TEMPERATURE = 1e-5


@dataclass(slots=True)
class RunnerConfig:
    block_size: int = 64
    capacity_tokens: int = 4096  # --context-length
    indexer_bound: str = "actual"  # "actual" | "capacity"
    cuda_graphs: bool = True  # replay decode steps and prefill chunks from CUDA graphs (needs the Triton kernels)
    max_batch: int = 64  # largest decode batch a graph is captured for
    prefill_chunk: int = 512  # largest prefill chunk a graph is captured for (the scheduler's chunk size)


@dataclass(slots=True)
class Picks:
    """A launched step's sampled tokens, still on the device: sequence id -> row of `sample`; on a GPU,
    the CUDA events recorded before and after its forward."""

    rows: dict[int, int]
    sample: PendingSample
    forward: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    def forward_seconds(self) -> float | None:
        """The forward's device time; call after `sample.result()` (queued behind it, so complete)."""
        if self.forward is None:
            return None
        return self.forward[0].elapsed_time(self.forward[1]) / 1e3


class ModelRunner:
    """Holds the model, its KV cache and the sampler; `run` does one forward step and samples."""

    def __init__(self, model: nn.Module, cache: KVCache, config: RunnerConfig, device: torch.device):
        self.model = model
        self.cache = cache
        self.config = config
        self.device = device
        self.sampler = Sampler()
        self.graphs = None
        self.prefill_graphs = None
        self.profile_eager = False  # set by /start_profile {"eager": true}: run steps eagerly while profiling
        if config.cuda_graphs and device.type == "cuda" and dispatch.use_triton(cache.latent[0]):
            from rooftop.engine.cuda_graphs import DecodeGraphs

            sizes = [b for b in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256) if b < config.max_batch]
            self.graphs = DecodeGraphs(
                model, cache, [*sizes, config.max_batch],
                max_pages=capacity_pages(config.capacity_tokens, config.block_size),
                dummy_block=cache.num_blocks - 1, indexer_bound=config.indexer_bound,
            )
            self.warm_up_prefill()
            from rooftop.engine.cuda_graphs import PrefillGraphs

            # Chunks of 16, 32, ... tokens up to the scheduler's chunk: a chunk pads to at most twice its size.
            sizes, tokens = [], 16
            while tokens < config.prefill_chunk:
                sizes.append(tokens)
                tokens *= 2
            self.prefill_graphs = PrefillGraphs(
                model, cache, [*sizes, config.prefill_chunk], max_seqs=config.max_batch,
                max_pages=capacity_pages(config.capacity_tokens, config.block_size), dummy_block=cache.num_blocks - 1,
            )

    # Prompt chunks run once at start. Triton compiles a kernel per class of its integer arguments
    # (1, a multiple of 16, other) and per tile the shapes pick (sparse MLA: rows-as-M up to 64
    # tokens, heads-as-M beyond, one split past ~132; the MoE layout kernel: one size a power of two
    # of the pairs, which token counts at most 2x apart reach whatever the top-k), so these lengths
    # reach every variant a served prefill would otherwise compile while a client waits (1.3 s in
    # the H200 demo).
    WARM_UP_CHUNKS = ([1], [5], [10], [16], [5, 16], [32], [48], [16] * 4, [100], [32] * 4, [200], [300], [512])

    @torch.inference_mode()
    def warm_up_prefill(self) -> None:
        """Run prefills of WARM_UP_CHUNKS in the graphs' padding block (every page of every chunk is
        that block: they overwrite each other there), so no served request pays a JIT compile."""
        block = self.config.block_size
        for lengths in self.WARM_UP_CHUNKS:
            if max(lengths) > self.config.capacity_tokens:
                continue
            batch = build_batch(
                new_tokens=[[0] * n for n in lengths], cached_lens=[0] * len(lengths),
                block_tables=[[self.graphs.dummy_block] * -(-n // block) for n in lengths], block_size=block,
                capacity_tokens=self.config.capacity_tokens, indexer_bound=self.config.indexer_bound,
                device=self.device,
            )
            self.model(batch, self.cache)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @property
    def reserved_blocks(self) -> int:
        """Cache blocks the block manager must never hand out (the graphs' padding block)."""
        return 1 if self.graphs is not None else 0

    def build(self, seqs: list[Sequence]) -> ForwardBatch:
        """The ForwardBatch of seqs' scheduled tokens (block tables padded to capacity when bound so)."""
        return build_batch(
            new_tokens=[s.token_ids[s.num_cached_tokens:s.num_cached_tokens + s.num_scheduled_tokens]
                        for s in seqs],
            cached_lens=[s.num_cached_tokens for s in seqs],
            block_tables=[s.block_table for s in seqs],
            block_size=self.config.block_size,
            capacity_tokens=self.config.capacity_tokens,
            indexer_bound=self.config.indexer_bound,
            device=self.device,
        )

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool, previous: Picks | None = None,
            ) -> tuple[list[Sequence], Picks | None]:
        """Queue the forward of seqs' scheduled tokens and the sampling for those whose last token is now
        in (called before postprocess). Nothing waits for the device: the picks come back as `Picks`.

        A scheduled token still PENDING_TOKEN on the host is taken from `previous` on the device."""
        if not torch.autograd.profiler._is_profiler_enabled:  # the range costs ~15 us of host time a step
            return self._run(seqs, is_prefill, previous)
        # One named range per step (forward and sampling), so a trace's steps and their kind show.
        with torch.profiler.record_function("prefill_step" if is_prefill else "decode_step"):
            return self._run(seqs, is_prefill, previous)

    def _gather_pending(self, batch: ForwardBatch, seqs: list[Sequence], previous: Picks | None) -> None:
        """Write the previous step's picks, on the device, where this batch's inputs still wait for them."""
        dst, src, offset = [], [], 0
        for seq in seqs:
            q, start = seq.num_scheduled_tokens, seq.num_cached_tokens
            if PENDING_TOKEN in seq.token_ids[start:start + q]:
                # only the newest token, sampled by the step before, may still be on the device
                if seq.token_ids.index(PENDING_TOKEN, start) != start + q - 1 or previous is None \
                        or seq.seq_id not in previous.rows:
                    raise RuntimeError(f"sequence {seq.seq_id}: a token it is scheduled with was not sampled by "
                                       "the step before this one and is not on the host yet")
                dst.append(offset + q - 1)
                src.append(previous.rows[seq.seq_id])
            offset += q
        if not dst:
            return
        n = len(dst)
        if dst == src == list(range(n)):
            # the common decode step: the same sequences in the same order, each one token
            batch.input_ids[:n].copy_(previous.sample.token_ids[:n])
            return
        index = host_to_device(dst + src, torch.long, self.device)
        batch.input_ids[index[:n]] = previous.sample.token_ids[index[n:]]

    def _run(self, seqs: list[Sequence], is_prefill: bool, previous: Picks | None,
             ) -> tuple[list[Sequence], Picks | None]:
        batch = self.build(seqs)
        batch.is_prefill = is_prefill
        self._gather_pending(batch, seqs, previous)
        # A profile shows the step as served (graph replays) unless it was started eager: then steps go
        # eagerly while the profiler runs, each kernel under its module, as the map of the graphed ones.
        use_graphs = self.graphs is not None and not (self.profile_eager and torch.autograd.profiler._is_profiler_enabled)
        # asked once a step: torch.cuda.current_stream() costs ~10 us of host time a call
        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        forward = _timing_events() if stream is not None else None
        start = None if forward is None else (forward[0], stream)  # recorded where the forward's kernels start
        if not use_graphs:
            mark_start(start)
            logits = self.model(batch, self.cache)
        elif is_prefill:
            logits = self.prefill_graphs.run(batch, start)
        else:
            logits = self.graphs.run(batch, start)
        if forward is not None:
            forward[1].record(stream)
        rows = [i for i, s in enumerate(seqs) if s.num_cached_tokens + s.num_scheduled_tokens == s.num_tokens]
        if not rows:
            return [], None
        sampled = [seqs[i] for i in rows]
        if len(rows) < len(seqs):
            logits = logits[host_to_device(rows, torch.long, self.device)]
        sample = self.sampler(
            logits,
            temperatures=[temperature(s) for s in sampled],
            top_ps=[s.params.top_p for s in sampled],
            generators=[self.generator(s) for s in sampled],
            # min_tokens: the end-of-sequence token and the stop tokens may not come before that many tokens
            banned_ids=[[EOS_ID, *s.params.stop_token_ids] if s.num_completion_tokens < s.params.min_tokens else []
                        for s in sampled],
            top_ks=[s.params.top_k for s in sampled],
            num_top_logprobs=max((s.params.logprobs or 0) for s in sampled),
            stream=stream,
        )
        return sampled, Picks({s.seq_id: i for i, s in enumerate(sampled)}, sample, forward)

    def generator(self, seq: Sequence) -> torch.Generator | None:
        """seq's own generator when it samples with a seed (made on first use), else None (torch's)."""
        if seq.params.seed is None or temperature(seq) == 0:
            return None
        if seq.generator is None:
            seq.generator = make_generator(seq.params.seed, self.device)
        return seq.generator


def _timing_events() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    """A pair of timing events for one step's forward (recording one costs a few microseconds of host
    time and waits for nothing)."""
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def temperature(seq: Sequence) -> float:
    """seq's temperature, 0 (greedy) below GREEDY_BELOW_TEMPERATURE."""
    t = seq.params.temperature
    return 0.0 if t < GREEDY_BELOW_TEMPERATURE else t
