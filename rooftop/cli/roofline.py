"""`rooftop roofline`: per-component floors of a model's decode and prefill steps on a GPU."""

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rooftop.cli.tables import print_table, stdout_console
from rooftop.errors import RooftopError
from rooftop.hardware.specs import gpu_spec, known_names
from rooftop.roofline.config import load_model_shape
from rooftop.roofline.floors import StepFloor, gap
from rooftop.roofline.report import roofline, roofline_json
from rooftop.roofline.speculative import SpecReport, Speculation


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
    speculative_tokens: Annotated[
        int | None, typer.Option("--speculative-tokens", help="k draft tokens a step: speculative decoding's gain")
    ] = None,
    acceptance: Annotated[
        str | None,
        typer.Option(
            "--acceptance",
            help="with --speculative-tokens: one rate per position given the ones before (0.7), or vLLM's "
            "per-position rates, num_accepted_tokens_per_pos / num_drafts (0.8,0.6,0.4)",
        ),
    ] = None,
    draft: Annotated[str, typer.Option("--draft", help="who drafts: mtp (the model's MTP layer) or ngram")] = "mtp",
    concurrency: Annotated[
        str | None, typer.Option("--concurrency", help="the speculative table's batches [1,8,64,256 and --batch]")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Floors = max(bytes / bandwidth, FLOPs / peak) per component, per GPU, for one decode and one prefill step."""
    speculation = _speculation(speculative_tokens, acceptance, draft, concurrency)
    concurrencies = _numbers(concurrency, "--concurrency", int) if concurrency else sorted({1, 8, 64, 256, batch})
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
        speculation=speculation,
        concurrencies=concurrencies,
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
        _print_gap(console, result.decode, measured_ms)
    for note in result.notes:  # assumptions the config forced (float32 costed as bf16, an unknown quant_method)
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    if result.dtypes and len(set(result.dtypes.values())) > 1:
        console.print("weights read as: " + ", ".join(f"{k} {v}" for k, v in result.dtypes.items()), highlight=False)
    print_table(console, _table(f"prefill: batch {batch} x input {input_len or context}", result.prefill))
    if result.speculative is not None:
        _print_speculative(console, result.speculative, context)


def _print_gap(console: Console, decode: StepFloor, measured_ms: float) -> None:
    g = gap(decode, measured_ms)
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


def _speculation(k: int | None, acceptance: str | None, draft: str, concurrency: str | None) -> Speculation | None:
    """--speculative-tokens and --acceptance come together; their values are checked by the roofline."""
    if k is None:
        for flag, value in (("--acceptance", acceptance), ("--concurrency", concurrency)):
            if value is not None:
                raise RooftopError(f"{flag} is for speculative decoding", "pass --speculative-tokens K with it")
        return None
    if acceptance is None:
        raise RooftopError(
            "--speculative-tokens needs --acceptance",
            "pass one rate (--acceptance 0.7) or one per draft position (--acceptance 0.8,0.6,0.4)",
        )
    rates = _numbers(acceptance, "--acceptance", float)
    return Speculation(k, rates[0] if len(rates) == 1 and k > 1 else tuple(rates), draft)


def _numbers(text: str, flag: str, kind: type) -> list:
    """A comma-separated flag's values; their rules are the roofline's, here only the spelling is checked."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values:
        example = "1,8,64" if kind is int else "0.8,0.6,0.4"
        raise RooftopError(f"{flag} {text!r} is not a comma-separated list of numbers", f"e.g. {flag} {example}")
    return values


def _print_speculative(console: Console, report: SpecReport, context: int) -> None:
    cross = report.crossover
    rates = "/".join(f"{a:.3f}" for a in report.acceptance)
    table = Table(
        title=f"speculative decoding: k {cross.k}, {report.draft} draft, acceptance per position {rates} "
        f"({report.expected_tokens:.3f} tokens per verify step), context {context}",
        title_justify="left",
    )
    columns = ("C", "verify ms", "draft ms", "plain ms/tok", "spec ms/tok", "plain tok/s", "spec tok/s", "gain",
               "verify bound")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "verify bound" else "right")
    for e in report.levels:
        table.add_row(
            f"{e.batch}", f"{e.verify_step_ms:.3f}", f"{e.draft_ms:.3f}", f"{e.plain_ms_per_token:.3f}",
            f"{e.spec_ms_per_token:.3f}", f"{e.plain_tok_s:,.0f}", f"{e.spec_tok_s:,.0f}", f"{e.gain:.2f}x",
            e.verify_bound,
        )  # fmt: skip
    print_table(console, table)
    up_to = f"up to batch {cross.max_batch:,}"

    def first(batch: int | None) -> str:
        return f"from batch {batch:,}" if batch else f"not {up_to}"

    plain = first(cross.plain_compute_bound_batch)
    console.print(f"verify step compute-bound {first(cross.compute_bound_batch)}; plain decode {plain}", highlight=False)
    if cross.first_paying_batch is None:
        pays = f"speculation does not pay at any batch {up_to} (gain <= 1)"
    elif cross.break_even_batch is None:
        pays = f"speculation pays from batch {cross.first_paying_batch:,} through {cross.max_batch:,}, the search's end"
    else:
        pays = (f"speculation pays from batch {cross.first_paying_batch:,} and stops paying at batch "
                f"{cross.break_even_batch:,} (gain <= 1 from there)")  # fmt: skip
    console.print(pays, highlight=False)
    for note in report.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)


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
