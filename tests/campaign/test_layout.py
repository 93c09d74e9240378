"""The roofline a campaign stores is per GPU at the deployment's TP/EP and KV dtype (campaign/layout.py)."""

from rooftop.campaign.collect import _layout_text
from rooftop.campaign.layout import Layout, serving_layout
from rooftop.hardware.specs import gpu_spec
from rooftop.roofline.config import shape_from_config
from rooftop.roofline.report import roofline
from rooftop.spec.deployment import DeploymentSpec


def _dep(**kw):
    return DeploymentSpec.model_validate({"engine": "sglang", "model": "m", **kw})


def test_the_serving_workers_tp_ep_and_kv_dtype_are_read():
    assert serving_layout(_dep(args={"tp-size": 8, "ep-size": 8, "kv-cache-dtype": "fp8_e4m3"})) == Layout(8, 8, "fp8")
    vllm = DeploymentSpec.model_validate({"engine": "vllm", "model": "m", "args": {
        "tensor-parallel-size": 4, "data-parallel-size": 2, "enable-expert-parallel": True}})
    assert serving_layout(vllm) == Layout(4, 8, "bf16")
    pd = _dep(topology="pd", args={"tp-size": 2}, prefill={"args": {"tp-size": 8}}, decode={"args": {"tp-size": 4}},
              router={})
    assert serving_layout(pd).tp == 4  # decode's: the floor is a decode step's
    assert serving_layout(DeploymentSpec.model_validate({"engine": "embedded", "args": {"tp": 4}})) == Layout()


def test_a_tp8_floor_is_an_eighth_of_the_weights_per_gpu():
    shape = shape_from_config({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                               "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                               "vocab_size": 128256, "torch_dtype": "bfloat16"}, "llama-3.1-8b")
    gpu = gpu_spec("h200")
    one = roofline(shape, gpu, batch=1, context=1024).decode.floor_ms
    eight = roofline(shape, gpu, batch=1, context=1024, tp=8).decode.floor_ms
    assert 6.0 < one / eight <= 8.0  # weights split 8 ways (the embedding and norms are not all split)


def test_the_documents_say_the_floor_is_per_gpu():
    assert _layout_text({"tp": 8, "ep": 8, "kv_dtype": "fp8"}) == ", per GPU at TP 8 (EP 8), KV fp8"
    assert _layout_text({"tp": 1, "ep": 1, "kv_dtype": "bf16"}) == "" and _layout_text({}) == ""
