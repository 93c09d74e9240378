"""The flags each engine takes, to warn about a deployment arg it does not.

SGLang's and vLLM's flags are recorded from their own parsers into `flags/*.txt` (the release named in
each file's first line): they need not be importable where rooftop runs (a dry run for another host).
The embedded engine's and rooftop's vLLM pd proxy's come from their real parsers.
"""

from __future__ import annotations

import argparse
from functools import cache
from pathlib import Path

from rooftop.spec.deployment import DeploymentSpec

FLAGS_DIR = Path(__file__).parent / "flags"
# (engine, program) -> recorded file; program is "server" (every worker role) or "router"
RECORDED = {("vllm", "server"): "vllm.txt", ("sglang", "server"): "sglang.txt",
            ("sglang", "router"): "sglang_router.txt"}


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
        from rooftop.engines.vllm_proxy import build_parser

        return _parser_flags(build_parser()), "rooftop's vLLM pd proxy"
    if engine == "embedded":
        if program == "router":
            return frozenset({"--prefill", "--decode", "--host", "--port"}), "rooftop router"
        from rooftop.engine.launch import add_arguments

        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return _parser_flags(parser), "rooftop's embedded engine"
    return None


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
        listed = f" (rooftop/engines/flags/{RECORDED[spec.engine, program]})" if (spec.engine, program) in RECORDED \
            else ""
        for key in args:
            if f"--{key}" not in flags:
                warnings.append(f"{name}: --{key} is not a flag of {source}{listed}; check its spelling")
    return warnings
