"""SUMMARY.md's Stack and placement sections: the inventory a reader checks at a glance (engine and
version, model, torch, key packages, hardware, CPUs per role) and each process's verified CPUs. The raw
inventory and placement of every bring-up stay whole in results.json."""

from __future__ import annotations

from rooftop.campaign.evidence import Evidence
from rooftop.campaign.store import DeploymentRow, RunRow
from rooftop.report import fmt

# Values past this many characters are cut (results.json keeps them whole): some images set a variable
# to a kilobyte of driver constraints.
MAX_VALUE_CHARS = 80
# The packages the Stack names besides the engine and torch (the inventory's KEY_PACKAGES, in this order).
SHOWN_PACKAGES = ("sglang", "sglang-router", "sgl-kernel", "vllm", "flashinfer-python", "triton", "transformers",
                  "nvidia-nccl-cu12", "nvidia-nccl-cu13", "nixl", "mooncake-transfer-engine", "deep-gemm",
                  "safetensors", "rooftop")
ENGINE_PACKAGES = {"vllm": "vllm", "sglang": "sglang", "embedded": "rooftop"}


def short(value) -> str:
    """A value as text, cut past MAX_VALUE_CHARS with its length said."""
    text = str(value)
    if len(text) <= MAX_VALUE_CHARS:
        return text
    return f"{text[:60]}… ({len(text)} characters; whole in results.json)"


def version_text(info: dict) -> str:
    """'0.32.0+cpu', '0.1.0 at 223fb9c (uncommitted changes)', or '' without a version or commit."""
    out = info.get("version") or ""
    if info.get("commit"):
        out += f" at {info['commit'][:7]}" + (" (uncommitted changes)" if info.get("dirty") else "")
    return out.strip()


def _dict(value) -> dict:
    """An inventory field as a dict ({} where a store written by an older rooftop holds something else)."""
    return value if isinstance(value, dict) else {}


def engine_line(inv: dict, engine: str) -> str:
    info = inv.get("engine") or {}
    if isinstance(info, str):  # older stores: "embedded 0.1.0"
        return info
    return f"{info.get('name') or engine} {version_text(info)}".strip()


def torch_line(inv: dict) -> str:
    t, py = inv.get("torch") or {}, _dict(inv.get("python"))
    t = {"version": t} if isinstance(t, str) else t
    if not t.get("version"):
        return "not installed in the engine's environment"
    build = f"CUDA {t['cuda']}" if t.get("cuda") else "no CUDA"
    where = f"; Python {py['python']} (`{py['executable']}`)" if py.get("python") and py.get("executable") else ""
    return f"{t['version']} ({build}){where}"


def packages_line(inv: dict, engine: str) -> str:
    pkgs = {k: v for k, v in _dict(inv.get("packages")).items() if isinstance(v, dict)}
    skip = {ENGINE_PACKAGES.get(engine, engine), "torch"} - ({"rooftop"} if engine != "embedded" else set())
    shown = [f"{name} {version_text(pkgs[name])}" for name in SHOWN_PACKAGES if name in pkgs and name not in skip]
    return ", ".join(shown) or "none of the key packages found"


def hardware_line(inv: dict) -> str:
    host, numa = _dict(inv.get("host")), [n for n in inv.get("numa") or [] if isinstance(n, dict)]
    gpus = [g for g in inv.get("gpus") or [] if isinstance(g, dict)]
    if gpus:
        names: dict[str, int] = {}
        for g in gpus:
            label = g.get("name") or "GPU"
            if g.get("memory_total_mib"):
                label += f" ({g['memory_total_mib'] / 1024:.0f} GiB)"
            names[label] = names.get(label, 0) + 1
        gpu = ", ".join(f"{n}× {label}" for label, n in names.items())
        driver = _dict(inv.get("driver"))
        if driver.get("driver_version"):
            gpu += f", driver {driver['driver_version']}" + (f" (CUDA {driver['cuda_driver_version']})"
                                                              if driver.get("cuda_driver_version") else "")
    else:
        gpu = "no GPU"
    cpus = f"{host.get('cpu_count', '?')} CPUs ({host.get('cpu_model') or 'model unknown'}, online {host.get('cpus_online', '?')})"
    nodes = f"{len(numa)} NUMA node{'s' if len(numa) != 1 else ''}" if numa else "NUMA layout unknown"
    kernel = f"; Linux {host['kernel']}" if host.get("kernel") else ""
    return f"{gpu}; {cpus}, {nodes}{kernel}"


def role_cpus(d: DeploymentRow) -> str:
    """'prefill 0 (pinned), decode 1 (pinned), router 0-1' from a bring-up's verified placement; GPUs and
    hosts where the inventory has them."""
    gpus = {p.get("name"): p.get("gpus") for p in (_dict(d.inventory).get("processes") or []) if isinstance(p, dict)}
    out = []
    for p in (p for p in d.placement if isinstance(p, dict)):
        text = f"{p.get('role') or p.get('name')} {p.get('cpus_allowed') or '?'}"
        if p.get("expected_cpus"):
            text += " (pinned)"
        if gpus.get(p.get("name")):
            text += f", GPUs {','.join(map(str, gpus[p.get('name')]))}"
        if p.get("host"):
            text += f" on {p['host']}"
        out.append(text)
    return ", ".join(out) or "no placement recorded"


def env_line(env: dict) -> str:
    """The engine's environment as NAME=value, each value cut past MAX_VALUE_CHARS; secrets redacted."""
    return ", ".join(f"{k}={short(v)}" for k, v in sorted(fmt.redact(env).items())) or "nothing set"


def first_bring_ups(deployments: list[DeploymentRow]) -> dict[str, DeploymentRow]:
    """Each variant's first bring-up (its lowest repeat), variants in the order they were first deployed."""
    out: dict[str, DeploymentRow] = {}
    for d in deployments:
        if d.variant not in out or d.repeat < out[d.variant].repeat:
            out[d.variant] = d
    return out


def stack(run: RunRow, deployments: list[DeploymentRow], ev: Evidence) -> str:
    """The Stack section: the baseline's first bring-up, and the CPUs of every variant's roles."""
    firsts = first_bring_ups(deployments)
    first = firsts.get(ev.baseline) or next(iter(firsts.values()), None)
    out = [f"Campaign **{run.name}**, started {run.created_utc}, mode {ev.mode}.", ""]
    if first is None:
        return "\n".join(out + ["_No deployment was brought up._"]) + "\n"
    inv = _dict(first.inventory)
    engine = str(_dict(inv.get("engine")).get("name") or first.spec.get("engine"))
    layouts: dict[str, list[str]] = {}
    for d in sorted(firsts.values(), key=lambda d: d.variant != first.variant):  # the baseline's group first
        layouts.setdefault(role_cpus(d), []).append(d.variant)
    out += [
        f"- **Engine**: {engine_line(inv, engine)}" + ("" if first.variant == ev.baseline else f" ({first.variant})"),
        f"- **Model**: `{first.spec.get('model')}`",
        f"- **torch**: {torch_line(inv)}",
        f"- **Packages**: {packages_line(inv, engine)}",
        f"- **Hardware**: {hardware_line(inv)}",
        "- **CPUs per role**: " + "; ".join(f"{', '.join(names)}: {layout}" for layout, names in layouts.items()),
        f"- **Engine environment**: {env_line(_dict(inv.get('env')))}",
        "",
        "Each bring-up's whole inventory and placement (processes and their children, NUMA nodes, the full "
        "environment) is in results.json under `deployments`.",
    ]
    return "\n".join(out) + "\n"


def placement_mismatch(p: dict) -> str | None:
    """The CPU list of a pinned process (or of one of its descendants) that is not the one it was pinned
    to, from the placement deploy.bring_up verified; None when it matches."""
    expected = p.get("expected_cpus")
    if not expected:
        return None
    for cpus in [p.get("cpus_allowed"), *(p.get("tree") or {}).values()]:
        if cpus is not None and cpus != expected:
            return cpus
    return None


def placement(deployments: list[DeploymentRow]) -> str:
    """Per variant (its first bring-up), each process: its role, pid, the CPUs it was pinned to, the CPUs
    it and its children were found allowed on, and how many processes that is."""
    out = []
    for name, d in first_bring_ups(deployments).items():  # later bring-ups are the same spec
        out.append(f"**{name}** — topology {d.spec.get('topology')}, levers: {', '.join(d.levers) or 'none'}"
                   + (f", URL {d.url}" if d.url else ""))
        out.append("")
        rows = [p for p in d.placement if isinstance(p, dict)]
        hosts = any(p.get("host") for p in rows)
        table = []
        for p in rows:
            tree = p.get("tree") or {}
            found = [c for c in dict.fromkeys([p.get("cpus_allowed"), *tree.values()]) if c is not None]
            table.append([str(p.get("role") or p.get("name")), str(p.get("pid", "–")),
                          str(p.get("expected_cpus") or "not pinned"), " and ".join(found) or "–",
                          str(max(len(tree), 1)), *([str(p.get("host") or "local")] if hosts else [])])
        out.append(fmt.table(["role", "pid", "pinned to CPUs", "allowed on CPUs", "processes",
                              *(["host"] if hosts else [])], table) if rows else "_(no placement recorded)_\n")
        bad = [p for p in rows if placement_mismatch(p)]
        if bad:
            out.append(f"**Placement mismatch** in {len(bad)} process(es): "
                       + "; ".join(f"{p.get('name')} (pid {p.get('pid')}) allowed on CPUs {placement_mismatch(p)}, "
                                   f"expected {p.get('expected_cpus')}" for p in bad) + ".\n")
    return "\n".join(out) if out else "_No deployment was brought up._\n"
