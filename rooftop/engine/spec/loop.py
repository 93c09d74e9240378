"""The step loop with speculation: each step drafts, verifies and accepts, synchronously."""

from rooftop.engine.engine import Engine
from rooftop.engine.spec.config import SpecConfig
from rooftop.engine.spec.step import Speculator


class SpeculativeEngine(Engine):
    """An Engine whose steps speculate (spec/step.py). It runs them synchronously: a step's tokens are on
    the host, accepted and handed out before the next step is scheduled, since the next step's drafts and
    its pages depend on how many were accepted. The plain Engine's overlap (launch step N+1 before reading
    step N's picks, PENDING_TOKEN) is not used here, and so neither is the decode graph's one-token step
    when drafts are scored; the verify forward replays a prefill-shaped CUDA graph where one holds it
    (spec/verify_graphs.py), and the MTP drafter runs eagerly."""

    def __init__(self, *args, speculative: SpecConfig, **kwargs):
        super().__init__(*args, **kwargs)
        self.scheduler.config.num_lookahead_tokens = speculative.num_speculative_tokens
        self.speculator = Speculator(self.runner, speculative, self.block_manager, self.context_length)

    def _iterate(self) -> None:
        """One pass: take requests in, then run one step to the end."""
        self._drain_inbox(block=not self.scheduler.has_work())
        if self.scheduler.has_work():
            self._speculate()

    def _speculate(self) -> None:
        scheduled = self._schedule()
        if scheduled is None:
            return
        seqs, is_prefill, record, start = scheduled
        try:
            out = self.speculator.step(seqs)
        except Exception as exc:  # e.g. out of memory: fail this step's prompts, keep serving
            self._step_failed(seqs, is_prefill, exc)
            return
        self._number(record)
        record.num_tokens, record.num_decode_tokens = out.num_tokens, out.num_decode_tokens
        record.num_drafts, record.num_draft_tokens = out.num_drafts, out.num_draft_tokens
        record.num_accepted_tokens, record.num_accepted_tokens_per_pos = out.num_accepted_tokens, out.accepted_per_pos
        self._read_back(record, start, None)
        for emitted in out.emitted:
            p = emitted.picked
            for j, token in enumerate(p.token_ids):  # a token that ends the request drops the ones after it
                self._deliver(emitted.seq, emitted.position + j, token, p.logprobs[j], p.tops[j])
