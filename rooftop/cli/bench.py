"""`rooftop bench`: load any OpenAI-compatible server and report latency and throughput with spread."""

from __future__ import annotations

import asyncio
import json
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
from rooftop.spec.bench import TRACE_DATASETS, BenchSettings


class Opt:
    """The options of `rooftop bench`: names, defaults and help, apart from the command that reads them."""

    base_url = typer.Option(None, "--base-url", help="Server root, e.g. http://127.0.0.1:30000")
    host = typer.Option("127.0.0.1", "--host", help="Used with --port when --base-url is not given")
    port = typer.Option(None, "--port", help="Used with --host when --base-url is not given")
    model = typer.Option(None, "--model", help="Model name; default: the first the server lists")
    api_key = typer.Option(None, "--api-key", envvar=auth.ENV, show_envvar=True,
                           help="Sent as Authorization: Bearer on every request, for a server started with "
                                "--api-key (never written to the results)")
    endpoint = typer.Option(None, "--endpoint", help=f"completions ({COMPLETIONS}, the default) | chat ({CHAT})")
    backend = typer.Option(
        None, "--backend",
        help="A backend name of vllm bench serve or sglang.bench_serving. "
             f"{COMPLETIONS}: {', '.join(k for k, v in BACKENDS.items() if v == COMPLETIONS)}. "
             f"{CHAT}: {', '.join(k for k, v in BACKENDS.items() if v == CHAT)}. "
             "sglang loads /v1/completions, as in vllm bench serve (sglang.bench_serving sends it to SGLang's "
             "native /generate). Refused, with the alternative: "
             f"{', '.join(NOT_SPOKEN)}.")
    dataset = typer.Option("random", "--dataset", "--dataset-name",
                           help="random | sharegpt | prefix | mooncake | burstgpt | azure | trace (replayed on "
                                "their own clock) | conversation (multi-turn sessions)")
    dataset_path = typer.Option(None, "--dataset-path", help="Local ShareGPT JSON file, or the trace file")
    input_len = typer.Option(256, "--input-len", "--random-input-len", help="Prompt tokens (random and prefix "
                             "datasets; at least 1)")
    output_len = typer.Option(256, "--output-len", "--random-output-len",
                              help="Tokens each request generates (at least 1; forced with --ignore-eos); "
                                   "with --dataset sharegpt, 0 takes each conversation's own answer length")
    prefix_len = typer.Option(0, "--prefix-len", "--random-prefix-len",
                              help="Shared prefix tokens, at least 1 and under --input-len (--dataset prefix only)")
    concurrency = typer.Option(None, "--concurrency", help="Closed-loop levels, e.g. 1,8,16 (default 1)")
    request_rate = typer.Option(None, "--request-rate", help="Open loop: Poisson rates in req/s, e.g. 2,4")
    burstiness = typer.Option(1.0, "--burstiness", help="Open loop: gamma shape of the gaps between arrivals, "
                              "mean 1/rate, as vllm bench serve (1: Poisson; under 1 burstier, above more even)")
    ramp_up_strategy = typer.Option(None, "--ramp-up-strategy",
                                    help="linear | exponential: one open-loop level whose rate moves from "
                                         "--ramp-up-start-rps to --ramp-up-end-rps over --num-requests, as vllm "
                                         "bench serve")
    ramp_up_start_rps = typer.Option(None, "--ramp-up-start-rps", help="The ramp's first rate, req/s")
    ramp_up_end_rps = typer.Option(None, "--ramp-up-end-rps", help="The ramp's last rate, req/s")
    trace_speedup = typer.Option(1.0, "--trace-speedup", help="Trace replay: its gaps divided by this")
    trace_window = typer.Option(None, "--trace-window", help="Trace replay: START:END seconds of trace time "
                                "(from its first request; END may be left out)")
    multi_turn = typer.Option(False, "--multi-turn", help="--dataset sharegpt: whole conversations, each human "
                              "turn sent with the history so far (the model's own replies)")
    sessions = typer.Option(16, "--sessions", help="Multi-turn: conversations per level (closed loop: "
                            "--concurrency of them in flight; open loop: --request-rate starts per second)")
    turns = typer.Option(4, "--turns", help="--dataset conversation: turns per session")
    turn_input_len = typer.Option(128, "--turn-input-len", help="--dataset conversation: new tokens a turn")
    turn_output_len = typer.Option(64, "--turn-output-len", help="--dataset conversation: tokens a reply")
    think_time = typer.Option(0.0, "--think-time", help="Multi-turn: seconds between a reply and the next turn")
    max_concurrency = typer.Option(None, "--max-concurrency", help="Open loop: cap on requests in flight "
                                   "(needs --request-rate; a closed loop is --concurrency)")
    num_requests = typer.Option(None, "--num-requests", "--num-prompts",
                                help="Requests per level (default 64; with --duration: no count unless given)")
    duration = typer.Option(None, "--duration",
                            help="Seconds each level issues requests (--num-requests, if given, becomes a "
                                 "cap); requests still in flight get a grace of a quarter of it (at least "
                                 "10 s, at most --timeout) and are then cut (cut_off)")
    repeats = typer.Option(1, "--repeats", help="Repeats of the sweep, for confidence intervals (one repeat "
                                                "gives none)")
    warmup = typer.Option(4, "--warmup", "--num-warmups", help="Warm-up requests, excluded from statistics")
    seed = typer.Option(0, "--seed", help="Seed of the prompts, the arrivals and the bootstrap")
    tokenizer = typer.Option(None, "--tokenizer", help="Local HF tokenizer dir; default: server /tokenize")
    confidence = typer.Option(0.95, "--confidence", help="Confidence level of every interval, strictly "
                                                          "between 0.5 and 1")
    timeout = typer.Option(600.0, "--timeout", help="Per-request timeout, seconds (above 0)")
    ignore_eos = typer.Option(True, "--ignore-eos/--no-ignore-eos",
                              help="Force the output length with ignore_eos and min_tokens")
    stream = typer.Option(True, "--stream/--no-stream",
                          help="Stream the answers (--no-stream: one chunk each, so no TPOT or ITL)")
    out = typer.Option(None, "--out", "--result-dir", help="Write requests.jsonl and summary.json here")
    client_procs = typer.Option(0, "--client-procs",
                                help="Client processes per level (each its own event loop and connections; "
                                     "the records stay one stream); 0 picks one per 256 requests in flight, "
                                     "at most one per CPU")
    as_json = typer.Option(False, "--json", help="Print summary.json to stdout instead of the table")
    goodput = typer.Option(None, "--goodput",
                           help="SLO bounds in ms, as vllm bench serve spells them: --goodput ttft:500 "
                                "tpot:50 e2el:2000 (any of the three). Adds each level's goodput "
                                "(requests/s that met every bound) and attainment, and the sweep's "
                                "SLO capacity")
    slo_attainment = typer.Option(None, "--slo-attainment",
                                  help="The share of requests that must meet --goodput for a level to "
                                       "count toward the SLO capacity (default 0.9)")
    metrics_url = typer.Option(None, "--metrics-url",
                               help="The server's /metrics, read around each level: the embedded engine's "
                                    "prefill and decode step times (and their device time on a GPU); vLLM's "
                                    "TTFT, inter-token latency, TPOT, queue, prefill, decode and end-to-end "
                                    "times and tokens per engine step; SGLang's TTFT, inter-token latency, "
                                    "queue and end-to-end times only (summary.json: engine_steps, "
                                    "engine_server, engine_decode_step_ms)")
    otlp_receiver = typer.Option(None, "--otlp-receiver",
                                 help="HOST:PORT (e.g. 127.0.0.1:4318) to receive the server's request spans over "
                                      "OTLP/HTTP during each level; start the engine with --otlp-traces-endpoint "
                                      "http://HOST:PORT/v1/traces. Each record gets its TTFT in parts and its ITL "
                                      "outliers' causes (requests.jsonl: ttft_breakdown, itl_outliers; "
                                      "summary.json: server_spans)")
    telemetry = typer.Option(True, "--telemetry/--no-telemetry",
                             help="Sample the GPUs during each level (NVML, or --dcgm-url): utilization, "
                                  "SM clock, memory, power and energy per output token (summary.json: "
                                  "telemetry). Without a GPU it says so once and goes on")
    gpus = typer.Option(None, "--gpus",
                        help="GPUs to sample, as nvidia-smi numbers them, e.g. 0,1; default: those "
                             "CUDA_VISIBLE_DEVICES names, else every GPU (with --dcgm-url: every GPU the "
                             "exporter exports)")
    dcgm_url = typer.Option(None, "--dcgm-url",
                            help="A dcgm-exporter's /metrics, read each second instead of NVML (run the "
                                 "exporter with -c 1000 or less: it refreshes every 30 s by default)")


def command(
    base_url: str = Opt.base_url, host: str = Opt.host, port: int = Opt.port, model: str = Opt.model,
    api_key: str = Opt.api_key, endpoint: str = Opt.endpoint, backend: str = Opt.backend,
    dataset: str = Opt.dataset, dataset_path: str = Opt.dataset_path, input_len: int = Opt.input_len,
    output_len: int = Opt.output_len, prefix_len: int = Opt.prefix_len,
    concurrency: str = Opt.concurrency, request_rate: str = Opt.request_rate,
    burstiness: float = Opt.burstiness, ramp_up_strategy: str = Opt.ramp_up_strategy,
    ramp_up_start_rps: float = Opt.ramp_up_start_rps, ramp_up_end_rps: float = Opt.ramp_up_end_rps,
    trace_speedup: float = Opt.trace_speedup, trace_window: str = Opt.trace_window, multi_turn: bool = Opt.multi_turn,
    sessions: int = Opt.sessions, turns: int = Opt.turns, turn_input_len: int = Opt.turn_input_len,
    turn_output_len: int = Opt.turn_output_len, think_time: float = Opt.think_time,
    max_concurrency: int = Opt.max_concurrency, num_requests: int = Opt.num_requests,
    duration: float = Opt.duration, repeats: int = Opt.repeats, warmup: int = Opt.warmup, seed: int = Opt.seed,
    tokenizer: str = Opt.tokenizer, confidence: float = Opt.confidence, timeout: float = Opt.timeout,
    ignore_eos: bool = Opt.ignore_eos, stream: bool = Opt.stream,
    out: Path = Opt.out, client_procs: int = Opt.client_procs, as_json: bool = Opt.as_json,
    goodput: list[str] = Opt.goodput, slo_attainment: float = Opt.slo_attainment,
    metrics_url: str = Opt.metrics_url, otlp_receiver: str = Opt.otlp_receiver,
    telemetry: bool = Opt.telemetry, gpus: str = Opt.gpus, dcgm_url: str = Opt.dcgm_url,
) -> None:
    """Load an OpenAI-compatible server: closed-loop concurrency levels, open-loop rates (Poisson, bursty or
    ramped), a trace replayed on its own clock, or multi-turn sessions."""
    # Imported here: the load path pulls in scipy, which other commands need not pay for.
    from rooftop.bench.sweep import BenchConfig

    if base_url is None:
        if port is None:
            raise RooftopError("no server given", "pass --base-url http://HOST:PORT (or --host and --port)")
        base_url = f"http://{host}:{port}"
    chat = resolve_endpoint(endpoint, backend) == CHAT
    rates = _numbers(request_rate, "--request-rate", float, "2,4,8") or []
    open_loop = bool(rates or ramp_up_strategy or dataset in TRACE_DATASETS)
    # a trace bounds itself, and multi-turn sessions are counted by --sessions: neither takes the default count
    bounded = dataset in TRACE_DATASETS or dataset == "conversation" or multi_turn
    settings = BenchSettings(
        dataset=dataset, dataset_path=dataset_path, input_len=input_len, output_len=output_len,
        prefix_len=prefix_len, request_rate=rates, max_concurrency=max_concurrency,
        # an open loop has no closed-loop levels unless --concurrency names some (which is then refused)
        concurrency=_numbers(concurrency, "--concurrency", int, "1,8,16") or ([] if open_loop else [1]),
        num_requests=64 if num_requests is None and duration is None and not bounded else num_requests,
        duration_s=duration, repeats=repeats, warmup=warmup, seed=seed, tokenizer=tokenizer, confidence=confidence,
        timeout_s=timeout, force_length=ignore_eos, stream=stream, telemetry=telemetry,
        gpus=_numbers(gpus, "--gpus", int, "0,1"), dcgm_url=dcgm_url, client_procs=client_procs or None,
        burstiness=burstiness, ramp_up_strategy=ramp_up_strategy, ramp_up_start_rps=ramp_up_start_rps,
        ramp_up_end_rps=ramp_up_end_rps, trace_speedup=trace_speedup, trace_window_s=_window(trace_window),
        multi_turn=multi_turn, sessions=sessions, turns=turns, turn_input_len=turn_input_len,
        turn_output_len=turn_output_len, think_time_s=think_time, otlp_receiver=otlp_receiver,
    )
    settings.check()
    settings.check_dataset_file()
    cfg = BenchConfig.of(settings, base_url=base_url, model=model, chat=chat, api_key=api_key or None, out_dir=out,
                         metrics_url=metrics_url, slo=slo_from_flags(goodput, slo_attainment, stream))
    if backend == "sglang":
        Console(stderr=True).print(f"--backend sglang: loading {COMPLETIONS}, as vllm bench serve does "
                                   "(sglang.bench_serving would load SGLang's native /generate, which rooftop does "
                                   "not speak)", highlight=False, soft_wrap=True)
    outcome = run_with_progress(cfg)
    print_outcome(outcome.summary, as_json, out)
    if outcome.aborted:
        Console(stderr=True).print(f"[bold red]run stopped:[/] {outcome.aborted}; every request sent is recorded"
                                   + (f" in {out}" if out else ""), highlight=False)
        raise typer.Exit(1)


def _numbers(text: str | None, flag: str, kind: type, example: str) -> list | None:
    """A comma-separated flag's values, or None when it was not given. Their rules (a level of at least 1, a
    finite rate) are BenchSettings.check's: here only the spelling is checked."""
    if text is None:
        return None
    try:
        vals = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals:
        raise RooftopError(f"{flag} {text!r} is not a comma-separated list of "
                           f"{'integers' if kind is int else 'numbers'}", f"e.g. {flag} {example}")
    return vals


def _window(text: str | None) -> tuple[float, float] | None:
    """--trace-window START:END (END may be left out: to the trace's end) as (start, end) seconds; its rule
    (0 <= START < END) is BenchSettings.check's."""
    if text is None:
        return None
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return float(start or 0), float(end) if end.strip() else math.inf
    except ValueError:
        raise RooftopError(f"--trace-window {text!r} is not START:END in seconds of trace time",
                           "e.g. --trace-window 0:600, or 300: for everything from 300 s on") from None


def _ints(text: str, flag: str) -> list[int]:
    """Positive integers from a comma-separated flag (`rooftop calibrate --concurrency`, which has no bench
    settings to check them)."""
    vals = _numbers(text, flag, int, "1,8,16")
    if any(v < 1 for v in vals):
        raise RooftopError(f"{flag} {text!r} needs positive integers", f"e.g. {flag} 1,8,16")
    return vals


def slo_from_flags(goodput: list[str] | None, slo_attainment: float | None, stream: bool):
    """The SLO --goodput and --slo-attainment give, or None. --slo-attainment needs --goodput; a TPOT bound
    needs streamed answers (without them no token's time is known, so TPOT is undefined)."""
    from rooftop.bench.slo import DEFAULT_ATTAINMENT, parse_goodput

    if slo_attainment is not None and not goodput:
        raise RooftopError("--slo-attainment has no effect without --goodput",
                           "give the SLO's bounds too, e.g. --goodput ttft:500 --slo-attainment 0.9")
    if not stream and any(part.startswith("tpot:") for text in goodput or [] for part in
                          text.replace(",", " ").split()):
        raise RooftopError("--goodput tpot: cannot be judged with --no-stream: an answer that is not streamed "
                           "has no per-token times, so its TPOT is undefined",
                           "drop --no-stream, or bound ttft:/e2el: only")
    if not goodput:
        return None
    return parse_goodput(goodput, DEFAULT_ATTAINMENT if slo_attainment is None else slo_attainment)


def run_with_progress(cfg):
    """run_bench with a progress bar per level on stderr, and its notes printed there."""
    from rooftop.bench.sweep import run_bench

    console = Console(stderr=True)
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

        return asyncio.run(run_bench(cfg, on_level_start, on_done, on_note=on_note))


def print_outcome(summary: dict, as_json: bool, out: Path | None) -> None:
    """summary.json on stdout, or its table and notes, and where the files went."""
    from rooftop.bench.table import summary_notes, summary_table
    from rooftop.cli.tables import print_table, stdout_console

    if as_json:
        print(json.dumps(summary, indent=2))
        return
    out_console = stdout_console()
    print_table(out_console, summary_table(summary))
    for note in summary_notes(summary):
        out_console.print(f"• {note}", highlight=False)
    if out:
        out_console.print(f"records: {out / 'requests.jsonl'} · summary: {out / 'summary.json'}")
