"""Which GPUs a sweep's telemetry samples (pure): the deployment's own, on this machine.

NVML reads this machine's GPUs. A worker on another host runs on that host's GPUs, so its indexes
say nothing here; a worker that names no GPUs runs on the first ones its engine sees; a worker on
the CPU runs on none. Sampling every GPU of the host instead would average idle GPUs in and sum their
power into joules per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from rooftop.campaign.layout import PP_KEYS, TP_KEYS, size_arg


@dataclass(frozen=True)
class GpuScope:
    """gpus: the NVML indexes to sample (None: let the sampler take what CUDA_VISIBLE_DEVICES names, or
    all); off: no telemetry, and `note` says why; note otherwise says what was assumed, or None."""
    gpus: list[int] | None
    off: bool = False
    note: str | None = None


def telemetry_scope(engine: str, workers: list[dict], dcgm_url: str | None = None,
                    visible: str | None = None, on_cpu: bool = False) -> GpuScope:
    """The GPUs to sample for a deployment's `workers`: dicts with role, gpus (list), machine (None
    here), args (the role's engine args) and env. `visible` is this machine's CUDA_VISIBLE_DEVICES;
    `on_cpu`: the campaign's hardware is the CPU. With `dcgm_url` the user named the exporter: the
    workers' GPU indexes are read there."""
    serving = [w for w in workers if w["role"] != "router"]
    if on_cpu and not any(w["gpus"] for w in serving):
        return GpuScope([], off=True, note='GPU telemetry is off: the deployment runs on the CPU ([hardware] gpu = "cpu")')
    if dcgm_url:
        named = sorted({g for w in serving for g in w["gpus"]})
        hosts = sorted({w["machine"] or "this machine" for w in serving})
        note = (f"the workers run on {', '.join(hosts)}: one DCGM exporter ({dcgm_url}) is read for all of them"
                if len(hosts) > 1 else None)
        return GpuScope(named or None, note=note)
    local = [w for w in serving if w["machine"] is None]
    remote = sorted({w["machine"] for w in serving if w["machine"] is not None})
    if not local:
        return GpuScope([], off=True, note=(
            f"GPU telemetry is off: the workers run on {', '.join(remote)}, and NVML reads only this "
            "machine's GPUs; set [bench] dcgm_url to an exporter on that host"))
    gpus: set[int] = set()
    assumed: list[str] = []
    for w in local:
        if w["gpus"]:
            gpus.update(w["gpus"])
            continue
        count = _gpus_used(engine, w["args"])
        if count == 0:
            continue
        seen = _visible(w["env"].get("CUDA_VISIBLE_DEVICES", visible))
        picked = seen[:count] if seen is not None else list(range(count))
        gpus.update(picked)
        assumed.append(f"{w['role']} names no gpus: GPU {', '.join(map(str, picked))} assumed")
    notes = assumed[:]
    if remote:
        notes.append(f"the workers on {', '.join(remote)} are not sampled (NVML reads this machine only)")
    if not gpus:
        return GpuScope([], off=True, note="GPU telemetry is off: the deployment runs on the CPU")
    return GpuScope(sorted(gpus), note="; ".join(notes) or None)


def _gpus_used(engine: str, args: dict) -> int:
    """How many GPUs a worker that names none runs on: 0 on the CPU (the embedded engine's --device cpu,
    vLLM's or SGLang's --device cpu), else its tensor x pipeline parallel size."""
    device = str(args.get("device", "")).lower()
    if device == "cpu":
        return 0
    if engine == "embedded":
        return 1
    return size_arg(args, TP_KEYS) * size_arg(args, PP_KEYS)


def _visible(value: str | None) -> list[int] | None:
    """CUDA_VISIBLE_DEVICES as NVML indexes; None when unset or not plain indexes (UUIDs)."""
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        return None
    return [int(p) for p in parts]

