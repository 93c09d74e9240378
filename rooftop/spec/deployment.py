"""A deployment as the user writes it: engine, model, topology and the roles that run it.

    [deployment]
    engine = "sglang"                 # embedded | sglang | vllm
    model = "/models/DeepSeek-V3.2"   # a path, or an embedded preset ("tiny", "small")
    python = "/opt/sglang/bin/python" # optional: the engine's own environment
    topology = "pd"                   # single | pd
    args = { tp-size = 4 }            # engine flags for every role, without leading dashes
    prefix_caching = false            # optional: the engine's prefix cache off (or on); unset: its default
    speculative = { method = "ngram", num_speculative_tokens = 3 }  # optional (rooftop/spec/speculative.py)
    [deployment.prefill]
    gpus = [0, 1, 2, 3]
    numa = 0                          # or cpus = "0-3,8" / [0, 1, 2, 3]
    [deployment.decode]
    gpus = [4, 5, 6, 7]
    numa = 1

Role `args`/`env` are merged over the deployment-wide ones. Pydantic only at this boundary.

Roles on other machines name an entry of `[deployment.hosts]` as their `host` (rooftop reaches it over
SSH); a role that spans machines (SGLang or vLLM tensor parallel over two 8-GPU hosts) lists them in
`nodes`, rank 0 first:

    [deployment.hosts.gpu-a]
    address = "10.0.0.1"              # what the engine binds and clients reach; default: the name
    user = "ubuntu"                   # ssh user, port, identity file; default: ~/.ssh/config's
    python = "/opt/sglang/bin/python" # the engine's interpreter on that host (else deployment.python)
    workdir = "/scratch/rooftop"      # logs, traces, pid files there (default: ~/rooftop-runs)
    [deployment.single]
    nodes = ["gpu-a", "gpu-b"]        # node rank 0 on gpu-a, rank 1 on gpu-b

With a hosts table, a role's `host` is one of its entries or an address of this machine (an IP literal or
a localhost name): any other name is taken for a typo. The pd router always runs on this machine.
"""

import difflib
import ipaddress
import re
import socket
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from rooftop.errors import RooftopError
from rooftop.hardware.topology import parse_cpu_list
from rooftop.spec.speculative import Speculative

ArgValue = str | int | float | bool
ROLE_NAMES = ("single", "prefill", "decode", "router")
# A lever may change these parts of a deployment; its other keys (name, hypothesis, ...) are its own.
LEVER_DEPLOYMENT_KEYS = ("engine", "model", "python", "topology", "prefix_caching", "speculative", "args", "env",
                         *ROLE_NAMES)


def _check_arg_keys(args: dict[str, ArgValue]) -> dict[str, ArgValue]:
    for key in args:
        if key.startswith("-"):
            raise ValueError(f"engine flag {key!r} must be written without leading dashes ({key.lstrip('-')!r})")
        if not key or any(c.isspace() for c in key):
            raise ValueError(f"engine flag {key!r} is not a flag name")
    return args


def _env_to_str(env: Any) -> Any:
    # TOML gives ints and bools for `NCCL_DEBUG = 1`; the environment only holds strings.
    if isinstance(env, dict):
        return {
            k: (("1" if v else "0") if isinstance(v, bool) else str(v) if isinstance(v, int | float) else v)
            for k, v in env.items()
        }
    return env


# Engine flags (checked names) and environment (TOML numbers and bools as strings), shared by a
# deployment and each of its roles.
EngineArgs = Annotated[dict[str, ArgValue], AfterValidator(_check_arg_keys)]
EnvVars = Annotated[dict[str, str], BeforeValidator(_env_to_str)]


# Names that mean this machine wherever they are written (a bind address of a role on this machine).
LOCAL_NAMES = ("localhost", "localhost6", "localhost.localdomain", "localhost6.localdomain6", "ip6-localhost",
               "ip6-loopback")
WILDCARDS = ("0.0.0.0", "::", "", "0")
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a [deployment.hosts] key: it names files (launch-NAME.sh)


def _ip_literal(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return address.startswith("127.")  # 127.1: the short loopback form the resolver takes
    return True


def local_only(address: str) -> str | None:
    """How a bind address on this machine is reached from it alone: "loopback" (127.x, ::1, localhost...),
    "wildcard" (0.0.0.0, ::: rooftop reaches it over loopback, and hands that URL on); None: another host may."""
    if address in WILDCARDS:
        return "wildcard"
    if address.startswith("127.") or address.lower() in LOCAL_NAMES:
        return "loopback"
    try:
        return "loopback" if ipaddress.ip_address(address).is_loopback else None
    except ValueError:
        return None


class Host(BaseModel):
    """A machine that roles run on, reached over SSH (OpenSSH's client: the user's ssh config and agent apply)."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = None  # what engines there bind and other hosts reach; default: the table's name
    user: str | None = None
    ssh_port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: str | None = None
    ssh_options: list[str] = Field(default_factory=list)  # extra `-o KEY=VALUE` for ssh
    python: str | None = None  # the engine's interpreter there; default: deployment.python
    workdir: str = "rooftop-runs"  # logs, traces, pid files; relative paths (and ~/...) are under the ssh user's home

    @field_validator("workdir")
    @classmethod
    def _workdir_home_relative(cls, value: str) -> str:
        try:
            return home_relative(value)
        except RooftopError as exc:
            raise ValueError(f"{exc.problem}; {exc.fix}") from None

    @field_validator("ssh_options")
    @classmethod
    def _options_valid(cls, value: list[str]) -> list[str]:
        for option in value:
            if "=" not in option or option.startswith("-"):
                raise ValueError(f"ssh option {option!r} is not KEY=VALUE (as after `ssh -o`)")
        return value


class Role(BaseModel):
    """One process of a deployment: where it runs (GPUs, NUMA node or CPUs), where it listens, extra flags."""

    model_config = ConfigDict(extra="forbid")

    gpus: list[int] = Field(default_factory=list)
    numa: int | None = Field(default=None, ge=0)
    cpus: list[int] | None = None
    port: int | None = Field(default=None, ge=0, le=65535)  # None: engine default; 0: a free port at launch
    host: str = "127.0.0.1"  # the address to bind, or the name of a [deployment.hosts] entry
    nodes: list[str] = Field(default_factory=list)  # a role over several hosts: their names, rank 0 first
    args: EngineArgs = Field(default_factory=dict)
    env: EnvVars = Field(default_factory=dict)
    _machine: str | None = PrivateAttr(default=None)  # set by DeploymentSpec.placed(): the hosts entry

    @property
    def machine(self) -> str | None:
        """The [deployment.hosts] entry this role runs on, once placed (DeploymentSpec.placed); None: this host."""
        return self._machine

    @field_validator("cpus", mode="before")
    @classmethod
    def _parse_cpus(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return parse_cpu_list(value)
            except ValueError as exc:
                raise ValueError(f"not a CPU list like \"0-3,8\": {exc}") from None
        return value

    @field_validator("cpus")
    @classmethod
    def _cpus_valid(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            if not value:
                raise ValueError("an empty CPU list pins to nothing; leave `cpus` out to run unpinned")
            if any(c < 0 for c in value):
                raise ValueError("CPU ids are >= 0")
            return sorted(set(value))
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus_valid(cls, value: list[int]) -> list[int]:
        if any(g < 0 for g in value):
            raise ValueError("GPU ids are >= 0")
        if len(set(value)) != len(value):
            raise ValueError("a GPU is listed twice")
        return value

    @model_validator(mode="after")
    def _one_placement(self) -> "Role":
        if self.numa is not None and self.cpus is not None:
            raise ValueError("give either `numa` or `cpus`, not both")
        return self


class DeploymentSpec(BaseModel):
    """An engine serving a model in one topology: `single` (one server) or `pd` (prefill + decode + router)."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["embedded", "sglang", "vllm"]
    model: str | None = None
    python: str | None = None  # interpreter with the engine installed; default: the one running rooftop
    hosts: dict[str, Host] = Field(default_factory=dict)
    topology: Literal["single", "pd"] = "single"
    # The engine's prefix cache (vLLM's and the embedded engine's prefix caching, SGLang's radix cache) on or
    # off, whichever the engine: each adapter turns it into its own flag. None: the engine's default (on, for all
    # three).
    prefix_caching: bool | None = Field(default=None, strict=True)
    # Speculative decoding (vLLM's --speculative-config keys), whichever the engine: each adapter spells it. None:
    # the engine decodes one token a step.
    speculative: Speculative | None = None
    args: EngineArgs = Field(default_factory=dict)
    env: EnvVars = Field(default_factory=dict)
    single: Role | None = None
    prefill: Role | None = None
    decode: Role | None = None
    router: Role | None = None

    @model_validator(mode="after")
    def _roles_match_topology(self) -> "DeploymentSpec":
        if self.topology == "single":
            if self.single is None:
                self.single = Role()
            extra = [r for r in ("prefill", "decode", "router") if getattr(self, r) is not None]
            if extra:
                raise ValueError(
                    f"topology \"single\" has no {'/'.join(extra)} role; set topology = \"pd\" or remove it"
                )
        else:
            missing = [r for r in ("prefill", "decode") if getattr(self, r) is None]
            if missing:
                raise ValueError(f"topology \"pd\" needs a [{'] and ['.join(missing)}] table")
            if self.router is None:
                self.router = Role()
            if self.single is not None:
                raise ValueError("topology \"pd\" has no `single` role; remove it or set topology = \"single\"")
        self._check_hosts()
        ports = [(name, self.rank0_host(name), role.port) for name, role in self.roles().items() if role.port]
        for i, (name, host, port) in enumerate(ports):
            for other, other_host, other_port in ports[i + 1 :]:
                if port == other_port and host == other_host:
                    raise ValueError(f"roles {name} and {other} both listen on {host}:{port}")
        return self

    def _check_hosts(self) -> None:
        for host in self.hosts:
            if not _HOST_NAME.fullmatch(host):
                raise ValueError(f"hosts.{host!r}: a host's name is letters, digits, '.', '_' and '-' (it names its "
                                 "launch script and logs); rename the table and give the address as `address`")
        for name, role in self.roles().items():
            unknown = [n for n in role.nodes if n not in self.hosts]
            if unknown:
                known = ", ".join(self.hosts) or "none"
                raise ValueError(f"{name}.nodes names {', '.join(map(repr, unknown))}, which no [deployment.hosts.NAME] "
                                 f"table defines (hosts: {known}); add the table or fix the name")
            if role.nodes:
                if len(set(role.nodes)) != len(role.nodes):
                    raise ValueError(f"{name}.nodes lists a host twice; one process per host")
                if name == "router":
                    raise ValueError("the router runs on this machine; give it no `nodes`")
                if role.host not in ("127.0.0.1", role.nodes[0]):
                    raise ValueError(f"{name}.host is {role.host!r} but {name}.nodes starts with {role.nodes[0]!r}; "
                                     "rank 0 runs on the first node: drop `host` or make them agree")
            elif self.hosts and role.host not in self.hosts and not (
                    _ip_literal(role.host) or local_only(role.host) or role.host == socket.gethostname()):
                # with hosts defined, a name that is none of them is a typo far more often than a local bind name
                close = difflib.get_close_matches(role.host.lower(), [h.lower() for h in self.hosts], n=1, cutoff=0.6)
                match = next((h for h in self.hosts if close and h.lower() == close[0]), None)
                hint = f"did you mean {match!r}? " if match else ""
                raise ValueError(f"{name}.host is {role.host!r}, which is neither a [deployment.hosts] entry "
                                 f"(hosts: {', '.join(self.hosts)}) nor an address of this machine; {hint}name a "
                                 "hosts entry, or give an IP address to bind on this machine")
            if name == "router" and role.host in self.hosts:
                raise ValueError(f"router.host is {role.host!r}, a [deployment.hosts] entry, but the pd router runs on "
                                 "this machine (with its interpreter and rooftop); leave router.host out (127.0.0.1) "
                                 "or give an address of this machine that clients reach")
            if self.machine(name) is not None and role.port == 0:
                raise ValueError(f"{name} runs on host {self.machine(name)!r}: give it a port (0 picks a free one "
                                 "only locally)")
        if self.topology == "pd":  # the workers talk to each other (KV pages): each must reach the other
            remote = [n for n in ("prefill", "decode") if self.machine(n) is not None]
            for name in ("prefill", "decode"):
                host = self.rank0_host(name)
                how = local_only(host)
                if remote and name not in remote and how:
                    other = remote[0]
                    said = ("on this machine's loopback" if how == "loopback" else
                            "on every address of this machine, but rooftop hands the other worker its loopback URL")
                    raise ValueError(f"{name} listens on {host!r} {said}, and {other} runs on host "
                                     f"{self.machine(other)!r}, which cannot reach it there: put {name} on a host too, "
                                     f"or set {name}.host to this machine's address that host {self.machine(other)!r} "
                                     "reaches")

    def rank0_host(self, name: str) -> str:
        """Role `name`'s `host` as written, or its first node for a multi-node role (rank 0 runs there)."""
        role = self.roles()[name]
        return role.nodes[0] if role.nodes else role.host

    def machine(self, name: str) -> str | None:
        """The [deployment.hosts] entry role `name` runs on (rank 0's for a multi-node role); None: this host."""
        role = self.roles()[name]
        if role._machine is not None:
            return role._machine
        host = self.rank0_host(name)
        return host if host in self.hosts else None

    def placed(self) -> "DeploymentSpec":
        """A copy whose roles on other hosts have `host` set to that host's address (the entry's name kept
        for `machine`), so engines bind it (`--host ADDRESS`) and URLs name what other hosts reach."""
        spec = self.model_copy(deep=True)
        for name, role in spec.roles().items():
            machine = self.machine(name)
            if machine is not None:
                role._machine = machine
                role.host = spec.address(machine)
        return spec

    def address(self, host: str) -> str:
        """The address of [deployment.hosts] entry `host` (its name when it gives none)."""
        return self.hosts[host].address or host

    def roles(self) -> dict[str, Role]:
        """The roles of this topology in start order: single, or prefill, decode, router."""
        names = ("single",) if self.topology == "single" else ("prefill", "decode", "router")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def role_args(self, name: str) -> dict[str, ArgValue]:
        """Deployment-wide args overlaid by role `name`'s args."""
        return {**self.args, **self.roles()[name].args}

    def role_env(self, name: str) -> dict[str, str]:
        """Deployment-wide env overlaid by role `name`'s env."""
        return {**self.env, **self.roles()[name].env}


def args_to_argv(args: dict[str, ArgValue]) -> list[str]:
    """Engine flags as argv: {"tp-size": 4, "enable-metrics": True, "x": False} -> ["--tp-size", "4", "--enable-metrics"]."""
    argv: list[str] = []
    for key, value in args.items():
        if value is True:
            argv.append(f"--{key}")
        elif value is False:
            continue
        else:
            argv += [f"--{key}", str(value)]
    return argv

def home_relative(workdir: str) -> str:
    """A host's workdir as rooftop uses it there: "~" and "~/x" become home-relative ("." and "x"), as
    every relative path there is under the ssh user's home (an engine's argv is not expanded by a shell,
    so a "~" left in it would name a directory called "~"); RooftopError for "~user/...". """
    if workdir == "~" or workdir.startswith("~/"):
        return workdir[2:].lstrip("/") or "."
    if workdir.startswith("~"):
        raise RooftopError(f"workdir {workdir!r}: another user's home (~user) is not supported",
                           "give a path relative to the ssh user's home, or an absolute one")
    if not workdir.strip():
        raise RooftopError("workdir is empty", "give a path relative to the ssh user's home, or an absolute one")
    return workdir
