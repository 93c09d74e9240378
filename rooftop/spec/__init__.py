"""Validated specs of what rooftop runs: deployments (here), campaigns, benches and levers."""

from rooftop.spec.deployment import ArgValue, DeploymentSpec, Role, args_to_argv
from rooftop.spec.load import (
    apply_changes,
    deployment_from_dict,
    format_validation_error,
    load_deployment,
    read_toml,
)

__all__ = [
    "ArgValue",
    "DeploymentSpec",
    "Role",
    "apply_changes",
    "args_to_argv",
    "deployment_from_dict",
    "format_validation_error",
    "load_deployment",
    "read_toml",
]
