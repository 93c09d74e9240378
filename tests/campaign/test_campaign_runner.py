"""The runner against the real embedded engine: killed mid-campaign, resumed without redoing finished work."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rooftop.campaign.store import Store
from rooftop.report import plan_md, summary_md

CAMPAIGN = """
[campaign]
name = "resume"
goal = "a killed campaign resumes"
[model]
preset = "tiny"
[deployment]
engine = "embedded"
args = { indexer-bound = "actual", context-length = 512 }
[bench]
input_len = 8
output_len = 4
concurrency = [1]
requests_per_level = 2
repeats = 2
warmup = 1
timeout_s = 120
[profile]
enabled = false
[slo]
e2el_ms = 600000
"""


def _units(store_path: Path) -> dict[str, str]:
    if not store_path.is_file():
        return {}
    db = sqlite3.connect(store_path, timeout=10)
    try:
        return dict(db.execute("SELECT key, status FROM units"))
    except sqlite3.OperationalError:
        return {}
    finally:
        db.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0


def _run_and_kill(tmp_path: Path, campaign: str, name: str, ready, poll_s: float) -> Path:
    """Start `rooftop run` on `campaign`, SIGKILL it as soon as ready(store path) holds; its run directory."""
    spec = tmp_path / "c.toml"
    spec.write_text(campaign)
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "rooftop", "run", str(spec), "--runs-dir", str(runs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        found = list(runs.glob(f"{name}-*/store.sqlite")) if runs.exists() else []
        if found and ready(found[0]):
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            return found[0].parent
        assert proc.poll() is None, proc.communicate()
        time.sleep(poll_s)
    proc.kill()
    pytest.fail(f"{name}: the campaign did not get there in time")


def _run_campaign(tmp_path: Path, campaign: str) -> Path:
    """`rooftop run` on `campaign` to its end; its run directory (the last line it prints)."""
    spec = tmp_path / "c.toml"
    spec.write_text(campaign)
    out = subprocess.run([sys.executable, "-m", "rooftop", "run", str(spec), "--runs-dir", str(tmp_path / "runs")],
                         capture_output=True, text=True, timeout=500)
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(600)
def test_killed_campaign_resumes_without_repeating_finished_work(tmp_path):
    run_dir = _run_and_kill(tmp_path, CAMPAIGN, "resume",
                            lambda store: _units(store).get("main/baseline/r0/sweep") == "done", poll_s=0.5)

    st = Store.open(run_dir)
    first = {(r.variant, r.repeat): r for r in st.levels()}
    deployed_pids = [p["pid"] for d in st.deployments() for p in d.placement]
    before = dict(st.db.execute("SELECT key, finished_utc FROM units WHERE status = 'done'"))
    st.close()
    assert ("baseline", 0) in first and ("baseline", 1) not in first
    # The engine dies with rooftop (no orphans), so resume starts clean: waited for, not given a time.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(_alive(p) for p in deployed_pids):
        time.sleep(0.1)
    assert not [p for p in deployed_pids if _alive(p)]

    out = subprocess.run([sys.executable, "-m", "rooftop", "run", "--resume", str(run_dir)],
                         capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(run_dir)

    st = Store.open(run_dir)
    units = st.units()
    assert units["main/baseline/r0/sweep"] == "done" and units["main/baseline/r1/sweep"] == "done"
    after = dict(st.db.execute("SELECT key, finished_utc FROM units WHERE status = 'done'"))
    # Nothing finished before the kill was run again: same finish times, and r0 was not redeployed.
    for key in before:
        assert after[key] == before[key], key
    assert [d.repeat for d in st.deployments()] == [0, 1]
    levels = st.levels("baseline")
    assert [r.repeat for r in levels] == [0, 1]
    assert levels[0].summary == first[("baseline", 0)].summary
    # The engine's own step times around each level: 2 requests x 3 decode steps (4 tokens, the
    # first from prefill) at C=1, each step timed by the engine.
    for row in levels:
        steps = row.summary["engine_steps"]
        assert steps["decode"]["steps"] == 6 and steps["prefill"]["steps"] == 2
        assert row.summary["engine_decode_step_ms"] > 0
        assert row.summary["engine_decode_step_ms"] == pytest.approx(steps["decode"]["ms_per_step"], abs=1e-4)
        # [slo]: every request of this tiny model ends well within 10 minutes
        assert row.summary["slo_met"] == 2 and row.summary["slo_attainment"]["mean"] == 1.0
        assert row.summary["slo_bounds"] == {"e2el": 1.0}
        assert row.summary["goodput_req_s"]["mean"] == pytest.approx(row.summary["request_s"]["mean"], rel=1e-9)
    st.close()
    summary = (run_dir / "SUMMARY.md").read_text()
    plan = (run_dir / "PLAN.md").read_text()
    assert [line[3:] for line in summary.splitlines() if line.startswith("## ")] == summary_md.SECTIONS
    assert [line[3:] for line in plan.splitlines() if line.startswith("## ")] == plan_md.SECTIONS
    assert "| 1 | " in summary and "| 2 | yes |" in summary  # C=1 row from both repeats
    assert ("SLO: E2E latency ≤ 600000 ms for 90% of requests; baseline C=1 or more [1, not reached]."
            in summary)
    assert "| 100 (no interval) | 2 | yes |" in summary  # SLO met % (both repeats 100%), repeats, valid
    assert summary.count("GPU telemetry off: ") == 1 and "J/tok" not in summary  # CI has no GPU: said once
    assert "GPU telemetry off: " in out.stderr
    assert "the campaign is complete" in plan
    # killed, then resumed to its end: complete, so neither document carries the incomplete-run banner
    assert "Incomplete run" not in summary and "Incomplete run" not in plan and "--resume" not in summary


MID_SWEEP = CAMPAIGN.replace('name = "resume"', 'name = "midsweep"').replace(
    "concurrency = [1]", "concurrency = [1, 2]").replace("repeats = 2", "repeats = 1").replace(
    "output_len = 4", "output_len = 24").replace("requests_per_level = 2", "requests_per_level = 4")


@pytest.mark.timeout(600)
def test_a_campaign_killed_mid_sweep_resumes_at_the_first_unfinished_level(tmp_path):
    """Each level lands in the store as it ends: SIGKILL between two levels, resume, and the level that
    had ended is neither measured again nor lost."""
    def a_level_is_stored(store: Path) -> bool:
        db = sqlite3.connect(store, timeout=10)
        try:
            return bool(db.execute("SELECT concurrency FROM bench_levels").fetchall())
        except sqlite3.OperationalError:
            return False
        finally:
            db.close()

    run_dir = _run_and_kill(tmp_path, MID_SWEEP, "midsweep", a_level_is_stored, poll_s=0.05)
    store_path = run_dir / "store.sqlite"

    st = Store.open(run_dir)
    assert [r.concurrency for r in st.levels("baseline")] == [1], "the kill came after the second level"
    assert _units(store_path)["main/baseline/r0/sweep"] == "running"
    assert _units(store_path)["main/baseline/r0/warmup"] == "done"  # the warm-up ran and said so
    first = st.db.execute("SELECT measured_utc, summary_json FROM bench_levels WHERE concurrency = 1").fetchone()
    first_ids = [r[0] for r in st.db.execute("SELECT id FROM requests WHERE concurrency = 1 ORDER BY id")]
    assert len(first_ids) == 4  # the level's requests were stored with it
    st.close()

    out = subprocess.run([sys.executable, "-m", "rooftop", "run", "--resume", str(run_dir)],
                         capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr
    st = Store.open(run_dir)
    assert st.units()["main/baseline/r0/sweep"] == "done"
    assert [r.concurrency for r in st.levels("baseline")] == [1, 2]
    again = st.db.execute("SELECT measured_utc, summary_json FROM bench_levels WHERE concurrency = 1").fetchone()
    assert again == first  # not measured again
    assert [r[0] for r in st.db.execute("SELECT id FROM requests WHERE concurrency = 1 ORDER BY id")] == first_ids
    assert len(st.requests("baseline", 0, 2)) == 4
    st.close()


NO_PROFILER = CAMPAIGN.replace('name = "resume"', 'name = "noprofiler"').replace(
    'args = { indexer-bound = "actual", context-length = 512 }',
    'args = { indexer-bound = "actual", context-length = 512, profile-dir = "" }').replace(
    "repeats = 2", "repeats = 1").replace("enabled = false", "enabled = true\nconcurrency = 1\nsteps = 2")


@pytest.mark.timeout(600)
def test_a_failed_profile_is_said_and_the_roofline_still_computed(tmp_path):
    """The engine refuses /start_profile (no profiler directory, as vLLM without --profiler-config):
    the profile unit fails with the engine's answer, SUMMARY says so where the profile would be, and
    the roofline, which needs no profile, is there."""
    run_dir = _run_campaign(tmp_path, NO_PROFILER)
    st = Store.open(run_dir)
    assert st.units()["main/baseline/r0/profile"] == "failed"
    assert st.analysis("baseline", "roofline")["floor_ms"] > 0
    st.close()
    summary = (run_dir / "SUMMARY.md").read_text()
    prof = summary.split("## Profile")[1].split("## Finding")[0]
    assert "_No profile was captured:_" in prof
    assert "- baseline: profile r0: POST http://127.0.0.1:" in prof and "profiling needs a directory" in prof
    roof = summary.split("## Roofline")[1].split("## Profile")[0]
    assert "| baseline |" in roof and "No roofline" not in roof


PD_PROFILED = CAMPAIGN.replace('name = "resume"', 'name = "pdprofile"').replace(
    "repeats = 2", "repeats = 1").replace("enabled = false", "enabled = true\nconcurrency = 2\nsteps = 3").replace(
    "output_len = 4", "output_len = 8") + """
[[lever]]
name = "pd"
hypothesis = "prefill and decode apart"
topology = "pd"
prefill = { cpus = [0] }
decode = { cpus = [1] }
"""


@pytest.mark.timeout(600)
def test_pd_is_profiled_per_role(tmp_path):
    """A pd variant is loaded through its router while both workers are profiled; each role's trace is
    attributed and stored as pd/ROLE, and SUMMARY shows both."""
    run_dir = _run_campaign(tmp_path, PD_PROFILED)
    st = Store.open(run_dir)
    assert st.units()["main/pd/r0/profile"] == "done", st.unit_errors()
    traces = {t.variant: t for t in st.traces()}
    assert {"baseline", "pd/decode", "pd/prefill"} <= set(traces)
    decode = traces["pd/decode"].analysis
    assert decode["role"] == "decode" and decode["steps"] >= 2
    assert {"attention", "moe"} <= {c["name"] for c in decode["components"]}
    assert traces["pd/decode"].path.startswith("traces/pd/decode/")
    assert st.analysis("pd", "profile_skipped") is None
    st.close()
    prof = (run_dir / "SUMMARY.md").read_text().split("## Profile")[1].split("## Finding")[0]
    assert "**pd/decode**" in prof and "**pd/prefill**" in prof


KEYED = CAMPAIGN.replace('name = "resume"', 'name = "keyed"').replace(
    'args = { indexer-bound = "actual", context-length = 512 }',
    'args = { indexer-bound = "actual", context-length = 512, api-key = "sk-campaign-test-7" }').replace(
    "repeats = 2", "repeats = 1").replace("enabled = false", "enabled = true\nconcurrency = 1\nsteps = 2") + """
[[lever]]
name = "pd"
hypothesis = "prefill and decode apart"
topology = "pd"
quality_check = true
prefill = { cpus = [0] }
decode = { cpus = [1] }
"""


@pytest.mark.timeout(600)
def test_a_deployment_with_an_api_key_is_measured_with_it(tmp_path):
    """The deployment's api-key arg starts every server (and the pd router) with it, and the campaign
    sends it with the sweep, the quality prompts and the profile's load: every unit done, every request
    answered."""
    run_dir = _run_campaign(tmp_path, KEYED)
    st = Store.open(run_dir)
    units = st.units()
    for variant in ("baseline", "pd"):
        for stage in ("sweep", "quality", "profile"):
            assert units[f"main/{variant}/r0/{stage}"] == "done", (variant, stage, st.unit_errors())
    levels = st.levels("pd") + st.levels("baseline")
    assert levels and all(lv.summary["failed"] == 0 and lv.summary["completed"] > 0 for lv in levels)
    st.close()
    docs = [p for p in run_dir.rglob("*") if p.suffix in (".md", ".json", ".html", ".sh")]
    assert docs and not [p for p in docs if "sk-campaign-test-7" in p.read_text(errors="replace")]
