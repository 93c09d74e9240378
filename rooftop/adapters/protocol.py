"""The `Engine` protocol every adapter module satisfies, and the `Endpoints` of one server."""

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rooftop.launch.supervisor import ProcessSpec
from rooftop.spec.deployment import DeploymentSpec


@dataclass(slots=True)
class Endpoints:
    """Where to reach one server: its base URL, health probe, Prometheus metrics and profiler controls."""

    base_url: str
    health_url: str
    metrics_url: str | None
    profile_start_url: str | None
    profile_stop_url: str | None
    profile_dir_env: str | None  # environment variable naming the trace directory; None: a flag does it


class Engine(Protocol):
    NAME: str
    DEFAULT_PORTS: dict[str, int]
    PROFILE_DIR_ENV: str | None
    EAGER_PROFILE: dict | None

    def installed(self, python: str | None = None, topology: str = "single") -> bool: ...

    def install_hint(self) -> str: ...

    def process_specs(self, spec: DeploymentSpec, run_dir: Path) -> list[ProcessSpec]: ...

    def endpoints(self, url: str, role: str = "single") -> Endpoints: ...

    def eager_variant(self, spec: DeploymentSpec) -> DeploymentSpec | None: ...
