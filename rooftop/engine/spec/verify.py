"""The verify step's forward: every sequence's new tokens (a prompt chunk, or its last token and its drafts)
in one prefill-shaped batch through the model's own kernels, with logits at each verified position."""

from dataclasses import dataclass

import torch

from rooftop.engine.model.batch import ForwardBatch, build_batch, host_to_device
from rooftop.engine.model_runner import ModelRunner
from rooftop.engine.sequence import Sequence
from rooftop.engine.spec.verify_graphs import VerifyGraphs


@dataclass(slots=True)
class VerifyBatch:
    """A verify step's batch, and where each sequence lies in it and in the logits it returns."""

    batch: ForwardBatch
    starts: list[int]  # each sequence's first token row in the batch
    rows: list[list[int]]  # each sequence's rows of the returned logits, one per verified position ([]: none)


def build_verify(runner: ModelRunner, seqs: list[Sequence], drafts: list[list[int]], want_hidden: bool,
                 as_prefill: bool) -> VerifyBatch:
    """seqs' scheduled tokens, each followed by its drafts. A sequence whose tokens reach its end (a decoding
    one, or the prompt's last chunk) gets logits at its last scheduled token and at each draft; the model
    returns the final-normed hidden state of every token when want_hidden (the MTP drafter reads them).
    as_prefill: mark even a batch of one token per sequence as prefill (the verify graphs' shape)."""
    new_tokens, starts, rows, flat, offset = [], [], [], [], 0
    for seq, extra in zip(seqs, drafts, strict=True):
        start, q = seq.num_cached_tokens, seq.num_scheduled_tokens
        new_tokens.append(seq.token_ids[start:start + q] + extra)
        starts.append(offset)
        n_rows = len(extra) + 1 if start + q == seq.num_tokens else 0
        rows.append(list(range(len(flat), len(flat) + n_rows)))
        flat += range(offset + q - 1, offset + q - 1 + n_rows)
        offset += q + len(extra)
    cfg = runner.config
    batch = build_batch(new_tokens, [s.num_cached_tokens for s in seqs], [s.block_table for s in seqs],
                        cfg.block_size, cfg.capacity_tokens, cfg.indexer_bound, runner.device)
    batch.logit_rows = host_to_device(flat, torch.long, runner.device)
    batch.return_hidden = want_hidden
    batch.is_prefill = batch.is_prefill or as_prefill
    return VerifyBatch(batch, starts, rows)


def verify_forward(runner: ModelRunner, graphs: VerifyGraphs | None, vb: VerifyBatch,
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits [rows, vocab] float32, hidden [tokens, hidden] or None): by a verify graph's replay where one
    holds the batch (CUDA), else eagerly. A batch of one token a sequence without hidden states is a plain
    decode step, and takes the runner's decode graphs."""
    batch = vb.batch
    # as the plain step: a profile started eager runs the steps eagerly
    eager = runner.profile_eager and torch.autograd.profiler._is_profiler_enabled
    if not batch.return_hidden and not batch.is_prefill and runner.graphs is not None and not eager:
        return runner.graphs.run(batch), None
    if graphs is not None and graphs.graph_tokens(batch) is not None and not eager:
        return graphs.run(batch)
    out = runner.model(batch, runner.cache)
    return out if batch.return_hidden else (out, None)
