"""Continuous batching: each step decodes the running batch and fills the rest of its token budget with prompt chunks."""

from collections import deque
from dataclasses import dataclass

from rooftop.engine.kv.block_manager import BlockManager
from rooftop.engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class SchedulerConfig:
    max_running_requests: int = 64
    chunked_prefill_size: int = 512  # new prompt tokens per prefill step, over all sequences
    # speculation: draft tokens a decoding sequence may bring beyond its last one (pages and budget held for them)
    num_lookahead_tokens: int = 0


def lookahead_tokens(seq: Sequence, k: int) -> int:
    """Drafts worth scoring for seq: at most k, and fewer than the tokens it may still make (a step makes
    its accepted drafts and one more)."""
    return max(0, min(k, seq.params.max_tokens - seq.num_completion_tokens - 1))


class Scheduler:
    """Owns the waiting and running queues; `schedule()` picks the next step's sequences."""

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        if config.max_running_requests <= 0 or config.chunked_prefill_size <= 0:
            raise ValueError("max_running_requests and chunked_prefill_size must be positive")
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()  # hold no pages
        self.running: deque[Sequence] = deque()  # hold pages: mid-prefill or decoding, oldest first
        self.num_preemptions = 0
        self.preempted: list[int] = []  # seq ids preempted since the engine last took this list
        # prefix cache, in tokens: looked up as sequences are admitted, and found cached
        self.num_prefix_query_tokens = 0
        self.num_prefix_hit_tokens = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """Take a sequence whose pages are already filled (PD import): it decodes from the next step."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """The sequences of the next step, each with num_scheduled_tokens set, and whether it prefills.

        Every sequence whose prompt is in decodes one token; prompt chunks fill what is left of the
        token budget (chunked_prefill_size), so a prefill step carries the running requests' next
        tokens too and a long prompt never stalls them. Prompts a previous step cut short go on
        first, then new ones, each from the end of its longest cached prefix of full pages. When a decoding sequence misses a page, the newest gives its pages back
        and will recompute (a half-prefilled one costs least); a prompt chunk never preempts."""
        bm = self.block_manager
        batch: list[Sequence] = []
        k = self.config.num_lookahead_tokens

        queue = deque(s for s in self.running if not s.is_prefilling)
        partial = [s for s in self.running if s.is_prefilling]
        while queue:
            seq = queue.popleft()
            need = seq.num_tokens + (lookahead_tokens(seq, k) if k else 0)
            while not bm.can_grow(seq, need):
                if partial:
                    self._preempt(partial.pop())
                elif queue:
                    self._preempt(queue.pop())
                else:
                    self._preempt(seq)
                    break
            else:
                bm.grow(seq, need)
                seq.num_scheduled_tokens = 1
                batch.append(seq)

        decode_tokens = len(batch) + (sum(lookahead_tokens(s, k) for s in batch) if k else 0)
        budget = max(0, self.config.chunked_prefill_size - decode_tokens)
        num_decode, stuck = len(batch), False
        for seq in partial:  # those the decodes left their pages
            if budget == 0:
                break
            n = min(seq.num_uncached_tokens, budget)
            if not bm.can_grow(seq, seq.num_cached_tokens + n):
                stuck = True  # no newcomer may take the pages this one waits for
                break
            bm.grow(seq, seq.num_cached_tokens + n)
            seq.num_scheduled_tokens = n
            budget -= n
            batch.append(seq)
        while not stuck and self.waiting and budget > 0 and len(self.running) < self.config.max_running_requests:
            seq = self.waiting[0]
            hit = bm.cached_prefix(seq)  # its first pages, if cached, are not computed again
            num_hit_tokens = len(hit) * bm.block_size
            n = min(seq.num_tokens - num_hit_tokens, budget)
            if not bm.can_allocate(seq, hit, num_hit_tokens + n):
                break
            bm.allocate(seq, hit, num_hit_tokens + n)
            if bm.enable_prefix_caching:
                self.num_prefix_query_tokens += seq.num_tokens
                self.num_prefix_hit_tokens += num_hit_tokens
            seq.num_scheduled_tokens = n
            seq.status = SequenceStatus.RUNNING
            budget -= n
            self.waiting.popleft()
            self.running.append(seq)
            batch.append(seq)
        if batch:
            return batch, len(batch) > num_decode
        if self.running:
            # only half-prefilled prompts hold pages and none can grow: the newest lets the oldest go on
            self._preempt(self.running[-1])
            return self.schedule()
        return [], False

    def _preempt(self, seq: Sequence) -> None:
        """Free seq's pages and put it first in line; its tokens so far are kept and recomputed."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.preempted.append(seq.seq_id)
        self.waiting.appendleft(seq)

    def postprocess(self, batch: list[Sequence]) -> list[Sequence]:
        """Mark the scheduled tokens as cached (their full pages are offered to the prefix cache: the step
        that writes them is queued before any that could read them); return the sequences whose logits
        give a next token."""
        done = []
        for seq in batch:
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            self.block_manager.cache_full_pages(seq)
            if seq.num_cached_tokens == seq.num_tokens:
                done.append(seq)
        return done

    def retire(self, seq: Sequence) -> None:
        """Schedule seq no more; it keeps its pages until `finish` (its last token is still being made)."""
        if seq in self.running:
            self.running.remove(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take seq out of the queues and free its pages."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
