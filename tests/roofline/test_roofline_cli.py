"""`rooftop roofline`: the JSON schema, the table, and one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rooftop.cli import roofline
from rooftop.errors import RooftopError

DATA = Path(__file__).parents[1] / "data"
REPO = Path(__file__).parents[2]


def app() -> typer.Typer:
    one = typer.Typer()
    one.command()(roofline.command)
    return one


def test_json_schema_and_values():
    result = CliRunner().invoke(
        app(),
        [
            "--model-config",
            str(DATA / "llama-3.1-8b.json"),
            "--gpu",
            "H200",
            "--weight-dtype",
            "bf16",
            "--batch",
            "1",
            "--context",
            "128",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert set(doc) == {"params_total", "params_active", "dtypes", "notes", "decode", "prefill"}
    assert doc["params_total"] == 8_030_261_248
    assert doc["notes"] == [] and doc["dtypes"] == {
        "attn_proj": "bf16", "dense_mlp": "bf16", "embedding": "bf16", "lm_head": "bf16"
    }  # fmt: skip
    for phase in ("decode", "prefill"):
        assert set(doc[phase]) == {"bytes", "flops", "floor_ms", "components"}
        for comp in doc[phase]["components"].values():
            assert set(comp) == {"bytes", "flops", "floor_ms"}
        assert doc[phase]["floor_ms"] == sum(c["floor_ms"] for c in doc[phase]["components"].values())
    assert 3.0 < doc["decode"]["floor_ms"] < 3.3
    assert doc["prefill"]["flops"] > 2 * 128 * 7e9


def test_table_for_the_engine_config_directory(tmp_path):
    (tmp_path / "config.json").write_text((DATA / "rooftop-tiny.json").read_text())
    result = CliRunner().invoke(
        app(),
        [
            "--model-config",
            str(tmp_path),
            "--gpu",
            "h200",
            "--batch",
            "4",
            "--context",
            "256",
            "--context-capacity",
            "4096",
            "--input-len",
            "64",
            "--measured-ms",
            "50",
        ],
    )
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())  # rich wraps long lines at the terminal width
    assert "indexer" in out and "capacity 4096" in out and "routed_experts" in out
    assert "measured 50.000 ms" in out and "the gap most likely sits in" in out


def test_full_command_line_error_is_one_line():
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "rooftop",
            "roofline",
            "--model-config",
            str(DATA / "llama-3.1-8b.json"),
            "--gpu",
            "h300",
            "--batch",
            "1",
            "--context",
            "8",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert run.returncode == 2
    assert "unknown GPU" in run.stderr and "h200" in run.stderr and "Traceback" not in run.stderr


def test_full_command_line_json_for_deepseek_tp8():
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "rooftop",
            "roofline",
            "--model-config",
            str(DATA / "deepseek-v3.json"),
            "--gpu",
            "h200",
            "--tp",
            "8",
            "--ep",
            "8",
            "--kv-dtype",
            "fp8",
            "--batch",
            "16",
            "--context",
            "2048",
            "--input-len",
            "512",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["params_active"] < doc["params_total"]
    assert doc["decode"]["components"]["comm_ep"]["bytes"] > 0


def test_a_measured_step_below_the_floor_names_no_component():
    """A step faster than its bound means an input is wrong (GPU, TP, dtypes): no gap to place."""
    args = ["--model-config", str(DATA / "deepseek-v3.2.json"), "--gpu", "h200", "--batch", "16", "--context", "512",
            "--context-capacity", "65536", "--measured-ms", "30"]
    result = CliRunner().invoke(app(), args)
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "measured 30.000 ms is below the floor of 61.877 ms (0.48x)" in out and "gap most likely" not in out


def test_the_configs_assumptions_are_printed_with_the_table():
    result = CliRunner().invoke(app(), ["--model-config", str(DATA / "gpt-oss-120b.json"), "--gpu", "h200",
                                        "--batch", "1", "--context", "1024"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "weights read as:" in out and "attn_proj bf16" in out and "routed_experts mxfp4" in out


def test_speculative_json_per_concurrency():
    args = ["--model-config", str(DATA / "llama-3.1-8b.json"), "--gpu", "h200", "--batch", "16", "--context", "128",
            "--speculative-tokens", "3", "--acceptance", "0.8,0.6,0.4", "--draft", "ngram", "--concurrency", "1,64",
            "--json"]  # fmt: skip
    result = CliRunner().invoke(app(), args)
    assert result.exit_code == 0, result.output
    spec = json.loads(result.output)["speculative"]
    assert spec["k"] == 3 and spec["draft"] == "ngram" and spec["acceptance_per_pos"] == [0.8, 0.6, 0.4]
    assert spec["expected_tokens"] == pytest.approx(2.8)
    assert [lv["concurrency"] for lv in spec["levels"]] == [1, 64]
    for lv in spec["levels"]:
        assert lv["draft_ms"] == 0.0
        assert lv["spec_ms_per_token"] == pytest.approx(lv["verify_step_ms"] / 2.8)
        assert lv["gain"] == pytest.approx(lv["plain_ms_per_token"] / lv["spec_ms_per_token"])
    assert spec["levels"][0]["gain"] == pytest.approx(2.8, rel=0.01)  # batch 1: verify reads what decode reads
    assert spec["compute_bound_batch"] < spec["plain_compute_bound_batch"]
    assert spec["first_paying_batch"] == 1 and spec["break_even_batch"] > spec["compute_bound_batch"]
    assert any("no device time" in n for n in spec["notes"])


def test_speculative_table_names_where_it_turns():
    args = ["--model-config", str(DATA / "llama-3.1-8b.json"), "--gpu", "h200", "--batch", "16", "--context", "128",
            "--speculative-tokens", "3", "--acceptance", "0.7"]  # fmt: skip
    result = CliRunner().invoke(app(), args)
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "speculative decoding: k 3, mtp draft, acceptance per position 0.700/0.490/0.343" in out
    assert "(2.533 tokens per verify step)" in out
    assert "verify step compute-bound from batch" in out and "speculation pays from batch 1" in out
    assert "no num_nextn_predict_layers" in out


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--speculative-tokens", "3", "--acceptance", "0.8,0.6,0.7"], "acceptance rises at position 3"),
        (["--speculative-tokens", "3", "--acceptance", "0.8,0.6"], "2 per-position acceptance rates for 3"),
        (["--acceptance", "0.5"], "--acceptance is for speculative decoding"),
        (["--speculative-tokens", "3"], "--speculative-tokens needs --acceptance"),
    ],
)
def test_bad_speculation_flags_are_one_line(flags, words):
    result = CliRunner().invoke(app(), ["--model-config", str(DATA / "llama-3.1-8b.json"), "--gpu", "h200",
                                        "--batch", "1", "--context", "8", *flags])  # fmt: skip
    assert result.exit_code != 0 and isinstance(result.exception, RooftopError)
    assert words in str(result.exception)


def test_full_command_line_speculation_error_is_one_line():
    run = subprocess.run(
        [sys.executable, "-m", "rooftop", "roofline", "--model-config", str(DATA / "llama-3.1-8b.json"), "--gpu",
         "h200", "--batch", "1", "--context", "8", "--speculative-tokens", "0", "--acceptance", "0.5"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "speculative tokens must be a positive integer, got 0" in run.stderr
