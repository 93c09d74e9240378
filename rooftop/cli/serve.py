"""`rooftop serve`: the embedded engine's OpenAI-compatible server (same flags as `python -m rooftop.engine`)."""

from typing import Annotated

import typer

from rooftop.errors import RooftopError


def command(
    preset: Annotated[str, typer.Option("--preset", help="tiny (CPU tests) or small (one GPU)")] = "tiny",
    model: Annotated[str | None, typer.Option("--model", help="dir with config.json + model.safetensors")] = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="0 = pick a free port (printed when ready)")] = 30000,
    context_length: Annotated[int, typer.Option("--context-length")] = 4096,
    indexer_bound: Annotated[str, typer.Option("--indexer-bound", help="actual or capacity")] = "actual",
    max_running_requests: Annotated[int, typer.Option("--max-running-requests")] = 64,
    page_size: Annotated[int, typer.Option("--page-size", help="tokens per KV-cache page")] = 64,
    num_blocks: Annotated[int | None, typer.Option("--num-blocks", help="KV-cache pages")] = None,
    kv_cache_tokens: Annotated[int | None, typer.Option("--kv-cache-tokens", help="KV-cache size in tokens")] = None,
    chunked_prefill_size: Annotated[int, typer.Option("--chunked-prefill-size")] = 512,
    served_model_name: Annotated[str | None, typer.Option("--served-model-name")] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda")] = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="auto, float32, bfloat16 or float16")] = "auto",
    seed: Annotated[int, typer.Option("--seed", help="weights seed")] = 0,
    profile_dir: Annotated[str | None, typer.Option("--profile-dir", help="where /stop_profile writes")] = None,
    role: Annotated[str, typer.Option("--role", help="single, or prefill/decode behind `rooftop router`")] = "single",
    kv_port: Annotated[int, typer.Option("--kv-port", help="decode role: KV port (0 = a free one, announced)")] = 0,
    cuda_graphs: Annotated[bool, typer.Option(
        "--cuda-graphs/--no-cuda-graphs", help="capture decode steps and prefill chunks in CUDA graphs (CUDA + Triton only)",
    )] = True,
    enable_prefix_caching: Annotated[bool, typer.Option(
        "--enable-prefix-caching/--no-enable-prefix-caching",
        help="reuse the KV pages of a prompt prefix seen before (full pages, hashed in a chain)")] = True,
    threads: Annotated[int | None, typer.Option(
        "--threads", help="torch CPU threads (default 1: a benchmark client usually shares the cores)")] = None,
    engine_process: Annotated[str, typer.Option(
        "--engine-process", help="the step loop in a process of its own: auto (on a GPU, single role), on, off",
    )] = "auto",
    api_key: Annotated[str | None, typer.Option(
        "--api-key", help="the OpenAI routes (/v1/...) want Authorization: Bearer KEY")] = None,
    otlp_traces_endpoint: Annotated[str | None, typer.Option(
        "--otlp-traces-endpoint",
        help="send request and step spans over OTLP/HTTP, e.g. http://127.0.0.1:4318/v1/traces")] = None,
    speculative_config: Annotated[str | None, typer.Option(
        "--speculative-config",
        help='speculative decoding, as vLLM\'s flag: JSON such as \'{"method": "ngram", "num_speculative_tokens": 3}\' '
             'or \'{"method": "mtp", "num_speculative_tokens": 1}\'')] = None,
) -> None:
    """Serve the embedded DeepSeek-style engine on 127.0.0.1 until Ctrl-C."""
    for flag, value, allowed in (("--indexer-bound", indexer_bound, ("actual", "capacity")),
                                 ("--device", device, ("auto", "cpu", "cuda")),
                                 ("--dtype", dtype, ("auto", "float32", "bfloat16", "float16")),
                                 ("--role", role, ("single", "prefill", "decode")),
                                 ("--engine-process", engine_process, ("auto", "on", "off"))):
        if value not in allowed:
            raise RooftopError(f"{flag} {value!r} is not one of {', '.join(allowed)}", "pick one of those")
    from rooftop.engine.build import ServeConfig  # torch loads only when serving
    from rooftop.engine.model.config import PRESETS
    from rooftop.engine.server import serve

    if preset not in PRESETS:
        raise RooftopError(f"--preset {preset!r} is not known", f"use one of {', '.join(PRESETS)}")
    cfg = ServeConfig(preset=preset, model=model, host=host, port=port, context_length=context_length,
                      indexer_bound=indexer_bound, max_running_requests=max_running_requests, page_size=page_size,
                      num_blocks=num_blocks, kv_cache_tokens=kv_cache_tokens,
                      chunked_prefill_size=chunked_prefill_size, served_model_name=served_model_name,
                      device=device, dtype=dtype, seed=seed, profile_dir=profile_dir, role=role,
                      kv_port=kv_port, cuda_graphs=cuda_graphs, enable_prefix_caching=enable_prefix_caching, threads=threads, engine_process=engine_process,
                      api_key=api_key, otlp_traces_endpoint=otlp_traces_endpoint,
                      speculative_config=speculative_config)
    try:
        code = serve(cfg)
    except (ValueError, OSError) as exc:
        raise RooftopError(f"rooftop serve: {exc}", "check the flags (rooftop serve --help)") from None
    if code:
        raise typer.Exit(code)
