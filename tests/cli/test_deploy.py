"""`rooftop deploy` as a user runs it: dry-run scripts, errors, and a live embedded deployment taken down by
Ctrl-C and by SIGKILL of rooftop itself."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rooftop.adapters.processes import free_port
from rooftop.cli import deploy
from rooftop.launch.supervisor import group_members

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def rooftop(*args, **kw):
    return subprocess.run([sys.executable, "-m", "rooftop", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, **kw)  # fmt: skip


def deploy_in_process(*args):
    """The deploy command alone, in this process (the full CLI imports every command)."""
    app = typer.Typer()
    app.command()(deploy.command)
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_dry_run_prints_a_runnable_script(tmp_path):
    done = deploy_in_process(str(EXAMPLES / "pd-embedded.toml"), "--dry-run", "--run-dir", str(tmp_path))
    assert done.exit_code == 0, done.output
    script = done.stdout
    assert script.startswith("#!/usr/bin/env bash")
    assert "taskset -c 0 " in script and "taskset -c 1 " in script and "-m rooftop router --prefill" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert not (tmp_path / "pids.json").exists()  # nothing started


def test_dry_run_of_a_lever(tmp_path):
    campaign = tmp_path / "c.toml"
    campaign.write_text(
        '[model]\npath = "/models/m"\n[deployment]\nengine = "sglang"\n[deployment.single]\ngpus = [0, 1, 2, 3]\n'
        '[[lever]]\nname = "pd"\ntopology = "pd"\nprefill = { gpus = [0, 1, 2, 3], numa = 0 }\n'
        "decode = { gpus = [4, 5, 6, 7], numa = 1 }\n"
    )
    done = deploy_in_process(str(campaign), "--lever", "pd", "--dry-run")
    assert done.exit_code == 0, done.output
    assert "--disaggregation-mode prefill" in done.stdout and "sglang_router.launch_router" in done.stdout
    assert "numactl --cpunodebind=1 --membind=1" in done.stdout


def test_bad_spec_is_one_clear_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[deployment]\nengine = "embedded"\n[deployment.single]\nnuma = 0\ncpus = "0"\n')
    done = rooftop("deploy", str(bad), "--dry-run")
    assert done.returncode == 2
    assert "deployment.single: give either `numa` or `cpus`, not both" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr


def live_spec(tmp_path) -> Path:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[deployment]\nengine = "embedded"\nmodel = "tiny"\n'
        'args = { device = "cpu", context-length = 256, page-size = 16, kv-cache-tokens = 512, seed = 0 }\n'
        f'[deployment.single]\ncpus = "0"\nport = {free_port()}\n'
    )
    return spec


def start_deploy(tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rooftop", "deploy", str(live_spec(tmp_path)), "--json", "--run-dir", str(run_dir),
         "--ready-timeout", "240"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        pytest.fail(f"deploy exited: {proc.stderr.read()}")
    return proc, json.loads(line), run_dir


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_live_deploy_pins_serves_and_stops_on_ctrl_c(tmp_path):
    proc, ready, run_dir = start_deploy(tmp_path)
    try:
        (entry,) = ready["processes"]
        assert entry["role"] == "single" and entry["cpus_allowed"] == "0"
        status = Path(f"/proc/{entry['pid']}/status").read_text()
        assert "Cpus_allowed_list:\t0\n" in status
        body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0}).encode()
        req = urllib.request.Request(ready["url"] + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert json.load(resp)["usage"]["completion_tokens"] == 4
        inventory = json.loads((run_dir / "inventory.json").read_text())
        assert [{k: p[k] for k in ("role", "pid", "cpus_allowed")} for p in inventory["processes"]] == ready["processes"]
        assert inventory["processes"][0]["expected_cpus"] == "0" and inventory["engine"]["name"] == "embedded"
        assert (run_dir / "launch.sh").read_text().count("taskset -c 0 ") == 1
        members = group_members(entry["pid"])
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert "stopped" in proc.stderr.read()
        assert wait_gone(members) == [] and group_members(entry["pid"]) == []
        assert not (run_dir / "pids.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigkill_of_rooftop_leaves_no_engine(tmp_path):
    proc, ready, _ = start_deploy(tmp_path)
    pid = ready["processes"][0]["pid"]
    members = group_members(pid)
    assert pid in members
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert wait_gone(members) == []


def pd_spec(tmp_path) -> Path:
    """examples/pd-embedded.toml on free ports (prefill on CPU 0, decode on CPU 1)."""
    text = (EXAMPLES / "pd-embedded.toml").read_text()
    for port in ("30000", "30001", "30002"):
        text = text.replace(f"port = {port}", f"port = {free_port()}")
    spec = tmp_path / "pd.toml"
    spec.write_text(text.replace('device = "auto"', 'device = "cpu"'))
    return spec


def greedy_tokens(url: str, prompt: str) -> str:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    req = urllib.request.Request(url + "/v1/completions", body.encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.load(resp)["choices"][0]["text"]


@pytest.mark.parametrize("stop", ["ctrl-c", "sigkill"])
def test_pd_embedded_matches_single_and_leaves_nothing(tmp_path, stop):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rooftop", "deploy", str(pd_spec(tmp_path)), "--json", "--run-dir", str(run_dir),
         "--ready-timeout", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.wait() is not None else ""
        ready = json.loads(line)
        cpus = {p["role"]: p["cpus_allowed"] for p in ready["processes"]}
        assert cpus["prefill"] == "0" and cpus["decode"] == "1" and "router" in cpus
        inventory = json.loads((run_dir / "inventory.json").read_text())
        assert {p["role"]: p["cpus_allowed"] for p in inventory["processes"]} == cpus
        members = [m for p in ready["processes"] for m in group_members(p["pid"])]
        pd_text = greedy_tokens(ready["url"], "The roofline of a GPU")
        if stop == "ctrl-c":
            # The same greedy request against a single server of the same weights gives the same tokens.
            single, single_ready, _ = start_deploy(tmp_path / "single")
            try:
                assert greedy_tokens(single_ready["url"], "The roofline of a GPU") == pd_text
            finally:
                single.send_signal(signal.SIGINT)
                try:
                    single.wait(timeout=60)
                finally:
                    if single.poll() is None:  # it did not stop: take it down, so no engine outlives the test
                        single.kill()
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 0
        else:
            proc.kill()
            proc.wait()
        assert wait_gone(members) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_demo_on_a_gpu_swaps_in_the_small_preset_and_says_so_in_the_goal(monkeypatch):
    import torch

    from rooftop.cli.demo import demo_text

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    text = demo_text()
    assert 'preset = "small"' in text and 'gpu = "NVIDIA H200"' in text
    assert "of the small DeepSeek" in text and "tiny" not in text.split("[model]")[0].split("goal =")[1]


def test_demo_pd_lever_splits_the_baseline_cpus_in_halves(monkeypatch):
    """The PD workers together get the CPUs the baseline gets: on 16 CPUs not one each."""
    from rooftop.cli import demo
    from rooftop.spec.campaign import parse_campaign

    assert demo.pd_pins([0, 1]) == ("prefill = { cpus = [0] }", "decode = { cpus = [1] }")
    assert demo.pd_pins([4, 5, 6]) == ("prefill = { cpus = [4] }", "decode = { cpus = [5, 6] }")
    assert demo.pd_pins([3]) == ("prefill = { cpus = [3] }", "decode = { cpus = [3] }")
    monkeypatch.setattr(demo.os, "sched_getaffinity", lambda pid: set(range(16)))
    spec = parse_campaign(demo.demo_text())
    pd = next(lever for lever in spec.levers if lever.name == "pd")
    assert pd.prefill.cpus == list(range(8)) and pd.decode.cpus == list(range(8, 16))
