"""Read a deployment from TOML and apply a lever to it; every mistake names the file, the key path and the reason.

A deployment file is either standalone (`[deployment]` and its subtables) or a campaign file, whose
`[deployment]` is the baseline, whose `[model] path` (or `preset`) fills in a missing `deployment.model`, and whose
`[[lever]]` entries can be applied by name.
"""

import copy
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rooftop.errors import RooftopError
from rooftop.spec.deployment import LEVER_DEPLOYMENT_KEYS, ROLE_NAMES, DeploymentSpec


def format_validation_error(exc: ValidationError, source: str, prefix: str = "deployment") -> str:
    """One line per problem: "FILE: deployment.prefill.numa: Input should be a valid integer (got 'x')"."""
    lines = []
    for err in exc.errors():
        loc = ".".join([prefix, *(str(p) for p in err["loc"])]) if err["loc"] else prefix
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (a typo? see examples/ for the keys a deployment takes)"
        elif err["type"] not in ("missing", "value_error") and "input" in err:
            msg += f" (got {err['input']!r})"
        lines.append(f"{source}: {loc}: {msg}")
    return "; ".join(lines)


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; RooftopError naming the file (and line) when it cannot."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise RooftopError(f"{path}: no such file", "check the path of the spec") from None
    except tomllib.TOMLDecodeError as exc:
        raise RooftopError(f"{path}: not valid TOML: {exc}", "fix the syntax at that line") from None
    except OSError as exc:
        raise RooftopError(f"{path}: cannot read: {exc.strerror}", "check the file's permissions") from None


def deployment_from_dict(data: dict[str, Any], source: str, prefix: str = "deployment") -> DeploymentSpec:
    """Validate a `[deployment]` table; RooftopError naming `source` and the key path on failure."""
    try:
        return DeploymentSpec.model_validate(data)
    except ValidationError as exc:
        raise RooftopError(format_validation_error(exc, source, prefix), "fix the spec") from None


def apply_changes(spec: DeploymentSpec, lever_changes: dict[str, Any], lever_name: str = "lever") -> DeploymentSpec:
    """The deployment with a lever's changes merged in: args/env and role tables key by key, the rest replaced.

    A lever that switches topology drops the roles the new topology has no use for (a `single` role
    when going to pd). Setting `numa` on a role replaces its `cpus`, and the reverse; setting `nodes` replaces
    its `host`, and the reverse.
    """
    base = spec.model_dump(exclude_none=True)
    changes = {k: v for k, v in lever_changes.items() if k in LEVER_DEPLOYMENT_KEYS and v is not None}
    merged = copy.deepcopy(base)
    for key, value in changes.items():
        if key in ("args", "env"):
            merged[key] = {**merged.get(key, {}), **value}
        elif key in ROLE_NAMES and isinstance(value, dict):
            role = dict(merged.get(key, {}))
            for field, field_value in value.items():
                if field in ("args", "env") and isinstance(field_value, dict):
                    role[field] = {**role.get(field, {}), **field_value}
                else:
                    role[field] = field_value
            # A lever that moves a role to a NUMA node replaces its CPU list (and the reverse).
            if "numa" in value and "cpus" not in value:
                role.pop("cpus", None)
            if "cpus" in value and "numa" not in value:
                role.pop("numa", None)
            # A lever that moves a multi-node role to other nodes places rank 0 on the first (and the reverse:
            # a lever giving one `host` takes the role off its nodes).
            if "nodes" in value and "host" not in value:
                role.pop("host", None)
            if "host" in value and "nodes" not in value:
                role.pop("nodes", None)
            merged[key] = role
        else:
            merged[key] = value
    topology = merged.get("topology", "single")
    keep = ("single",) if topology == "single" else ("prefill", "decode", "router")
    for role in ROLE_NAMES:
        if role not in keep and role not in changes:
            merged.pop(role, None)
    return deployment_from_dict(merged, f"lever {lever_name!r}")


def load_deployment(path: str | Path, lever: str | None = None) -> DeploymentSpec:
    """The deployment of a standalone or campaign TOML file, with lever `lever` (a `[[lever]]` name) applied."""
    data = read_toml(path)
    table = data.get("deployment")
    if not isinstance(table, dict):
        raise RooftopError(
            f"{path}: no [deployment] table",
            "add one (engine, model, topology and roles); see examples/sglang-single.toml",
        )
    table = dict(table)
    model = data.get("model")
    if "model" not in table and isinstance(model, dict):
        named = model.get("path") or model.get("preset")  # a campaign names its model once, in [model]
        if isinstance(named, str):
            table["model"] = named
    spec = deployment_from_dict(table, str(path))
    if lever is None:
        return spec
    levers = data.get("lever", [])
    if not isinstance(levers, list):
        raise RooftopError(f"{path}: lever: must be an array of tables ([[lever]])", "write [[lever]] entries")
    for entry in levers:
        if isinstance(entry, dict) and entry.get("name") == lever:
            return apply_changes(spec, entry, lever)
    names = ", ".join(str(e.get("name")) for e in levers if isinstance(e, dict)) or "none"
    raise RooftopError(f"{path}: no lever named {lever!r} (levers: {names})", "use one of the names listed")
