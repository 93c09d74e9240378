"""`rooftop run CAMPAIGN.toml [--resume RUN_DIR] [--runs-dir runs]`: the whole campaign, then its documents."""

import signal
from pathlib import Path

import typer
from rich.console import Console

from rooftop.errors import RooftopError

# The campaign and report packages pull in scipy and matplotlib: imported when a command runs, so
# that `rooftop --help`, `rooftop router` and the rest start quickly.


def flag_warnings(spec) -> list[str]:
    """Deployment args the engine does not take, in the baseline and in each lever's deployment, and a
    vLLM pd hand-off that would move no KV at the bench's prompt length."""
    from rooftop.adapters.flags import unknown_args
    from rooftop.spec.campaign import apply_lever

    warnings = [f"baseline: {w}" for w in unknown_args(spec.deployment)]
    for lv in spec.levers:
        warnings += [f"lever {lv.name}: {w}" for w in unknown_args(apply_lever(spec.deployment, [lv]))
                     if f"baseline: {w}" not in warnings]
    variants = [("baseline", spec.deployment)] + [(f"lever {lv.name}", apply_lever(spec.deployment, [lv]))
                                                  for lv in spec.levers]
    for name, dep in variants:  # a KV hand-off that would move nothing at the bench's prompt length
        if dep.engine == "vllm":
            from rooftop.adapters.vllm import short_prompt_warning

            if (w := short_prompt_warning(dep, spec.bench_settings().input_len)) is not None:
                warnings.append(f"{name}: {w}")
    return warnings


def run_and_report(spec, store) -> Path:
    """Run the campaign's remaining units, rebuild the documents, print where they are; returns the run dir."""
    from rooftop.campaign.runner import Runner
    from rooftop.report.build import build_report

    run_dir = store.run_dir
    err = Console(stderr=True, highlight=False)
    err.print(f"run directory: {run_dir}")
    for warning in flag_warnings(spec):
        err.print(f"[yellow]warning:[/] {warning}")
    # SIGTERM or SIGHUP between bring-ups unwinds like Ctrl-C, as the supervisor makes it do while one is up,
    # so the documents of what ran are written (saying, at their top, what did not) instead of none.
    previous = {sig: signal.signal(sig, _terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        Runner(spec, store, err).run()
    finally:
        store.close()
        # Partial results are documents too: write them even when the run was interrupted.
        paths = build_report(run_dir)
        err.print(f"wrote {paths.summary}, {paths.plan}, {paths.results}, {paths.html} and {len(paths.plots)} plot(s)")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return run_dir


def _terminated(signum, frame) -> None:
    from rooftop.launch.supervisor import Terminated

    raise Terminated(f"received {signal.Signals(signum).name}")


def command(
    campaign: Path = typer.Argument(None, metavar="CAMPAIGN.toml", help="campaign file (not needed with --resume)"),
    resume_dir: Path = typer.Option(None, "--resume", metavar="RUN_DIR", help="continue a killed campaign"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="where new run directories go"),
) -> None:
    """Run a campaign: baseline and levers, deployed, benchmarked, profiled; SUMMARY.md and PLAN.md at the end."""
    from rooftop.campaign.runner import resume, start

    if resume_dir is not None:
        spec, store = resume(resume_dir)
    elif campaign is not None:
        spec, store = start(campaign, runs_dir)
    else:
        raise RooftopError("no campaign given", "pass CAMPAIGN.toml, or --resume RUN_DIR")
    run_dir = run_and_report(spec, store)
    print(run_dir)
