"""The ordered units of work of a campaign.

A block is one bring-up of one variant: deploy → verify placement → warm up → one sweep of every
concurrency level (one repeat) → [quality] → [profile] → tear down. Repeats of compared variants
alternate in time (A B, then B A, ...) so drift lands on both. In cumulative mode each lever is a
step: the current base and base+lever alternate, and a winner joins the base of the next step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rooftop.spec.campaign import BASELINE, CampaignSpec, variant_name

STAGES = ("deploy", "verify", "warmup", "sweep", "quality", "profile", "teardown")
# Stages whose results are stored: a block whose measuring stages are all done is skipped on resume.
MEASURING = ("sweep", "quality", "profile")
MAIN_SERIES = "main"


@dataclass(slots=True)
class Block:
    """One bring-up of one variant for one repeat."""

    variant: str
    levers: list[str]  # applied on top of the baseline, in order
    series: str  # the comparison this block's sweep belongs to
    repeat: int
    quality: bool = False  # decode the fixed quality prompts (reference for a base, compared for a lever)
    quality_base: str | None = None  # the variant whose outputs this one's are compared with
    profile: bool = False
    stages: list[str] = field(default_factory=list)

    def key(self, stage: str) -> str:
        return f"{self.series}/{self.variant}/r{self.repeat}/{stage}"

    def measuring_keys(self) -> list[str]:
        return [self.key(s) for s in self.stages if s in MEASURING]


def _stages(quality: bool, profile: bool) -> list[str]:
    return [s for s in STAGES if (s != "quality" or quality) and (s != "profile" or profile)]


def _block(variant: str, levers: list[str], series: str, repeat: int, quality: bool,
           quality_base: str | None, profile: bool) -> Block:
    return Block(variant, levers, series, repeat, quality, quality_base, profile, _stages(quality, profile))


def independent_plan(spec: CampaignSpec) -> list[Block]:
    """Rounds of baseline and every lever; the order reverses on odd rounds."""
    any_quality = any(lv.quality_check for lv in spec.levers)
    blocks = []
    for r in range(spec.bench.repeats):
        round_ = [_block(BASELINE, [], MAIN_SERIES, r, any_quality and r == 0, None,
                         spec.profile.enabled and r == 0)]
        for lv in spec.levers:
            round_.append(_block(lv.name, [lv.name], MAIN_SERIES, r, lv.quality_check and r == 0, BASELINE,
                                 spec.profile.enabled and r == 0))
        if r % 2 == 1:
            round_.reverse()
        blocks += round_
    return blocks


def cumulative_step(spec: CampaignSpec, step: int, winners: list[str], profiled: set[str]) -> list[Block]:
    """Step `step` (lever index) given the levers that won before it: base and base+lever alternate."""
    lever = spec.levers[step]
    base = variant_name(winners)
    cand_levers = [*winners, lever.name]
    cand = variant_name(cand_levers)
    blocks = []
    for r in range(spec.bench.repeats):
        pair = [
            _block(base, list(winners), lever.name, r, lever.quality_check and r == 0, None,
                   spec.profile.enabled and r == 0 and base not in profiled),
            _block(cand, cand_levers, lever.name, r, lever.quality_check and r == 0, base,
                   spec.profile.enabled and r == 0 and cand not in profiled),
        ]
        if r % 2 == 1:
            pair.reverse()
        blocks += pair
    return blocks


def total_blocks(spec: CampaignSpec) -> int:
    """How many blocks the whole campaign runs (known before any verdict)."""
    if spec.campaign.mode == "independent":
        return spec.bench.repeats * (1 + len(spec.levers))
    return 2 * spec.bench.repeats * len(spec.levers) if spec.levers else spec.bench.repeats


def baseline_only(spec: CampaignSpec) -> list[Block]:
    """A campaign without levers: the baseline's repeats."""
    return [_block(BASELINE, [], MAIN_SERIES, r, False, None, spec.profile.enabled and r == 0)
            for r in range(spec.bench.repeats)]


def campaign_plan(spec: CampaignSpec, joined: set[str]) -> list[Block]:
    """Every block of the campaign, given the levers that joined the base so far (cumulative mode);
    levers not yet decided count as not joined, so the plan is final once every step is decided."""
    if not spec.levers:
        return baseline_only(spec)
    if spec.campaign.mode == "independent":
        return independent_plan(spec)
    blocks: list[Block] = []
    profiled: set[str] = set()
    for step in range(len(spec.levers)):
        winners = [lv.name for lv in spec.levers[:step] if lv.name in joined]
        step_blocks = cumulative_step(spec, step, winners, profiled)
        profiled |= {b.variant for b in step_blocks if b.profile}
        blocks += step_blocks
    return blocks


def remaining_keys(blocks: list[Block], units: dict[str, str]) -> list[str]:
    """Measuring units of the plan not done yet."""
    return [k for b in blocks for k in b.measuring_keys() if units.get(k) != "done"]
