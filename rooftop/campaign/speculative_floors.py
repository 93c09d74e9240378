"""A speculative variant's roofline, stored with it so that the diagnosis can price the acceptance it measures: the
plain decode, verify and draft floors at batches from 1 past the sweep's levels, and the batch where the verify step
turns compute-bound (roofline/speculative.py)."""

from __future__ import annotations

from rooftop.hardware.specs import GPUSpec
from rooftop.roofline.config import ModelShape
from rooftop.roofline.speculative import crossover_batch, speculation_notes, speculative_gain
from rooftop.spec.speculative import Speculative

GRID_MIN = 1024  # the batches priced go at least this far (powers of two), past the sweep's highest level 4x


def roofline_draft(s: Speculative) -> tuple[str, bool]:
    """(the roofline's draft, whether its cost is modelled): ngram drafts on the host (no device time), mtp as the
    model's MTP module; an EAGLE head is not modelled, so its draft is priced at nothing (the gain is then a bound)."""
    if s.method in ("ngram", "mtp"):
        return s.method, True
    return "ngram", False


def speculative_floors(shape: ModelShape, gpu: GPUSpec, context: int, s: Speculative, concurrencies: list[int],
                       **layout) -> dict:
    """The stored record: k, the draft, the floors (ms, per GPU) of one plain decode step, one verify step of k + 1
    tokens a sequence and the k draft steps at each batch priced, the verify and plain compute-bound batches, and the
    roofline's notes. `layout`: decode_costs's keywords (tp, ep, kv_dtype)."""
    k = s.num_speculative_tokens
    draft, modelled = roofline_draft(s)
    top = max(GRID_MIN, 4 * max(concurrencies, default=1))
    batches = sorted(set(concurrencies) | {1 << i for i in range(top.bit_length()) if 1 << i <= top})
    steps = []
    for batch in batches:
        # floors do not depend on the acceptance; it is priced later, with what the variant measured
        e = speculative_gain(shape, gpu, batch, k, 0.0, context=context, draft=draft, **layout)
        steps.append({"batch": batch, "plain_ms": e.plain_step_ms, "verify_ms": e.verify_step_ms,
                      "draft_ms": e.draft_ms})
    cross = crossover_batch(shape, gpu, k, 0.0, context=context, draft=draft, **layout)
    notes = speculation_notes(shape, k, draft, context)
    if not modelled:
        notes.append(f"the {s.method} draft head is not modelled: its time is counted as nothing, so the predicted "
                     "gain is an upper bound")
    return {"method": s.method, "k": k, "draft": draft, "draft_modelled": modelled, "hardware": gpu.name,
            "context": context, "verify_compute_bound_batch": cross.compute_bound_batch,
            "plain_compute_bound_batch": cross.plain_compute_bound_batch, "steps": steps, "notes": notes}
