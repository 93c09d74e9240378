"""The deployment an eager map is taken on, and what makes two maps the same (pure functions).

SGLang and vLLM serve compiled steps (CUDA graphs, torch.compile) whose kernels carry no module
frames; the profile attributes them through a trace of the same model run eagerly (the map). That
map is a second bring-up of the deployment, without graphs or compilation. It is taken after the
compiled deployment is torn down (both would not fit the same GPUs: each vLLM claims 90% of their
memory), on free ports, and for a pd deployment on one single server built from the decode worker:
the map's steps cover prefills and decodes of the model, and the profile picks, for each worker's
steps, the map steps whose kernels match them.
"""

from __future__ import annotations

import json

from rooftop.spec.deployment import DeploymentSpec

# Engine args that change the model's graph, hence its kernels and modules: a lever setting one
# gets its own map; any other arg (batch caps, scheduling, ports) shares its base's.
GRAPH_ARGS = frozenset({
    "tensor-parallel-size", "tp", "tp-size", "pipeline-parallel-size", "pp", "pp-size",
    "data-parallel-size", "dp", "dp-size", "enable-expert-parallel", "ep-size", "expert-parallel-size",
    "quantization", "dtype", "kv-cache-dtype", "speculative-config", "speculative-algorithm",
    "speculative-draft-model-path", "speculative-num-steps", "attention-backend", "mla-disable",
    "moe-runner-backend", "moe-a2a-backend", "enable-dp-attention", "hf-overrides", "load-format",
    "max-model-len", "context-length",
})

# Args that only a prefill/decode pair takes (the KV hand-off): left out of the map's single server.
PD_ONLY_ARGS = ("kv-transfer-config", "disaggregation-")


def map_key(dep: DeploymentSpec, variant: str | None = None, role: str | None = None) -> str:
    """What the campaign stores a map under: engine, model, interpreter and the args that shape the
    graph (`variant` and `role` too where the map is the same server profiled eagerly)."""
    graph = {k: v for k, v in sorted(_args(dep).items()) if k in GRAPH_ARGS}
    key = f"{dep.engine}|{dep.model}|{dep.python or ''}"
    if graph:
        key += "|" + json.dumps(graph, sort_keys=True, separators=(",", ":"), default=str)
    if variant is not None:
        key += f"|{variant}|{role}"
    return key


def map_deployment(dep: DeploymentSpec) -> DeploymentSpec:
    """`dep` as one single server on free ports: for pd, the decode worker's placement and args without
    the KV hand-off's. The engine's eager_variant then turns graphs and compilation off."""
    out = dep.model_copy(deep=True)
    if dep.topology == "pd":
        decode = out.decode.model_copy(deep=True)
        decode.args = {k: v for k, v in decode.args.items() if not _pd_only(k)}
        out = out.model_copy(update={"topology": "single", "single": decode, "prefill": None, "decode": None,
                                     "router": None,
                                     "args": {k: v for k, v in out.args.items() if not _pd_only(k)}})
        out = DeploymentSpec.model_validate(out.model_dump(mode="python"))
    for role in out.roles().values():
        role.port = 0  # a free port at launch: nothing left of the compiled deployment answers there
    return out


def _args(dep: DeploymentSpec) -> dict:
    """The args the map's server runs with: the deployment's, overlaid by its serving worker's."""
    name = "decode" if dep.topology == "pd" else "single"
    return {k: v for k, v in dep.role_args(name).items() if not _pd_only(k)}


def _pd_only(key: str) -> bool:
    return key == PD_ONLY_ARGS[0] or key.startswith(PD_ONLY_ARGS[1])
