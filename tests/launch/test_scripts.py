import shlex
import shutil
import signal
import subprocess
import sys
import urllib.request

import pytest

from rooftop.adapters.processes import free_port
from rooftop.launch.scripts import command_line, launch_script
from rooftop.launch.supervisor import ProcessSpec, group_members
from rooftop.redact import redact_argv, redact_env
from tests.launch.test_supervisor import SERVER, alive, wait_gone


def test_command_line_quotes_every_word_and_pins():
    spec = ProcessSpec(
        name="prefill",
        role="prefill",
        argv=["python3", "-m", "x", "--prompt", "a b $HOME 'q'", "--json", '{"k": 1}'],
        env={"CUDA_VISIBLE_DEVICES": "0,1", "NOTE": "two words"},
        cpus=[0, 1, 2, 3, 8],
    )
    line = command_line(spec)
    assert shlex.split(line) == [
        "env", "CUDA_VISIBLE_DEVICES=0,1", "NOTE=two words", "taskset", "-c", "0-3,8",
        "python3", "-m", "x", "--prompt", "a b $HOME 'q'", "--json", '{"k": 1}',
    ]  # fmt: skip
    assert shlex.split(command_line(spec, pin="numactl"))[3:5] == ["numactl", "--physcpubind=0-3,8"]
    node = ProcessSpec(name="decode", role="decode", argv=["x"], numa=1)
    assert shlex.split(command_line(node)) == ["numactl", "--cpunodebind=1", "--membind=1", "x"]


def test_secrets_never_reach_the_script():
    spec = ProcessSpec(
        name="router",
        role="router",
        argv=["router", "--api-key", "sk-live-123", "--hf-token=hf_abc", "--max-tokens", "64"],
        env={"HF_TOKEN": "hf_abc", "MY_PASSWORD": "pw1", "OPENAI_API_KEY": "sk-live-123", "SAFE": "ok"},
    )
    script = launch_script([spec])
    for secret in ("sk-live-123", "hf_abc", "pw1"):
        assert secret not in script
    assert 'HF_TOKEN="${HF_TOKEN:?set HF_TOKEN in the environment}"' in script
    assert "--max-tokens 64" in script  # a token *count* is not a secret
    assert "SAFE=ok" in script
    assert redact_env({"X_SECRET": "s", "Y": "y"}) == {"X_SECRET": "<redacted>", "Y": "y"}
    assert redact_argv(["--token", "t", "--n", "1"]) == ["--token", "<redacted>", "--n", "1"]


def test_pd_script_starts_router_after_workers_and_is_valid_bash():
    def spec(name, port):
        url = f"http://127.0.0.1:{port}"
        return ProcessSpec(name=name, role=name, argv=["srv", str(port)], health_url=url + "/health", url=url)

    script = launch_script([spec("prefill", 1), spec("decode", 2), spec("router", 3)], "pd test")
    lines = script.splitlines()
    router_at = next(i for i, line in enumerate(lines) if line.startswith("srv 3"))
    waits = [i for i, line in enumerate(lines) if line.startswith("wait_healthy ")]
    assert [lines[i] for i in waits if i < router_at] == [
        "wait_healthy http://127.0.0.1:1/health",
        "wait_healthy http://127.0.0.1:2/health",
    ]
    assert "echo 'serving on http://127.0.0.1:3'" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.skipif(not (shutil.which("taskset") and shutil.which("curl")), reason="needs taskset and curl")
def test_script_runs_pins_and_stops(tmp_path):
    (tmp_path / "server.py").write_text(SERVER)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec = ProcessSpec(
        name="single",
        role="single",
        argv=[sys.executable, str(tmp_path / "server.py"), str(port), "plain"],
        cpus=[0],
        health_url=url + "/health",
        url=url,
    )
    (tmp_path / "launch.sh").write_text(launch_script([spec]))
    bash = subprocess.Popen(["bash", "launch.sh"], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        assert bash.stdout.readline().strip() == f"ready: {url}/health"
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            assert resp.status == 200
        server = [p for p in group_members(bash.pid) if p != bash.pid]
        assert len(server) == 1
        status = open(f"/proc/{server[0]}/status").read()
        assert "Cpus_allowed_list:\t0\n" in status
        assert (tmp_path / "logs" / "single.log").read_text().startswith("serving on")
        bash.send_signal(signal.SIGTERM)
        bash.wait(timeout=30)
        assert wait_gone(server) == []
    finally:
        if alive(bash.pid):
            bash.kill()
