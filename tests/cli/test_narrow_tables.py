"""Every table a command prints keeps its figures whole when piped at 80 columns (and at 40): each figure of
the command's --json output (or summary.json) is found in full in the printed text."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
V4 = ROOT / "tests" / "data" / "deepseek-v4-flash.json"
TRACES = ROOT / "tests" / "profile" / "data"


def rooftop(*args, columns: int | None = None) -> str:
    env = {**os.environ, "COLUMNS": str(columns)} if columns else {k: v for k, v in os.environ.items()
                                                                     if k != "COLUMNS"}
    done = subprocess.run([sys.executable, "-m", "rooftop", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def missing(figures: list[str], text: str) -> list[str]:
    """The figures not found whole in the text (a figure cut to '126.6…' or folded across lines is missing)."""
    return [f for f in figures if not re.search(rf"(?<![\d.]){re.escape(f)}(?![\d.])", text)]


def fits(text: str, columns: int) -> bool:
    return all(len(line) <= columns for line in text.splitlines())


ROOFLINE = ("roofline", "--model-config", V4, "--gpu", "rtx-pro-6000", "--batch", 16, "--context", 2048,
            "--tp", 4, "--weight-dtype", "fp4")


@pytest.mark.parametrize("columns", [80, 40])
def test_roofline_figures_are_whole(columns):
    data = json.loads(rooftop(*ROOFLINE, "--json"))
    figures = []
    for step in ("decode", "prefill"):
        s = data[step]
        figures += [f"{s['bytes'] / 1e9:.3f}", f"{s['flops'] / 1e9:.1f}", f"{s['floor_ms']:.3f}"]
        for c in s["components"].values():
            if c["bytes"] or c["flops"]:
                figures += [f"{c['bytes'] / 1e9:.3f}", f"{c['flops'] / 1e9:.1f}", f"{c['floor_ms']:.3f}"]
    assert "126.6" in " ".join(figures) and "10569" in " ".join(figures)  # the figures issue 19 saw cut
    text = rooftop(*ROOFLINE, columns=columns)
    assert missing(figures, text) == [] and "…" not in text
    assert fits(text, columns)


def test_roofline_piped_without_columns_is_one_wide_table():
    text = rooftop(*ROOFLINE)
    assert "┃ component " in text and "…" not in text  # a pipe has no width: the table is not squeezed


@pytest.mark.parametrize("columns", [80, 40])
def test_profile_figures_are_whole(columns):
    args = (TRACES / "h200_capacity_ctx262144.json.gz", "--context-length", 262144,
            "--vs", TRACES / "h200_actual_ctx262144.json.gz")
    data = json.loads(rooftop("profile", *args, "--json"))
    figures = []
    for c in data["components"]:
        figures += [f"{c['share']:.1%}", f"{c['ms_per_step']:.3f}"]
    for k in data["top_kernels"]:
        figures += [f"{k['ms_per_step']:.3f}", f"{k['share']:.1%}", f"{k['calls_per_step']:.1f}"]
    figures += [f"{f['ms_per_step']:.3f}" for f in data["capacity_findings"]]
    for r in data["vs"]["diff"]["components"] + data["vs"]["diff"]["kernels"][:15]:
        figures += [f"{r['a_ms_per_step']:.3f}", f"{r['b_ms_per_step']:.3f}", f"{r['delta_ms']:+.3f}"]
    text = rooftop("profile", *args, columns=columns)
    assert missing(figures, text) == [] and "…" not in text


def test_bench_figures_are_whole(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "3", "--itl-ms", "1")
    text = rooftop("bench", "--base-url", srv.url, "--input-len", 16, "--output-len", 8, "--concurrency", "1,4",
                   "--num-requests", 8, "--warmup", 1, "--out", tmp_path, columns=80)
    summary = json.loads((tmp_path / "summary.json").read_text())
    figures = []
    for lv in summary["levels"]:
        o = lv["output_tok_s"]
        assert o["ci_method"] == "single"  # one repeat: no interval, and the table says so (below)
        figures += [f"{o['mean']:.1f}",
                    f"{lv['ttft_ms']['median']:.1f}/{lv['ttft_ms']['p99']:.1f}",
                    f"{lv['tpot_ms']['median']:.2f}/{lv['tpot_ms']['p99']:.2f}",
                    f"{lv['itl_ms']['median']:.2f}/{lv['itl_ms']['p99']:.2f}", f"{lv['e2e_ms']['median']:.1f}",
                    f"{lv['completed']}/{lv['failed']}"]
    assert missing(figures, text) == [] and "…" not in text
    assert "No intervals: one repeat per level." in text and "–" not in text.split("No intervals")[0]


def test_calibrate_figures_are_whole():
    text = rooftop("calibrate", "--concurrency", "1,2", "--ttft-ms", 2, "--itl-ms", 1, "--output-len", 4,
                   columns=80)
    assert "…" not in text and fits(text, 80)
    # At 80 columns the table drops its borders: each level is one line of its nine figures.
    rows = [line.split() for line in text.splitlines() if re.fullmatch(r"\s*[12](\s+-?[\d.]+){8}\s*", line)]
    assert [r[:4] for r in rows] == [["1", "1", "48", "0"], ["2", "1", "48", "0"]]  # C, client procs, requests, failed
    for r in rows:  # four error figures in ms to 3 decimals, then tokens/s
        assert all(re.fullmatch(r"-?\d+\.\d{3}", x) for x in r[4:8]) and r[8].isdigit()
