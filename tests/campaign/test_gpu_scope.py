"""Which GPUs a sweep's telemetry samples (campaign/gpu_scope.py): the deployment's own, on this machine."""

from rooftop.campaign.gpu_scope import telemetry_scope


def _w(role="single", gpus=(), machine=None, args=None, env=None):
    return {"role": role, "gpus": list(gpus), "machine": machine, "args": args or {}, "env": env or {}}


def test_named_gpus_of_local_workers_are_sampled_and_the_router_is_not():
    scope = telemetry_scope("vllm", [_w("prefill", [0, 1]), _w("decode", [4]), _w("router", [7])])
    assert scope.gpus == [0, 1, 4] and not scope.off and scope.note is None


def test_a_worker_naming_no_gpus_runs_on_the_first_ones_its_engine_sees():
    assert telemetry_scope("embedded", [_w()]).gpus == [0]
    scope = telemetry_scope("vllm", [_w(args={"tensor-parallel-size": 2, "pipeline-parallel-size": 2})], visible="3,5,6,7,1")
    assert scope.gpus == [3, 5, 6, 7] and "GPU 3, 5, 6, 7 assumed" in scope.note
    assert telemetry_scope("sglang", [_w(args={"tp-size": 2}, env={"CUDA_VISIBLE_DEVICES": "6,7"})]).gpus == [6, 7]


def test_a_cpu_deployment_samples_no_gpu():
    scope = telemetry_scope("embedded", [_w(args={"device": "cpu"})])
    assert scope.off and scope.gpus == [] and "runs on the CPU" in scope.note
    assert telemetry_scope("vllm", [_w()], on_cpu=True).off


def test_remote_workers_are_not_read_through_this_machines_nvml():
    scope = telemetry_scope("vllm", [_w("prefill", range(8), "gpu-a"), _w("decode", range(8), "gpu-b")])
    assert scope.off and "gpu-a, gpu-b" in scope.note and "dcgm_url" in scope.note
    mixed = telemetry_scope("vllm", [_w("prefill", [0], None), _w("decode", [0, 1], "gpu-b")])
    assert mixed.gpus == [0] and "gpu-b are not sampled" in mixed.note


def test_with_an_exporter_the_named_indexes_are_read_there():
    scope = telemetry_scope("vllm", [_w("single", [0, 1], "gpu-a")], dcgm_url="http://127.0.0.1:9400/metrics")
    assert scope.gpus == [0, 1] and not scope.off and scope.note is None
