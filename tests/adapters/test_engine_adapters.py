"""What the vLLM and SGLang adapters write for flags set to false, flags rooftop manages itself, the
profiler by what the engine's interpreter says, NIXL's side channel, parallel sizes over nodes and
rendezvous ports per role. Processes are built, not started."""

import json
import sys
from pathlib import Path

import pytest

from rooftop.adapters import vllm
from rooftop.adapters.flags import unknown_args
from rooftop.adapters.processes import build_processes
from rooftop.errors import RooftopError
from rooftop.spec import DeploymentSpec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HOSTS = {"a": {"address": "10.0.0.1"}, "b": {"address": "10.0.0.2"}}


def deployment(**fields) -> DeploymentSpec:
    return DeploymentSpec.model_validate({"model": "/m", "python": "/opt/py", **fields})


def flag_values(argv: list[str]) -> dict[str, str]:
    """{--flag: the word after it} (a bare flag maps to the next flag or "")."""
    return dict(zip(argv, argv[1:] + [""], strict=True))


# --- flags set to false ---------------------------------------------------------------------------


def test_vllm_false_turns_a_default_on_feature_off(tmp_path):
    spec = deployment(engine="vllm", args={"enable-prefix-caching": False, "enable-chunked-prefill": False,
                                           "async-scheduling": False, "max-num-seqs": 2})
    (proc,) = build_processes(spec, tmp_path)
    assert proc.argv[-5:] == ["--no-enable-prefix-caching", "--no-enable-chunked-prefill", "--no-async-scheduling",
                              "--max-num-seqs", "2"]
    assert unknown_args(spec) == []


def test_a_false_flag_without_a_no_form_is_left_out_and_named():
    spec = deployment(engine="vllm", args={"headless": False})
    (warning,) = unknown_args(spec)
    assert "headless = false passes nothing" in warning and "no --no-headless" in warning
    sglang = deployment(engine="sglang", args={"enable-tf32-matmul": False, "disable-radix-cache": False})
    (proc,) = build_processes(sglang, Path("/tmp/unused"))
    assert "--no-enable-tf32-matmul" in proc.argv and "--disable-radix-cache" not in proc.argv
    (warning,) = unknown_args(sglang)
    assert warning.startswith("single: disable-radix-cache = false passes nothing")


# --- flags rooftop sets itself ----------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize(("where", "key"), [("args", "port"), ("args", "host"), ("role", "port"), ("role", "node-rank")])
def test_host_port_and_rank_in_args_are_one_clear_error(tmp_path, engine, where, key):
    fields = {"engine": engine, "single": {"port": 8000}}
    if where == "args":
        fields["args"] = {key: 9000}
    else:
        fields["single"]["args"] = {key: 9000}
    with pytest.raises(RooftopError, match=rf"single: args.{key} = 9000 .*rooftop sets --{key} itself") as err:
        build_processes(deployment(**fields), tmp_path)
    assert f"remove {key} from args" in err.value.fix


def test_the_routers_port_in_its_args_is_an_error_too(tmp_path):
    spec = deployment(engine="vllm", topology="pd", prefill={}, decode={}, router={"args": {"port": 9000}})
    with pytest.raises(RooftopError, match=r"router: args.port = 9000"):
        build_processes(spec, tmp_path)


def test_the_users_profiler_config_is_merged_with_rooftops_trace_directory(tmp_path):
    spec = deployment(engine="vllm", args={"profiler-config": '{"torch_profiler_with_flops":true,'
                                                              '"torch_profiler_record_shapes":false}'})
    (proc,) = build_processes(spec, tmp_path)
    assert proc.argv.count("--profiler-config") == 1
    config = json.loads(flag_values(proc.argv)["--profiler-config"])
    assert config["torch_profiler_dir"] == str((tmp_path / "traces" / "single").absolute())  # where capture reads
    assert config["torch_profiler_with_flops"] is True and config["torch_profiler_record_shapes"] is False
    assert config["profiler"] == "torch" and config["ignore_frontend"] is True
    spec.args["profiler-config"] = '{"torch_profiler_dir":"/scratch/traces"}'
    with pytest.raises(RooftopError, match=r"sets torch_profiler_dir '/scratch/traces', but rooftop collects traces"):
        build_processes(spec, tmp_path)
    spec.args["profiler-config"] = "[1]"
    with pytest.raises(RooftopError, match=r"profiler-config is not a JSON object"):
        build_processes(spec, tmp_path)


def test_profiler_config_false_picks_the_old_variables(tmp_path):
    """vLLM before 0.13.0 on another host (its version cannot be read from here): the variables instead."""
    spec = deployment(engine="vllm", args={"profiler-config": False}, hosts=HOSTS, single={"host": "a"})
    (proc,) = build_processes(spec, tmp_path)
    assert not any(w.startswith("--profiler-config") or w.startswith("--no-profiler") for w in proc.argv)
    assert proc.env["VLLM_TORCH_PROFILER_DIR"].endswith("traces/single")
    assert unknown_args(spec) == []  # rooftop reads this false itself
    assert proc.fixes == []  # no flag, so no refusal of it to explain


# --- vLLM's version and features, read from its interpreter ------------------------------------------


def fake_vllm(root: Path, version: str, arg_utils: str) -> Path:
    """An 'interpreter' (this one, with a made-up vllm package on its path) that marks each time it runs."""
    site = root / "site"
    (site / "vllm" / "engine").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("raise SystemExit('importing vllm is not how rooftop probes it')\n")
    (site / "vllm" / "engine" / "arg_utils.py").write_text(arg_utils)
    dist = site / f"vllm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    python = root / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\necho ran >> {root}/ran\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


@pytest.mark.parametrize(("text", "version"), [
    ("0.32.0+cpu", (0, 32, 0)), ("0.6.3.post1", (0, 6, 3)), ("0.13.0rc1", (0, 13, 0)), ("0.10.1rc1", (0, 10, 1)),
    ("0.1.dev7557+g977180c", None), ("0.1.dev1+gb22b798.d20241006.cu126", None), ("0.12.10.dev3", None),
    ("", None), ("unknown", None),
])
def test_parse_version(text, version):
    assert vllm.parse_version(text) == version


def test_a_source_build_is_known_by_its_arguments_not_its_version(tmp_path):
    """A fork or shallow clone of current vLLM reports setuptools_scm's 0.1.devN: its arg_utils decides."""
    new = fake_vllm(tmp_path / "new", "0.1.dev7557+g977180c", "profiler_config: ProfilerConfig = ...\n")
    old = fake_vllm(tmp_path / "old", "0.12.0", "# no profiler flag here\n")
    assert vllm.probe(str(new)) == (None, True)
    assert vllm.probe(str(old)) == ((0, 12, 0), False)
    for python, flag in ((new, True), (old, False)):
        (proc,) = build_processes(deployment(engine="vllm", python=str(python)), tmp_path / "run")
        assert ("--profiler-config" in proc.argv, "VLLM_TORCH_PROFILER_DIR" in proc.env) == (flag, not flag)


def test_a_remote_roles_interpreter_is_not_run_here(tmp_path):
    old = fake_vllm(tmp_path / "old-remote", "0.12.0", "# no profiler flag here\n")
    vllm.probe.cache_clear()
    spec = deployment(engine="vllm", python=str(old), hosts=HOSTS, single={"host": "a", "port": 8000})
    (proc,) = build_processes(spec, tmp_path / "run")
    assert not (tmp_path / "old-remote" / "ran").exists()  # what sits at that path here says nothing of host a
    assert "--profiler-config" in proc.argv and proc.machine == "a"  # the documented default: vLLM >= 0.13.0
    # if that host's vLLM is older and refuses the flag, the error for its death says to set it false
    assert proc.fixes == [vllm.OLD_VLLM_FIX]


# --- NIXL's side channel -----------------------------------------------------------------------------


def test_nixl_side_channel_host_whenever_the_role_is_reachable_from_elsewhere(tmp_path):
    """Decode on host a, prefill here at an address host a reaches: prefill's side channel must listen there."""
    spec = deployment(engine="vllm", topology="pd", hosts={"a": {"address": "10.0.0.1"}},
                      prefill={"host": "10.0.0.5", "port": 8100}, decode={"host": "a", "port": 8200})
    procs = {p.name: p for p in build_processes(spec, tmp_path)}
    assert procs["prefill"].env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.5" and procs["prefill"].machine is None
    assert procs["decode"].env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.1"
    for host in ("127.0.0.1", "0.0.0.0", "localhost"):
        local = deployment(engine="vllm", topology="pd", prefill={"host": host, "port": 8100}, decode={"port": 8200})
        assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in build_processes(local, tmp_path)[0].env, host


def test_nixl_inside_multiconnector_gets_a_side_channel_port_per_worker(tmp_path):
    config = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "NixlConnector", "kv_role": "kv_both"}, {"kv_connector": "OffloadingConnector"}]}}
    spec = deployment(engine="vllm", topology="pd", args={"kv-transfer-config": json.dumps(config)}, prefill={},
                      decode={})
    p, d, _ = build_processes(spec, tmp_path)
    assert (p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"], d.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == ("5600", "5601")
    inner = json.loads(flag_values(d.argv)["--kv-transfer-config"])["kv_connector_extra_config"]["connectors"]
    assert inner == config["kv_connector_extra_config"]["connectors"]  # the user's own, untouched
    shared = deployment(engine="vllm", topology="pd", prefill={}, decode={},
                        args={"kv-transfer-config": '{"kv_connector":"ExampleConnector"}'})
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in build_processes(shared, tmp_path)[0].env


# --- parallel sizes over nodes -----------------------------------------------------------------------


@pytest.mark.parametrize(("engine", "pp", "tp"), [("vllm", "pipeline-parallel-size", "--tensor-parallel-size"),
                                                  ("sglang", "pp-size", "--tp-size")])
def test_default_tensor_parallel_leaves_room_for_the_pipeline(tmp_path, engine, pp, tp):
    """vLLM's documented multi-node layout: TP 8 x PP 2 over two 8-GPU hosts."""
    spec = deployment(engine=engine, args={pp: 2}, hosts=HOSTS, single={"nodes": ["a", "b"], "gpus": list(range(8))})
    rank0, rank1 = build_processes(spec, tmp_path)
    assert flag_values(rank0.argv)[tp] == flag_values(rank1.argv)[tp] == "8"
    spec.args[pp] = 3
    with pytest.raises(RooftopError, match=r"16 GPU\(s\) do not split into .*3 pipeline stage"):
        build_processes(spec, tmp_path)


def test_data_parallel_must_split_evenly_over_the_nodes(tmp_path):
    for size in (3, 1):
        spec = deployment(engine="vllm", args={"data-parallel-size": size}, hosts=HOSTS,
                          single={"nodes": ["a", "b"], "gpus": [0, 1]})
        with pytest.raises(RooftopError, match=rf"data-parallel-size {size} over 2 nodes plans \d replica"):
            build_processes(spec, tmp_path)
    one_host = deployment(engine="vllm", args={"data-parallel-size": 2}, single={"gpus": list(range(8))})
    (proc,) = build_processes(one_host, tmp_path)
    assert flag_values(proc.argv)["--tensor-parallel-size"] == "4"  # 2 replicas x TP 4 on 8 GPUs


# --- rendezvous ports per role -----------------------------------------------------------------------


@pytest.mark.parametrize(("engine", "args", "flag", "ports"), [
    ("sglang", {}, "--dist-init-addr", {"prefill": "10.0.0.1:25000", "decode": "10.0.0.1:25100"}),
    ("vllm", {}, "--master-port", {"prefill": "29501", "decode": "29601"}),
    ("vllm", {"data-parallel-size": 2}, "--data-parallel-rpc-port", {"prefill": "29550", "decode": "29650"}),
])
def test_two_multi_node_roles_on_one_first_host_rendezvous_apart(tmp_path, engine, args, flag, ports):
    spec = deployment(engine=engine, topology="pd", args=args, hosts=HOSTS,
                      prefill={"nodes": ["a", "b"], "gpus": [0, 1, 2, 3]},
                      decode={"nodes": ["a", "b"], "gpus": [4, 5, 6, 7]})
    seen = {p.name: flag_values(p.argv)[flag] for p in build_processes(spec, tmp_path) if p.role != "router"}
    assert seen == {"prefill": ports["prefill"], "prefill-node1": ports["prefill"],
                    "decode": ports["decode"], "decode-node1": ports["decode"]}


def test_sglang_dist_init_addr_brackets_ipv6(tmp_path):
    spec = deployment(engine="sglang", hosts={"a": {"address": "fd00::1"}, "b": {"address": "fd00::2"}},
                      single={"nodes": ["a", "b"], "gpus": [0]})
    for proc in build_processes(spec, tmp_path):
        assert flag_values(proc.argv)["--dist-init-addr"] == "[fd00::1]:25000"


# --- a shared-storage connector and short prompts ----------------------------------------------------


def test_short_prompts_through_a_shared_storage_connector_are_named():
    spec = deployment(engine="vllm", topology="pd", prefill={}, decode={},
                      args={"kv-transfer-config": '{"kv_connector":"ExampleConnector"}'})
    warning = vllm.short_prompt_warning(spec, 64)
    assert "whole 128-token KV blocks" in warning and "at least 130 tokens" in warning
    assert vllm.short_prompt_warning(spec, 130) is None  # one block moves
    spec.args["block-size"] = 16
    assert vllm.short_prompt_warning(spec, 64) is None and "at least 18" in vllm.short_prompt_warning(spec, 17)
    nixl = deployment(engine="vllm", topology="pd", prefill={}, decode={})
    assert vllm.short_prompt_warning(nixl, 8) is None  # not a shared-storage connector


# --- the example campaigns ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["vllm-cpu-campaign.toml", "vllm-gpu-campaign.toml", "sglang-gpu-campaign.toml"])
def test_example_campaigns_levers_use_their_engines_flags(tmp_path, name):
    from rooftop.spec.campaign import apply_lever, load_campaign

    campaign = load_campaign(EXAMPLES / name)
    assert unknown_args(campaign.deployment) == []
    for lever in campaign.levers:
        assert unknown_args(apply_lever(campaign.deployment, [lever])) == [], lever.name
    (pd,) = [lv for lv in campaign.levers if lv.name == "pd"]
    spec = apply_lever(campaign.deployment, [pd])
    assert vllm.short_prompt_warning(spec, campaign.bench_settings().input_len) is None  # KV really moves
    procs = {p.role: p for p in build_processes(spec, tmp_path)}
    if name.endswith("gpu-campaign.toml"):  # a GPU each, not both on GPU 0
        assert (procs["prefill"].env["CUDA_VISIBLE_DEVICES"], procs["decode"].env["CUDA_VISIBLE_DEVICES"]) == ("0", "1")
    else:
        assert (procs["prefill"].cpus, procs["decode"].cpus) == ([0], [1])


def test_rendezvous_ports_for_a_preflight(tmp_path):
    from rooftop.adapters import sglang

    roles = {"prefill": {"nodes": ["a", "b"], "gpus": [0, 1]}, "decode": {"host": "b", "gpus": [2]}}
    spec = deployment(engine="vllm", topology="pd", hosts=HOSTS, **roles).placed()
    assert vllm.rendezvous_ports(spec) == [("prefill", "a", 29501), ("prefill", "a", 5600), ("prefill", "b", 5600),
                                           ("decode", "b", 5601)]
    spec = deployment(engine="sglang", topology="pd", hosts=HOSTS, args={"dist-init-addr": "10.0.0.1:7000"},
                      **roles).placed()
    assert sglang.rendezvous_ports(spec) == [("prefill", "a", p) for p in range(7000, 7007)]
