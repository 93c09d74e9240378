"""Generated kernels judged by their compiled code: Triton compiles for sm_90 here, without a GPU, into a
real cache directory; a trace naming those kernels gets a tensor-core verdict with its instruction."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rooftop.profile import analyze, load_trace
from rooftop.profile.classify import CUDA_CORE, TENSOR, UNKNOWN
from rooftop.profile.kernel_code import read_verdicts

COMPILE = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from rooftop.engine.kernels import compile_check, triton_sparse_mla

@triton.jit
def _add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)

triton.compile(ASTSource(fn=_add_kernel, signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                         constexprs={"BLOCK": 128}), target=GPUTarget("cuda", 90, 32))
compile_check.sparse_mla_pipeline(triton_sparse_mla.default_config(64, 16, 2048))
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A Triton cache holding the engine's sparse-MLA kernel and a plain elementwise kernel, for sm_90."""
    d = tmp_path_factory.mktemp("triton-cache")
    script = d.parent / "compile_for_sm90.py"  # @triton.jit reads its source from a file
    script.write_text(COMPILE)
    subprocess.run([sys.executable, str(script)], env={**os.environ, "TRITON_CACHE_DIR": str(d)},
                   check=True, timeout=600, capture_output=True)
    return d


def _trace(path: Path, kernels: list[tuple[str, int]]) -> Path:
    """A one-step Kineto trace: a decode_step range, one op and launch per kernel, the kernels."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "decode_step", "pid": 1, "tid": 1, "ts": 0, "dur": 1000}]
    ts = 10
    for i, (name, dur) in enumerate(kernels):
        events += [
            {"ph": "X", "cat": "cpu_op", "name": "triton_op", "pid": 1, "tid": 1, "ts": ts, "dur": 5,
             "args": {"External id": i + 1}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cuLaunchKernelEx", "pid": 1, "tid": 1, "ts": ts + 1, "dur": 3,
             "args": {"External id": i + 1, "correlation": 100 + i}},
            {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts + 20, "dur": dur,
             "args": {"correlation": 100 + i, "device": 0, "stream": 7}},
        ]
        ts += 10 + dur
    path.write_text(json.dumps({"deviceProperties": [{"computeMajor": 9, "computeMinor": 0}], "traceEvents": events}))
    return path


def test_the_compiled_code_decides_and_says_which_instruction(cache):
    verdicts = read_verdicts(["_sparse_mla_split_kernel", "_add_kernel", "not_compiled_here"], [cache])
    mla, add = verdicts["_sparse_mla_split_kernel"], verdicts["_add_kernel"]
    assert mla.unit == TENSOR and mla.evidence.startswith("mma.sync.aligned.m16n8k16") and ".ptx" in mla.evidence
    assert add.unit == CUDA_CORE and add.evidence.startswith("no mma/wgmma instruction in ")
    assert "not_compiled_here" not in verdicts  # unknown stays unknown


def test_a_profile_reads_the_cache_for_generated_kernels(cache, tmp_path):
    trace = load_trace(_trace(tmp_path / "t.json", [("_sparse_mla_split_kernel", 300), ("_add_kernel", 100),
                                                    ("triton_poi_fused_mystery_0", 100)]))
    before = {k.name: k for k in analyze(trace, top=10).top_kernels}
    assert before["_sparse_mla_split_kernel"].unit == UNKNOWN and before["_add_kernel"].unit == UNKNOWN
    s = analyze(trace, top=10, kernel_code=[cache])
    by = {k.name: k for k in s.top_kernels}
    assert by["_sparse_mla_split_kernel"].unit == TENSOR and "mma.sync" in by["_sparse_mla_split_kernel"].rule
    assert by["_add_kernel"].unit == CUDA_CORE and by["_add_kernel"].rule.startswith("compiled code: no mma")
    assert by["triton_poi_fused_mystery_0"].unit == CUDA_CORE  # named pointwise by Inductor: no cache needed
    assert s.tensor_core_share == pytest.approx(300 / 500)
    assert s.unit_shares.get(UNKNOWN, 0.0) == 0.0


PTX = """.version 8.4
.target sm_90a
.visible .entry triton_tem_fused_mm_0(
	.param .u64 triton_tem_fused_mm_0_param_0
)
{{
	{body}
	ret;
}}
"""


def test_cached_copies_that_disagree_are_ambiguous_and_the_caches_read_are_named(tmp_path):
    # the same Inductor template compiled in a bf16 run (wgmma) and an fp32 run (FMA only)
    for d, body in (("a", "fma.rn.f32 %f1, %f2, %f3, %f1;"),
                    ("b", "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd1, %rd2, 1, 1, 1, 1, 1;")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "triton_tem_fused_mm_0.ptx").write_text(PTX.format(body=body))
    (v,) = read_verdicts(["triton_tem_fused_mm_0"], [tmp_path / "a", tmp_path / "b"]).values()
    assert v.unit == UNKNOWN and v.evidence.startswith("ambiguous: 2 cached copies disagree: wgmma.mma_async")
    (v,) = read_verdicts(["triton_tem_fused_mm_0"], [tmp_path / "b"]).values()  # one copy: it decides
    assert v.unit == TENSOR
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "again.ptx").write_text((tmp_path / "b" / "triton_tem_fused_mm_0.ptx").read_text())
    (v,) = read_verdicts(["triton_tem_fused_mm_0"], [tmp_path / "b", tmp_path / "c"]).values()
    assert v.unit == TENSOR and v.evidence.endswith("(2 cached copies agree)")

    trace = load_trace(_trace(tmp_path / "t.json", [("triton_tem_fused_mm_0", 100)]))
    s = analyze(trace, kernel_code=[tmp_path / "a", tmp_path / "b", tmp_path / "nowhere"])
    (k,) = s.top_kernels
    assert k.unit == UNKNOWN and k.rule.startswith("compiled code: ambiguous")
    note = next(n for n in s.notes if "looked up in the compiled code of" in n)
    assert f"{tmp_path / 'a'}, {tmp_path / 'b'}:" in note and "nowhere" not in note
    assert note.endswith("0 judged, 1 ambiguous (cached copies disagree), 0 not found")
