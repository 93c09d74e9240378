"""`rooftop roofline`: per-component floors of a model's decode and prefill steps on a GPU."""

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from rooftop.cli.tables import print_table, stdout_console
from rooftop.hardware.specs import gpu_spec, known_names
from rooftop.roofline.config import load_model_shape
from rooftop.roofline.floors import StepFloor, gap
from rooftop.roofline.report import roofline, roofline_json


def command(
    model_config: Annotated[
        Path, typer.Option("--model-config", help="config.json, or the model directory holding it")
    ],
    gpu: Annotated[str, typer.Option("--gpu", help="a GPU of the spec table (" + ", ".join(known_names()) + ") or cpu")],
    batch: Annotated[int, typer.Option("--batch", help="sequences per step")],
    context: Annotated[int, typer.Option("--context", help="decode: cached tokens per sequence")],
    input_len: Annotated[
        int | None, typer.Option("--input-len", help="prefill tokens per sequence [--context]")
    ] = None,
    context_capacity: Annotated[
        int | None,
        typer.Option(
            "--context-capacity", help="allocated context the decode indexer scores (capacity-bound indexer)"
        ),
    ] = None,
    tp: Annotated[int, typer.Option("--tp", help="tensor-parallel size")] = 1,
    ep: Annotated[int, typer.Option("--ep", help="expert-parallel size (divides --tp)")] = 1,
    weight_dtype: Annotated[
        str, typer.Option("--weight-dtype", help="auto (from the config), bf16, fp8, nvfp4, mxfp4, int4")
    ] = "auto",
    kv_dtype: Annotated[str, typer.Option("--kv-dtype", help="bf16 or fp8")] = "bf16",
    expert_dtype: Annotated[
        str | None, typer.Option("--expert-dtype", help="routed-expert weights, if not --weight-dtype")
    ] = None,
    measured_ms: Annotated[
        float | None,
        typer.Option("--measured-ms", help="a measured decode step (ms) to set beside the floor"),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Floors = max(bytes / bandwidth, FLOPs / peak) per component, per GPU, for one decode and one prefill step."""
    shape = load_model_shape(model_config)
    spec = gpu_spec(gpu)
    result = roofline(
        shape,
        spec,
        batch=batch,
        context=context,
        input_len=input_len,
        context_capacity=context_capacity,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        expert_dtype=expert_dtype,
        tp=tp,
        ep=ep,
    )
    if json_out:
        typer.echo(json.dumps(roofline_json(result), indent=2))
        return
    console = stdout_console()
    p = result.params
    mtp = f" (+{p.mtp / 1e9:.2f}B MTP)" if p.mtp else ""
    console.print(
        f"[bold]{shape.model_type}[/] on {spec.name}, tp {tp}, ep {ep}: {p.total / 1e9:.2f}B params"
        f"{mtp}, {p.active / 1e9:.2f}B active per token; floors per GPU",
        highlight=False,
    )
    print_table(console, _table(f"decode: batch {batch} x context {context}", result.decode))
    if result.decode_actual_context is not None:
        actual = result.decode_actual_context
        console.print(
            f"indexer over capacity {context_capacity}: "
            f"{result.decode.components['indexer'].floor_ms:.3f} ms; over the actual context {context}: "
            f"{actual.components['indexer'].floor_ms:.3f} ms (step {actual.floor_ms:.3f} ms)"
        )
    console.print(f"decode ceiling: {batch / result.decode.floor_ms * 1e3:,.0f} tok/s at batch {batch}")
    if measured_ms is not None:
        g = gap(result.decode, measured_ms)
        if g.ratio < 1:  # a step faster than its bound: the inputs are wrong, no component holds a gap
            console.print(
                f"measured {measured_ms:.3f} ms is below the floor of {g.floor_ms:.3f} ms ({g.ratio:.2f}x): no step "
                "can beat its floor, so an input is off: check --gpu, --tp/--ep, the dtypes and the config",
                highlight=False,
            )
        else:
            console.print(
                f"measured {measured_ms:.3f} ms = {g.ratio:.1f}x the floor of {g.floor_ms:.3f} ms; "
                f"the gap most likely sits in {g.component} ({g.basis})"
            )
    for note in result.notes:  # assumptions the config forced (float32 costed as bf16, an unknown quant_method)
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    if result.dtypes and len(set(result.dtypes.values())) > 1:
        console.print("weights read as: " + ", ".join(f"{k} {v}" for k, v in result.dtypes.items()), highlight=False)
    print_table(console, _table(f"prefill: batch {batch} x input {input_len or context}", result.prefill))


def _table(title: str, step: StepFloor) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("component", no_wrap=True)
    for column in ("GB", "GFLOP", "mem ms", "flop ms", "floor ms", "bound", "%"):
        table.add_column(column, justify="left" if column == "bound" else "right")
    total_ms = step.floor_ms or 1.0
    for name, c in step.components.items():
        if not (c.bytes or c.flops):
            continue
        table.add_row(
            name,
            f"{c.bytes / 1e9:.3f}",
            f"{c.flops / 1e9:.1f}",
            f"{c.memory_ms:.3f}",
            f"{c.compute_ms:.3f}",
            f"{c.floor_ms:.3f}",
            c.bound,
            f"{c.floor_ms / total_ms:.0%}".rstrip("%"),
        )
    table.add_row(
        "step",
        f"{step.bytes / 1e9:.3f}",
        f"{step.flops / 1e9:.1f}",
        "",
        "",
        f"{step.floor_ms:.3f}",
        "",
        "100",
        style="bold",
    )
    return table
