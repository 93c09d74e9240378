"""What `--backend` and `--endpoint` mean: the backend names of `vllm bench serve` and SGLang's
`bench_serving`, the API each loads, and the ones rooftop's load generator does not speak."""

from __future__ import annotations

from rooftop.errors import RooftopError

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"

# `--backend` as `vllm bench serve` (vllm/benchmarks/lib/endpoint_request_func.py; before it,
# benchmarks/backend_request_func.py) and SGLang's `python -m sglang.bench_serving` take it, and the API each
# name loads. The two tools agree on every name but `sglang`: vLLM loads /v1/completions with it, SGLang its
# native /generate. rooftop follows vLLM there (an SGLang server serves both) and says so on stderr.
BACKENDS = {
    "openai": COMPLETIONS, "vllm": COMPLETIONS, "sglang": COMPLETIONS, "sglang-oai": COMPLETIONS,
    "lmdeploy": COMPLETIONS, "scalellm": COMPLETIONS, "llama.cpp": COMPLETIONS,
    "openai-chat": CHAT, "vllm-chat": CHAT, "sglang-oai-chat": CHAT, "lmdeploy-chat": CHAT,
}
_TRT = ("is Triton's TensorRT-LLM /v2/models/ensemble/generate_stream, which rooftop does not speak",
        "serve the engine with trtllm-serve (OpenAI API) and use --backend openai")
_POOLING = ("loads a pooling model (embeddings, scores), which generates no tokens: rooftop bench measures "
            "generation (TTFT, inter-token latency)", "load pooling models with vllm bench serve")
# The names those tools take for an API rooftop's load generator does not speak: (what it is, what to do).
NOT_SPOKEN = {
    "sglang-native": ("is SGLang's native /generate API, which rooftop does not speak",
                      "SGLang serves the same engine at /v1/completions: use --backend sglang-oai"),
    "tgi": ("is TGI's /generate_stream API, which rooftop does not speak",
            "TGI serves OpenAI chat at /v1/chat/completions: use --backend openai-chat"),
    "tensorrt-llm": _TRT, "trt": _TRT,
    "deepspeed-mii": ("is DeepSpeed-MII's own request format, which rooftop does not speak",
                      "bench an OpenAI-compatible server with --backend openai"),
    "truss": ("is Baseten Truss's /v1/models/model:predict, which rooftop does not speak",
              "bench an OpenAI-compatible server with --backend openai"),
    "gserver": ("is a placeholder that sglang.bench_serving itself does not implement",
                "use --backend openai or openai-chat"),
    "openai-audio": ("loads speech transcription (/v1/audio/transcriptions): rooftop bench loads text generation",
                     "load audio models with vllm bench serve"),
    **{name: _POOLING for name in (
        "openai-embeddings", "openai-embeddings-chat", "openai-embeddings-clip", "openai-embeddings-vlm2vec",
        "infinity-embeddings", "infinity-embeddings-clip", "vllm-pooling", "vllm-rerank")},
}
ENDPOINTS = {"completions": COMPLETIONS, COMPLETIONS: COMPLETIONS,
             "chat": CHAT, "chat-completions": CHAT, CHAT: CHAT}


def resolve_endpoint(endpoint: str | None, backend: str | None) -> str:
    """The API path to load, from --endpoint and --backend (either, both when they agree, or neither)."""
    path = None
    if backend is not None:
        if backend in NOT_SPOKEN:
            what, fix = NOT_SPOKEN[backend]
            raise RooftopError(f"--backend {backend} {what}", fix)
        if backend not in BACKENDS:
            raise RooftopError(f"unknown --backend {backend!r}", f"use one of {', '.join(BACKENDS)}")
        path = BACKENDS[backend]
    if endpoint is not None:
        if endpoint not in ENDPOINTS:
            hint = f"; {endpoint} is a backend name: --backend {endpoint}" if endpoint in BACKENDS else ""
            raise RooftopError(f"unknown --endpoint {endpoint!r}",
                               f"use completions ({COMPLETIONS}) or chat ({CHAT}){hint}")
        if path is not None and ENDPOINTS[endpoint] != path:
            raise RooftopError(f"--backend {backend} loads {path} but --endpoint {endpoint} asks for "
                               f"{ENDPOINTS[endpoint]}", "pass one of the two")
        path = ENDPOINTS[endpoint]
    return path or COMPLETIONS
