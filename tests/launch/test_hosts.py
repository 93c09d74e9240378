"""Deployments across hosts through a real sshd: 127.0.0.1 and 127.0.0.2 are two hosts, reached over SSH."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rooftop.adapters.processes import build_processes, free_port
from rooftop.deploy.bring_up import bring_up
from rooftop.errors import RooftopError
from rooftop.launch.ssh import SSHHost
from rooftop.launch.supervisor import ProcessSpec, Supervisor, group_members
from rooftop.spec.deployment import DeploymentSpec
from tests.launch.sshd import start_sshd, stop_sshd
from tests.launch.test_supervisor import alive, wait_gone

MARK = b"# rooftop-remote"  # in every remote wrapper's command line

# argv: ADDRESS PORT. Answers /health with 200; starts a child that sleeps (teardown must reach it too).
SERVER = textwrap.dedent(
    """
    import http.server, subprocess, sys
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    print("serving", flush=True)
    http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), Health).serve_forever()
    """
)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    stop_sshd(server)


def wrappers(ssh_clients: bool = False) -> list[int]:
    """Pids of remote wrappers (the sshd under test runs them on this machine), or of the ssh clients
    whose sessions run them."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                program = b"ssh" if ssh_clients else b"python3"
                if argv[0].rsplit(b"/", 1)[-1] == program and MARK in b" ".join(argv) and alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def wait_until(check, timeout_s=30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def pd_spec(sshd, tmp_path, **changes) -> DeploymentSpec:
    """The embedded engine's pd: prefill on host a (127.0.0.1), decode on host b (127.0.0.2), router here."""
    data = {
        "engine": "embedded", "model": "tiny", "topology": "pd", "python": sys.executable,
        "args": {"device": "cpu", "context-length": 512, "page-size": 16, "kv-cache-tokens": 2048, "seed": 0,
                 "threads": 1},
        "env": {"OMP_NUM_THREADS": "1"},
        "hosts": {"a": sshd.host_table("127.0.0.1", workdir=str(tmp_path / "host-a")),
                  "b": sshd.host_table("127.0.0.2", workdir=str(tmp_path / "host-b"))},
        "prefill": {"host": "a", "port": free_port("127.0.0.1"), "cpus": "0"},
        "decode": {"host": "b", "port": free_port("127.0.0.2"), "cpus": "1"},
        "router": {"port": free_port()},
    }
    for key, value in changes.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    return DeploymentSpec.model_validate(data)


def test_pd_across_two_hosts_serves_benches_profiles_and_leaves_nothing(sshd, tmp_path):
    from rooftop.bench.sweep import BenchConfig, run_bench
    from rooftop.campaign.profile_stage import profile_targets
    from rooftop.profile import load_trace
    from rooftop.profile.capture import capture_targets
    from rooftop.profile.summary import analyze

    spec = pd_spec(sshd, tmp_path)
    run_dir = tmp_path / "run"
    with bring_up(spec, run_dir, ready_timeout_s=300, grace_s=5) as live:
        placed = {p["role"]: (p["host"], p["cpus_allowed"]) for p in live.placement}
        assert placed == {"prefill": ("a", "0"), "decode": ("b", "1"), "router": (None, placed["router"][1])}
        by_role = {p.spec.role: p for p in live.processes}
        assert by_role["decode"].spec.url.startswith("http://127.0.0.2:")
        # the engines run under the wrappers, in their own groups, pinned as the spec says (this host's /proc)
        remote_pids = [by_role[r].pid for r in ("prefill", "decode")]
        assert "Cpus_allowed_list:\t1\n" in Path(f"/proc/{by_role['decode'].pid}/status").read_text()
        members = [m for pid in remote_pids for m in group_members(pid)] + group_members(by_role["router"].pid)
        assert set(remote_pids) <= set(members) and len(wrappers()) == 2
        assert (run_dir / "launch-a.sh").exists() and (run_dir / "launch-b.sh").exists()
        assert "--role decode" in (run_dir / "launch-b.sh").read_text()
        import json

        inventory = json.loads((run_dir / "inventory.json").read_text())
        assert {p["role"]: p["host"] for p in inventory["processes"]} == {"prefill": "a", "decode": "b", "router": None}
        assert inventory["hosts"]["b"]["address"] == "127.0.0.2" and "torch" in inventory["hosts"]["b"]["packages"]
        assert inventory["hardware_of"].startswith("this machine (where rooftop ran)")

        bench = asyncio.run(run_bench(BenchConfig(base_url=live.url, input_len=16, output_len=8, concurrency=[2],
                                                  num_requests=4, warmup=1, telemetry=False)))
        (level,) = bench.summary["levels"]
        assert level["completed"] == 4 and not bench.aborted

        targets = profile_targets(live, run_dir)  # as a campaign profiles: each worker, its trace fetched from its host
        assert [(t.name, t.files.host.name) for t in targets] == [("prefill", "a"), ("decode", "b")]
        traces = asyncio.run(capture_targets(live.url, tmp_path / "traces", targets, engine="embedded", steps=3, prompt_words=8,
                                             concurrency=2))
        for role in ("prefill", "decode"):
            (path,) = traces[role]
            assert path.parent == tmp_path / "traces" / role and path.stat().st_size > 0
            assert str(spec.hosts["a" if role == "prefill" else "b"].workdir) not in str(path)  # fetched here
            assert analyze(load_trace(path)).steps > 0
        # the decode worker's log came back over its ssh session while it ran
        assert "kv port" in (run_dir / "logs" / "decode.log").read_text()
    assert wait_gone(members) == []
    assert wrappers() == [] and wrappers(ssh_clients=True) == [] and not (run_dir / "pids.json").exists()


def remote_server(script: Path, host: SSHHost, name: str, address: str, env: dict | None = None) -> ProcessSpec:
    port = free_port(address)
    argv = [sys.executable, str(script), address, str(port)]
    return ProcessSpec(name=name, role=name, argv=argv, cpus=[0], host=host, env=env or {},
                       health_url=f"http://{address}:{port}/health", url=f"http://{address}:{port}")


def ssh_host(sshd, name, address, tmp_path) -> SSHHost:
    table = sshd.host_table(address, workdir=str(tmp_path / f"host-{name}"))
    return SSHHost(name=name, address=address, user=table["user"], port=table["ssh_port"],
                   identity_file=table["identity_file"], options=table["ssh_options"], workdir=table["workdir"])


def test_a_dropped_ssh_connection_leaves_no_remote_process(sshd, tmp_path):
    """Killing one process's ssh client takes down its engine there; killing the host's master connection
    takes down the rest; teardown afterwards finds nothing to do and says nothing was left."""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    a, b = ssh_host(sshd, "a", "127.0.0.1", tmp_path), ssh_host(sshd, "b", "127.0.0.2", tmp_path)
    with Supervisor(tmp_path / "run", grace_s=2) as sup:
        one, two, three = sup.start_and_wait([remote_server(script, a, "one", "127.0.0.1"),
                                              remote_server(script, a, "two", "127.0.0.1"),
                                              remote_server(script, b, "three", "127.0.0.2")], 60)
        groups = {p.spec.name: group_members(p.pid) for p in (one, two, three)}
        assert all(groups.values()) and len(wrappers()) == 3
        os.kill(one.popen.pid, signal.SIGKILL)  # one session's client dies
        assert wait_gone(groups["one"]) == [] and all(alive(p) for p in groups["two"] + groups["three"])
        with pytest.raises(RooftopError, match="one on host a .* lost its SSH connection|one on host a .* killed"):
            sup.check_alive()
        os.kill(sup.ssh.masters["a"][1].pid, signal.SIGKILL)  # host a's connection drops: all of its sessions
        assert wait_gone(groups["two"]) == [] and all(alive(p) for p in groups["three"])
    assert wait_gone(groups["three"]) == [] and wait_until(lambda: wrappers() == [])
    # the lost sessions' whole logs, copied from their host at teardown
    assert (tmp_path / "run" / "logs" / "one.remote.log").read_text().startswith("serving")
    assert not (tmp_path / "run" / "logs" / "three.remote.log").exists()  # its session ended normally


DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from rooftop.launch.ssh import SSHHost
    from rooftop.launch.supervisor import ProcessSpec, Supervisor
    host = SSHHost(**json.loads(sys.argv[1]))
    with Supervisor(sys.argv[2]) as sup:
        proc = sup.start(ProcessSpec(name="engine", role="single", argv=json.loads(sys.argv[3]), host=host))
        print(proc.pid, flush=True)
        time.sleep(600)
    """
)


def test_rooftop_killed_leaves_no_remote_process(sshd, tmp_path):
    """SIGKILL of rooftop itself: its ssh clients die with it (PR_SET_PDEATHSIG), the wrapper sees its
    session end and takes the engine's group down."""
    import json

    host = ssh_host(sshd, "b", "127.0.0.2", tmp_path)
    argv = [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(600)']); time.sleep(600)"]
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(host.to_dict()), str(tmp_path / "run"),
                               json.dumps(argv)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        pid = int(driver.stdout.readline())
        assert wait_until(lambda: len(group_members(pid)) == 2)  # the engine and its child
        members = group_members(pid)
        driver.kill()
        driver.wait()
        assert wait_gone(members) == [] and wait_until(lambda: wrappers() == [])
    finally:
        if driver.poll() is None:
            driver.kill()


def nothing_runs(before: set[int]) -> bool:
    return wrappers() == [] and not [p for p in wrappers() if p not in before]


def test_unreachable_host_is_one_clear_error(sshd, tmp_path):
    closed = free_port("127.0.0.3")
    spec = pd_spec(sshd, tmp_path, hosts={"a": sshd.host_table("127.0.0.1", workdir=str(tmp_path / "a")),
                                          "b": {**sshd.host_table("127.0.0.3"), "ssh_port": closed}})
    with pytest.raises(RooftopError) as info:
        with bring_up(spec, tmp_path / "run", ready_timeout_s=60):
            pass
    text = str(info.value)
    assert "cannot reach host b (" in text and "127.0.0.3" in text and "Connection refused" in text
    assert "BatchMode=yes" in text  # the fix: the command to try by hand
    assert wrappers() == []


def test_host_without_the_engine_is_one_clear_error(sshd, tmp_path):
    hosts = {"a": sshd.host_table("127.0.0.1", workdir=str(tmp_path / "a")),
             "b": sshd.host_table("127.0.0.2", workdir=str(tmp_path / "b"), python="/opt/no-engine/bin/python")}
    spec = pd_spec(sshd, tmp_path, hosts=hosts)
    with pytest.raises(RooftopError) as info:
        with bring_up(spec, tmp_path / "run", ready_timeout_s=60):
            pass
    text = str(info.value)
    assert "host b (" in text and "has no '/opt/no-engine/bin/python'" in text
    assert "[deployment.hosts.b] python" in text
    assert wrappers() == []


def test_port_taken_on_the_remote_host_is_one_clear_error(sshd, tmp_path):
    spec = pd_spec(sshd, tmp_path)
    import socket

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.2", spec.decode.port))
        squatter.listen()
        with pytest.raises(RooftopError) as info:
            with bring_up(spec, tmp_path / "run", ready_timeout_s=60):
                pass
    text = str(info.value)
    assert f"port {spec.decode.port} on host b (" in text and "not free for decode" in text
    assert "another `port`" in text
    assert wrappers() == []


def test_processes_on_hosts_get_their_run_directory_there(sshd, tmp_path):
    spec = pd_spec(sshd, tmp_path)
    procs = {p.name: p for p in build_processes(spec, tmp_path / "run")}
    assert procs["router"].host is None and procs["decode"].host.address == "127.0.0.2"
    profile_dir = procs["decode"].argv[procs["decode"].argv.index("--profile-dir") + 1]
    assert profile_dir.startswith(str(tmp_path / "host-b") + "/run-") and profile_dir.endswith("/traces/decode")
    assert procs["router"].argv[procs["router"].argv.index("--decode") + 1] == f"http://127.0.0.2:{spec.decode.port}"


def test_traces_of_every_rank_are_fetched_from_their_hosts(sshd, tmp_path):
    """A multi-node server's ranks write their traces on their own hosts; capture lists each trace directory
    over ssh, waits for the files to settle, fetches them and orders them by rank (the API server's left out)."""
    from rooftop.launch.ssh import HostFiles, SSHConnections
    from rooftop.profile.capture import _copy_new_traces, worker_traces

    since = time.time()
    node0, node1 = tmp_path / "host-a" / "traces", tmp_path / "host-b" / "traces"
    for d, names in ((node0, ["x-TP-0.trace.json.gz", "x-TP-1.trace.json.gz", "async_llm.trace.json"]),
                     (node1, ["x-TP-2.trace.json.gz", "x-TP-3.trace.json.gz", "notes.txt"])):
        d.mkdir(parents=True)
        for name in names:
            (d / name).write_bytes(name.encode() * 100)
    connections = SSHConnections(tmp_path / "logs")
    try:
        fetched = []
        for address, directory in (("127.0.0.1", node0), ("127.0.0.2", node1)):
            files = HostFiles(connections, ssh_host(sshd, address[-1], address, tmp_path))
            fetched += asyncio.run(_copy_new_traces(files, str(directory), tmp_path / "out", since, 30))
    finally:
        connections.close()
    ordered = worker_traces(fetched)
    assert [p.name for p in ordered] == [f"x-TP-{r}.trace.json.gz" for r in range(4)]
    assert all(p.parent == tmp_path / "out" and p.read_bytes() == p.name.encode() * 100 for p in ordered)


def test_a_worker_that_fails_on_its_host_takes_the_deployment_down_with_its_reason(sshd, tmp_path):
    spec = pd_spec(sshd, tmp_path, decode={"args": {"page-size": 0}})  # the engine refuses it and exits
    with pytest.raises(RooftopError) as info:
        with bring_up(spec, tmp_path / "run", ready_timeout_s=120, grace_s=2):
            pass
    text = str(info.value)
    assert text.startswith("decode on host b (") and "exited with code" in text and "page" in text
    assert wait_until(lambda: wrappers() == [] and wrappers(ssh_clients=True) == [])  # prefill on a went too


def test_rooftop_deploy_across_hosts_stops_on_sigterm(sshd, tmp_path):
    import json

    def toml(value) -> str:  # an inline TOML value (JSON's strings, numbers and arrays are TOML's)
        if isinstance(value, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {toml(v)}" for k, v in value.items()) + " }"
        return json.dumps(value) if not isinstance(value, list) else "[" + ", ".join(map(toml, value)) + "]"

    spec = pd_spec(sshd, tmp_path).model_dump(exclude_none=True, exclude_defaults=True)
    path = tmp_path / "pd-hosts.toml"
    path.write_text("[deployment]\n" + "".join(f"{json.dumps(k)} = {toml(v)}\n" for k, v in spec.items()))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "rooftop", "deploy", str(path), "--json", "--run-dir", str(run_dir),
                             "--ready-timeout", "240"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parents[2])
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.wait() is not None else ""
        ready = json.loads(line)
        hosts = {p["role"]: p.get("host") for p in ready["processes"]}
        assert hosts == {"prefill": "a", "decode": "b", "router": None}
        members = [m for p in ready["processes"] for m in group_members(p["pid"])]
        assert len(wrappers()) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0 and "stopped" in proc.stderr.read()
        assert wait_gone(members) == [] and wait_until(lambda: wrappers() == [])
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_later_run_reaps_what_a_crashed_one_left_on_another_host(sshd, tmp_path):
    """pids.json names remote groups by host, pgid and start time; reap_leftovers kills them over ssh
    (the wrapper normally has already: this is the case where it could not, e.g. it was SIGKILLed)."""
    import json

    from rooftop.launch.ssh import SSHConnections
    from rooftop.launch.supervisor import PID_FILE, _proc_stat, reap_leftovers

    host = ssh_host(sshd, "b", "127.0.0.2", tmp_path)
    connections = SSHConnections(tmp_path)
    try:
        done = connections.run(host, "setsid sleep 600 > /dev/null 2>&1 < /dev/null & echo $!")
    finally:
        connections.close()
    pgid = int(done.stdout)
    assert wait_until(lambda: group_members(pgid) == [pgid])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    entry = {"name": "decode", "role": "decode", "pid": pgid, "pgid": pgid, "start_ticks": _proc_stat(pgid)[1],
             "host": host.to_dict()}
    # and a group that is not that one any more (its id reused: the leader started at another time): left alone
    reused = {**entry, "pid": os.getpgrp(), "pgid": os.getpgrp(), "start_ticks": 1}
    (run_dir / PID_FILE).write_text(json.dumps([entry, reused]))
    assert reap_leftovers(run_dir) == [pgid]
    assert wait_gone([pgid]) == [] and not (run_dir / PID_FILE).exists()


@pytest.mark.timeout(600)
def test_a_campaign_benches_and_profiles_pd_across_hosts(sshd, tmp_path):
    """`rooftop run` with a pd lever whose prefill runs on host a and decode on host b: swept, both workers
    profiled (traces fetched from their hosts, attributed as pd/ROLE), and nothing left on either host."""
    import json

    from rooftop.campaign.store import Store

    def table(t: dict) -> str:
        return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in t.items()) + " }"

    hosts = {"a": sshd.host_table("127.0.0.1", workdir=str(tmp_path / "host-a")),
             "b": sshd.host_table("127.0.0.2", workdir=str(tmp_path / "host-b"))}
    campaign = textwrap.dedent(f"""
        [campaign]
        name = "hosts"
        goal = "pd across two hosts"
        [model]
        preset = "tiny"
        [deployment]
        engine = "embedded"
        python = {json.dumps(sys.executable)}
        args = {{ indexer-bound = "actual", context-length = 512 }}
        hosts = {{ a = {table(hosts["a"])}, b = {table(hosts["b"])} }}
        [bench]
        input_len = 8
        output_len = 8
        concurrency = [1]
        requests_per_level = 2
        repeats = 1
        warmup = 1
        timeout_s = 120
        [profile]
        enabled = true
        concurrency = 2
        steps = 3
        [[lever]]
        name = "pd"
        hypothesis = "prefill and decode on two hosts"
        topology = "pd"
        prefill = {{ host = "a", cpus = [0], port = {free_port("127.0.0.1")} }}
        decode = {{ host = "b", cpus = [1], port = {free_port("127.0.0.2")} }}
        """)
    spec = tmp_path / "c.toml"
    spec.write_text(campaign)
    out = subprocess.run([sys.executable, "-m", "rooftop", "run", str(spec), "--runs-dir", str(tmp_path / "runs")],
                         capture_output=True, text=True, timeout=500, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = Path(out.stdout.strip().splitlines()[-1])
    st = Store.open(run_dir)
    try:
        assert st.units()["main/pd/r0/profile"] == "done", st.unit_errors()
        traces = {t.variant: t for t in st.traces()}
        assert traces["pd/decode"].analysis["steps"] >= 2 and traces["pd/prefill"].analysis["role"] == "prefill"
        assert traces["pd/decode"].path.startswith("traces/pd/decode/")
    finally:
        st.close()
    inventory = json.loads(next(run_dir.glob("deployments/*/pd/r0/inventory.json")).read_text())
    assert {p["role"]: p["host"] for p in inventory["processes"]} == {"prefill": "a", "decode": "b", "router": None}
    assert wait_until(lambda: wrappers() == [] and wrappers(ssh_clients=True) == [])


def test_a_link_gone_silent_takes_the_remote_engine_down(sshd, tmp_path):
    """A connection that stays open but carries nothing (here: host a's master connection stopped, which
    carries its sessions' input; the TCP link stays up): after the heartbeat timeout the wrapper takes
    the engine down on its own. Host b's engine hears its heartbeats and runs on."""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    a, b = ssh_host(sshd, "a", "127.0.0.1", tmp_path), ssh_host(sshd, "b", "127.0.0.2", tmp_path)
    with Supervisor(tmp_path / "run", grace_s=2, heartbeat_timeout_s=3) as sup:
        quiet, chatty = sup.start_and_wait([remote_server(script, a, "quiet", "127.0.0.1"),
                                            remote_server(script, b, "chatty", "127.0.0.2")], 60)
        groups = {p.spec.name: group_members(p.pid) for p in (quiet, chatty)}
        master = sup.ssh.masters["a"][1].pid
        os.kill(master, signal.SIGSTOP)
        try:
            assert wait_gone(groups["quiet"]) == []
            assert all(alive(p) for p in groups["chatty"])
        finally:
            os.kill(master, signal.SIGCONT)
    assert wait_gone(groups["chatty"]) == [] and wait_until(lambda: wrappers() == [])


def test_the_environment_reaches_the_remote_engine_but_no_command_line(sshd, tmp_path):
    """A secret in the deployment's env goes to the wrapper over its session's stdin: the engine has it,
    no process on either side shows it in its command line."""
    import base64

    script = tmp_path / "server.py"
    script.write_text(SERVER)
    secret = "s3cret-" + os.urandom(4).hex()
    with Supervisor(tmp_path / "run", grace_s=2) as sup:
        (proc,) = sup.start_and_wait([remote_server(script, ssh_host(sshd, "b", "127.0.0.2", tmp_path), "engine",
                                                    "127.0.0.2", env={"HF_TOKEN": secret})], 60)
        assert f"HF_TOKEN={secret}".encode() in Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        needles = (secret.encode(), base64.b64encode(secret.encode())[:8])
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                assert not any(n in cmdline for n in needles), entry.name


def test_cpus_the_remote_host_lacks_are_one_clear_error(sshd, tmp_path):
    spec = pd_spec(sshd, tmp_path, decode={"cpus": "4096"})
    with pytest.raises(RooftopError) as info:
        with bring_up(spec, tmp_path / "run", ready_timeout_s=60, grace_s=2):
            pass
    text = str(info.value)
    assert text.startswith("cannot start decode on host b (") and "CPUs [4096] are not available on this host" in text
    assert "give decode `cpus` that host has" in text
    assert wait_until(lambda: wrappers() == [] and wrappers(ssh_clients=True) == [])


def test_a_tilde_workdir_is_home_relative_everywhere(sshd, tmp_path):
    """workdir = "~/..." means the ssh user's home: the engine's argv (not expanded by a shell), the wrapper's
    files and the trace listing all name the same directory (before, the engine wrote under "$HOME/~/...")."""
    import shutil
    import uuid

    from rooftop.campaign.profile_stage import process_trace_dir

    name = f".rooftop-test-{uuid.uuid4().hex[:8]}"
    home = Path(os.path.expanduser("~"))  # the sshd under test logs in as this user
    spec = DeploymentSpec.model_validate({
        "engine": "sglang", "model": "/m", "python": sys.executable,
        "hosts": {"a": sshd.host_table("127.0.0.1", workdir=f"~/{name}")},
        "single": {"host": "a", "port": 30000}})
    assert spec.hosts["a"].workdir == name
    (proc,) = build_processes(spec, tmp_path / "run")
    trace_dir = process_trace_dir(proc, tmp_path / "run")
    assert "~" not in trace_dir and trace_dir.startswith(f"{name}/run-") and trace_dir.endswith("/a/traces/single")
    assert proc.env["SGLANG_TORCH_PROFILER_DIR"] == trace_dir
    write = ("import os, sys, time; d = os.environ['SGLANG_TORCH_PROFILER_DIR']; os.makedirs(d, exist_ok=True); "
             "open(os.path.join(d, 'x-TP-0.trace.json'), 'w').write('{}'); print('wrote', flush=True); time.sleep(60)")
    proc.argv = [sys.executable, "-c", write]
    try:
        with Supervisor(tmp_path / "run", grace_s=2) as sup:
            sup.start(proc)
            assert wait_until(lambda: "wrote" in (tmp_path / "run" / "logs" / "single.log").read_text())
            listed = sup.connections().list_files(proc.host, trace_dir, 0.0)
        assert list(listed) == [str(home / trace_dir / "x-TP-0.trace.json")]
        assert not (home / "~").exists()
    finally:
        shutil.rmtree(home / name, ignore_errors=True)
    from rooftop.spec.load import deployment_from_dict

    with pytest.raises(RooftopError, match=r"hosts.a.workdir: workdir '~other/x': another user's home \(~user\) is not"):
        deployment_from_dict({"engine": "sglang", "hosts": {"a": {"workdir": "~other/x"}}}, "spec")


def test_hosts_sharing_a_home_keep_each_ranks_trace_once(sshd, tmp_path):
    """Two hosts with one home directory (NFS homes; here 127.0.0.1 and 127.0.0.2 share this machine's):
    each node gets its own run directory there; a directory listed from two hosts is fetched once; the
    traces keep their host and the rank their file names give."""
    from rooftop.campaign.profile_stage import process_trace_dir
    from rooftop.launch.ssh import HostFiles, SSHConnections
    from rooftop.profile.capture import _copy_new_traces, worker_traces
    from rooftop.profile.ranks import trace_labels

    shared = str(tmp_path / "home")
    spec = DeploymentSpec.model_validate({
        "engine": "sglang", "model": "/m", "python": sys.executable,
        "hosts": {"a": sshd.host_table("127.0.0.1", workdir=shared), "b": sshd.host_table("127.0.0.2", workdir=shared)},
        "single": {"nodes": ["a", "b"], "gpus": [0], "port": 30000}})
    procs = build_processes(spec, tmp_path / "run")
    dirs = [process_trace_dir(p, tmp_path / "run") for p in procs]
    assert [p.machine for p in procs] == ["a", "b"] and dirs[0] != dirs[1]
    assert [d.rsplit("/traces/", 1)[0].rsplit("/", 1)[1] for d in dirs] == ["a", "b"]  # one directory per node
    for rank, d in enumerate(dirs):
        Path(d).mkdir(parents=True)
        (Path(d) / f"1700000000-TP-{rank}.trace.json.gz").write_bytes(b"x" * 10)
    connections = SSHConnections(tmp_path / "logs")
    try:
        files = {name: HostFiles(connections, ssh_host(sshd, name, address, tmp_path))
                 for name, address in (("a", "127.0.0.1"), ("b", "127.0.0.2"))}
        seen: set[str] = set()
        fetched = []
        # each node's directory, and then node a's listed again from b (a shared file system shows it there too)
        for name, d in (("a", dirs[0]), ("b", dirs[1]), ("b", dirs[0])):
            fetched += asyncio.run(_copy_new_traces(files[name], d, tmp_path / "out" / name, 0.0, 30, before={},
                                                    seen=seen))
    finally:
        connections.close()
    ordered = worker_traces(fetched)
    assert [(p.parent.name, p.name) for p in ordered] == [("a", "1700000000-TP-0.trace.json.gz"),
                                                          ("b", "1700000000-TP-1.trace.json.gz")]
    assert trace_labels(ordered) == [(0, "1700000000-TP-0.trace.json.gz on a"), (1, "1700000000-TP-1.trace.json.gz on b")]


def test_remote_traces_are_new_by_listing_not_by_clock(sshd, tmp_path):
    """A host whose clock runs an hour behind writes traces with old mtimes: what the listing before the
    window did not hold is new, whatever the clocks say; what it held unchanged is not."""
    from rooftop.launch.ssh import HostFiles, SSHConnections
    from rooftop.profile.capture import _copy_new_traces

    d = tmp_path / "traces"
    d.mkdir()
    old = d / "old-TP-0.trace.json.gz"
    old.write_bytes(b"o" * 10)
    connections = SSHConnections(tmp_path / "logs")
    try:
        files = HostFiles(connections, ssh_host(sshd, "b", "127.0.0.2", tmp_path))
        before = files.list_files(str(d), 0.0)
        new = d / "new-TP-0.trace.json.gz"
        new.write_bytes(b"n" * 10)
        hour_ago = time.time() - 3600
        os.utime(new, (hour_ago, hour_ago))  # written by a host whose clock lags
        fetched = asyncio.run(_copy_new_traces(files, str(d), tmp_path / "out", time.time(), 30, before=before))
    finally:
        connections.close()
    assert [p.name for p in fetched] == ["new-TP-0.trace.json.gz"]


def test_remote_processes_are_built_for_their_run_directory(tmp_path):
    """A process on another host is built by the engine for its run directory there, not patched by string
    replacement: a local run directory with a quote (escaped inside vLLM's JSON flags) leaves no trace of it."""
    import json

    run_dir = tmp_path / 'run "q"'
    spec = DeploymentSpec.model_validate({
        "engine": "vllm", "model": "/m", "python": "/opt/vllm/bin/python", "topology": "pd",
        "hosts": {"a": {"address": "10.0.0.1", "workdir": "/scratch/r"}, "b": {"address": "10.0.0.2"}},
        "prefill": {"host": "a", "port": 8100}, "decode": {"host": "b", "port": 8200}})
    procs = {p.name: p for p in build_processes(spec, run_dir)}
    for name, base in (("prefill", "/scratch/r/"), ("decode", "rooftop-runs/")):
        proc = procs[name]
        assert proc.remote_dir.startswith(base + 'run "q"-') and proc.remote_dir.endswith("/" + proc.machine)
        words = proc.argv + list(proc.env.values())
        assert not any(str(tmp_path) in w for w in words), words
        config = json.loads(proc.argv[proc.argv.index("--profiler-config") + 1])
        assert config["torch_profiler_dir"] == f"{proc.remote_dir}/traces/{name}"


def single_on(sshd, tmp_path, name, table_extra, **role):
    """The embedded engine's single server on host `name`, reached over ssh at 127.0.0.1 (HostName)."""
    table = {k: v for k, v in sshd.host_table("127.0.0.1", workdir=str(tmp_path / "wd")).items() if k != "address"}
    table["ssh_options"] = [*table["ssh_options"], "HostName=127.0.0.1"]
    return DeploymentSpec.model_validate({
        "engine": "embedded", "model": "tiny", "python": sys.executable,
        "hosts": {name: {**table, **table_extra}}, "single": {"host": name, "port": 30123, **role}})


@pytest.mark.parametrize("address, said, fix", [
    (None, "'gpu-alias', the address single would listen on, does not resolve on host gpu-alias",
     "set [deployment.hosts.gpu-alias] address to the host's IP address"),
    ("10.254.254.254", "single would listen on 10.254.254.254, which is not an address of host gpu-alias",
     "set [deployment.hosts.gpu-alias] address to one of that host's own addresses"),
])
def test_an_address_the_host_cannot_bind_is_not_called_a_taken_port(sshd, tmp_path, address, said, fix):
    """An ssh config alias (ssh reaches it, the name does not resolve there) and an address the host lacks
    (a public IP, a typo): each its own error and fix, not "port not free"."""
    spec = single_on(sshd, tmp_path, "gpu-alias", {"address": address} if address else {})
    with pytest.raises(RooftopError) as info:
        with bring_up(spec, tmp_path / "run", ready_timeout_s=20):
            pass
    text = str(info.value)
    assert said in text and fix in text and "not free" not in text
    assert wrappers() == []


def test_the_local_router_is_checked_before_any_host_starts_a_worker(sshd, tmp_path):
    """pd with both workers on hosts: a router interpreter here without its module is an error before
    anything starts anywhere (before, both workers were started and waited for first)."""
    spec = pd_spec(sshd, tmp_path, engine="sglang", model="/m", args={},
                   hosts={"a": sshd.host_table("127.0.0.1", workdir=str(tmp_path / "a")),
                          "b": sshd.host_table("127.0.0.2", workdir=str(tmp_path / "b"))},
                   prefill={"cpus": None}, decode={"cpus": None})
    with pytest.raises(RooftopError) as info:
        with bring_up(spec, tmp_path / "run", ready_timeout_s=30):
            pass
    text = str(info.value)
    assert f"the router runs on this machine with {sys.executable}, which cannot import sglang_router" in text
    assert not (tmp_path / "run" / "logs").exists() and wrappers() == []


def test_a_wrapper_killed_on_its_host_is_not_a_lost_connection(sshd, tmp_path):
    """The wrapper SIGKILLed there (OOM killer, an admin) while the link holds: said as such; teardown
    takes the rest of the engine's group down."""
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
            "print('up', flush=True); time.sleep(300)")
    spec = ProcessSpec(name="eng", role="single", argv=[sys.executable, "-c", code],
                       host=ssh_host(sshd, "a", "127.0.0.1", tmp_path), remote_dir=str(tmp_path / "wk"))
    with Supervisor(tmp_path / "run", grace_s=1) as sup:
        proc = sup.start(spec)
        assert wait_until(lambda: len(group_members(proc.remote_pid)) == 2)
        members = group_members(proc.remote_pid)
        wrapper = int(Path(f"/proc/{proc.remote_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(wrapper, signal.SIGKILL)
        proc.popen.wait(30)
        with pytest.raises(RooftopError) as info:
            sup.check_alive()
    assert "eng on host a (" in str(info.value) and "lost its wrapper on the host, which was killed there" in str(info.value)
    assert "lost its SSH connection" not in str(info.value)
    assert wait_gone(members) == []


def test_remote_inventory_reads_the_deployment_python(sshd, tmp_path):
    """A process whose argv is not `PYTHON -m ...` (vLLM's `vllm serve`) on a host without its own python:
    its stack is read with deployment.python, not the host's python3."""
    from rooftop.deploy.bring_up import remote_inventory

    spec = ProcessSpec(name="single", role="single", argv=["/opt/vllm/bin/vllm", "serve", "/m"],
                       host=ssh_host(sshd, "a", "127.0.0.1", tmp_path))
    with Supervisor(tmp_path / "run") as sup:
        found = remote_inventory([spec], sup, sys.executable)["a"]
    assert found["executable"] == sys.executable and "pydantic" not in found.get("error", "")


def test_a_failed_start_says_what_teardown_could_not_check(sshd, tmp_path, monkeypatch):
    """A host that teardown cannot reach after a failed start is named in the error (and so by `rooftop
    deploy`), not only after Ctrl-C."""
    from rooftop.launch.ssh import SSHConnections

    def unreachable(self, host, pgid, start_ticks):
        raise RooftopError(f"cannot reach {host.describe()} over SSH: gone", "check it")

    monkeypatch.setattr(SSHConnections, "kill_group", unreachable)
    spec = pd_spec(sshd, tmp_path, decode={"args": {"page-size": 0}})  # the engine refuses it and exits
    with pytest.raises(RooftopError) as info:
        with bring_up(spec, tmp_path / "run", ready_timeout_s=120, grace_s=2):
            pass
    text = str(info.value)
    assert "teardown could not check prefill on host a (" in text and "cannot reach host a (" in text


def test_a_taken_rendezvous_port_on_a_host_is_one_clear_error(sshd, tmp_path):
    """Ports an engine listens on besides HTTP (a multi-node rank 0's --master-port, NIXL's side channel:
    engine.rendezvous_ports) are checked free on their host before anything starts."""
    import socket

    from rooftop.deploy.bring_up import check_hosts

    spec = pd_spec(sshd, tmp_path)
    specs = build_processes(spec, tmp_path / "run")
    port = free_port("127.0.0.2")
    with Supervisor(tmp_path / "run") as supervisor, socket.socket() as squatter:
        squatter.bind(("127.0.0.2", port))
        squatter.listen()
        check_hosts(specs, supervisor, "embedded", [("decode", "a", port)])  # another host's port: not b's
        with pytest.raises(RooftopError) as info:
            check_hosts(specs, supervisor, "embedded", [("decode", "b", port)])
    text = str(info.value)
    assert f"port {port} on host b (" in text and "not free for decode (its rendezvous or KV side channel)" in text
    assert wrappers() == []
