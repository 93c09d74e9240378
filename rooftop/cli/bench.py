"""`rooftop bench`: load any OpenAI-compatible server and report latency and throughput with spread."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from rooftop import auth
from rooftop.bench.backends import BACKENDS, CHAT, COMPLETIONS, NOT_SPOKEN, resolve_endpoint
from rooftop.errors import RooftopError


def _ints(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise RooftopError(f"{flag} {text!r} is not a comma-separated list of integers", f"e.g. {flag} 1,8,16") from exc
    if not vals or any(v < 1 for v in vals):
        raise RooftopError(f"{flag} {text!r} needs positive integers", f"e.g. {flag} 1,8,16")
    return vals


def _gpus(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise RooftopError(f"--gpus {text!r} is not a comma-separated list of GPU indexes", "e.g. --gpus 0,1") from exc
    if not vals or any(v < 0 for v in vals):
        raise RooftopError(f"--gpus {text!r} needs GPU indexes from 0 (as nvidia-smi numbers them)", "e.g. --gpus 0,1")
    return vals


def _floats(text: str | None, flag: str) -> list[float]:
    if not text:
        return []
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise RooftopError(f"{flag} {text!r} is not a comma-separated list of numbers", f"e.g. {flag} 2,4,8") from exc
    if not vals or any(not (0 < v < math.inf) for v in vals):  # nan fails both comparisons
        raise RooftopError(f"{flag} {text!r} needs positive, finite rates (requests/s); for every request at once "
                           "run a closed loop instead (--concurrency N)", f"e.g. {flag} 2,4,8")
    return vals


def check_slo_flags(goodput: list[str] | None, slo_attainment: float | None, stream: bool) -> None:
    """--slo-attainment needs --goodput; a TPOT bound needs streamed answers (without them no token's time
    is known, so TPOT is undefined)."""
    if slo_attainment is not None and not goodput:
        raise RooftopError("--slo-attainment has no effect without --goodput",
                           "give the SLO's bounds too, e.g. --goodput ttft:500 --slo-attainment 0.9")
    if not stream and any(part.startswith("tpot:") for text in goodput or [] for part in
                          text.replace(",", " ").split()):
        raise RooftopError("--goodput tpot: cannot be judged with --no-stream: an answer that is not streamed "
                           "has no per-token times, so its TPOT is undefined",
                           "drop --no-stream, or bound ttft:/e2el: only")


def check_load_flags(input_len: int, output_len: int, confidence: float, timeout: float,
                     dataset: str = "random") -> None:
    """The flags that shape every request and the intervals, checked before any load runs (the campaign
    spec's [bench] bounds: lengths from 1, confidence strictly between 0.5 and 1, a positive timeout).
    ShareGPT alone takes --output-len 0: each conversation's own answer length."""
    if input_len < 1:
        raise RooftopError(f"--input-len {input_len}: a prompt needs at least one token", "e.g. --input-len 256")
    if output_len < 1 and not (output_len == 0 and dataset == "sharegpt"):
        raise RooftopError(f"--output-len {output_len}: a request must generate at least one token "
                           "(TTFT and TPOT are times of generated tokens)",
                           "e.g. --output-len 256 (with --dataset sharegpt, 0 takes each answer's own length)")
    if not 0.5 < confidence < 1.0:
        raise RooftopError(f"--confidence {confidence:g} is not a confidence level: it must lie strictly between "
                           "0.5 and 1 (a share, not a percentage)", "e.g. --confidence 0.95")
    if not 0 < timeout < math.inf:
        raise RooftopError(f"--timeout {timeout:g}: a request's timeout must be a positive, finite number of seconds",
                           "e.g. --timeout 600")


def check_sweep_flags(concurrency: str | None, request_rate: str | None, max_concurrency: int | None,
                      num_requests: int | None, duration: float | None) -> None:
    """The shape of a sweep: closed loop (--concurrency) or open loop (--request-rate, capped by
    --max-concurrency), bounded by a count (--num-requests) and/or a time (--duration)."""
    if max_concurrency is not None and not request_rate:
        raise RooftopError(f"--max-concurrency {max_concurrency} caps an open loop's requests in flight and has no "
                           "effect without --request-rate",
                           f"for a closed loop of {max_concurrency} users pass --concurrency {max_concurrency}; "
                           f"or add --request-rate to cap its arrivals at {max_concurrency} in flight")
    if max_concurrency is not None and max_concurrency < 1:
        raise RooftopError(f"--max-concurrency {max_concurrency}: a cap on requests in flight is at least 1",
                           "e.g. --max-concurrency 16, or drop it for no cap")
    if concurrency is not None and request_rate:
        raise RooftopError("--concurrency (closed-loop levels) and --request-rate (open-loop levels) were both "
                           "given: a sweep is one or the other",
                           "drop --concurrency (cap an open loop with --max-concurrency), or drop --request-rate")
    if num_requests is not None and num_requests < 1:
        raise RooftopError(f"--num-requests {num_requests}: a level needs at least one request",
                           "e.g. --num-requests 64, or --duration SECONDS alone")
    if duration is not None and not (0 < duration < math.inf):
        raise RooftopError(f"--duration {duration:g}: a level's duration must be a positive, finite number of "
                           "seconds", "e.g. --duration 60")


def check_dataset_flags(dataset: str, input_len: int, prefix_len: int, dataset_path: str | None) -> None:
    """--prefix-len belongs to --dataset prefix, which needs one shorter than --input-len; --dataset
    sharegpt needs a --dataset-path that exists."""
    from rooftop.bench.datasets import DATASETS

    if dataset not in DATASETS:
        raise RooftopError(f"--dataset {dataset!r} is not one rooftop builds", f"use one of {', '.join(DATASETS)}")
    if dataset == "prefix" and not 1 <= prefix_len < input_len:
        raise RooftopError(f"--prefix-len {prefix_len}: --dataset prefix shares a prefix of at least 1 token and "
                           f"fewer than --input-len ({input_len})", f"e.g. --prefix-len {max(1, input_len // 2)}")
    if dataset != "prefix" and prefix_len:
        raise RooftopError(f"--prefix-len {prefix_len} has no effect with --dataset {dataset}: only --dataset prefix "
                           "shares a prefix", "pass --dataset prefix (--input-len counts the prefix too), or drop "
                           "--prefix-len")
    if dataset == "sharegpt":
        if not dataset_path:
            raise RooftopError("--dataset sharegpt needs --dataset-path", "point it at a local ShareGPT JSON file")
        if not Path(dataset_path).is_file():
            raise RooftopError(f"ShareGPT file {dataset_path} not found",
                               "pass --dataset-path to a local ShareGPT JSON (or JSONL) file")


def check_telemetry_flags(telemetry: bool, gpus: str | None, dcgm_url: str | None) -> None:
    """--gpus and --dcgm-url choose what telemetry samples: given with --no-telemetry they would do
    nothing; a --dcgm-url must be an http(s) URL with a host."""
    from rooftop.spec.bench import dcgm_url_problem

    if not telemetry and (gpus is not None or dcgm_url):
        flags = " and ".join(f for f, v in (("--gpus", gpus is not None), ("--dcgm-url", dcgm_url)) if v)
        raise RooftopError(f"{flags} {'has' if ' and ' not in flags else 'have'} no effect with --no-telemetry",
                           f"drop --no-telemetry to sample the GPUs, or drop {flags}")
    problem = dcgm_url_problem(dcgm_url) if dcgm_url else None
    if problem:
        raise RooftopError(f"--dcgm-url {dcgm_url!r} {problem}", "e.g. --dcgm-url http://HOST:9400/metrics")


def command(
    base_url: str = typer.Option(None, "--base-url", help="Server root, e.g. http://127.0.0.1:30000"),
    host: str = typer.Option("127.0.0.1", "--host", help="Used with --port when --base-url is not given"),
    port: int = typer.Option(None, "--port", help="Used with --host when --base-url is not given"),
    model: str = typer.Option(None, "--model", help="Model name; default: the first the server lists"),
    api_key: str = typer.Option(None, "--api-key", envvar=auth.ENV, show_envvar=True,
                                help="Sent as Authorization: Bearer on every request, for a server started with "
                                     "--api-key (never written to the results)"),
    endpoint: str = typer.Option(None, "--endpoint", help=f"completions ({COMPLETIONS}, the default) | chat ({CHAT})"),
    backend: str = typer.Option(
        None, "--backend",
        help="A backend name of vllm bench serve or sglang.bench_serving. "
             f"{COMPLETIONS}: {', '.join(k for k, v in BACKENDS.items() if v == COMPLETIONS)}. "
             f"{CHAT}: {', '.join(k for k, v in BACKENDS.items() if v == CHAT)}. "
             "sglang loads /v1/completions, as in vllm bench serve (sglang.bench_serving sends it to SGLang's "
             "native /generate). Refused, with the alternative: "
             f"{', '.join(NOT_SPOKEN)}."),
    dataset: str = typer.Option("random", "--dataset", "--dataset-name", help="random | sharegpt | prefix"),
    dataset_path: str = typer.Option(None, "--dataset-path", help="Local ShareGPT JSON file"),
    input_len: int = typer.Option(256, "--input-len", "--random-input-len", help="Prompt tokens (random and prefix "
                                  "datasets; at least 1)"),
    output_len: int = typer.Option(256, "--output-len", "--random-output-len",
                                   help="Tokens each request generates (at least 1; forced with --ignore-eos); "
                                        "with --dataset sharegpt, 0 takes each conversation's own answer length"),
    prefix_len: int = typer.Option(0, "--prefix-len", "--random-prefix-len",
                                   help="Shared prefix tokens, at least 1 and under --input-len (--dataset prefix only)"),
    concurrency: str = typer.Option(None, "--concurrency", help="Closed-loop levels, e.g. 1,8,16 (default 1)"),
    request_rate: str = typer.Option(None, "--request-rate", help="Open loop: Poisson rates in req/s, e.g. 2,4"),
    max_concurrency: int = typer.Option(None, "--max-concurrency", help="Open loop: cap on requests in flight "
                                        "(needs --request-rate; a closed loop is --concurrency)"),
    num_requests: int = typer.Option(None, "--num-requests", "--num-prompts",
                                     help="Requests per level (default 64; with --duration: no count unless given)"),
    duration: float = typer.Option(None, "--duration",
                                   help="Seconds each level issues requests (--num-requests, if given, becomes a "
                                        "cap); requests still in flight get a grace of a quarter of it (at least "
                                        "10 s, at most --timeout) and are then cut (cut_off)"),
    repeats: int = typer.Option(1, "--repeats", help="Repeats of the sweep, for confidence intervals (one repeat "
                                                     "gives none)"),
    warmup: int = typer.Option(4, "--warmup", "--num-warmups", help="Warm-up requests, excluded from statistics"),
    seed: int = typer.Option(0, "--seed", help="Seed of the prompts, the arrivals and the bootstrap"),
    tokenizer: str = typer.Option(None, "--tokenizer", help="Local HF tokenizer dir; default: server /tokenize"),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence level of every interval, strictly "
                                                                 "between 0.5 and 1"),
    timeout: float = typer.Option(600.0, "--timeout", help="Per-request timeout, seconds (above 0)"),
    ignore_eos: bool = typer.Option(True, "--ignore-eos/--no-ignore-eos",
                                    help="Force the output length with ignore_eos and min_tokens"),
    stream: bool = typer.Option(True, "--stream/--no-stream",
                                help="Stream the answers (--no-stream: one chunk each, so no TPOT or ITL)"),
    out: Path = typer.Option(None, "--out", "--result-dir", help="Write requests.jsonl and summary.json here"),
    client_procs: int = typer.Option(0, "--client-procs",
                                     help="Client processes per level (each its own event loop and connections; "
                                          "the records stay one stream); 0 picks one per 256 requests in flight, "
                                          "at most one per CPU"),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json to stdout instead of the table"),
    goodput: list[str] = typer.Option(None, "--goodput",
                                      help="SLO bounds in ms, as vllm bench serve spells them: --goodput ttft:500 "
                                           "tpot:50 e2el:2000 (any of the three). Adds each level's goodput "
                                           "(requests/s that met every bound) and attainment, and the sweep's "
                                           "SLO capacity"),
    slo_attainment: float = typer.Option(None, "--slo-attainment",
                                         help="The share of requests that must meet --goodput for a level to "
                                              "count toward the SLO capacity (default 0.9)"),
    metrics_url: str = typer.Option(None, "--metrics-url",
                                    help="The server's /metrics, read around each level: the embedded engine's "
                                         "step times, vLLM's and SGLang's own TTFT, inter-token latency, queue, "
                                         "prefill and decode times (summary.json: engine_steps, engine_server, "
                                         "engine_decode_step_ms)"),
    telemetry: bool = typer.Option(True, "--telemetry/--no-telemetry",
                                   help="Sample the GPUs during each level (NVML, or --dcgm-url): utilization, "
                                        "SM clock, memory, power and energy per output token (summary.json: "
                                        "telemetry). Without a GPU it says so once and goes on"),
    gpus: str = typer.Option(None, "--gpus",
                             help="GPUs to sample, as nvidia-smi numbers them, e.g. 0,1; default: those "
                                  "CUDA_VISIBLE_DEVICES names, else every GPU (with --dcgm-url: every GPU the "
                                  "exporter exports)"),
    dcgm_url: str = typer.Option(None, "--dcgm-url",
                                 help="A dcgm-exporter's /metrics, read each second instead of NVML (run the "
                                      "exporter with -c 1000 or less: it refreshes every 30 s by default)"),
) -> None:
    """Load an OpenAI-compatible server: closed-loop concurrency levels or open-loop Poisson rates."""
    # Imported here: the statistics pull in scipy, which other commands need not pay for.
    from rooftop.bench.slo import DEFAULT_ATTAINMENT, parse_goodput
    from rooftop.bench.sweep import BenchConfig, run_bench
    from rooftop.bench.table import summary_notes, summary_table
    from rooftop.cli.tables import print_table, stdout_console

    if base_url is None:
        if port is None:
            raise RooftopError("no server given", "pass --base-url http://HOST:PORT (or --host and --port)")
        base_url = f"http://{host}:{port}"
    chat = resolve_endpoint(endpoint, backend) == CHAT
    if repeats < 1:
        raise RooftopError(f"--repeats {repeats}: a sweep runs at least once", "e.g. --repeats 3")
    check_sweep_flags(concurrency, request_rate, max_concurrency, num_requests, duration)
    if num_requests is None and duration is None:
        num_requests = 64
    check_load_flags(input_len, output_len, confidence, timeout, dataset)
    check_dataset_flags(dataset, input_len, prefix_len, dataset_path)
    check_slo_flags(goodput, slo_attainment, stream)
    check_telemetry_flags(telemetry, gpus, dcgm_url)
    if client_procs < 0:
        raise RooftopError(f"--client-procs {client_procs}: a level needs at least one client process",
                           "e.g. --client-procs 2, or 0 to pick one per 256 requests in flight")
    cfg = BenchConfig(
        base_url=base_url, model=model, chat=chat, dataset=dataset, dataset_path=dataset_path,
        input_len=input_len, output_len=output_len, prefix_len=prefix_len,
        concurrency=_ints(concurrency or "1", "--concurrency"), request_rate=_floats(request_rate, "--request-rate"),
        max_concurrency=max_concurrency, num_requests=num_requests, duration_s=duration, repeats=repeats,
        warmup=warmup, seed=seed, tokenizer=tokenizer, confidence=confidence, timeout_s=timeout,
        force_length=ignore_eos, stream=stream, out_dir=out, metrics_url=metrics_url,
        slo=parse_goodput(goodput, DEFAULT_ATTAINMENT if slo_attainment is None else slo_attainment) if goodput else None,
        telemetry=telemetry, gpus=_gpus(gpus), dcgm_url=dcgm_url, client_procs=client_procs or None,
        api_key=api_key or None,
    )
    console = Console(stderr=True)
    if backend == "sglang":
        console.print(f"--backend sglang: loading {COMPLETIONS}, as vllm bench serve does (sglang.bench_serving "
                      "would load SGLang's native /generate, which rooftop does not speak)",
                      highlight=False, soft_wrap=True)
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True,
    ) as progress:
        task = {"id": None}

        def on_level_start(label: str, repeat: int, n: int | None) -> None:
            if task["id"] is not None:
                progress.update(task["id"], visible=False)
            desc = label if label in ("warm-up", "building prompts") else f"{label} · repeat {repeat + 1}/{cfg.repeats}"
            task["id"] = progress.add_task(desc, total=n)

        def on_done(_rec) -> None:
            progress.advance(task["id"])

        def on_note(line: str) -> None:
            console.print(line, highlight=False, soft_wrap=True)

        outcome = asyncio.run(run_bench(cfg, on_level_start, on_done, on_note=on_note))
    if as_json:
        import json

        print(json.dumps(outcome.summary, indent=2))
    else:
        out_console = stdout_console()
        print_table(out_console, summary_table(outcome.summary))
        for note in summary_notes(outcome.summary):
            out_console.print(f"• {note}", highlight=False)
        if out:
            out_console.print(f"records: {out / 'requests.jsonl'} · summary: {out / 'summary.json'}")
    if outcome.aborted:
        console.print(f"[bold red]run stopped:[/] {outcome.aborted}; every request sent is recorded"
                      + (f" in {out}" if out else ""), highlight=False)
        raise typer.Exit(1)
