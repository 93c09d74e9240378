import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import scaled_gpu_trace
from typer.testing import CliRunner

from rooftop.cli import app

DATA = Path(__file__).parent / "data"


def rooftop(*args):
    """The command in-process (the error path below runs the real console script)."""
    return CliRunner().invoke(app, ["profile", *map(str, args)], env={"COLUMNS": "200"})


def test_json_output(gpu_trace_path):
    r = rooftop(gpu_trace_path, "--context-length", 262144, "--page-size", 64, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["steps"] == 2 and d["components"][0]["name"] == "indexer"
    assert d["capacity_findings"][0]["dim"] == 262208
    assert d["capacity_findings"][0]["ops"] == ["aten::bmm", "aten::clamp_min", "aten::mul", "aten::sum"]


def test_tables_and_sentences(gpu_trace_path):
    r = rooftop(gpu_trace_path, "--context-length", 262144)
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "sized by the allocated capacity" in text and "262208" in text
    assert "components" in text and "top 10 kernels" in text


def test_vs_reports_scaling_and_diff(gpu_trace_path, tmp_path):
    small = scaled_gpu_trace(gpu_trace_path, tmp_path / "small.json", 0.25, 65600)
    r = rooftop(small, "--vs", gpu_trace_path, "--json")
    assert r.exit_code == 0, r.output
    vs = json.loads(r.stdout)["vs"]
    assert vs["capacity_scaling"][0]["component"] == "indexer" and vs["capacity_scaling"][0]["scales"]
    assert vs["diff"]["components"][0]["name"] == "indexer"
    r = rooftop(small, "--vs", gpu_trace_path)
    assert "scales with allocated capacity, not with actual context" in " ".join(r.stdout.split())


def test_bad_trace_is_one_line_error(tmp_path):
    (tmp_path / "t.json").write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op"')
    r = subprocess.run([sys.executable, "-m", "rooftop", "profile", str(tmp_path / "t.json")], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "COLUMNS": "1000"})
    assert r.returncode == 2
    assert "truncated" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_vs_reads_both_traces_through_the_eager_map():
    graph, eager = DATA / "h200_graph_replay_cap262144.json.gz", DATA / "h200_graph_eager_cap262144.json.gz"
    r = rooftop(graph, "--vs", graph, "--eager-trace", eager, "--context-length", 262144, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    b = d["vs"]["summary"]
    assert b["components"][0]["name"] == "indexer" and b["attribution_source"] == f"eager map {eager}"
    assert [c["name"] for c in b["components"]] == [c["name"] for c in d["components"]]  # B was "cuda_graph 99%"
    assert b["capacity_findings"][0]["dim"] == 262144
    rows = {row["name"]: row for row in d["vs"]["diff"]["components"]}
    assert "cuda_graph" not in rows and rows["indexer"]["delta_ms"] == 0
    assert len(d["top_kernels"]) == 10 and len(b["top_kernels"]) == 10
