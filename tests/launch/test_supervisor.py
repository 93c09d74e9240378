"""The supervisor against real processes: a tiny HTTP server written here, pinned, killed in every way."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from rooftop.adapters.processes import free_port
from rooftop.errors import RooftopError
from rooftop.hardware.pinning import cpus_allowed
from rooftop.launch.supervisor import PID_FILE, ProcessSpec, Supervisor, group_members, reap_leftovers

REPO = Path(__file__).resolve().parents[2]

# argv: PORT MODE [READY_AFTER_S]. MODE: plain | child (also starts a grandchild) | die (fails on start)
SERVER = textwrap.dedent(
    """
    import http.server, subprocess, sys, time
    port, mode = int(sys.argv[1]), sys.argv[2]
    ready_after_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    if mode == "die":
        for i in range(30):
            print(f"loading line {i}")
        print("fatal: model weights missing")
        sys.exit(3)
    if mode == "child":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    start = time.monotonic()

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if time.monotonic() - start >= ready_after_s else 503)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", port), Health)
    print(f"serving on {port}", flush=True)
    server.serve_forever()
    """
)


@pytest.fixture
def server_script(tmp_path):
    path = tmp_path / "server.py"
    path.write_text(SERVER)
    return path


def server_spec(script, mode="plain", cpus=(0,), ready_after_s=0.0, name="single"):
    port = free_port()
    return ProcessSpec(
        name=name,
        role=name,
        argv=[sys.executable, str(script), str(port), mode, str(ready_after_s)],
        env={"ROOFTOP_TEST_MARK": "1"},
        cpus=list(cpus) if cpus else None,
        health_url=f"http://127.0.0.1:{port}/health",
    )


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids, timeout_s=15.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def test_start_pinned_ready_and_teardown(tmp_path, server_script):
    spec = server_spec(server_script, mode="child")
    with Supervisor(tmp_path, grace_s=5) as sup:
        (proc,) = sup.start_and_wait([spec], timeout_s=60)
        with urllib.request.urlopen(spec.health_url, timeout=5) as resp:
            assert resp.status == 200
        assert cpus_allowed(proc.pid) == [0]
        assert os.getpgid(proc.pid) == proc.pid  # its own process group
        members = group_members(proc.pid)
        assert proc.pid in members and len(members) == 2  # the server and its child
        pids = json.loads((tmp_path / PID_FILE).read_text())
        assert [(e["name"], e["pgid"]) for e in pids] == [("single", proc.pid)]
        assert (tmp_path / "logs" / "single.log").read_text().count("serving on") == 1
    assert group_members(proc.pid) == []
    assert wait_gone(members) == []
    assert not (tmp_path / PID_FILE).exists()


def test_ready_only_when_health_says_200(tmp_path, server_script):
    spec = server_spec(server_script, ready_after_s=1.0, cpus=None)
    with Supervisor(tmp_path, grace_s=5, poll_s=0.05) as sup:
        sup.start_and_wait([spec], timeout_s=60)
        with urllib.request.urlopen(spec.health_url, timeout=5) as resp:
            assert resp.status == 200


def test_not_ready_in_time(tmp_path, server_script):
    spec = server_spec(server_script, ready_after_s=1000.0)
    with Supervisor(tmp_path, grace_s=5) as sup:
        with pytest.raises(RooftopError, match="not ready after 1 s: single"):
            sup.start_and_wait([spec], timeout_s=1)


def test_death_while_starting_shows_last_log_lines(tmp_path, server_script):
    spec = server_spec(server_script, mode="die")
    with Supervisor(tmp_path, grace_s=5) as sup:
        with pytest.raises(RooftopError) as info:
            sup.start_and_wait([spec], timeout_s=60)
    message = str(info.value)
    assert "single exited with code 3 while starting" in message
    assert "fatal: model weights missing" in message and "loading line 29" in message
    assert "loading line 11" in message and "loading line 10\n" not in message  # exactly the last 20 lines


def test_a_refused_command_line_is_the_first_error_and_a_known_cause_gives_its_fix(tmp_path):
    """argparse's refusal ("vllm: error: unrecognized arguments: ...") is quoted as the first error, and a
    process's `fixes` turn a known cause into the error's fix (vLLM before 0.13.0 given --profiler-config)."""
    from rooftop.adapters.vllm import OLD_VLLM_FIX

    refuse = ("import sys; print('INFO starting'); "
              "print('usage: vllm serve [-h] [--port PORT]', file=sys.stderr); "
              "print('vllm: error: unrecognized arguments: --profiler-config {\"profiler\":\"torch\"}', file=sys.stderr); "
              "sys.exit(2)")
    port = free_port()

    def death(flag: str, run_dir) -> RooftopError:
        spec = ProcessSpec(name="single", role="single", argv=[sys.executable, "-c", refuse.replace("--profiler-config", flag)],
                           health_url=f"http://127.0.0.1:{port}/health", fixes=[OLD_VLLM_FIX])
        with Supervisor(run_dir, grace_s=5) as sup:
            with pytest.raises(RooftopError) as info:
                sup.start_and_wait([spec], timeout_s=60)
        return info.value

    err = death("--profiler-config", tmp_path)
    assert "first error in its log: vllm: error: unrecognized arguments: --profiler-config" in err.problem
    assert err.fix == OLD_VLLM_FIX[1] and "profiler-config = false" in err.fix
    assert death("--nope", tmp_path / "b").fix == "read the whole log there"  # another cause: no fix of its own


def test_bad_cpu_is_a_clear_error(tmp_path, server_script):
    spec = server_spec(server_script, cpus=(4095,))
    with Supervisor(tmp_path) as sup:
        with pytest.raises(RooftopError, match="cannot start single"):
            sup.start(spec)


def test_start_refuses_other_threads(tmp_path, server_script):
    errors = []
    sup = Supervisor(tmp_path)

    def run():
        try:
            sup.start(server_spec(server_script))
        except RuntimeError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert errors and "main thread" in errors[0]
    assert sup.processes == []


# A supervising rooftop stand-in: starts the given servers, prints their pids, and waits to be killed.
DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from rooftop.launch.supervisor import ProcessSpec, Supervisor
    run_dir, specs = sys.argv[1], json.loads(sys.argv[2])
    with Supervisor(run_dir, grace_s=5) as sup:
        procs = sup.start_and_wait([ProcessSpec(**s) for s in specs], timeout_s=60)
        print(json.dumps([p.pid for p in procs]), flush=True)
        while True:
            time.sleep(0.1)
    """
)


def start_driver(tmp_path, specs):
    argv = [sys.executable, "-c", DRIVER, str(tmp_path), json.dumps([
        {"name": s.name, "role": s.role, "argv": s.argv, "cpus": s.cpus, "health_url": s.health_url} for s in specs
    ])]  # fmt: skip
    driver = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO)
    line = driver.stdout.readline()
    assert line, "driver died before its servers were ready"
    pids = json.loads(line)
    members = [m for pid in pids for m in group_members(pid)]
    return driver, pids, members


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_of_supervisor_tear_everything_down(tmp_path, server_script, sig):
    specs = [server_spec(server_script, "child", name="prefill"), server_spec(server_script, "child", name="decode")]
    driver, pids, members = start_driver(tmp_path, specs)
    try:
        assert len(members) == 4
        driver.send_signal(sig)
        assert driver.wait(timeout=30) != 0
        assert wait_gone(members) == []
        assert all(group_members(pid) == [] for pid in pids)
        assert not (tmp_path / PID_FILE).exists()
    finally:  # a failed check must not leave the driver or its servers running
        if driver.poll() is None:
            driver.kill()
        for pid in members:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_sigkill_of_supervisor_leaves_no_server(tmp_path, server_script):
    driver, pids, members = start_driver(tmp_path, [server_spec(server_script, "plain")])
    assert members == pids
    driver.kill()  # no handler runs: only PR_SET_PDEATHSIG can take the server down
    driver.wait()
    assert wait_gone(pids) == []


def test_sigkill_leftover_grandchildren_are_reaped_by_the_next_run(tmp_path, server_script):
    driver, pids, members = start_driver(tmp_path, [server_spec(server_script, "child")])
    assert len(members) == 2
    driver.kill()
    driver.wait()
    assert wait_gone(pids) == []  # the server itself died with its parent
    # Its own child got no death signal; the pid file lets the next run in this directory reap it.
    orphans = [m for m in members if alive(m)]
    assert len(orphans) == 1 and orphans[0] not in pids
    assert reap_leftovers(tmp_path) == pids  # the group keeps the dead leader's id while a member lives
    assert wait_gone(members) == []
    assert not (tmp_path / PID_FILE).exists()


def test_reap_skips_a_recycled_pid(tmp_path):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        entry = {"name": "x", "role": "single", "pid": bystander.pid, "pgid": bystander.pid, "start_ticks": 1}
        (tmp_path / PID_FILE).write_text(json.dumps([entry]))
        assert reap_leftovers(tmp_path) == []
        assert alive(bystander.pid)
    finally:
        bystander.kill()
        bystander.wait()
