"""rooftop's own engine: `python -m rooftop.engine` per server, `rooftop router` in front of a pd pair.

Flags follow the embedded-engine contract (--preset/--model, --host, --port, --role, --profile-dir, ...);
spec `args` become `--key value`. Profiling is controlled by --profile-dir, not an environment variable.
"""

import sys
from pathlib import Path

from rooftop.adapters.common import (
    gpu_env,
    module_importable,
    role_url,
    router_process,
    server_endpoints,
    trace_dir,
    with_traces_arg,
    worker_process,
)
from rooftop.adapters.flags import engine_argv, prefix_caching_argv, speculative_argv, speculative_json
from rooftop.adapters.protocol import Endpoints
from rooftop.errors import RooftopError
from rooftop.launch.supervisor import ProcessSpec
from rooftop.spec.deployment import DeploymentSpec
from rooftop.spec.speculative import Speculative

NAME = "embedded"
PRESETS = ("tiny", "small")
DEFAULT_PORTS = {"single": 30000, "router": 30000, "prefill": 30001, "decode": 30002}
EAGER_PROFILE = {"eager": True}  # the same server profiles eagerly: no second deployment for the map
PROFILE_DIR_ENV = None
# The deployment's prefix_caching, as the engine spells it (vLLM's spelling; on by default)
PREFIX_CACHING = {True: ["--enable-prefix-caching"], False: ["--no-enable-prefix-caching"]}
# The deployment's speculative: vLLM's --speculative-config JSON, which the engine reads (engine/spec/config.py:
# methods ngram and mtp, keys method, num_speculative_tokens, prompt_lookup_min/max)
SPECULATIVE_FLAGS = ("speculative-config",)
SPECULATIVE_METHODS = ("ngram", "mtp")


def installed(python: str | None = None, topology: str = "single") -> bool:
    """Whether the embedded engine package is importable (it ships with rooftop)."""
    return module_importable("rooftop.engine", python)


def install_hint() -> str:
    return "it ships with rooftop: pip install -e . in the rooftop checkout"


def model_argv(model: str | None) -> list[str]:
    """--preset NAME for a preset, --model PATH for a directory; the tiny preset when none is given."""
    model = model or "tiny"
    return ["--preset", model] if model in PRESETS else ["--model", model]


def process_specs(spec: DeploymentSpec, run_dir: Path) -> list[ProcessSpec]:
    """One engine process per worker role, plus `rooftop router` for pd. Ports must be resolved."""
    python = spec.python or sys.executable
    roles = spec.roles()
    procs: list[ProcessSpec] = []
    for name, role in roles.items():
        if name == "router":
            continue
        if len(role.nodes) > 1:
            raise RooftopError(f"deployment.{name}.nodes: the embedded engine runs each role as one process on one "
                               "host", f"give {name} one `host`; put prefill and decode on different hosts instead")
        args = spec.role_args(name)
        argv = [python, "-m", "rooftop.engine", *model_argv(spec.model), "--host", role.host, "--port", str(role.port)]
        if name != "single":
            argv += ["--role", name]
        if "profile-dir" not in args:
            argv += ["--profile-dir", trace_dir(run_dir, name)]
        argv += engine_argv(NAME, args)  # cuda-graphs = false -> --no-cuda-graphs
        argv += prefix_caching_argv(spec, name, PREFIX_CACHING)
        if name != "prefill":  # a prefill worker makes one token a request: nothing to speculate (it refuses the flag)
            argv += speculative_argv(spec, name, SPECULATIVE_FLAGS, lambda s: speculative_flags(s, spec.topology))
        procs.append(worker_process(name, role, argv, {**gpu_env(role.gpus), **spec.role_env(name)}))
    if spec.topology == "pd":
        command = [sys.executable, "-m", "rooftop", "router",
                   "--prefill", role_url(roles["prefill"]), "--decode", role_url(roles["decode"])]
        key = spec.args.get("api-key")
        if key and "api-key" not in roles["router"].args:  # the workers got it with the deployment's args:
            command += ["--api-key", str(key)]  # the router wants it of clients and sends it on
        procs.append(router_process(spec, roles["router"], command))
    return procs


def speculative_flags(s: Speculative, topology: str = "single") -> list[str]:
    """A deployment's `speculative` as the engine's flag; RooftopError for what it does not draft with."""
    if s.method not in SPECULATIVE_METHODS:
        raise RooftopError(f"embedded: speculative method {s.method!r}: the embedded engine drafts with ngram (prompt "
                           "lookup) or mtp (its model's MTP module) only",
                           "use method \"ngram\" or \"mtp\", or serve with vLLM or SGLang for an EAGLE draft")
    if s.model:
        raise RooftopError("embedded: speculative.model: the embedded engine loads no separate draft (mtp is the "
                           "model's own module)", "drop model from speculative")
    if s.method == "mtp" and topology == "pd":
        raise RooftopError("embedded: speculative method \"mtp\" in a pd deployment: the prefill worker sends the "
                           "decode worker no MTP state, so the decode worker refuses it",
                           "use method \"ngram\" for pd, or mtp on topology \"single\"")
    return ["--speculative-config", speculative_json(s)]


def endpoints(url: str, role: str = "single") -> Endpoints:
    """The embedded server's and router's endpoints (the router has no profiler of its own)."""
    return server_endpoints(url, role, profile_dir_env=None)


def with_traces(spec: DeploymentSpec, endpoint: str) -> DeploymentSpec:
    """`spec` whose workers export their request and step spans to `endpoint` (OTLP/HTTP protobuf, every
    0.2 s: engine/tracing.py); the router makes none of its own."""
    return with_traces_arg(spec, endpoint)


def eager_variant(spec: DeploymentSpec) -> DeploymentSpec | None:
    """None: the same server profiles eagerly on request (EAGER_PROFILE), no second deployment."""
    return None


def preset_config(name: str) -> dict | None:
    """The HF-style config.json of an embedded preset (the roofline's model), None for another model. The
    one place rooftop outside the engine reads its code: its config dataclasses, pure data (no torch)."""
    from rooftop.engine.model.config import PRESETS, ModelConfig

    return ModelConfig.preset(name).to_dict() if name in PRESETS else None
