import json
from pathlib import Path

import pytest

from rooftop.adapters.processes import (
    build_processes,
    entry_process,
    get_engine,
    require_installed,
    resolve_ports,
)
from rooftop.errors import RooftopError
from rooftop.hardware.topology import NumaNode, Topology
from rooftop.spec import DeploymentSpec, load_deployment

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EIGHT_GPU_HOST = Topology(numa_nodes=[NumaNode(0, list(range(0, 16))), NumaNode(1, list(range(16, 32)))],
                          online_cpus=list(range(32)))  # fmt: skip


def by_name(processes):
    return {p.name: p for p in processes}


def after(argv, flag, n=1):
    i = argv.index(flag)
    return argv[i + 1 : i + 1 + n]


def test_sglang_single_tp4(tmp_path):
    (single,) = build_processes(load_deployment(EXAMPLES / "sglang-single.toml"), tmp_path)
    assert single.argv[1:3] == ["-m", "sglang.launch_server"]
    assert after(single.argv, "--model-path") == ["/models/DeepSeek-V3.2-Exp"]
    assert after(single.argv, "--tp-size") == ["4"] and "--enable-metrics" in single.argv
    assert after(single.argv, "--context-length") == ["8192"] and "--trust-remote-code" in single.argv
    assert "--disaggregation-mode" not in single.argv
    assert single.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert single.env["SGLANG_TORCH_PROFILER_DIR"] == str((tmp_path / "traces" / "single").absolute())
    assert (single.numa, single.cpus, single.url) == (0, None, "http://127.0.0.1:30000")
    assert single.health_url == "http://127.0.0.1:30000/health"


def test_sglang_pd_with_router_and_placement(tmp_path):
    spec = load_deployment(EXAMPLES / "sglang-pd.toml")
    procs = build_processes(spec, tmp_path, EIGHT_GPU_HOST)
    assert [p.role for p in procs] == ["prefill", "decode", "router"]
    p, d, r = procs
    assert after(p.argv, "--disaggregation-mode") == ["prefill"] and after(d.argv, "--disaggregation-mode") == ["decode"]
    assert after(p.argv, "--disaggregation-bootstrap-port") == ["8998"]
    assert after(p.argv, "--disaggregation-transfer-backend") == ["nixl"]
    assert (p.env["CUDA_VISIBLE_DEVICES"], d.env["CUDA_VISIBLE_DEVICES"]) == ("0,1,2,3", "4,5,6,7")
    assert (p.cpus, d.cpus, r.cpus) == (list(range(16)), list(range(16, 32)), list(range(16)))
    assert r.argv[1:4] == ["-m", "sglang_router.launch_router", "--pd-disaggregation"]
    assert after(r.argv, "--prefill", 2) == ["http://127.0.0.1:30000", "8998"]
    assert after(r.argv, "--decode") == ["http://127.0.0.1:30001"]
    assert entry_process(procs) is r and r.url == "http://127.0.0.1:8000"


def test_explicit_tp_flag_is_not_doubled(tmp_path):
    spec = DeploymentSpec.model_validate(
        {"engine": "sglang", "model": "/m", "args": {"tp": 2}, "single": {"gpus": [0, 1, 2, 3]}}
    )
    (proc,) = build_processes(spec, tmp_path)
    assert "--tp-size" not in proc.argv and after(proc.argv, "--tp") == ["2"]


def test_vllm_pd(tmp_path):
    p, d, r = build_processes(load_deployment(EXAMPLES / "vllm-pd.toml"), tmp_path, EIGHT_GPU_HOST)
    assert p.argv[0].endswith("vllm") and p.argv[1:3] == ["serve", "/models/DeepSeek-V3.2-Exp"]
    assert after(p.argv, "--tensor-parallel-size") == ["4"] and after(p.argv, "--max-model-len") == ["8192"]
    # vLLM 0.32 deprecates kv_both for NixlConnector: each side is named
    assert json.loads(after(p.argv, "--kv-transfer-config")[0]) == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    assert json.loads(after(d.argv, "--kv-transfer-config")[0]) == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}
    assert (p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"], d.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == ("5600", "5601")
    profiler = json.loads(after(d.argv, "--profiler-config")[0])  # vLLM >= 0.13.0, or a version not known here
    assert profiler["torch_profiler_dir"].endswith("traces/decode") and profiler["torch_profiler_record_shapes"]
    assert "VLLM_TORCH_PROFILER_DIR" not in d.env and d.env["VLLM_NO_USAGE_STATS"] == "1"
    assert r.argv[1:3] == ["-m", "rooftop.adapters.vllm_proxy"]
    assert after(r.argv, "--prefill") == ["http://127.0.0.1:8100"] and after(r.argv, "--decode") == ["http://127.0.0.1:8200"]
    assert after(r.argv, "--port") == ["8000"]


def test_vllm_profiler_by_version(tmp_path):
    from rooftop.adapters import vllm

    spec = resolve_ports(load_deployment(EXAMPLES / "vllm-pd.toml"), vllm.DEFAULT_PORTS)
    assert vllm.parse_version("0.32.0+cpu") == (0, 32, 0) and vllm.parse_version("0.6.3.post1") == (0, 6, 3)
    assert vllm.parse_version("") is None
    assert "--profiler-config" in vllm.server_argv(spec, "decode", tmp_path, flag=True)
    assert "--profiler-config" not in vllm.server_argv(spec, "decode", tmp_path, flag=False)
    env = vllm.process_env(spec, "decode", tmp_path, flag=False)
    assert env["VLLM_TORCH_PROFILER_DIR"].endswith("traces/decode") and env["VLLM_TORCH_PROFILER_RECORD_SHAPES"] == "1"
    assert "VLLM_TORCH_PROFILER_DIR" not in vllm.process_env(spec, "decode", tmp_path, flag=True)


def test_vllm_shared_storage_connector_gets_roles_and_a_directory(tmp_path):
    from rooftop.adapters import vllm

    spec = load_deployment(EXAMPLES / "vllm-pd.toml")
    spec.args["kv-transfer-config"] = '{"kv_connector": "ExampleConnector"}'
    spec.prefill.env.clear()  # the example names NIXL's side-channel port itself
    p, d, _ = build_processes(spec, tmp_path)
    pc, dc = (json.loads(after(x.argv, "--kv-transfer-config")[0]) for x in (p, d))
    assert (pc["kv_role"], dc["kv_role"]) == ("kv_producer", "kv_consumer")
    shared = str((tmp_path / "kv-shared").absolute())
    assert pc["kv_connector_extra_config"]["shared_storage_path"] == dc["kv_connector_extra_config"]["shared_storage_path"] == shared
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in p.env  # only NIXL has a side channel
    assert p.argv.count("--kv-transfer-config") == 1  # completed, not repeated
    spec.args["kv-transfer-config"] = "not json"
    with pytest.raises(RooftopError, match="kv-transfer-config is not a JSON object"):
        build_processes(spec, tmp_path)
    assert vllm.eager_variant(spec).args["enforce-eager"] is True and "enforce-eager" not in spec.args
    assert vllm.eager_variant(vllm.eager_variant(spec)) is None


def test_embedded_pd(tmp_path):
    procs = by_name(build_processes(load_deployment(EXAMPLES / "pd-embedded.toml"), tmp_path))
    p, d, r = procs["prefill"], procs["decode"], procs["router"]
    assert p.argv[1:3] == ["-m", "rooftop.engine"] and after(p.argv, "--preset") == ["tiny"]
    assert after(p.argv, "--role") == ["prefill"] and after(d.argv, "--role") == ["decode"]
    assert after(p.argv, "--profile-dir") == [str((tmp_path / "traces" / "prefill").absolute())]
    assert (p.cpus, d.cpus, r.cpus) == ([0], [1], None)
    assert r.argv[1:4] == ["-m", "rooftop", "router"]
    assert after(r.argv, "--prefill") == ["http://127.0.0.1:30001"] and after(r.argv, "--decode") == ["http://127.0.0.1:30002"]
    assert "--context-length" not in r.argv  # engine flags are for the workers, not the router


def test_embedded_single_model_path_and_default_preset(tmp_path):
    spec = DeploymentSpec.model_validate({"engine": "embedded", "model": "/ckpt/dir"})
    (proc,) = build_processes(spec, tmp_path)
    assert after(proc.argv, "--model") == ["/ckpt/dir"] and "--role" not in proc.argv
    (proc,) = build_processes(DeploymentSpec.model_validate({"engine": "embedded"}), tmp_path)
    assert after(proc.argv, "--preset") == ["tiny"]


def test_ports_defaults_and_free(tmp_path):
    spec = DeploymentSpec.model_validate(
        {"engine": "embedded", "topology": "pd", "prefill": {"port": 0}, "decode": {"port": 0}, "router": {}}
    )
    resolved = resolve_ports(spec, get_engine("embedded").DEFAULT_PORTS)
    ports = [resolved.prefill.port, resolved.decode.port, resolved.router.port]
    assert 0 not in ports and len(set(ports)) == 3 and ports[2] == 30000
    assert spec.prefill.port == 0  # the spec itself is untouched


def test_placement_errors_on_this_host(tmp_path):
    spec = load_deployment(EXAMPLES / "sglang-pd.toml")
    one_node = Topology(numa_nodes=[NumaNode(0, [0, 1])], online_cpus=[0, 1])
    with pytest.raises(RooftopError, match="NUMA node 1 does not exist on this host"):
        build_processes(spec, tmp_path, one_node)


def test_engine_errors(tmp_path):
    with pytest.raises(RooftopError, match="unknown engine 'tgi'"):
        get_engine("tgi")
    with pytest.raises(RooftopError, match="deployment.model is not set"):
        build_processes(DeploymentSpec.model_validate({"engine": "vllm"}), tmp_path)


@pytest.mark.parametrize("name", ["sglang", "vllm"])
def test_not_installed_is_a_clear_error(name):
    engine = get_engine(name)
    if engine.installed():
        pytest.skip(f"{name} is installed here")
    with pytest.raises(RooftopError, match=f"^{name} is not installed .*or use --dry-run"):
        require_installed(engine, None, "pd")
    assert get_engine("embedded").installed()


def test_endpoints():
    sg = get_engine("sglang").endpoints("http://h:1")
    assert (sg.health_url, sg.metrics_url, sg.profile_stop_url) == ("http://h:1/health", "http://h:1/metrics", "http://h:1/stop_profile")
    assert sg.profile_dir_env == "SGLANG_TORCH_PROFILER_DIR"
    assert get_engine("vllm").endpoints("http://h:1").profile_dir_env is None  # --profiler-config names it
    emb = get_engine("embedded").endpoints("http://h:1")
    assert emb.profile_dir_env is None and emb.profile_start_url == "http://h:1/start_profile"
    assert get_engine("embedded").endpoints("http://h:1", role="router").profile_start_url is None
