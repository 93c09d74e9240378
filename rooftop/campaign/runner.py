"""Execute a campaign's plan against its store: deploy, verify, warm up, sweep, quality, profile, tear down.

Every unit of work is marked in the store as it starts and ends, and every measurement is written as
soon as it exists, so a killed campaign resumes (`rooftop run --resume RUN_DIR`) without redoing a
finished sweep, quality check or profile. A block (one bring-up) whose measuring units are all done
is skipped without deploying anything.
"""

from __future__ import annotations

import asyncio
import os
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
from rooftop.campaign import quality as quality_mod
from rooftop.campaign.collect import COMPARISON, JOINED, KEPT, TELEMETRY_NOTE_SUBJECT, one_line, slo_capacity
from rooftop.campaign.eager_map import map_deployment, map_key
from rooftop.campaign.gpu_scope import GpuScope, telemetry_scope
from rooftop.campaign.layout import serving_layout
from rooftop.campaign.plan import Block
from rooftop.campaign.preflight import check_engines_installed
from rooftop.campaign.store import UNIT_DONE, Store
from rooftop.campaign.verdicts import capacity_change, lever_effects, wins
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
    import os
    import platform

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
        self._telemetry_said = False
        self._scope_said: set[str] = set()

    # ---- the plan
    def blocks(self) -> Iterator[Block]:
        """Blocks in order; in cumulative mode a step's blocks depend on the verdicts before it."""
        spec = self.spec
        if spec.campaign.mode == "independent" or not spec.levers:
            blocks = plan_mod.campaign_plan(spec, set())
            for lv in spec.levers:
                self._record_comparison(lv.name, lv.name, BASELINE, plan_mod.MAIN_SERIES)
            yield from blocks
            return
        winners: list[str] = []
        profiled: set[str] = set()
        for step, lever in enumerate(spec.levers):
            step_blocks = plan_mod.cumulative_step(spec, step, winners, profiled)
            profiled |= {b.variant for b in step_blocks if b.profile}
            base, cand = step_blocks[0].variant, step_blocks[1].variant  # round 0 runs base first
            self._record_comparison(lever.name, cand, base, lever.name)
            yield from step_blocks
            if self._decide(lever.name, base, cand):
                winners.append(lever.name)

    def _record_comparison(self, lever: str, variant: str, base: str, series: str) -> None:
        if not any(d.subject == lever for d in self.store.decisions(COMPARISON)):
            self.store.put_decision(COMPARISON, lever, {"lever": lever, "variant": variant,
                                                        "base_variant": base, "series": series})

    def _decide(self, lever: str, base: str, cand: str) -> bool:
        """Cumulative mode: does the lever join the base? Decided once, then read back on resume."""
        for d in self.store.decisions():
            if d.subject == lever and d.kind in (JOINED, KEPT):
                return d.kind == JOINED
        rows_b = self.store.levels(base, series=lever)
        rows_c = self.store.levels(cand, series=lever)
        effects = lever_effects(rows_b, rows_c, self.spec.bench.confidence, self.spec.campaign.seed)
        if not effects:
            return False  # nothing measured (failed blocks): undecided, not joined
        capacity = None
        if self.spec.slo is not None:  # a lever that lowers the SLO capacity stays out, however fast
            from rooftop.bench.slo import Slo

            slo, conf = Slo(**self.spec.slo.model_dump()), self.spec.bench.confidence
            capacity = capacity_change(slo_capacity(rows_b, slo, conf), slo_capacity(rows_c, slo, conf))  # as SUMMARY
        won = wins(effects, capacity)
        tok = {e.concurrency: [round(e.ratio, 4), round(e.ratio_low, 4), round(e.ratio_high, 4), e.verdict]
               for e in effects if e.metric == "output_tok_s"}
        self.store.put_decision(JOINED if won else KEPT, lever, {"base": base, "variant": cand, "tok_s": tok,
                                                                 **({"slo_capacity": capacity} if capacity else {})})
        self.console.print(f"[bold]{lever}[/]: {'joins the baseline' if won else 'stays out of the baseline'}")
        return won

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
        from rooftop.deploy.bring_up import bring_up

        dep = deployment_for(self.spec, block)
        block_dir = self.run_dir / "deployments" / block.series / block.variant / f"r{block.repeat}"
        units = self.store.units()
        todo = [s for s in block.stages if s in plan_mod.MEASURING and units.get(block.key(s)) != UNIT_DONE]
        if block.repeat == 0:  # the roofline needs no measurement: there even if the deployment never comes up
            self.roofline(block, dep, self.spec.profile_concurrency)
        with self._unit(block, "deploy"):
            ctx = bring_up(dep, block_dir, ready_timeout_s=self.spec.bench.timeout_s * 5)
            live = ctx.__enter__()
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
                    if stage == "sweep":
                        self.sweep(block, live.url, block_dir, metrics_url(live, dep.engine), self.gpu_scope(dep, live),
                                   api_key=api_key(dep))
                    elif stage == "quality":
                        with self._unit(block, "quality"):
                            self.quality(block, live.url, api_key(dep))
                    elif stage == "profile":
                        with self._unit(block, "profile") as unit:
                            after_teardown = self.profile(block, dep, live, block_dir)
                            unit["open"] = after_teardown is not None
                except RooftopError as exc:
                    errors.append(exc)
        finally:
            with self._unit(block, "teardown"):
                ctx.__exit__(None, None, None)
        if after_teardown is not None:  # the compiled deployment is down: its GPUs and ports are free
            try:
                with self._unit(block, "profile"):
                    after_teardown()
            except RooftopError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def gpu_scope(self, dep: DeploymentSpec, live) -> GpuScope:
        """The GPUs the sweep's telemetry samples: the deployment's, on this machine (campaign/gpu_scope.py)."""
        workers = [{"role": p.spec.role, "gpus": list(p.spec.gpus or []), "machine": p.spec.machine,
                    "args": dep.role_args(p.spec.role) if p.spec.role in dep.roles() else dict(dep.args),
                    "env": dict(p.spec.env or {})} for p in live.processes]
        return telemetry_scope(dep.engine, workers, self.spec.bench.dcgm_url, os.environ.get("CUDA_VISIBLE_DEVICES"),
                               on_cpu=(self.spec.hardware.gpu or "").lower() == "cpu")

    def sweep(self, block: Block, url: str, block_dir: Path, metrics_url: str | None = None,
              scope: GpuScope | None = None, api_key: str | None = None) -> None:
        """Warm up, then one repeat of every concurrency level not yet in the store; each level and its
        requests go to the store as soon as the level ends (with the server's own figures where
        `metrics_url` exports them, and telemetry of the GPUs in `scope`: None for every visible one),
        so a killed sweep resumes at the first level it had not finished."""
        from rooftop.bench.slo import Slo
        from rooftop.bench.sweep import BenchConfig, run_bench

        b = self.spec.bench
        scope = scope or GpuScope(None)
        if b.telemetry and scope.off:
            self.telemetry_note(scope.note)
        elif b.telemetry and scope.note and scope.note not in self._scope_said:
            self._scope_said.add(scope.note)
            (self.progress.console if self.progress is not None else self.console).print(
                f"GPU telemetry: {scope.note}", highlight=False, markup=False)
        slo = self.spec.slo
        done = sorted({r.concurrency for r in self.store.levels(block.variant, series=block.series)
                       if r.repeat == block.repeat})
        cfg = BenchConfig(
            base_url=url, dataset=b.dataset, dataset_path=b.dataset_path, input_len=b.input_len,
            output_len=b.output_len, prefix_len=b.prefix_len, concurrency=list(b.concurrency),
            num_requests=b.requests_per_level, duration_s=b.duration_s, repeats=1, warmup=b.warmup,
            # The same prompts for every variant in a repeat: A and B answer the same requests.
            seed=self.spec.campaign.seed + 7 * block.repeat, tokenizer=self.spec.model.tokenizer,
            confidence=b.confidence, timeout_s=b.timeout_s, out_dir=block_dir / "bench", metrics_url=metrics_url,
            skip_concurrency=done, slo=Slo(**slo.model_dump()) if slo is not None else None,
            telemetry=b.telemetry and not scope.off, gpus=scope.gpus, dcgm_url=b.dcgm_url, api_key=api_key,
        )
        warmup_key = block.key("warmup")

        def level_done(concurrency: int, records: list, level: dict | None) -> None:
            self.store.put_requests(block.series, block.variant, block.repeat, concurrency,
                                    [r.to_json_dict() for r in records])
            if level is not None:
                self.store.put_level(block.series, block.variant, block.repeat, int(level["concurrency"]), level,
                                     bool(level.get("valid")))
            elif concurrency == 0:  # the warm-up ended: this bring-up is warm, or could not be warmed
                failed = [r for r in records if not r.ok]
                self.store.finish_unit(warmup_key, error=(f"every warm-up request failed ({failed[0].error})"
                                                          if records and len(failed) == len(records) else None))

        with self._unit(block, "sweep"):
            if b.warmup > 0:
                self.store.start_unit(warmup_key)
            outcome = asyncio.run(run_bench(cfg, on_level_start=lambda label, r, n: self._stage(block, label),
                                            on_level_done=level_done, on_note=self.telemetry_note))
            if outcome.aborted:
                raise RooftopError(f"sweep of {block.variant} stopped: {outcome.aborted}",
                                   "see the process logs under " + str(block_dir / "logs"))

    def telemetry_note(self, note: str) -> None:
        """GPU telemetry is off, and why: said once per campaign, and kept for the documents."""
        if self.store.analysis(TELEMETRY_NOTE_SUBJECT, "telemetry_note") is None:
            self.store.put_analysis(TELEMETRY_NOTE_SUBJECT, "telemetry_note", {"note": note})
        if not self._telemetry_said:
            self._telemetry_said = True
            (self.progress.console if self.progress is not None else self.console).print(note, highlight=False, markup=False)

    def quality(self, block: Block, url: str, key: str | None = None) -> None:
        """Greedy outputs of the fixed prompts: a base stores them, a lever is compared with its base's."""
        q = self.spec.quality
        model = asyncio.run(_first_model(url, key))
        outputs = asyncio.run(quality_mod.greedy_outputs(url, model, q.prompts, q.max_tokens, q.logprobs,
                                                         self.spec.bench.timeout_s, key))
        self.store.put_analysis(block.variant, "quality_outputs", {"outputs": quality_mod.outputs_to_dicts(outputs)})
        if block.quality_base is None:
            return
        ref = self.store.analysis(block.quality_base, "quality_outputs")
        if ref is None:
            raise RooftopError(f"quality check of {block.variant}: {block.quality_base} has no reference outputs",
                               "its quality unit failed; rerun with --resume")
        result = quality_mod.compare_outputs(quality_mod.outputs_from_dicts(ref["outputs"]), outputs,
                                             q.kl_threshold, q.agreement_threshold, q.tie_margin)
        self.store.put_analysis(block.variant, "quality", result.to_dict())

    def profile(self, block: Block, dep: DeploymentSpec, live, block_dir: Path):
        """Capture traces at the profile concurrency, attribute them, store them. A pd deployment is loaded
        through its router while both workers are profiled; each role's trace is stored as VARIANT/ROLE.
        Where a trace needs an eager map that is a second bring-up (SGLang, vLLM) and none is stored yet,
        the attribution is returned, to be called once this deployment is down; else None."""
        from rooftop.adapters.processes import get_engine
        from rooftop.deploy.bring_up import profile_targets
        from rooftop.profile import hides_modules, load_trace
        from rooftop.profile.capture import capture_targets

        conc = self.spec.profile_concurrency
        targets = profile_targets(live, block_dir)  # every rank's trace directory, on whichever host it ran
        traces = asyncio.run(capture_targets(live.url, self.run_dir / "traces" / block.variant, targets,
                                             engine=dep.engine, steps=self.spec.profile.steps, concurrency=conc,
                                             timeout_s=self.spec.bench.timeout_s * 3, api_key=api_key(dep)))
        loaded = {role: load_trace(files[0]) for role, files in traces.items()}
        hides = {role: hides_modules(trace) for role, trace in loaded.items()}
        second_bring_up = (get_engine(dep.engine).EAGER_PROFILE is None and self.spec.profile.eager_map
                           and any(hides.values()) and not self.store.analysis(map_key(dep), "eager_map"))
        if second_bring_up:
            return lambda: self.attribute(block, dep, block_dir, None, traces, loaded, hides)
        self.attribute(block, dep, block_dir, live, traces, loaded, hides)
        return None

    def attribute(self, block: Block, dep: DeploymentSpec, block_dir: Path, live, traces: dict, loaded: dict,
                  hides: dict) -> None:
        """Attribute each role's captured trace (through an eager map where its steps hide their modules)
        and store it. `live` is the running deployment, or None once it is down."""
        from rooftop.adapters.processes import get_engine
        from rooftop.profile import analyze, load_trace
        from rooftop.profile.kernel_code import default_dirs
        from rooftop.profile.ranks import rank_report
        from rooftop.roofline.weights import model_dims

        conc = self.spec.profile_concurrency
        # Each role's own trace decides whether it needs a map; the embedded engine's map is that role's
        # own worker profiled eagerly, SGLang's and vLLM's one eager server of the model (eager_map.py).
        one_map = get_engine(dep.engine).EAGER_PROFILE is None  # one bring-up serves every role
        maps: dict = {}
        taken = None  # the first role's map (or why there is none), where one serves all
        for role, hidden in hides.items():
            if not hidden:
                maps[role] = (None, None)
            elif taken is not None:
                maps[role] = taken
            else:
                maps[role] = self.eager_map(block, dep, block_dir, live, role)
                taken = maps[role] if one_map else None
        args = dep.args
        shape = model_shape(self.spec, dep)
        failed = []
        for role, files in traces.items():
            name = block.variant if role == "single" else f"{block.variant}/{role}"
            hidden, (eager_map, map_error) = hides[role], maps[role]
            try:
                kw = dict(context_length=_int(args.get("context-length") or args.get("max-model-len")),
                          # No max-batch hint: a small batch size matches too many unrelated dims.
                          page_size=_int(args.get("page-size")),
                          eager_map=self._load_map(eager_map) if eager_map else None,
                          model_dims=model_dims(shape) if shape is not None else None,
                          # the engine ran on this host: its compiler caches hold the kernels' code
                          kernel_code=default_dirs({**os.environ, **dep.env}))
                summary = analyze(loaded[role], **kw)
            except RooftopError as exc:  # one role's trace unreadable: keep the others, say why
                self.store.put_analysis(name, "profile_error", {"error": one_line(str(exc)),
                                                                "trace": str(files[0].relative_to(self.run_dir))})
                failed.append(f"{role}: {one_line(str(exc))}")
                continue
            analysis = summary.to_json_dict()
            analysis["role"] = role
            analysis["measured"] = (f"the steps as served ({hidden}), attributed through an eager run of the same "
                                    "steps" if hidden and eager_map else
                                    f"the steps as served ({hidden}), without an eager map" if hidden else
                                    "the steps as served (eagerly)")
            if map_error:
                analysis["notes"].append(f"the eager map could not be taken ({map_error}): the step ({hidden}) is "
                                         "attributed by op and kernel names only")
            if len(files) > 1:  # every rank's trace (profile/ranks.py): a per-rank table, stragglers in the notes
                analysis["ranks"], found = rank_report(files, summary,
                                                       lambda path, kw=kw: analyze(load_trace(path), **kw))
                analysis["notes"] += found
            self.store.put_trace(name, str(files[0].relative_to(self.run_dir)), analysis, conc)
        if failed and len(failed) == len(traces):
            raise RooftopError(f"no trace of {block.variant} could be attributed ({'; '.join(failed)})",
                               "read the traces under " + str(self.run_dir / "traces" / block.variant))

    def eager_map(self, block: Block, dep: DeploymentSpec, block_dir: Path, live,
                  role: str = "single") -> tuple[str | None, str | None]:
        """The trace of this deployment's steps run eagerly (its profile's map of module paths), as a path
        under the run directory, for a `role`'s profile whose steps hide their modules (CUDA graphs,
        torch.compile); (None, why) when there is none. The embedded engine profiles the same worker
        eagerly; SGLang and vLLM bring the model up again as one server without graphs or compilation,
        on free ports, after the compiled deployment is down (`live` None; campaign/eager_map.py). Taken
        once per engine, model, interpreter and graph-shaping args in a campaign (the embedded engine:
        per variant and role, as it costs no bring-up), and stored."""
        from rooftop.adapters.common import trace_dir
        from rooftop.adapters.processes import get_engine
        from rooftop.deploy.bring_up import bring_up
        from rooftop.profile import capture
        from rooftop.profile.capture import Target, capture_targets

        if not self.spec.profile.eager_map:
            return None, "[profile] eager_map = false"
        engine = get_engine(dep.engine)
        same_server = engine.EAGER_PROFILE is not None
        key = map_key(dep, block.variant, role) if same_server else map_key(dep)
        stored = self.store.analysis(key, "eager_map")
        if stored:
            return stored["path"], None
        out_dir = self.run_dir / "traces" / f"{block.variant}-eager-map" / (role if same_server and dep.topology == "pd" else "")
        self._stage(block, "profile: eager map" + (f" ({role})" if same_server and dep.topology == "pd" else ""))
        try:
            if same_server:  # load the deployment as served; the role's worker profiles eagerly
                if live is None:
                    return None, "the deployment was down before its eager map was taken"
                running = next(p for p in live.processes if p.spec.role == role)
                worker = running.spec  # on another host its trace is fetched from there
                target = Target(worker.role, worker.url, files=live.supervisor.host_files(running))
                traces = asyncio.run(capture_targets(live.url, out_dir, [target],
                                                     engine=dep.engine, steps=self.spec.profile.steps,
                                                     concurrency=self.spec.profile_concurrency,
                                                     timeout_s=self.spec.bench.timeout_s * 3,
                                                     start_body=engine.EAGER_PROFILE, api_key=api_key(dep)))
                trace = traces[worker.role][0]
                deployment = {"same server": worker.url, "start_profile": engine.EAGER_PROFILE}
            else:  # one eager server of the model, on free ports, once the compiled deployment is down
                eager = engine.eager_variant(map_deployment(dep))
                if eager is None:
                    return None, f"{dep.engine} has no eager variant of this deployment"
                map_dir = block_dir / "eager-map"
                with bring_up(eager, map_dir, ready_timeout_s=self.spec.bench.timeout_s * 5) as map_live:
                    # prefills arrive during the window: the map covers a pd prefill worker's steps too
                    trace = asyncio.run(capture(map_live.url, out_dir, engine=dep.engine, steps=self.spec.profile.steps,
                                                concurrency=self.spec.profile_concurrency,
                                                trace_dir=trace_dir(map_dir, "single"),
                                                timeout_s=self.spec.bench.timeout_s * 3, arrivals=True,
                                                api_key=api_key(eager)))
                deployment = eager.model_dump(mode="json", exclude_none=True)
        except RooftopError as exc:
            return None, one_line(str(exc))
        path = str(trace.relative_to(self.run_dir))
        self.store.put_analysis(key, "eager_map", {"path": path, "variant": block.variant, "deployment": deployment})
        return path, None

    def _load_map(self, path: str):
        """The eager map's trace, named by its path in the run directory (as the profile will cite it)."""
        from rooftop.profile import load_trace

        trace = load_trace(self.run_dir / path)
        trace.path = path
        return trace

    def roofline(self, block: Block, dep: DeploymentSpec, batch: int) -> None:
        """The decode floor of this variant's model at the profile's batch and the bench's mean context;
        where there is none, why (stored as roofline_missing)."""
        from rooftop.hardware.specs import gpu_spec
        from rooftop.roofline.report import roofline

        context = self.spec.bench.input_len + self.spec.bench.output_len // 2
        try:
            shape = model_shape(self.spec, dep)
            if shape is None:
                raise RooftopError(f"no config.json for model {dep.model!r}",
                                   "set [model] config, or serve a model directory that holds one")
            gpu = gpu_spec(self.spec.hardware.gpu or "cpu")
            layout = serving_layout(dep)  # per GPU: the deployment's TP/EP and KV cache dtype
            r = roofline(shape, gpu, batch=batch, context=context, tp=layout.tp, ep=layout.ep,
                         kv_dtype=layout.kv_dtype)
        except RooftopError as exc:
            self.store.put_analysis(block.variant, "roofline_missing", {"reason": one_line(str(exc))})
            return
        self.store.put_analysis(block.variant, "roofline", {
            "hardware": gpu.name, "batch": batch, "context": context,
            "tp": layout.tp, "ep": layout.ep, "kv_dtype": layout.kv_dtype,
            "notes": list(r.notes),  # what the config forced the model to assume (float32 as bf16, ...)
            "context_capacity": _int(dep.args.get("context-length") or dep.args.get("max-model-len")),
            "floor_ms": r.decode.floor_ms,
            "components": {name: c.floor_ms for name, c in r.decode.components.items()},
        })


def metrics_url(live, engine: str | None = None) -> str | None:
    """The /metrics read around each level: the server's; in pd the router's where it joins both workers'
    (vLLM's proxy: TTFT and queue from prefill, ITL from decode), else the decode worker's (decode runs
    the steps TPOT is made of)."""
    from rooftop.adapters.processes import get_engine

    router = next((p for p in live.processes if p.spec.role == "router" and p.spec.url), None)
    if router is not None and engine is not None and getattr(get_engine(engine), "ROUTER_METRICS", False):
        return router.spec.url + "/metrics"
    for proc in live.processes:
        if proc.spec.role in ("single", "decode") and proc.spec.url:
            return proc.spec.url + "/metrics"
    return None


def model_shape(spec: CampaignSpec, dep: DeploymentSpec):
    """The roofline's model shape: [model] config, <path>/config.json, or an embedded preset's config."""
    from rooftop.roofline.config import load_model_shape, shape_from_config

    if spec.model.config:
        return load_model_shape(spec.model.config)
    model = dep.model or spec.model.served
    if model and Path(model, "config.json").is_file():
        return load_model_shape(Path(model, "config.json"))
    if dep.engine == "embedded":
        from rooftop.adapters.embedded import preset_config  # the engine's own config, as HF keys

        config = preset_config(model or "tiny")
        if config is not None:
            return shape_from_config(config, f"preset {model}")
    return None


def _int(v) -> int | None:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


async def _first_model(url: str, key: str | None = None) -> str:
    import aiohttp

    from rooftop.auth import auth_headers
    from rooftop.bench.sweep import resolve_model

    async with aiohttp.ClientSession(headers=auth_headers(key)) as session:
        return await resolve_model(session, url)
