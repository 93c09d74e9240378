"""`rooftop calibrate`: measure the load generator's own error against a server of known timing."""

from __future__ import annotations

import json
import os
import platform

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from rooftop.bench.calibrate import DEFAULT_LEVELS, THRESHOLD_MS, best_level, calibrate
from rooftop.cli.bench import _ints
from rooftop.cli.tables import print_table, stdout_console
from rooftop.errors import RooftopError


def _ms(x: float | None) -> str:
    """A figure in ms, or '-' where there was nothing to measure (one output token has no ITL)."""
    return "-" if x is None else f"{x:.3f}"


def command(
    concurrency: str = typer.Option(",".join(map(str, DEFAULT_LEVELS)), "--concurrency", help="Levels to sweep"),
    ttft_ms: float = typer.Option(20.0, "--ttft-ms", help="The synthetic server's time to first token"),
    itl_ms: float = typer.Option(10.0, "--itl-ms", help="The synthetic server's gap between tokens"),
    output_len: int = typer.Option(32, "--output-len", help="Tokens per request; 1 measures TTFT only"),
    as_json: bool = typer.Option(False, "--json", help="Print the levels as JSON"),
) -> None:
    """Drive a built-in synthetic streaming server (127.0.0.1) and report the client's TTFT/ITL error."""
    levels = _ints(concurrency, "--concurrency")
    if output_len < 1:
        raise RooftopError(f"--output-len {output_len}: every request needs at least one output token",
                           "e.g. --output-len 32 (TTFT and ITL), or --output-len 1 (TTFT only)")
    err = Console(stderr=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  console=err, transient=True) as progress:
        task = {"id": None}

        def on_level(c: int, n: int) -> None:
            task["id"] = progress.add_task(f"C={c}", total=n)

        results = calibrate(levels, ttft_ms=ttft_ms, itl_ms=itl_ms, output_len=output_len,
                            on_level=on_level, on_done=lambda _r: progress.advance(task["id"]))
    best = best_level(results)
    if as_json:
        print(json.dumps({
            "levels": [r.to_json_dict() for r in results],
            "threshold_ms": THRESHOLD_MS,
            "max_concurrency_under_threshold": best.concurrency if best else None,
            "tokens_per_s_under_threshold": round(best.tokens_per_s, 1) if best else None,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        }, indent=2))
        return
    t = Table(title=f"client error vs a synthetic server (TTFT {ttft_ms:g} ms, ITL {itl_ms:g} ms)", title_justify="left")
    for col in ("concurrency", "requests", "failed", "TTFT err p50 ms", "TTFT err p99 ms", "ITL err p50 ms",
                "ITL err p99 ms", "tokens/s"):
        t.add_column(col, justify="right")
    for r in results:
        t.add_row(str(r.concurrency), str(r.requests), str(r.failed), _ms(r.ttft_error_ms["median"]),
                  _ms(r.ttft_error_ms["p99"]), _ms(r.itl_error_ms["median"]), _ms(r.itl_error_ms["p99"]),
                  f"{r.tokens_per_s:.0f}")
    console = stdout_console()
    print_table(console, t)
    if output_len == 1:
        console.print("ITL: not measured — with one output token per request there is no gap between tokens.")
    if best:
        console.print(f"Median TTFT error stays under {THRESHOLD_MS:g} ms up to C={best.concurrency} "
                      f"({best.tokens_per_s:.0f} tokens/s).")
    else:
        console.print(f"[yellow]Median TTFT error is over {THRESHOLD_MS:g} ms at every level.[/]")
