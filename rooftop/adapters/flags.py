"""The flags each engine takes, to warn about a deployment arg it does not.

SGLang's and vLLM's flags are recorded from their own parsers into `flags/*.txt` (the release named in
each file's first line): they need not be importable where rooftop runs (a dry run for another host).
The embedded engine's are recorded the same way (`flags/embedded.txt`, checked against its parser by the
tests), so that checking a deployment never imports the engine (and torch); rooftop's vLLM pd proxy's come
from its real parser.

A flag set to false in a deployment is passed as `--no-KEY` where the engine has that form (vLLM's
on-by-default features: `enable-prefix-caching = false` -> `--no-enable-prefix-caching`); without one it
is left out, which gives the engine's default, and `unknown_args` says so.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path

from rooftop.errors import RooftopError
from rooftop.spec.deployment import ArgValue, DeploymentSpec, args_to_argv
from rooftop.spec.speculative import Speculative

FLAGS_DIR = Path(__file__).parent / "flags"
# (engine, program) -> recorded file; program is "server" (every worker role) or "router"
RECORDED = {("vllm", "server"): "vllm.txt", ("sglang", "server"): "sglang.txt",
            ("sglang", "router"): "sglang_router.txt", ("embedded", "server"): "embedded.txt"}


@cache
def recorded_flags(name: str) -> tuple[frozenset[str], str]:
    """The flags in flags/NAME and the program and release they were read from (its '# release:' line)."""
    lines = (FLAGS_DIR / name).read_text().splitlines()
    source = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("# release:")), name)
    return frozenset(line.strip() for line in lines if line.startswith("--")), source


def _parser_flags(parser: argparse.ArgumentParser) -> frozenset[str]:
    return frozenset(o for action in parser._actions for o in action.option_strings if o.startswith("--"))


@cache
def known_flags(engine: str, program: str) -> tuple[frozenset[str], str] | None:
    """The flags `program` ("server" or "router") of `engine` takes and where that list comes from;
    None where rooftop has no list."""
    if (engine, program) in RECORDED:
        return recorded_flags(RECORDED[engine, program])
    if engine == "vllm" and program == "router":
        from rooftop.adapters.vllm_proxy import build_parser

        return _parser_flags(build_parser()), "rooftop's vLLM pd proxy"
    if engine == "embedded" and program == "router":
        return frozenset({"--prefill", "--decode", "--host", "--port", "--api-key"}), "rooftop router"
    return None


# Flags rooftop sets from the role itself: the engine takes the last of two, so one in args would make the
# server listen elsewhere than where rooftop polls it (or every node claim the same rank).
ROLE_FLAGS = {"host": "host", "port": "port", "node-rank": "nodes"}
# Args rooftop reads itself when false (vLLM: profiler-config = false picks VLLM_TORCH_PROFILER_DIR).
READ_WHEN_FALSE = {"vllm": frozenset({"profiler-config"})}


def check_role_flags(spec: DeploymentSpec) -> None:
    """RooftopError for an arg that sets what a role's own fields decide (host, port, node-rank)."""
    for name, role in spec.roles().items():
        args = role.args if name == "router" else spec.role_args(name)
        for key, field in ROLE_FLAGS.items():
            if key in args:
                where = "role" if key in role.args else "deployment"
                raise RooftopError(
                    f"{name}: args.{key} = {args[key]!r} in the {where}'s args; rooftop sets --{key} itself, from "
                    f"[deployment.{name}] {field}, and polls the server there",
                    f"remove {key} from args and set {field} in [deployment.{name}]"
                    + (" (one process per host, ranks in that order)" if key == "node-rank" else ""))


def engine_argv(engine: str, args: dict[str, ArgValue]) -> list[str]:
    """A server's args as argv: {"tp": 2, "x": True} -> --tp 2 --x; a false flag -> --no-KEY where `engine`'s
    server has it, else nothing (the engine's default)."""
    known = known_flags(engine, "server")
    argv: list[str] = []
    for key, value in args.items():
        if value is False and known is not None and f"--no-{key}" in known[0]:
            argv.append(f"--no-{key}")
        else:
            argv += args_to_argv({key: value})
    return argv


def prefix_caching_argv(spec: DeploymentSpec, name: str, flags: dict[bool, list[str]]) -> list[str]:
    """The deployment's `prefix_caching` as role `name`'s engine spells it (`flags`: on -> argv, off -> argv,
    from the engine's module); nothing where it is unset. RooftopError where the role's args set one of
    those flags too: two settings of one cache, and the engine would take whichever came last."""
    if spec.prefix_caching is None:
        return []
    args = spec.role_args(name)
    given = [f.removeprefix("--") for argv in flags.values() for f in argv if f.removeprefix("--") in args]
    if given:
        raise RooftopError(f"{name}: prefix_caching = {str(spec.prefix_caching).lower()} and args.{given[0]} both "
                           "set the engine's prefix cache",
                           f"keep prefix_caching (rooftop passes {' '.join(flags[spec.prefix_caching]) or 'nothing'} "
                           f"for {spec.engine}) and remove {given[0]} from args")
    return list(flags[spec.prefix_caching])


def speculative_argv(spec: DeploymentSpec, name: str, owned: tuple[str, ...],
                     spell: Callable[[Speculative], list[str]]) -> list[str]:
    """The deployment's `speculative` as role `name`'s engine spells it (`spell`, from the engine's module; `owned`:
    every flag it may set, without dashes); nothing where it is unset. RooftopError where the role's args set one of
    those flags too: two settings of one drafter, and the engine would take whichever came last."""
    if spec.speculative is None:
        return []
    args = spec.role_args(name)
    given = [flag for flag in owned if flag in args]
    if given:
        raise RooftopError(f"{name}: speculative ({spec.speculative.label()}) and args.{given[0]} both set the "
                           "engine's speculative decoding",
                           f"keep speculative (rooftop passes {' '.join(spell(spec.speculative))} for {spec.engine}) "
                           f"and remove {given[0]} from args, or drop speculative and give the engine's own flags "
                           "in args")
    return spell(spec.speculative)


def speculative_json(s: Speculative) -> str:
    """`speculative` as vLLM's --speculative-config JSON (its key names; unset keys left out)."""
    return json.dumps(s.model_dump(exclude_none=True), separators=(",", ":"))


def unknown_args(spec: DeploymentSpec) -> list[str]:
    """One warning per deployment arg that its process's engine does not take."""
    warnings = []
    for name in spec.roles():
        program = "router" if name == "router" else "server"
        known = known_flags(spec.engine, program)
        if known is None:
            continue
        flags, source = known
        args = spec.roles()[name].args if name == "router" else spec.role_args(name)
        listed = f" (rooftop/adapters/flags/{RECORDED[spec.engine, program]})" if (spec.engine, program) in RECORDED \
            else ""
        for key, value in args.items():
            if f"--{key}" not in flags:
                warnings.append(f"{name}: --{key} is not a flag of {source}{listed}; check its spelling")
            elif value is False and (program == "router" or f"--no-{key}" not in flags) and not (
                    program == "server" and key in READ_WHEN_FALSE.get(spec.engine, ())):
                warnings.append(f"{name}: {key} = false passes nothing: {source} has no --no-{key}, so the engine "
                                f"keeps its default for it; leave {key} out, or set the flag that turns it off")
    return warnings
