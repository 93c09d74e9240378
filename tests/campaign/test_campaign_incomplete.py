"""A campaign stopped part-way: its documents say at the top which bring-ups did not run, and how to resume."""

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rooftop.report.build import build_report

CAMPAIGN = """
[campaign]
name = "stopped"
goal = "a stopped campaign says so"
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
repeats = 3
warmup = 1
timeout_s = 120
[profile]
enabled = false
"""


def _units(store: Path) -> dict[str, str]:
    if not store.is_file():
        return {}
    db = sqlite3.connect(store, timeout=10)
    try:
        return dict(db.execute("SELECT key, status FROM units"))
    except sqlite3.OperationalError:
        return {}
    finally:
        db.close()


@pytest.mark.timeout(600)
def test_a_campaign_stopped_by_sigterm_says_which_bring_ups_did_not_run_and_how_to_resume(tmp_path):
    spec = tmp_path / "c.toml"
    spec.write_text(CAMPAIGN)
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "rooftop", "run", str(spec), "--runs-dir", str(runs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    store = None
    while time.monotonic() < deadline:
        found = list(runs.glob("stopped-*/store.sqlite")) if runs.exists() else []
        if found and _units(found[0]).get("main/baseline/r0/sweep") == "done":
            store = found[0]
            proc.send_signal(signal.SIGTERM)
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the campaign did not finish its first sweep in time")
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    run_dir = store.parent

    # What the store says, read here on its own: the bring-ups that measured (their sweep is done: resume
    # skips them), and those that did not.
    units = _units(store)
    done = [r for r in range(3) if units.get(f"main/baseline/r{r}/sweep") == "done"]
    missing = [f"main/baseline/r{r}" for r in range(3) if r not in done]
    assert missing, "SIGTERM came after the last bring-up"

    out = build_report(run_dir)
    summary, plan = out.summary.read_text(), out.plan.read_text()
    top = summary.split("Goal:")[0]  # the banner stands above everything else
    assert f"> **Incomplete run: {len(done)} of 3 planned bring-ups ran to their end.**" in top
    for key in missing:
        assert key in top
    for r in done:
        assert f"main/baseline/r{r}" not in top
    assert f"`rooftop run --resume {run_dir}`" in top
    # the finding says what it rests on
    assert f"> **Finding (from {len(done)} of 3 bring-ups):**" in summary or "_Not enough evidence" in summary
    assert f"> **Incomplete run: {len(done)} of 3 planned bring-ups" in plan.split("## Goal")[0]
    doc = json.loads(out.results.read_text())
    assert doc["complete"] is False and doc["bring_ups"]["planned"] == 3 and doc["bring_ups"]["done"] == len(done)
    assert [b["name"] for b in doc["bring_ups"]["not_done"]] == missing
