"""The eager map's deployment and key (campaign/eager_map.py): one eager single server of the model on
free ports, for single and pd deployments alike; a lever that changes the graph gets its own map."""

from rooftop.adapters import vllm
from rooftop.campaign.eager_map import map_deployment, map_key
from rooftop.spec.deployment import DeploymentSpec

PD = {
    "engine": "vllm", "model": "m", "topology": "pd",
    "args": {"max-model-len": 1024, "kv-transfer-config": '{"kv_connector":"NixlConnector"}'},
    "prefill": {"gpus": [0, 1], "port": 8100, "args": {"max-num-batched-tokens": 8192}},
    "decode": {"gpus": [2, 3], "port": 8200, "args": {"max-num-seqs": 64, "disaggregation-mode": "decode"}},
    "router": {"port": 8000},
}


def test_a_pd_deployment_maps_through_one_single_server_built_from_decode():
    dep = DeploymentSpec.model_validate(PD)
    single = map_deployment(dep)
    assert single.topology == "single" and single.prefill is None and single.router is None
    assert single.single.gpus == [2, 3] and single.single.port == 0
    assert single.single.args == {"max-num-seqs": 64}  # the KV hand-off's args are left out
    assert single.args == {"max-model-len": 1024}
    eager = vllm.eager_variant(single)
    assert eager.args["enforce-eager"] is True and eager.topology == "single"
    assert dep.topology == "pd" and dep.decode.port == 8200  # the deployment itself is untouched


def test_a_single_deployment_maps_on_free_ports():
    dep = DeploymentSpec.model_validate({"engine": "vllm", "model": "m", "single": {"port": 8000, "gpus": [0]}})
    assert map_deployment(dep).single.port == 0 and dep.single.port == 8000


def test_the_map_is_shared_across_levers_that_keep_the_graph():
    base = DeploymentSpec.model_validate({"engine": "vllm", "model": "m", "args": {"max-model-len": 1024}})
    batch_cap = base.model_copy(update={"args": {"max-model-len": 1024, "max-num-seqs": 2}})
    fp8_kv = base.model_copy(update={"args": {"max-model-len": 1024, "kv-cache-dtype": "fp8"}})
    pd = DeploymentSpec.model_validate({**PD, "args": {"max-model-len": 1024}, "decode": {"gpus": [2, 3]}})
    assert map_key(base) == map_key(batch_cap) == map_key(pd)
    assert map_key(fp8_kv) != map_key(base)
    assert map_key(base, "baseline", "single") != map_key(base, "lever", "single")
