"""A campaign wires both ends of the server's spans: the engine's --otlp-traces-endpoint and the bench's receiver.

Before a block's bring-up `traced` gives its deployment an endpoint on a port free on 127.0.0.1 (through the
engine's adapter: `with_traces`, the embedded engine's and vLLM's); the sweep then runs the bench's OTLP
receiver there (`receiver_for`), so each stored request carries its ttft_breakdown. Left as they are: an
engine without `with_traces` (SGLang: adapters/sglang.py says why), a deployment with a role on another host
(it could not reach this machine's loopback), and one whose args already name an endpoint of the user's.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from rooftop.adapters.common import traces_endpoint
from rooftop.adapters.processes import free_port, get_engine
from rooftop.spec.bench import BenchSettings
from rooftop.spec.deployment import DeploymentSpec

HOST = "127.0.0.1"
_WIRED: set[str] = set()  # endpoints `traced` chose: the sweep listens on these, never on a user's own


def traced(dep: DeploymentSpec) -> DeploymentSpec:
    """`dep` exporting its servers' spans to a receiver on a free port of this machine, where its engine can."""
    wire = getattr(get_engine(dep.engine), "with_traces", None)
    if wire is None or traces_endpoint(dep) is not None:
        return dep
    roles = dep.roles()
    if any(dep.machine(n) is not None or set(r.nodes) & set(dep.hosts) for n, r in roles.items()):
        return dep
    endpoint = f"http://{HOST}:{free_port(HOST)}/v1/traces"
    _WIRED.add(endpoint)
    return wire(dep, endpoint)


def receiver_for(dep: DeploymentSpec, settings: BenchSettings) -> str | None:
    """HOST:PORT for the bench's --otlp-receiver: the campaign's own [bench] otlp_receiver, else the endpoint
    `traced` gave `dep`; None: no receiver (the levels then say "no server spans")."""
    if settings.otlp_receiver:
        return settings.otlp_receiver
    endpoint = traces_endpoint(dep)
    if endpoint is None or endpoint not in _WIRED:
        return None
    parts = urlsplit(endpoint)
    return f"{parts.hostname}:{parts.port}"
