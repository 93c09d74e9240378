"""The profile of one block: capture every worker's trace at the profile concurrency, map steps that hide
their modules through an eager run of the same steps, attribute each role's trace, store it.

A pd deployment is loaded through its router while both workers are profiled; each role's trace is
stored as VARIANT/ROLE. Where the eager map is a second bring-up of the model (SGLang, vLLM), it waits
until the compiled deployment is down: `run_profile` then returns the attribution, to be called then.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from rooftop.adapters.common import api_key, trace_dir
from rooftop.adapters.processes import RemoteDir, get_engine
from rooftop.campaign.collect import one_line
from rooftop.campaign.eager_map import map_deployment, map_key
from rooftop.campaign.plan import Block
from rooftop.campaign.roofline_stage import context_capacity, int_or_none, model_shape
from rooftop.campaign.stage_context import StageContext
from rooftop.campaign.stored_profile import StoredProfile
from rooftop.deploy.bring_up import LiveDeployment, bring_up
from rooftop.errors import RooftopError
from rooftop.launch.supervisor import ProcessSpec, RunningProcess
from rooftop.profile import analyze, capture, hides_modules, load_trace
from rooftop.profile.capture import Target, capture_targets
from rooftop.profile.kernel_code import default_dirs
from rooftop.profile.ranks import rank_report
from rooftop.profile.trace import Trace
from rooftop.roofline.weights import model_dims
from rooftop.spec.deployment import DeploymentSpec


def run_profile(ctx: StageContext, block: Block, dep: DeploymentSpec, live: LiveDeployment,
                block_dir: Path) -> Callable[[], None] | None:
    """Capture traces at the profile concurrency, attribute them, store them. Where a trace needs an eager
    map that is a second bring-up (SGLang, vLLM) and none is stored yet, the attribution is returned, to
    be called once this deployment is down; else None."""
    spec = ctx.spec
    targets = profile_targets(live, block_dir)  # every rank's trace directory, on whichever host it ran
    traces = asyncio.run(capture_targets(live.url, ctx.run_dir / "traces" / block.variant, targets,
                                         engine=dep.engine, steps=spec.profile.steps,
                                         concurrency=spec.profile_concurrency, timeout_s=spec.bench.timeout_s * 3,
                                         api_key=api_key(dep)))
    loaded = {role: load_trace(files[0]) for role, files in traces.items()}
    hides = {role: hides_modules(trace) for role, trace in loaded.items()}
    second_bring_up = (get_engine(dep.engine).EAGER_PROFILE is None and spec.profile.eager_map
                       and any(hides.values()) and not ctx.store.analysis(map_key(dep), "eager_map"))
    if second_bring_up:
        return lambda: attribute(ctx, block, dep, block_dir, None, traces, loaded, hides)
    attribute(ctx, block, dep, block_dir, live, traces, loaded, hides)
    return None


def attribute(ctx: StageContext, block: Block, dep: DeploymentSpec, block_dir: Path, live: LiveDeployment | None,
              traces: dict[str, list[Path]], loaded: dict[str, Trace], hides: dict[str, str | None]) -> None:
    """Attribute each role's captured trace (through an eager map where its steps hide their modules)
    and store it. `live` is the running deployment, or None once it is down."""
    # Each role's own trace decides whether it needs a map; the embedded engine's map is that role's
    # own worker profiled eagerly, SGLang's and vLLM's one eager server of the model (eager_map.py).
    one_map = get_engine(dep.engine).EAGER_PROFILE is None  # one bring-up serves every role
    maps: dict[str, tuple[str | None, str | None]] = {}
    taken = None  # the first role's map (or why there is none), where one serves all
    for role, hidden in hides.items():
        if not hidden:
            maps[role] = (None, None)
        elif taken is not None:
            maps[role] = taken
        else:
            maps[role] = eager_map(ctx, block, dep, block_dir, live, role)
            taken = maps[role] if one_map else None
    shape = model_shape(ctx.spec, dep)
    failed = []
    for role, files in traces.items():
        name = block.variant if role == "single" else f"{block.variant}/{role}"
        hidden, (map_path, map_error) = hides[role], maps[role]
        try:
            kw = dict(context_length=context_capacity(dep),
                      # No max-batch hint: a small batch size matches too many unrelated dims.
                      page_size=int_or_none(dep.args.get("page-size")),
                      eager_map=_load_map(ctx, map_path) if map_path else None,
                      model_dims=model_dims(shape) if shape is not None else None,
                      # the engine ran on this host: its compiler caches hold the kernels' code
                      kernel_code=default_dirs({**os.environ, **dep.env}))
            summary = analyze(loaded[role], **kw)
        except RooftopError as exc:  # one role's trace unreadable: keep the others, say why
            ctx.store.put_analysis(name, "profile_error", {"error": one_line(str(exc)),
                                                           "trace": str(files[0].relative_to(ctx.run_dir))})
            failed.append(f"{role}: {one_line(str(exc))}")
            continue
        stored = StoredProfile(summary, role, measured=(
            f"the steps as served ({hidden}), attributed through an eager run of the same steps"
            if hidden and map_path else
            f"the steps as served ({hidden}), without an eager map" if hidden else "the steps as served (eagerly)"))
        if map_error:
            summary.notes.append(f"the eager map could not be taken ({map_error}): the step ({hidden}) is "
                                 "attributed by op and kernel names only")
        if len(files) > 1:  # every rank's trace (profile/ranks.py): a per-rank table, stragglers in the notes
            stored.ranks, found = rank_report(files, summary, lambda path, kw=kw: analyze(load_trace(path), **kw))
            summary.notes += found
        ctx.store.put_trace(name, str(files[0].relative_to(ctx.run_dir)), stored.to_json_dict(),
                            ctx.spec.profile_concurrency)
    if failed and len(failed) == len(traces):
        raise RooftopError(f"no trace of {block.variant} could be attributed ({'; '.join(failed)})",
                           "read the traces under " + str(ctx.run_dir / "traces" / block.variant))


def eager_map(ctx: StageContext, block: Block, dep: DeploymentSpec, block_dir: Path, live: LiveDeployment | None,
              role: str = "single") -> tuple[str | None, str | None]:
    """The trace of this deployment's steps run eagerly (its profile's map of module paths), as a path
    under the run directory, for a `role`'s profile whose steps hide their modules (CUDA graphs,
    torch.compile); (None, why) when there is none. The embedded engine profiles the same worker
    eagerly; SGLang and vLLM bring the model up again as one server without graphs or compilation,
    on free ports, after the compiled deployment is down (`live` None; campaign/eager_map.py). Taken
    once per engine, model, interpreter and graph-shaping args in a campaign (the embedded engine:
    per variant and role, as it costs no bring-up), and stored."""
    spec = ctx.spec
    if not spec.profile.eager_map:
        return None, "[profile] eager_map = false"
    engine = get_engine(dep.engine)
    same_server = engine.EAGER_PROFILE is not None
    key = map_key(dep, block.variant, role) if same_server else map_key(dep)
    stored = ctx.store.analysis(key, "eager_map")
    if stored:
        return stored["path"], None
    per_role = same_server and dep.topology == "pd"
    out_dir = ctx.run_dir / "traces" / f"{block.variant}-eager-map" / (role if per_role else "")
    ctx.stage("profile: eager map" + (f" ({role})" if per_role else ""))
    timeout_s = spec.bench.timeout_s * 3
    try:
        if same_server:  # load the deployment as served; the role's worker profiles eagerly
            if live is None:
                return None, "the deployment was down before its eager map was taken"
            running = next(p for p in live.processes if p.spec.role == role)
            worker = running.spec  # on another host its trace is fetched from there
            target = Target(worker.role, worker.url, files=live.supervisor.host_files(running))
            traces = asyncio.run(capture_targets(live.url, out_dir, [target], engine=dep.engine,
                                                 steps=spec.profile.steps, concurrency=spec.profile_concurrency,
                                                 timeout_s=timeout_s, start_body=engine.EAGER_PROFILE,
                                                 api_key=api_key(dep)))
            trace = traces[worker.role][0]
            deployment = {"same server": worker.url, "start_profile": engine.EAGER_PROFILE}
        else:  # one eager server of the model, on free ports, once the compiled deployment is down
            eager = engine.eager_variant(map_deployment(dep))
            if eager is None:
                return None, f"{dep.engine} has no eager variant of this deployment"
            map_dir = block_dir / "eager-map"
            with bring_up(eager, map_dir, ready_timeout_s=spec.bench.timeout_s * 5) as map_live:
                # prefills arrive during the window: the map covers a pd prefill worker's steps too
                trace = asyncio.run(capture(map_live.url, out_dir, engine=dep.engine, steps=spec.profile.steps,
                                            concurrency=spec.profile_concurrency,
                                            trace_dir=trace_dir(map_dir, "single"), timeout_s=timeout_s,
                                            arrivals=True, api_key=api_key(eager)))
            deployment = eager.model_dump(mode="json", exclude_none=True)
    except RooftopError as exc:
        return None, one_line(str(exc))
    path = str(trace.relative_to(ctx.run_dir))
    ctx.store.put_analysis(key, "eager_map", {"path": path, "variant": block.variant, "deployment": deployment})
    return path, None


def _load_map(ctx: StageContext, path: str) -> Trace:
    """The eager map's trace, named by its path in the run directory (as the profile will cite it)."""
    trace = load_trace(ctx.run_dir / path)
    trace.path = path
    return trace


def profile_targets(live: LiveDeployment, run_dir: Path) -> list[Target]:
    """What profile capture profiles: each worker role's server (rank 0 of a multi-node role), with its
    trace directory, the files of its host when that is another, and its other nodes' trace directories."""
    roles = ("prefill", "decode") if live.spec.topology == "pd" else ("single",)
    targets = []
    for proc in live.processes:
        if proc.spec.role not in roles or not proc.spec.url:
            continue
        others = [(live.supervisor.host_files(p), process_trace_dir(p, run_dir)) for p in live.processes
                  if p.spec.role == proc.spec.role and p is not proc]
        url = proc.spec.url if live.spec.topology == "pd" else live.url
        targets.append(Target(proc.spec.role, url, process_trace_dir(proc, run_dir),
                              files=live.supervisor.host_files(proc), more=others))
    return targets


def process_trace_dir(proc: RunningProcess | ProcessSpec, run_dir: Path) -> str:
    """Where process `proc` writes its traces: the role's trace directory, on its host where it runs elsewhere."""
    spec = proc.spec if isinstance(proc, RunningProcess) else proc
    return trace_dir(RemoteDir(spec.remote_dir), spec.role) if spec.remote_dir else trace_dir(run_dir, spec.role)
