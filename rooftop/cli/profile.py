"""`rooftop profile TRACE [--vs TRACE2] [--eager-trace E] [--vs-eager-trace E2] [--context-length N] [--json] ...`."""

import dataclasses
import json
import math
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from rooftop.cli.tables import print_table, stdout_console
from rooftop.errors import RooftopError
from rooftop.profile import analyze, load_trace
from rooftop.profile.diff import diff_summaries
from rooftop.profile.kernel_code import default_dirs
from rooftop.profile.scaling import scaling_of
from rooftop.profile.summary import ProfileSummary


def command(
    trace: Path = typer.Argument(..., help="Kineto trace (.json / .json.gz) or Nsight Systems .sqlite export."),
    vs: Path | None = typer.Option(None, "--vs", help="Second trace of the same workload: diff it, and read "
                                   "TRACE as the small capacity and this one as the large for capacity scaling."),
    context_length: int | None = typer.Option(None, "--context-length", min=1, help="Configured context (tokens)."),
    page_size: int | None = typer.Option(None, "--page-size", min=1, help="KV page size (tokens); default 64."),
    max_batch: int | None = typer.Option(None, "--max-batch", min=1, help="Configured max running requests."),
    eager_trace: Path | None = typer.Option(None, "--eager-trace", help="A trace of the same engine serving the "
                                            "same load eagerly (vLLM --enforce-eager): the map that gives a "
                                            "compiled step's ops their modules."),
    vs_eager_trace: Path | None = typer.Option(None, "--vs-eager-trace", help="The eager map for the --vs trace "
                                               "(default: --eager-trace's)."),
    kernel_code: list[Path] = typer.Option(None, "--kernel-code", help="A compiler cache (Triton's, Inductor's) "
                                           "whose PTX decides whether generated kernels ran on tensor cores; "
                                           "repeatable. Default: this host's Triton, Inductor and vLLM caches."),
    ncu: str | None = typer.Option(None, "--ncu", help="A command that runs the step (e.g. \"python3 step.py\"): "
                                   "run it under Nsight Compute for the trace's top kernels and put each on "
                                   "the roofline (a GPU host with ncu)."),
    ncu_range: str | None = typer.Option(None, "--ncu-range", help="Profile only inside this NVTX range (e.g. "
                                         "the step's, so set-up launches of the same kernels are left out)."),
    ncu_report: Path | None = typer.Option(None, "--ncu-report", help="An .ncu-rep report to read instead."),
    gpu: str | None = typer.Option(None, "--gpu", help="The GPU's peaks for --ncu (default: the trace's GPU)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    top: int = typer.Option(10, "--top", min=1, help="How many kernels to list."),
):
    """Attribute a trace's time to components, classify kernels, and find work sized by capacity."""
    first = load_trace(trace)
    eager_map = load_trace(eager_trace) if eager_trace is not None else None
    code = list(kernel_code or default_dirs())
    # with --vs the diff lists more kernels than the summary shows
    depth = max(top, DIFF_KERNELS) if vs is not None else top
    summary = analyze(first, context_length=context_length, page_size=page_size, max_batch=max_batch, top=depth,
                      eager_map=eager_map, kernel_code=code)
    out = _shown(summary, top).to_json_dict()
    other = load_trace(vs) if vs is not None else None
    if other is not None:
        vs_map = eager_map if vs_eager_trace is None or vs_eager_trace == eager_trace else load_trace(vs_eager_trace)
        other_summary = analyze(other, context_length=context_length, page_size=page_size, max_batch=max_batch,
                                top=depth, eager_map=vs_map, kernel_code=code)
        out["vs"] = {
            "summary": _shown(other_summary, top).to_json_dict(),
            "diff": diff_summaries(summary, other_summary).to_json_dict(),
            "capacity_scaling": [
                {"component": f.component, "path": f.path, "ms_per_step_small": f.ms_per_step_small,
                 "ms_per_step_large": f.ms_per_step_large, "ratio": _finite(f.ratio), "scales": f.scales,
                 "finding": f.sentence()}
                for f in scaling_of(summary, other_summary)
            ],
        }
    summary = _shown(summary, top)
    kernels = None
    if ncu is not None or ncu_report is not None:
        kernels = _ncu_table(first, summary, ncu, ncu_report, gpu, top, ncu_range)
        out["ncu"] = [k.row() for k in kernels]
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    console = stdout_console()
    _print(console, summary, top)
    if kernels is not None:
        _print_ncu(console, kernels)
    if other is not None:
        _print_vs(console, out["vs"])


DIFF_KERNELS = 50  # kernels compared by --vs


def _shown(summary: ProfileSummary, top: int) -> ProfileSummary:
    """The summary with its `top` kernels only."""
    return dataclasses.replace(summary, top_kernels=summary.top_kernels[:top])


def _ncu_table(trace, summary: ProfileSummary, command: str | None, report: Path | None, gpu: str | None, top: int,
               nvtx_range: str | None = None):
    """The trace's top kernels as Nsight Compute measured them, each on the roofline of `gpu`."""
    import shlex
    import tempfile

    from rooftop.hardware.specs import gpu_spec
    from rooftop.profile import ncu

    name = gpu or next((p.get("name") for p in trace.device_properties if p.get("name")), None)
    if name is None:
        raise RooftopError("the trace names no GPU", "pass --gpu (h100, h200, b200, ...)")
    spec = gpu_spec(name)
    names = [k.name for k in summary.top_kernels[:top]]
    if report is None:
        report = ncu.run_ncu(shlex.split(command), names, Path(tempfile.mkdtemp(prefix="rooftop-ncu-")) / "step",
                             nvtx_range=nvtx_range)
        typer.echo(f"ncu report: {report} (read it again with --ncu-report)", err=True)
    measured = ncu.read_report(report)
    wanted = {ncu.base_name(n) for n in names}
    return [k for k in ncu.kernel_table(measured, spec) if k.name in wanted]


def _print_ncu(console: Console, kernels) -> None:
    t = Table(title="Nsight Compute: the top kernels on the roofline", title_justify="left")
    for col in ("kernel", "launches", "us each", "DRAM GB/s", "TFLOP/s", "tensor TFLOP/s", "tensor pipe",
                "FLOP/B", "bound", "% of bound"):
        t.add_column(col, justify="left" if col in ("kernel", "bound") else "right")
    for k in kernels:
        t.add_row(k.name[:60], str(k.launches), f"{k.time_us:.1f}", f"{k.dram_gb_s:.0f}", f"{k.tflop_s:.2f}",
                  f"{k.tensor_tflop_s:.2f}", "–" if k.tensor_pipe_pct is None else f"{k.tensor_pipe_pct:.1f}%",
                  f"{k.intensity:.1f}", f"{k.bound} ({k.peak_flops_used})" if k.bound == "compute" else k.bound,
                  f"{k.pct_of_bound:.1f}%")
    print_table(console, t)


def _finite(x: float) -> float | None:
    """JSON has no infinity: a ratio from zero is null."""
    return x if math.isfinite(x) else None


def _print(console: Console, s: ProfileSummary, top: int) -> None:
    basis = "GPU kernel time" if s.basis == "kernels" else "CPU op self time (no GPU kernels in the trace)"
    console.print(f"[bold]{s.trace}[/]  {s.arch or 'cpu'} · {s.steps} step(s) · shares of {basis}")
    console.print(f"attributed by {s.attribution_source}; {s.unattributed_share:.0%} of the step in no component",
                  highlight=False)
    for line in s.findings():
        console.print(f"• {line}", highlight=False)
    t = Table(title="components", title_justify="left")
    for col in ("component", "share", "ms/step", "units", "path"):
        t.add_column(col, justify="right" if col in ("share", "ms/step") else "left")
    for c in s.components:
        units = ", ".join(f"{u} {v:.0%}" for u, v in c.unit_shares.items())
        t.add_row(c.name, f"{c.share:.1%}", f"{c.ms_per_step:.3f}", units, c.path)
    print_table(console, t)
    t = Table(title="categories", title_justify="left")
    t.add_column("category")
    t.add_column("share", justify="right")
    for name, share in s.categories.items():
        t.add_row(name, f"{share:.1%}")
    print_table(console, t)
    t = Table(title=f"top {top} kernels" if s.basis == "kernels" else f"top {top} CPU ops", title_justify="left")
    for col in ("name", "category", "unit", "rule", "component", "ms/step", "share", "calls/step"):
        t.add_column(col, justify="right" if col in ("ms/step", "share", "calls/step") else "left")
    for k in s.top_kernels:
        t.add_row(k.name[:70], k.category, k.unit, k.rule, k.component, f"{k.ms_per_step:.3f}", f"{k.share:.1%}",
                  f"{k.calls_per_step:.1f}")
    print_table(console, t)
    if s.capacity_findings:
        t = Table(title="capacity findings", title_justify="left")
        for col in ("dim", "derived from", "component", "ms/step", "ops"):
            t.add_column(col)
        for f in s.capacity_findings:
            t.add_row(str(f.dim), f.derived_from, f.component, f"{f.ms_per_step:.3f}", ", ".join(f.ops[:8]))
        print_table(console, t)
    for note in s.notes:
        console.print(f"[dim]note: {note}[/]", highlight=False)


def _print_vs(console: Console, vs: dict) -> None:
    d = vs["diff"]
    console.print(f"\n[bold]vs {d['b']}[/]  busy ms/step {d['busy_ms_per_step'][0]:.3f} -> {d['busy_ms_per_step'][1]:.3f}")
    for f in vs["capacity_scaling"]:
        if f["scales"]:
            console.print(f"• {f['finding']}", highlight=False)
    for title, rows in (("components", d["components"]), ("kernels", d["kernels"][:15])):
        t = Table(title=f"diff by {title}", title_justify="left")
        for col in ("name", "A ms/step", "B ms/step", "delta ms", "B/A"):
            t.add_column(col, justify="left" if col == "name" else "right")
        for r in rows:
            t.add_row(r["name"][:70], f"{r['a_ms_per_step']:.3f}", f"{r['b_ms_per_step']:.3f}", f"{r['delta_ms']:+.3f}",
                      f"{r['ratio']:.2f}x" if r["ratio"] is not None else "new")
        print_table(console, t)
