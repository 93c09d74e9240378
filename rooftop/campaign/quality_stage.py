"""The quality check of one block: greedy outputs of the fixed prompts; a base stores them, a lever is
compared with its base's (campaign/quality.py)."""

from __future__ import annotations

import asyncio

import aiohttp

from rooftop.auth import auth_headers
from rooftop.bench.sweep import resolve_model
from rooftop.campaign import quality as quality_mod
from rooftop.campaign.plan import Block
from rooftop.campaign.stage_context import StageContext
from rooftop.errors import RooftopError


def run_quality(ctx: StageContext, block: Block, url: str, key: str | None = None) -> None:
    """Decode the prompts through `url` (with the deployment's API key `key`), store the outputs, and
    where the block has a base, the comparison with the base's."""
    q, store = ctx.spec.quality, ctx.store
    model = asyncio.run(_first_model(url, key))
    outputs = asyncio.run(quality_mod.greedy_outputs(url, model, q.prompts, q.max_tokens, q.logprobs,
                                                     ctx.spec.bench.timeout_s, key))
    store.put_analysis(block.variant, "quality_outputs", {"outputs": quality_mod.outputs_to_dicts(outputs)})
    if block.quality_base is None:
        return
    ref = store.analysis(block.quality_base, "quality_outputs")
    if ref is None:
        raise RooftopError(f"quality check of {block.variant}: {block.quality_base} has no reference outputs",
                           "its quality unit failed; rerun with --resume")
    result = quality_mod.compare_outputs(quality_mod.outputs_from_dicts(ref["outputs"]), outputs,
                                         q.kl_threshold, q.agreement_threshold, q.tie_margin,
                                         must_match=must_match(ctx, block))
    store.put_analysis(block.variant, "quality", result.to_dict())


def must_match(ctx: StageContext, block: Block) -> bool:
    """Whether the lever this block measures must keep its base's greedy outputs token for token: it sets
    `speculative` (the target model verifies every draft, so greedy decoding cannot change)."""
    lever = next((lv for lv in ctx.spec.levers if block.levers and lv.name == block.levers[-1]), None)
    return lever is not None and lever.speculative is not None


async def _first_model(url: str, key: str | None = None) -> str:
    async with aiohttp.ClientSession(headers=auth_headers(key)) as session:
        return await resolve_model(session, url)
