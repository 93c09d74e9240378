"""Flags that shape every request or every interval are checked before any load runs: a bad one is one
clear error (exit 2) naming the flag and a value that works, never a traceback after the sweep."""

import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from rooftop.cli import bench, deploy
from rooftop.errors import RooftopError
from rooftop.spec.bench import BenchSettings

BAD = {
    ("--output-len", "0"): ("--output-len 0: a request must generate at least one token", "--output-len 256"),
    ("--output-len", "-3"): ("--output-len -3: a request must generate at least one token", "--output-len 256"),
    ("--input-len", "0"): ("--input-len 0: a prompt needs at least one token", "--input-len 256"),
    ("--confidence", "95"): ("--confidence 95 is not a confidence level", "--confidence 0.95"),
    ("--confidence", "0.5"): ("--confidence 0.5 is not a confidence level", "--confidence 0.95"),
    ("--confidence", "1"): ("--confidence 1 is not a confidence level", "--confidence 0.95"),
    ("--timeout", "0"): ("--timeout 0: a request's timeout must be a positive", "--timeout 600"),
    ("--timeout", "-5"): ("--timeout -5: a request's timeout must be a positive", "--timeout 600"),
    ("--timeout", "inf"): ("--timeout inf: a request's timeout must be a positive, finite", "--timeout 600"),
}

# The shape of a sweep: each is refused before any request, naming the flag and the fix.
BAD_SWEEPS = [
    (["--max-concurrency", "8"], "--max-concurrency 8 caps an open loop", "--concurrency 8"),
    (["--request-rate", "2", "--max-concurrency", "-1"], "--max-concurrency -1: a cap", "--max-concurrency 16"),
    (["--request-rate", "2", "--concurrency", "4"], "--concurrency (closed-loop levels) and --request-rate",
     "drop --concurrency"),
    (["--duration", "0"], "--duration 0: a level's duration must be a positive, finite", "--duration 60"),
    (["--duration", "-5"], "--duration -5: a level's duration must be a positive, finite", "--duration 60"),
    (["--duration", "inf"], "--duration inf: a level's duration must be a positive, finite", "--duration 60"),
    (["--request-rate", "inf"], "--request-rate inf needs positive, finite rates", "--request-rate 2,4,8"),
    (["--request-rate", "nan"], "--request-rate nan needs positive, finite rates", "--request-rate 2,4,8"),
    (["--num-requests", "0"], "--num-requests 0: a level needs at least one request", "--num-requests 64"),
    (["--prefix-len", "8"], "--prefix-len 8 has no effect with --dataset random", "--dataset prefix"),
    (["--dataset", "prefix"], "--prefix-len 0: --dataset prefix shares a prefix of at least 1 token",
     "--prefix-len 128"),
    (["--dataset", "prefix", "--prefix-len", "256"], "--prefix-len 256: --dataset prefix", "--prefix-len 128"),
    (["--dataset", "sharegpt"], "--dataset sharegpt needs --dataset-path", "ShareGPT JSON"),
    (["--dataset", "sharegpt", "--dataset-path", "/nonexistent.json"], "--dataset-path '/nonexistent.json' is not a "
     "file", "--dataset-path"),
]


@pytest.mark.parametrize("args,problem,fix", BAD_SWEEPS)
def test_a_bad_sweep_is_refused_before_any_request(args, problem, fix):
    with pytest.raises(RooftopError) as err:  # port 9 (discard): nothing listens, and nothing is tried
        invoke(bench.command, "--port", 9, "--no-telemetry", *args)
    assert err.value.problem.startswith(problem) and fix in err.value.fix


def invoke(command, *args):
    app = typer.Typer()
    app.command()(command)
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("flag,value", list(BAD))
def test_a_bad_load_flag_is_refused_before_any_request(flag, value):
    problem, fix = BAD[flag, value]
    with pytest.raises(RooftopError) as err:  # port 9 (discard): nothing listens, and nothing is tried
        invoke(bench.command, "--port", 9, "--no-telemetry", flag, value)
    assert err.value.problem.startswith(problem) and fix in err.value.fix


def test_good_edges_pass_the_check():
    BenchSettings(input_len=1, output_len=1, confidence=0.51, timeout_s=0.001).check()
    BenchSettings(input_len=256, output_len=256, confidence=0.99, timeout_s=600).check()
    # each conversation's own answer length
    BenchSettings(output_len=0, dataset="sharegpt", dataset_path="x.json").check()
    with pytest.raises(RooftopError, match="--output-len 0"):
        BenchSettings(output_len=0, dataset="prefix", prefix_len=128).check()


def test_bad_flag_exits_2_without_traceback():
    done = subprocess.run([sys.executable, "-m", "rooftop", "bench", "--port", "9", "--no-telemetry",
                           "--confidence", "1.5"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--confidence 1.5 is not a confidence level" in " ".join(done.stderr.split())


def test_deploy_help_shows_the_lever_table_name():
    from rich.text import Text

    done = CliRunner().invoke(_app(deploy.command), ["--help"], env={"COLUMNS": "200"})
    assert "apply the [[lever]] of this name" in Text.from_ansi(done.output).plain  # rich markup ate it


def _app(command):
    app = typer.Typer()
    app.command()(command)
    return app


def test_deploy_pin_must_be_taskset_or_numactl(tmp_path):
    with pytest.raises(RooftopError) as err:
        invoke(deploy.command, tmp_path / "absent.toml", "--dry-run", "--pin", "numctl")
    assert err.value.problem == "--pin 'numctl' is not a pinning tool rooftop writes"
    assert err.value.fix == "use --pin taskset or --pin numactl"
