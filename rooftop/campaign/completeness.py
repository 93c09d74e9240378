"""Whether a run did all its campaign's plan: per planned bring-up (block), done (every measuring unit
done), failed (at which stage, with its error), interrupted (the stage it was in when the campaign
stopped) or not run."""

from __future__ import annotations

from dataclasses import dataclass, field

from rooftop.campaign import plan as plan_mod
from rooftop.campaign.collect import one_line
from rooftop.campaign.store import UNIT_DONE, UNIT_FAILED, UNIT_INTERRUPTED, UNIT_RUNNING, Store
from rooftop.spec.campaign import CampaignSpec

DONE = "done"
FAILED = "failed"
INTERRUPTED = "interrupted"  # a unit was running (or marked interrupted) when the campaign stopped
NOT_RUN = "not run"  # no unit of the block started (or, of a started block, the stages left after the last done)


@dataclass(slots=True)
class BlockState:
    """One planned bring-up and how far it got."""

    name: str  # "main/pd/r2" (series/variant/repeat)
    variant: str
    repeat: int
    state: str  # DONE | FAILED | INTERRUPTED | NOT_RUN
    stage: str | None = None  # the stage that failed or was cut off; None when done or never started
    error: str | None = None  # the failed stage's error, as one line
    not_done: list[str] = field(default_factory=list)  # the block's stages not done, in plan order
    # the cut-off stage is still marked running: the campaign was stopped without marking it (a SIGTERM
    # or a kill; `--resume` marks it interrupted), or it is running now
    running: bool = False
    started: bool = False  # some unit of the block is in the store


@dataclass(slots=True)
class Completeness:
    """Every planned bring-up of a run, in plan order."""

    blocks: list[BlockState]

    @property
    def complete(self) -> bool:
        return all(b.state == DONE for b in self.blocks)

    def with_state(self, state: str) -> list[BlockState]:
        return [b for b in self.blocks if b.state == state]

    @property
    def done(self) -> int:
        return len(self.with_state(DONE))


def block_state(block: plan_mod.Block, units: dict[str, str], errors: dict[str, str]) -> BlockState:
    """How far one block got, from the store's units (key -> status) and failed units' errors. A block
    whose measuring units are all done is done, as the runner counts it (resume skips it), even where
    the kill came in its teardown."""
    name = f"{block.series}/{block.variant}/r{block.repeat}"
    status = {stage: units.get(block.key(stage)) for stage in block.stages}
    state = BlockState(name, block.variant, block.repeat, DONE,
                       not_done=[s for s in block.stages if status[s] != UNIT_DONE],
                       started=any(v is not None for v in status.values()))
    if all(units.get(k) == UNIT_DONE for k in block.measuring_keys()):
        return state
    failed = next((s for s in block.stages if status[s] == UNIT_FAILED), None)
    cut = next((s for s in block.stages if status[s] in (UNIT_RUNNING, UNIT_INTERRUPTED)), None)
    if failed is not None:
        state.state, state.stage = FAILED, failed
        state.error = one_line(errors.get(block.key(failed))) or None
    elif cut is not None:
        state.state, state.stage, state.running = INTERRUPTED, cut, status[cut] == UNIT_RUNNING
    else:
        state.state = NOT_RUN
    return state


def read(store: Store, spec: CampaignSpec, joined: set[str]) -> Completeness:
    """The run's completeness against its plan (`joined`: the levers that joined the base so far, in
    cumulative mode; the plan counts undecided levers as not joined)."""
    units, errors = store.units(), store.unit_errors()
    return Completeness([block_state(b, units, errors) for b in plan_mod.campaign_plan(spec, joined)])
