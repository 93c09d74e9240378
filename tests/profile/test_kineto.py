import gzip
import json

import pytest

import rooftop.profile.kineto as kineto
from rooftop.errors import RooftopError
from rooftop.profile import load_trace


def test_cpu_trace_parses_modules_ops_and_steps(traces):
    t = load_trace(traces["capacity"])
    assert not t.has_kernels and t.arch is None
    names = set(t.names)
    assert {"aten::bmm", "aten::relu", "aten::sum", "Indexer_0", "DSAModel_0", "Sampler_0"} <= names
    steps = [t.names[n] for n in t.annotations.name if t.names[n].startswith("ProfilerStep#")]
    assert len(steps) == 3
    # the indexer's bmm carries the capacity-shaped input: (ceil(8192/64) + 1) * 64 = 8256
    bmm = t.names.index("aten::bmm")
    shapes = {t.shapes[d] for n, d in zip(t.ops.name, t.ops.dims, strict=True) if n == bmm}
    assert ((2, 8256, 16), (2, 16, 4)) in shapes


def test_gzip_and_plain_agree(traces):
    a, b = load_trace(traces["capacity"]), load_trace(traces["gz"])
    assert len(a.ops.name) == len(b.ops.name) and len(a.modules.name) == len(b.modules.name)
    assert [a.names[n] for n in a.ops.name] == [b.names[n] for n in b.ops.name]


@pytest.mark.parametrize("chunk", [41, 1000, 65536])
def test_small_chunks_give_the_same_events(traces, monkeypatch, chunk):
    whole = load_trace(traces["capacity"])
    monkeypatch.setattr(kineto, "CHUNK_BYTES", chunk)
    cut = load_trace(traces["capacity"])
    assert cut.events_read == whole.events_read
    assert (cut.ops.ts_ns == whole.ops.ts_ns).all() and (cut.modules.dur_ns == whole.modules.dur_ns).all()


def test_gpu_trace_fields(gpu_trace_path):
    t = load_trace(gpu_trace_path)
    assert t.arch == "sm_90" and t.device_properties[0]["numSms"] == 132
    assert len(t.kernels.name) == 16 and len(t.launches.name) == 14 and len(t.ops.name) == 14
    # correlation and External id survive; ts in ns
    i = t.names.index("cudaGraphLaunch")
    graph = [k for k, n in enumerate(t.launches.name) if n == i]
    assert sorted(t.launches.correlation[graph].tolist()) == [107, 207]
    assert int(t.kernels.ts_ns.min()) == 1_100_000


def _err(path) -> str:
    with pytest.raises(RooftopError) as info:
        load_trace(path)
    return str(info.value)


def test_empty_trace(tmp_path):
    (tmp_path / "e.json").write_bytes(b"")
    assert "is empty" in _err(tmp_path / "e.json")
    (tmp_path / "w.json").write_bytes(b"  \n")
    assert "is empty" in _err(tmp_path / "w.json")


def test_truncated_trace(traces, tmp_path):
    data = traces["capacity"].read_bytes()
    (tmp_path / "t.json").write_bytes(data[: len(data) // 2])
    assert "truncated" in _err(tmp_path / "t.json")
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(data)[:5000])
    assert "truncated" in _err(tmp_path / "t.json.gz")


def test_malformed_trace(traces, tmp_path):
    data = bytearray(traces["capacity"].read_bytes())
    at = data.index(b'"name": "aten::bmm"', len(data) // 3)
    data[at + 6 : at + 7] = b"@"  # "name"@ "aten::bmm": not JSON
    (tmp_path / "m.json").write_bytes(bytes(data))
    msg = _err(tmp_path / "m.json")
    assert "not valid trace JSON" in msg and "byte" in msg
    (tmp_path / "x.json").write_bytes(b"hello")
    assert "not valid trace JSON" in _err(tmp_path / "x.json")


def test_not_a_kineto_trace(tmp_path):
    (tmp_path / "o.json").write_text('{"a": 1}')
    assert "no traceEvents" in _err(tmp_path / "o.json")
    (tmp_path / "n.json").write_text('{"traceEvents": [{"ph": "M", "name": "x"}]}')
    assert "no kernels and no CPU ops" in _err(tmp_path / "n.json")
    assert "does not exist" in _err(tmp_path / "missing.json")


@pytest.mark.parametrize("chunk", [37, 500, 8 << 20])
def test_keys_after_the_events_may_hold_objects(gpu_trace_path, tmp_path, monkeypatch, chunk):
    # SGLang's merged traces: {"traceEvents": [...], ..., "deviceProperties": [{...}]}
    top = json.loads(gpu_trace_path.read_text())
    merged = {"traceEvents": top.pop("traceEvents"), "distributedInfo": {"rank": 0, "world": {"size": 1}}, **top}
    merged["deviceProperties"] = merged.pop("deviceProperties")
    (tmp_path / "merged.json").write_text(json.dumps(merged))
    whole = load_trace(gpu_trace_path)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", chunk)
    t = load_trace(tmp_path / "merged.json")
    assert t.events_read == whole.events_read == 85
    assert (t.kernels.ts_ns == whole.kernels.ts_ns).all()
    assert t.arch == "sm_90" and t.device_properties == whole.device_properties
