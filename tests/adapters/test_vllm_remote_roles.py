"""vLLM roles on other hosts and the pd hand-off as a campaign runs it: offline env for a model path on
the host, a shared-storage connector across machines, the proxy's joined /metrics, the short-prompt warning."""

from types import SimpleNamespace

import pytest

from rooftop.adapters import vllm
from rooftop.adapters.processes import RemoteDir
from rooftop.campaign.sweep_stage import metrics_url
from rooftop.cli.run import flag_warnings
from rooftop.errors import RooftopError
from rooftop.spec.campaign import parse_campaign
from rooftop.spec.deployment import DeploymentSpec

HOSTS = {"a": {"address": "10.0.0.1"}, "b": {"address": "10.0.0.2"}}


def _pd(model="/models/dsv2", connector='{"kv_connector":"ExampleConnector"}', decode_host="b"):
    return DeploymentSpec.model_validate({
        "engine": "vllm", "model": model, "topology": "pd", "hosts": HOSTS,
        "args": {"kv-transfer-config": connector},
        "prefill": {"host": "a", "port": 8100}, "decode": {"host": decode_host, "port": 8200}, "router": {"port": 8000},
    }).placed()


def test_a_model_path_on_another_host_runs_offline_there_and_a_hub_id_does_not():
    spec = _pd(connector='{"kv_connector":"NixlConnector"}')
    assert vllm.process_env(spec, "prefill", RemoteDir("runs/x"))["HF_HUB_OFFLINE"] == "1"
    hub = _pd(model="deepseek-ai/DeepSeek-V2-Lite", connector='{"kv_connector":"NixlConnector"}')
    assert "HF_HUB_OFFLINE" not in vllm.process_env(hub, "prefill", RemoteDir("runs/x"))


def test_a_shared_storage_connector_across_machines_needs_a_shared_path():
    with pytest.raises(RooftopError) as info:
        vllm.kv_transfer_config(_pd(), "prefill", RemoteDir("runs/x"))
    assert "different machines" in str(info.value) and "shared_storage_path" in info.value.fix
    given = '{"kv_connector":"ExampleConnector","kv_connector_extra_config":{"shared_storage_path":"/nfs/kv"}}'
    assert "/nfs/kv" in vllm.kv_transfer_config(_pd(connector=given), "decode", RemoteDir("runs/x"))
    # both workers on one host: rooftop's default directory is shared
    assert "kv-shared" in vllm.kv_transfer_config(_pd(decode_host="a"), "decode", RemoteDir("runs/x"))


def _live(*procs):
    return SimpleNamespace(processes=[SimpleNamespace(spec=SimpleNamespace(role=r, url=u)) for r, u in procs])


def test_a_vllm_pd_campaign_reads_the_proxys_joined_metrics():
    live = _live(("prefill", "http://127.0.0.1:8100"), ("decode", "http://127.0.0.1:8200"),
                 ("router", "http://127.0.0.1:8000"))
    assert metrics_url(live, "vllm") == "http://127.0.0.1:8000/metrics"
    assert metrics_url(live, "embedded") == "http://127.0.0.1:8200/metrics"  # its router exports none
    assert metrics_url(_live(("single", "http://127.0.0.1:8000")), "vllm") == "http://127.0.0.1:8000/metrics"


CAMPAIGN = """
[campaign]
name = "w"
goal = "g"
[model]
path = "/models/m"
[deployment]
engine = "vllm"
[bench]
input_len = {input_len}
[[lever]]
name = "pd"
hypothesis = "h"
topology = "pd"
args = {{ kv-transfer-config = '{{"kv_connector":"ExampleConnector"}}' }}
prefill = {{ port = 8100 }}
decode = {{ port = 8200 }}
router = {{ port = 8000 }}
"""


def test_run_warns_when_the_pd_lever_would_move_no_kv_at_the_bench_prompt_length():
    short = flag_warnings(parse_campaign(CAMPAIGN.format(input_len=64), "c.toml"))
    assert any(w.startswith("lever pd: ExampleConnector moves only whole") for w in short)
    assert not any("moves only whole" in w for w in flag_warnings(parse_campaign(CAMPAIGN.format(input_len=256), "c.toml")))
