"""Serve flags -> a built Engine: device, dtype, weights, and a KV cache sized for the context."""

import argparse
import contextlib
from dataclasses import dataclass, fields

import torch

from rooftop.engine.engine import Engine
from rooftop.engine.kv.block_manager import blocks_for
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.config import PRESETS, ModelConfig, count_params
from rooftop.engine.model.weights import load_model, random_model
from rooftop.engine.spec.config import SpecConfig, parse_spec_config
from rooftop.engine.spec.loop import SpeculativeEngine

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# without --num-blocks/--kv-cache-tokens: at most this much memory for the cache on a CPU
CPU_KV_BUDGET_BYTES = 512 << 20
# on a GPU, this fraction of the memory left after the weights (the rest for activations,
# which the capacity-bound indexer makes large)
GPU_KV_FRACTION = 0.5


@dataclass(slots=True)
class ServeConfig:
    """Everything `rooftop serve` / `python -m rooftop.engine` takes."""

    preset: str = "tiny"
    model: str | None = None  # dir with config.json + model.safetensors; overrides preset
    host: str = "127.0.0.1"
    port: int = 30000  # 0 = a free port, printed in the ready line
    context_length: int = 4096
    indexer_bound: str = "actual"
    max_running_requests: int = 64
    page_size: int = 64
    num_blocks: int | None = None
    kv_cache_tokens: int | None = None
    chunked_prefill_size: int = 512
    served_model_name: str | None = None  # default: the preset's name (or the model dir's name)
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    profile_dir: str | None = None
    role: str = "single"  # single | prefill | decode (PD: `rooftop router` sends to prefill, which hands off)
    kv_port: int = 0  # decode role: TCP port for KV pages (0 = a free one, in the ready line and /pd/info)
    cuda_graphs: bool = True  # capture decode steps on CUDA when the Triton kernels are there
    threads: int | None = None  # torch CPU threads; default 1 (the load generator shares the cores)
    # the step loop in a process of its own, apart from the HTTP front end: auto = on a GPU, single role
    engine_process: str = "auto"
    api_key: str | None = None  # the /v1 routes want Authorization: Bearer <key> (engine/auth.py)
    enable_prefix_caching: bool = True  # reuse cached full pages of a prompt's prefix (kv/block_manager.py)
    # OTLP/HTTP traces endpoint (e.g. http://127.0.0.1:4318/v1/traces): request and step spans (tracing.py)
    otlp_traces_endpoint: str | None = None
    # vLLM's JSON, e.g. '{"method": "ngram", "num_speculative_tokens": 3}' (spec/config.py); None: no speculation
    speculative_config: str | None = None

    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if self.model:
            return self.model.rstrip("/").rsplit("/", 1)[-1]
        return self.preset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine's flags (defaults from ServeConfig)."""
    d = ServeConfig()
    parser.add_argument("--preset", default=d.preset, choices=sorted(PRESETS))
    parser.add_argument("--model", default=None, help="dir with config.json + model.safetensors")
    parser.add_argument("--host", default=d.host)
    parser.add_argument("--port", type=int, default=d.port, help="0 = pick a free port")
    parser.add_argument("--context-length", type=int, default=d.context_length)
    parser.add_argument("--indexer-bound", default=d.indexer_bound, choices=["actual", "capacity"])
    parser.add_argument("--max-running-requests", type=int, default=d.max_running_requests)
    parser.add_argument("--page-size", type=int, default=d.page_size)
    parser.add_argument("--num-blocks", type=int, default=None)
    parser.add_argument("--kv-cache-tokens", type=int, default=None)
    parser.add_argument("--chunked-prefill-size", type=int, default=d.chunked_prefill_size)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--device", default=d.device, choices=["auto", "cpu", "cuda"])
    parser.add_argument("--dtype", default=d.dtype, choices=["auto", *DTYPES])
    parser.add_argument("--seed", type=int, default=d.seed, help="weights seed")
    parser.add_argument("--profile-dir", default=None)
    parser.add_argument("--role", default=d.role, choices=["single", "prefill", "decode"],
                        help="prefill/decode: a disaggregated worker behind `rooftop router`")
    parser.add_argument("--kv-port", type=int, default=d.kv_port,
                        help="decode role: TCP port that receives KV pages (0 = a free port, announced)")
    parser.add_argument("--cuda-graphs", default=d.cuda_graphs, action=argparse.BooleanOptionalAction,
                        help="replay decode steps and prefill chunks from CUDA graphs (CUDA + Triton only)")
    parser.add_argument("--threads", type=int, default=d.threads,
                        help="torch CPU threads (default 1: a benchmark client usually shares the cores)")
    parser.add_argument("--engine-process", default=d.engine_process, choices=["auto", "on", "off"],
                        help="run the step loop in a process of its own, apart from the HTTP front end "
                             "(auto: on a GPU, for the single role; PD workers keep it in the server process)")
    parser.add_argument("--enable-prefix-caching", default=d.enable_prefix_caching,
                        action=argparse.BooleanOptionalAction,
                        help="reuse the KV pages of a cached prompt prefix (full pages, hashed in a chain)")
    parser.add_argument("--api-key", default=None,
                        help="the OpenAI routes (/v1/...) want Authorization: Bearer KEY; health, metrics, "
                             "tokenize and the profiler stay open")
    parser.add_argument("--otlp-traces-endpoint", default=None,
                        help="send a span per request and per engine step to this OTLP/HTTP endpoint "
                             "(e.g. http://127.0.0.1:4318/v1/traces), as vLLM's flag of that name")
    parser.add_argument("--speculative-config", default=None,
                        help='speculative decoding, as vLLM\'s flag: JSON such as \'{"method": "ngram", '
                             '"num_speculative_tokens": 3, "prompt_lookup_max": 4}\' or \'{"method": "mtp", '
                             '"num_speculative_tokens": 1}\' (the model\'s MTP module)')


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    return ServeConfig(**{f.name: getattr(args, f.name) for f in fields(ServeConfig)})


def check(cfg: ServeConfig) -> None:
    """Refuse flag values that cannot work, with the reason (ValueError)."""
    for name in ("context_length", "max_running_requests", "page_size", "chunked_prefill_size"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, not {getattr(cfg, name)}")
    if cfg.role not in ("single", "prefill", "decode"):
        raise ValueError(f"--role {cfg.role}: use single, prefill or decode")
    if not 0 <= cfg.kv_port < 65536:
        raise ValueError(f"--kv-port {cfg.kv_port} is not a TCP port (0 = a free one)")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible to torch")
    if cfg.num_blocks is not None and cfg.kv_cache_tokens is not None:
        raise ValueError("give --num-blocks or --kv-cache-tokens, not both")
    if cfg.otlp_traces_endpoint is not None and not cfg.otlp_traces_endpoint.startswith(("http://", "https://")):
        raise ValueError(f"--otlp-traces-endpoint {cfg.otlp_traces_endpoint!r}: give an http:// URL, "
                         "e.g. http://127.0.0.1:4318/v1/traces (OTLP over HTTP; gRPC is not spoken here)")
    if cfg.engine_process not in ("auto", "on", "off"):
        raise ValueError(f"--engine-process {cfg.engine_process}: use auto, on or off")
    spec_config(cfg)
    if cfg.engine_process == "on" and cfg.role != "single":
        raise ValueError(f"--engine-process on is for the single role: a {cfg.role} worker reads and writes the "
                         "engine's KV pages from its server, so its engine stays in that process (use auto or off)")


def spec_config(cfg: ServeConfig, model: ModelConfig | None = None) -> SpecConfig | None:
    """The parsed --speculative-config, refused where this engine does not speculate (ValueError). model: the
    served model's config (default: the preset's, or --model's config.json where it can be read)."""
    if cfg.speculative_config is None:
        return None
    spec = parse_spec_config(cfg.speculative_config)
    if model is None and cfg.model is None:
        model = ModelConfig.preset(cfg.preset) if cfg.preset in PRESETS else None
    elif model is None:
        with contextlib.suppress(OSError, ValueError, TypeError):  # load_model says what is wrong with it
            model = ModelConfig.from_json(cfg.model)
    if spec.method == "mtp" and model is not None and not model.num_nextn_predict_layers:
        raise ValueError(f"--speculative-config method mtp: the model {cfg.model or cfg.preset} has no MTP module "
                         "(num_nextn_predict_layers is 0 in its config.json); use method ngram, or a model with "
                         "one (the tiny and small presets have one)")
    if cfg.role == "prefill":
        raise ValueError("--speculative-config on a prefill worker: it makes one token a request, so there is "
                         "nothing to speculate; give the flag to the decode worker")
    if cfg.role == "decode" and spec.method == "mtp":
        raise ValueError("--speculative-config method mtp on a decode worker: the prefill worker sends no MTP "
                         "rows for the prompt; use method ngram there, or serve with --role single")
    return spec


def engine_in_own_process(cfg: ServeConfig) -> bool:
    """Whether the server runs the step loop in a child process (--engine-process, auto resolved)."""
    if cfg.engine_process != "auto":
        return cfg.engine_process == "on"
    return cfg.role == "single" and resolve_device(cfg.device).type == "cuda"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_engine(cfg: ServeConfig, log=print) -> Engine:
    """Load or draw the weights, size and allocate the KV cache, and return an Engine (not started)."""
    check(cfg)
    device = resolve_device(cfg.device)
    if device.type == "cpu":
        torch.set_num_threads(cfg.threads or 1)
    dtype = DTYPES[cfg.dtype] if cfg.dtype != "auto" else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if cfg.model:
        model = load_model(cfg.model, device=device, dtype=dtype)
    else:
        model = random_model(ModelConfig.preset(cfg.preset), seed=cfg.seed, device=device, dtype=dtype)
    mc = model.config
    if cfg.context_length > mc.max_position_embeddings:
        raise ValueError(f"--context-length {cfg.context_length} exceeds the model's "
                         f"max_position_embeddings {mc.max_position_embeddings}")
    n = count_params(mc)
    log(f"model {cfg.model or cfg.preset}: {n.total:,} parameters ({n.active_per_token:,} active per token, "
        f"{n.mtp:,} more in MTP), {dtype} on {device}")
    spec = spec_config(cfg, mc)
    # the MTP module's KV rows: one cache layer past the model's
    num_layers = mc.num_hidden_layers + (1 if spec is not None and spec.method == "mtp" else 0)
    num_blocks = _num_blocks(cfg, mc, dtype, device, num_layers)
    cache = KVCache(mc, num_blocks, cfg.page_size, dtype=dtype, device=device, num_layers=num_layers)
    log(f"KV cache: {num_blocks} pages x {cfg.page_size} tokens = {cache.num_tokens} tokens, "
        f"{cache.nbytes / 2**20:.1f} MiB; context {cfg.context_length}, indexer bound {cfg.indexer_bound}, "
        f"prefix caching {'on' if cfg.enable_prefix_caching else 'off'}")
    args = (model, cache, cfg.context_length, cfg.indexer_bound, cfg.max_running_requests, cfg.chunked_prefill_size)
    options = {"cuda_graphs": cfg.cuda_graphs, "enable_prefix_caching": cfg.enable_prefix_caching}
    if spec is None:
        engine = Engine(*args, **options)
    else:
        engine = SpeculativeEngine(*args, **options, speculative=spec)
        log(f"speculative decoding: {spec.method}, {spec.num_speculative_tokens} tokens a step (steps run "
            "synchronously)")
    engine.trace_steps = cfg.otlp_traces_endpoint is not None
    return engine


def _num_blocks(cfg: ServeConfig, mc: ModelConfig, dtype: torch.dtype, device: torch.device, num_layers: int) -> int:
    one_context = blocks_for(cfg.context_length, cfg.page_size)
    if cfg.num_blocks is not None:
        return cfg.num_blocks
    if cfg.kv_cache_tokens is not None:
        return blocks_for(cfg.kv_cache_tokens, cfg.page_size)
    if device.type == "cuda":
        free_bytes, _ = torch.cuda.mem_get_info(device)
        budget = int(free_bytes * GPU_KV_FRACTION)
    else:
        budget = CPU_KV_BUDGET_BYTES
    fit = KVCache.blocks_for_bytes(mc, cfg.page_size, dtype, budget, num_layers)
    # no more than every running request at full context needs, and at least one whole context;
    # one more on CUDA for the decode graphs' padding block
    spare = 1 if device.type == "cuda" else 0
    return max(one_context, min(fit, one_context * cfg.max_running_requests)) + spare
