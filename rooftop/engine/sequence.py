"""A request as the engine sees it: its tokens, how many of them are in the KV cache, its pages."""

import itertools
from dataclasses import dataclass, field
from enum import Enum, auto


class SequenceStatus(Enum):
    WAITING = auto()  # holds no KV pages (new, or preempted)
    RUNNING = auto()  # holds KV pages: prefilling in chunks, or decoding
    FINISHED = auto()


@dataclass(slots=True)
class SamplingParams:
    """How to pick tokens and when to stop, per request."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # sample among the k likeliest tokens only (before top-p); 0 = all
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)  # end with "stop" on these, as on <eos>
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # top-N logprobs of each sampled position; None = none


_seq_ids = itertools.count()

# Stands for a sampled token that is still on the device: the engine launches the next step before it
# reads a step's picks back, and the next step's inputs take them from the device.
PENDING_TOKEN = -1


class Sequence:
    """One request's token ids and cache state; the scheduler moves it between queues."""

    __slots__ = (
        "seq_id", "token_ids", "num_prompt_tokens", "num_cached_tokens", "num_scheduled_tokens",
        "block_table", "status", "params", "finish_reason", "generator", "num_preemptions",
        "arrival_ns", "imported", "block_hashes",
    )

    def __init__(self, prompt_token_ids: list[int], params: SamplingParams, arrival_ns: int = 0):
        self.seq_id = next(_seq_ids)
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        # tokens whose latent rows and index keys are in the cache; the last sampled token is not,
        # until the next decode step writes it
        self.num_cached_tokens = 0
        self.num_scheduled_tokens = 0  # new tokens this step (set by the scheduler)
        self.block_table: list[int] = []
        self.status = SequenceStatus.WAITING
        self.params = params
        self.finish_reason: str | None = None
        self.generator = None  # torch.Generator for seeded sampling, made by the sampler side
        self.num_preemptions = 0
        self.arrival_ns = arrival_ns
        self.imported = False  # its prompt's KV came from a prefill worker (PD decode)
        # chained hash of each full page of its tokens, as far as hashed (kv/block_manager.py); kept when
        # preempted, as its tokens are
        self.block_hashes: list[bytes] = []

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncached_tokens(self) -> int:
        return len(self.token_ids) - self.num_cached_tokens

    @property
    def is_prefilling(self) -> bool:
        """True while more than the last sampled token is missing from the cache (prompt, or recompute)."""
        return self.num_completion_tokens == 0 or self.num_uncached_tokens > 1

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
