"""`rooftop calibrate`: measure the load generator's own error against a server of known timing."""

from __future__ import annotations

import json
import os
import platform

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from rooftop.bench.calibrate import (
    DEFAULT_LEVELS,
    MEDIAN_TARGET_MS,
    P99_TARGET_MS,
    SERVER_NICE,
    CalibrationLevel,
    calibrate,
    holds_up_to,
)
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
    client_procs: int = typer.Option(0, "--client-procs",
                                     help="Client processes per level; 0 picks one per 256 requests in flight, "
                                          "at most one per CPU"),
    server_nice: int = typer.Option(SERVER_NICE, "--server-nice",
                                    help="How much lower the synthetic server's CPU priority is than the client's "
                                         "(0: equal, so on a few cores the two compete for them)"),
    as_json: bool = typer.Option(False, "--json", help="Print the levels as JSON"),
) -> None:
    """Drive a built-in synthetic streaming server (127.0.0.1) and report the client's TTFT/ITL error."""
    levels = _ints(concurrency, "--concurrency")
    if output_len < 1:
        raise RooftopError(f"--output-len {output_len}: every request needs at least one output token",
                           "e.g. --output-len 32 (TTFT and ITL), or --output-len 1 (TTFT only)")
    if client_procs < 0:
        raise RooftopError(f"--client-procs {client_procs}: a level needs at least one client process",
                           "e.g. --client-procs 2, or 0 to pick one per 256 requests in flight")
    if not 0 <= server_nice <= 19:
        raise RooftopError(f"--server-nice {server_nice}: a nice value is 0 to 19",
                           f"e.g. --server-nice {SERVER_NICE} (the default), or 0 for equal priority")
    load_before = list(os.getloadavg())  # other work on the CPUs the client shares shows in its error
    err = Console(stderr=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  console=err, transient=True) as progress:
        task = {"id": None}

        def on_level(c: int, n: int) -> None:
            task["id"] = progress.add_task(f"C={c}", total=n)

        results = calibrate(levels, ttft_ms=ttft_ms, itl_ms=itl_ms, output_len=output_len,
                            on_level=on_level, on_done=lambda _r: progress.advance(task["id"]),
                            client_procs=client_procs or None, server_nice=server_nice)
    held = holds_up_to(results)
    if as_json:
        print(json.dumps({
            "levels": [r.to_json_dict() for r in results],
            "schedule": {"ttft_ms": ttft_ms, "itl_ms": itl_ms, "output_len": output_len, "server_nice": server_nice},
            "targets_ms": {"median": MEDIAN_TARGET_MS, "p99": P99_TARGET_MS, "figures": ["ttft_error_ms", "itl_error_ms"]},
            "holds_up_to_concurrency": held.concurrency if held else None,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                        "load_average": {"before": load_before, "after": list(os.getloadavg())}},
        }, indent=2))
        return
    t = Table(title=f"client error vs a synthetic server (TTFT {ttft_ms:g} ms, ITL {itl_ms:g} ms)", title_justify="left")
    for col in ("concurrency", "client procs", "requests", "failed", "TTFT err p50 ms", "TTFT err p99 ms",
                "ITL err p50 ms", "ITL err p99 ms", "tokens/s"):
        t.add_column(col, justify="right")
    for r in results:
        t.add_row(str(r.concurrency), str(r.client_procs), str(r.requests), str(r.failed),
                  _ms(r.ttft_error_ms["median"]), _ms(r.ttft_error_ms["p99"]), _ms(r.itl_error_ms["median"]),
                  _ms(r.itl_error_ms["p99"]), f"{r.tokens_per_s:.0f}")
    console = stdout_console()
    print_table(console, t)
    if output_len == 1:
        console.print("ITL: not measured — with one output token per request there is no gap between tokens.")
    for r in results:
        if not r.server_on_schedule and r.server_late_ms["n"]:
            late = r.server_late_ms
            console.print(f"[yellow]C={r.concurrency}: the synthetic server fell behind its schedule (chunks went out "
                          f"{late['median']:.1f} ms late at the median, {late['p99']:.1f} ms at p99): the client was "
                          f"offered fewer tokens/s than planned; its error is still measured against what was sent.[/]")
    console.print(verdict(results, output_len), highlight=False)


def verdict(results: list[CalibrationLevel], output_len: int) -> str:
    """The line under the table: the highest level the targets hold up to, and what missed them above."""
    line = (f"Targets (client error on TTFT{'' if output_len == 1 else ' and ITL'}: median < {MEDIAN_TARGET_MS:g} ms, "
            f"p99 < {P99_TARGET_MS:g} ms): ")
    held = holds_up_to(results)
    line += f"hold up to C={held.concurrency}" if held else "hold at no level"
    missed = next((r for r in sorted(results, key=lambda r: r.concurrency) if not r.holds), None)
    if missed:
        line += f"; missed at C={missed.concurrency} ({_misses(missed)})"
    return line + "."


def _misses(r: CalibrationLevel) -> str:
    """What kept a level off the targets, e.g. 'TTFT err p99 12.374 ms'."""
    out = [f"{r.failed} requests failed"] if r.failed else []
    for name, e in (("TTFT", r.ttft_error_ms), ("ITL", r.itl_error_ms)):
        if e["n"] and e["median"] >= MEDIAN_TARGET_MS:
            out.append(f"{name} err p50 {e['median']:.3f} ms")
        if e["n"] and e["p99"] >= P99_TARGET_MS:
            out.append(f"{name} err p99 {e['p99']:.3f} ms")
    return ", ".join(out) or "no error figure"
