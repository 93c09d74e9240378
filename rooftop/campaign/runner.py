"""Execute a campaign's plan against its store: deploy, verify, warm up, sweep, quality, profile, tear down.

The runner holds the block loop and the bookkeeping of units; each stage is a module of plain functions
over a `StageContext`: `sweep_stage`, `quality_stage`, `profile_stage` (capture, eager map,
attribution), `roofline_stage`; `decisions` says what a lever is compared with and whether it joins.

Every unit of work is marked in the store as it starts and ends, and every measurement is written as
soon as it exists, so a killed campaign resumes (`rooftop run --resume RUN_DIR`) without redoing a
finished sweep, quality check or profile. A block (one bring-up) whose measuring units are all done
is skipped without deploying anything.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from rooftop.adapters.common import api_key
from rooftop.campaign import plan as plan_mod
from rooftop.campaign.decisions import decide, record_comparison
from rooftop.campaign.plan import Block
from rooftop.campaign.preflight import check_engines_installed
from rooftop.campaign.profile_stage import run_profile
from rooftop.campaign.quality_stage import run_quality
from rooftop.campaign.roofline_stage import run_roofline
from rooftop.campaign.server_spans import traced
from rooftop.campaign.stage_context import StageContext
from rooftop.campaign.store import UNIT_DONE, Store
from rooftop.campaign.sweep_stage import run_sweep
from rooftop.deploy.bring_up import bring_up
from rooftop.errors import RooftopError
from rooftop.spec.campaign import (
    BASELINE,
    CampaignSpec,
    apply_lever,
    load_campaign,
    parse_campaign,
)
from rooftop.spec.deployment import DeploymentSpec


def new_run_dir(runs_dir: Path | str, name: str) -> Path:
    """runs/<name>-<UTC time>/ (a suffix when two runs start in the same second)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = Path(runs_dir) / f"{name}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def start(campaign_path: Path | str, runs_dir: Path | str = "runs", text: str | None = None) -> tuple[CampaignSpec, Store]:
    """Validate the campaign (the file, or `text` labelled with its path), check its engines, create
    its run directory and store."""
    if text is None:
        spec = load_campaign(campaign_path)
        text = Path(campaign_path).read_text()
    else:
        spec = parse_campaign(text, campaign_path)
    check_engines_installed(spec, campaign_path)
    store = Store.create(new_run_dir(runs_dir, spec.campaign.name))
    store.put_run(spec.campaign.name, spec.campaign.goal, spec.campaign.mode, text, str(campaign_path), _host())
    return spec, store


def resume(run_dir: Path | str) -> tuple[CampaignSpec, Store]:
    """Reopen a run directory; the campaign is the one stored there (the file may have changed since)."""
    store = Store.open(run_dir)
    store.mark_interrupted()
    run = store.run()
    spec = parse_campaign(run.spec_toml, run.spec_path or Path(run_dir) / "store.sqlite")
    check_engines_installed(spec, run.spec_path or "campaign")
    return spec, store


def _host() -> dict:
    return {"hostname": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()}


def deployment_for(spec: CampaignSpec, block: Block) -> DeploymentSpec:
    """The block's deployment: baseline plus its levers, every unset port a free one (no fixed ports)."""
    levers = [next(lv for lv in spec.levers if lv.name == name) for name in block.levers]
    dep = apply_lever(spec.deployment, levers).model_copy(deep=True)
    for role in dep.roles().values():
        if role.port is None:
            role.port = 0
    return dep


class Runner:
    """Runs the blocks of one campaign in order, skipping what the store says is done."""

    def __init__(self, spec: CampaignSpec, store: Store, console: Console | None = None):
        self.spec = spec
        self.store = store
        self.run_dir = store.run_dir
        self.console = console or Console(stderr=True)
        self.progress: Progress | None = None
        self.task = None
        self._said: set[str] = set()  # what the stages said once for the whole campaign

    # ---- the plan
    def blocks(self) -> Iterator[Block]:
        """Blocks in order; in cumulative mode a step's blocks depend on the verdicts before it."""
        spec = self.spec
        if spec.campaign.mode == "independent" or not spec.levers:
            blocks = plan_mod.campaign_plan(spec, set())
            for lv in spec.levers:
                record_comparison(self.store, lv.name, lv.name, BASELINE, plan_mod.MAIN_SERIES)
            yield from blocks
            return
        winners: list[str] = []
        profiled: set[str] = set()
        for step, lever in enumerate(spec.levers):
            step_blocks = plan_mod.cumulative_step(spec, step, winners, profiled)
            profiled |= {b.variant for b in step_blocks if b.profile}
            base, cand = step_blocks[0].variant, step_blocks[1].variant  # round 0 runs base first
            record_comparison(self.store, lever.name, cand, base, lever.name)
            yield from step_blocks
            if decide(spec, self.store, lever.name, base, cand, self.console.print):
                winners.append(lever.name)

    # ---- running
    def run(self) -> None:
        """Run every block not yet done; failures of one block are recorded and the next one runs."""
        total = plan_mod.total_blocks(self.spec)
        columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        with Progress(*columns, console=self.console, transient=False) as progress:
            self.progress = progress
            self.task = progress.add_task("campaign", total=total)
            for block in self.blocks():
                units = self.store.units()
                if all(units.get(k) == UNIT_DONE for k in block.measuring_keys()):
                    progress.advance(self.task)
                    continue
                try:
                    self.run_block(block)
                except RooftopError as exc:
                    self.console.print(f"[red]{block.variant} r{block.repeat}:[/] {exc}", highlight=False)
                except Exception as exc:  # noqa: BLE001 - one block's bug must not lose the campaign
                    self.console.print(f"[red]{block.variant} r{block.repeat}: internal error "
                                       f"{type(exc).__name__}: {exc}[/] (recorded in the store)", highlight=False)
                progress.advance(self.task)
            progress.update(self.task, description="campaign done")

    def _stage(self, block: Block, stage: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=f"{block.variant} r{block.repeat}: {stage}")

    def _context(self, block: Block) -> StageContext:
        """What the stages of `block` are given: its progress label, this campaign's console and store."""
        return StageContext(self.spec, self.store,
                            say=lambda text: self.console.print(text, highlight=False, markup=False),
                            stage=lambda label: self._stage(block, label), said=self._said)

    @contextmanager
    def _unit(self, block: Block, stage: str) -> Iterator[dict]:
        """Mark one unit running, then done, or failed with its error (and re-raise). The body sets
        `["open"] = True` on what it is given to leave the unit running for a later phase."""
        key = block.key(stage)
        self._stage(block, stage)
        self.store.start_unit(key)
        state = {"open": False}
        try:
            yield state
        except RooftopError as exc:
            self.store.finish_unit(key, error=str(exc))
            raise
        except Exception as exc:
            self.store.finish_unit(key, error=f"{type(exc).__name__}: {exc}")
            raise
        # Ctrl-C and a killed rooftop leave the unit "running"; resume marks it interrupted and redoes it.
        if not state["open"]:
            self.store.finish_unit(key)

    def run_block(self, block: Block) -> None:
        """One bring-up of one variant: every stage of the block whose unit is not done."""
        ctx = self._context(block)
        dep = traced(deployment_for(self.spec, block))  # the sweep receives its spans (campaign/server_spans.py)
        block_dir = self.run_dir / "deployments" / block.series / block.variant / f"r{block.repeat}"
        units = self.store.units()
        todo = [s for s in block.stages if s in plan_mod.MEASURING and units.get(block.key(s)) != UNIT_DONE]
        if block.repeat == 0:  # the roofline needs no measurement: there even if the deployment never comes up
            run_roofline(ctx, block, dep, self.spec.profile_concurrency)
        with self._unit(block, "deploy"):
            up = bring_up(dep, block_dir, ready_timeout_s=self.spec.bench.timeout_s * 5)
            live = up.__enter__()
        errors: list[RooftopError] = []
        after_teardown = None  # the profile's attribution where its eager map is a second bring-up
        try:
            with self._unit(block, "verify"):
                launch = (block_dir / "launch.sh").read_text() if (block_dir / "launch.sh").is_file() else ""
                self.store.put_deployment(block.variant, block.repeat, block.levers,
                                          dep.model_dump(mode="json", exclude_none=True), live.inventory,
                                          launch, live.placement, live.url)
            # Each measuring stage stands alone: a failed quality check still leaves the profile to run.
            for stage in todo:
                try:
                    with self._unit(block, stage) as unit:
                        if stage == "sweep":
                            run_sweep(ctx, block, dep, live, block_dir)
                        elif stage == "quality":
                            run_quality(ctx, block, live.url, api_key(dep))
                        elif stage == "profile":
                            after_teardown = run_profile(ctx, block, dep, live, block_dir)
                            unit["open"] = after_teardown is not None
                except RooftopError as exc:
                    errors.append(exc)
        finally:
            with self._unit(block, "teardown"):
                up.__exit__(None, None, None)
        if after_teardown is not None:  # the compiled deployment is down: its GPUs and ports are free
            try:
                with self._unit(block, "profile"):
                    after_teardown()
            except RooftopError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
