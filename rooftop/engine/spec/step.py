"""One step with speculation: draft, verify every draft in one forward, keep what the acceptance rule keeps,
and roll the rest back (spec/README in rooftop/engine/README.md, "Speculative decoding")."""

from dataclasses import dataclass, field

import torch

from rooftop.engine.kv.block_manager import BlockManager
from rooftop.engine.model_runner import ModelRunner
from rooftop.engine.scheduler import lookahead_tokens
from rooftop.engine.sequence import Sequence
from rooftop.engine.spec.config import SpecConfig
from rooftop.engine.spec.mtp import MTPDrafter
from rooftop.engine.spec.ngram import propose_ngram
from rooftop.engine.spec.picks import Picked, pick
from rooftop.engine.spec.verify import build_verify, verify_forward
from rooftop.engine.spec.verify_graphs import VerifyGraphs


@dataclass(slots=True)
class Emitted:
    """Tokens a sequence made in a step, from index `position` of its token_ids on."""

    seq: Sequence
    position: int
    picked: Picked


@dataclass(slots=True)
class StepOutcome:
    """A speculative step: the tokens it made, and what it computed, drafted and accepted (vLLM's
    spec_decode counts: a draft is a sequence that brought at least one draft token)."""

    emitted: list[Emitted]
    num_tokens: int  # tokens the verify forward computed, drafts included
    num_decode_tokens: int  # of those, the decoding sequences' (their last token and their drafts)
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # accepted drafts by position, 0 = the first


class Speculator:
    """Runs a scheduled step with drafts: the scheduler held num_speculative_tokens more pages and budget
    for each decoding sequence (SchedulerConfig.num_lookahead_tokens)."""

    def __init__(self, runner: ModelRunner, config: SpecConfig, block_manager: BlockManager, context_length: int):
        self.runner, self.config, self.block_manager = runner, config, block_manager
        self.context_length = context_length
        self.mtp = MTPDrafter(runner.model, runner.cache, runner.config, runner.device) \
            if config.method == "mtp" else None
        self.graphs = None
        prefill = runner.prefill_graphs
        if prefill is not None:
            self.graphs = VerifyGraphs(runner.model, runner.cache, prefill.token_sizes, prefill.max_seqs,
                                       prefill.max_pages, prefill.dummy_block)

    def step(self, seqs: list[Sequence]) -> StepOutcome:
        """See `_step`; under a profiler, in a range named for it."""
        if not torch.autograd.profiler._is_profiler_enabled:
            return self._step(seqs)
        with torch.profiler.record_function("spec_step"):
            return self._step(seqs)

    def _step(self, seqs: list[Sequence]) -> StepOutcome:
        """Draft for the decoding ones of seqs, verify, accept, then move each sequence on: its kept tokens
        appended, num_cached_tokens over the positions kept, its full pages offered to the prefix cache, and
        the pages held for rejected drafts given back. Nothing is changed on the host if it raises."""
        counts = [0 if s.is_prefilling else min(lookahead_tokens(s, self.config.num_speculative_tokens),
                                                self.context_length - s.num_tokens) for s in seqs]
        drafts = self._draft(seqs, counts)
        vb = build_verify(self.runner, seqs, drafts, want_hidden=self.mtp is not None,
                          as_prefill=self.graphs is not None and self.mtp is not None)
        logits, hidden = verify_forward(self.runner, self.graphs, vb)
        picked = pick(seqs, drafts, vb.rows, logits, self.runner.generator)
        # what each sequence keeps: its scheduled tokens, then its accepted drafts
        kept = [s.num_scheduled_tokens + (p.num_accepted if p else 0) for s, p in zip(seqs, picked, strict=True)]
        if self.mtp is not None:
            following = [_following(s, p, n) for s, p, n in zip(seqs, picked, kept, strict=True)]
            self.mtp.advance(seqs, kept, following, hidden, vb.starts)
        outcome = StepOutcome([], vb.batch.input_ids.shape[0],
                              sum(1 + len(d) for s, d in zip(seqs, drafts, strict=True) if not s.is_prefilling),
                              accepted_per_pos=[0] * self.config.num_speculative_tokens)
        for seq, extra, p, n in zip(seqs, drafts, picked, kept, strict=True):
            if extra:
                outcome.num_drafts += 1
                outcome.num_draft_tokens += len(extra)
                outcome.num_accepted_tokens += p.num_accepted
                for j in range(p.num_accepted):
                    outcome.accepted_per_pos[j] += 1
            if p is not None:
                outcome.emitted.append(Emitted(seq, seq.num_tokens, p))
            self._move_on(seq, n, p.token_ids if p else [])
        return outcome

    def _draft(self, seqs: list[Sequence], counts: list[int]) -> list[list[int]]:
        if self.mtp is not None:
            return self.mtp.propose(seqs, counts)
        c = self.config
        return [propose_ngram(s.token_ids, n, c.prompt_lookup_min, c.prompt_lookup_max) if n else []
                for s, n in zip(seqs, counts, strict=True)]

    def _move_on(self, seq: Sequence, num_kept: int, tokens: list[int]) -> None:
        """Roll seq forward over its kept positions; the rejected drafts' rows stay in its pages past
        num_cached_tokens, where no step reads them and the next one writes over them."""
        seq.token_ids.extend(tokens)
        seq.num_cached_tokens += num_kept
        seq.num_scheduled_tokens = 0
        self.block_manager.cache_full_pages(seq)  # pages whose every position is kept: never a rejected draft
        self.block_manager.shrink(seq, seq.num_tokens)


def _following(seq: Sequence, picked: Picked | None, num_kept: int) -> list[int]:
    """The token after each of seq's num_kept positions from num_cached_tokens on, its new ones included."""
    start = seq.num_cached_tokens + 1
    return (seq.token_ids[start:start + num_kept] + (picked.token_ids if picked else []))[:num_kept]
