"""Documents rebuilt from a real store alone: sections, numbers with intervals, plots, JSON, redaction."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "campaign"))

from sample_store import populate  # noqa: E402

from rooftop.report import plan_md, summary_md  # noqa: E402
from rooftop.report.build import build_report  # noqa: E402


def _sections(text: str) -> list[str]:
    return [line[3:] for line in text.splitlines() if line.startswith("## ")]


def test_full_run_documents(tmp_path):
    populate(tmp_path).close()
    out = build_report(tmp_path)
    summary = out.summary.read_text()
    plan = out.plan.read_text()
    assert _sections(summary) == summary_md.SECTIONS
    assert _sections(plan) == plan_md.SECTIONS
    # The finding names the capacity-bound indexer, its profile share, the lever's gain with its interval,
    # and whether PD helped, with intervals.
    finding = summary.split("## Finding")[1].split("## Launch scripts")[0]
    assert "**Capacity-bound indexer.**" in finding and "70% of the step" in finding
    assert "lever context-cap (context-length = 4096) measured output tok/s 5." in finding
    assert "**PD:**" in finding and "did not help" in finding and "at C=1" in finding and "at C=4" in finding
    # Secrets are redacted in every document.
    for text in (summary, plan, out.results.read_text()):
        assert "hf_abc123" not in text
    assert "HF_TOKEN=<redacted>" in summary
    for name in ("throughput", "latency", "roofline_gap", "profile"):
        assert out.plots[name].read_bytes()[:4] == b"\x89PNG"
    doc = json.loads(out.results.read_text())
    assert doc["complete"] is True and doc["remaining_units"] == []
    assert doc["findings"][0]["title"] == "Capacity-bound indexer"
    cap = next(lv for lv in doc["levers"] if lv["name"] == "context-cap")
    tok4 = next(e for e in cap["effects"] if e["metric"] == "output_tok_s" and e["concurrency"] == 4)
    assert tok4["verdict"] == "faster" and tok4["ratio_low"] > 4.5
    assert "- nothing: the campaign is complete" in plan
    # a complete run carries no banner: it starts with its goal and its finding
    assert "Incomplete run" not in summary and "Incomplete run" not in plan
    assert summary.startswith("# sample — summary\n\nGoal: ") and "> **Finding:** " in summary


def test_interrupted_run_has_the_same_sections_and_lists_what_is_left(tmp_path):
    populate(tmp_path, stop_after_blocks=7).close()  # killed in the second round
    out = build_report(tmp_path)
    summary, plan = out.summary.read_text(), out.plan.read_text()
    assert _sections(summary) == summary_md.SECTIONS
    assert _sections(plan) == plan_md.SECTIONS
    doc = json.loads(out.results.read_text())
    assert doc["complete"] is False
    # 5 variants x 3 repeats; 7 blocks done -> 8 sweeps left (plus none of the r0 quality/profile units).
    assert sum(k.endswith("/sweep") for k in doc["remaining_units"]) == 8
    assert f"rooftop run --resume {tmp_path}" in plan
    assert "not started: main/baseline/r2/sweep" in plan
    # Both documents say so at the top: 7 of 15 bring-ups, the 8 that never started, and how to resume.
    not_run = ["main/context-cap/r1", "main/pd/r1", "main/baseline/r1", "main/baseline/r2", "main/pd/r2",
               "main/context-cap/r2", "main/indexer-actual/r2", "main/max-running/r2"]
    for top in (summary.split("Goal:")[0], plan.split("## Goal")[0]):
        assert "> **Incomplete run: 7 of 15 planned bring-ups ran to their end.**" in top
        assert f"> - Not run: {', '.join(not_run)}\n" in top
        assert f"`rooftop run --resume {tmp_path}`" in top
    assert "> **Finding (from 7 of 15 bring-ups):** " in summary
    assert doc["bring_ups"]["planned"] == 15 and doc["bring_ups"]["done"] == 7
    assert [(b["name"], b["state"]) for b in doc["bring_ups"]["not_done"]] == [(k, "not run") for k in not_run]


def test_report_command(tmp_path):
    import subprocess

    populate(tmp_path / "run").close()
    out = subprocess.run([sys.executable, "-m", "rooftop", "report", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    printed = out.stdout.split()
    assert printed[:3] == [str(tmp_path / "run" / n) for n in ("SUMMARY.md", "PLAN.md", "results.json")]
    bad = subprocess.run([sys.executable, "-m", "rooftop", "report", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no store.sqlite" in bad.stderr and "Traceback" not in bad.stderr


def test_failed_pd_is_reported_not_hidden(tmp_path):
    populate(tmp_path, pd_fails=True).close()
    out = build_report(tmp_path)
    summary, plan = out.summary.read_text(), out.plan.read_text()
    assert "**PD:** PD (lever pd) could not be compared with baseline: deploy r0: prefill exited with code 2" \
        in summary
    assert "- pd: deploy r0: prefill exited with code 2 while starting; last lines of logs/prefill.log: … " \
           "error: --role prefill: not built yet" in summary
    blocked = plan.split("### Blocked")[1].split("## Key decisions")[0]
    assert blocked.count("- main/pd/r") == 3 and "\n    error" not in blocked
    assert "Get PD measured" in plan
    # the top of both documents says which bring-ups failed, where and why
    failed = ("> - Failed: " + "; ".join(f"main/pd/r{r} at deploy: prefill exited with code 2 while starting; last "
                                         "lines of logs/prefill.log: … error: --role prefill: not built yet"
                                         for r in range(3)) + "\n")
    assert failed in summary.split("Goal:")[0] and failed in plan.split("## Goal")[0]
    assert "> **Incomplete run: 12 of 15 planned bring-ups ran to their end.**" in summary
    # The rest of the story stands: the capacity-bound indexer is still the top finding.
    assert "**Capacity-bound indexer.**" in summary


def test_stack_cuts_kilobyte_values_but_keeps_short_ones():
    from rooftop.report.stack_md import env_line

    line = env_line({"NVIDIA_REQUIRE_CUDA": "cuda>=13.0 " + "brand=tesla,driver>=535 " * 60,
                     "CUDA_VERSION": "13.0.2"})
    long = line.split("NVIDIA_REQUIRE_CUDA=")[1]
    assert len(long) < 260 and "characters; whole in results.json" in long
    assert "CUDA_VERSION=13.0.2," in line


def test_every_compared_figure_carries_its_interval(tmp_path):
    populate(tmp_path).close()
    summary = build_report(tmp_path).summary.read_text()
    results = summary.split("## Single-node results")[1].split("## PD results")[0]
    rows = [line.split(" | ") for line in results.splitlines() if line.startswith("| 4 | ")]
    assert rows
    for cells in rows:  # C, tok/s, TTFT, TPOT, repeats, valid: every figure "mean [low, high]"
        assert all("[" in c and "]" in c for c in cells[1:4]), cells
    roof = summary.split("## Roofline")[1].split("## Profile")[0]
    row = next(line for line in roof.splitlines() if line.startswith("| baseline |"))
    floor, measured, times = row.split(" | ")[5:8]
    assert floor.endswith("(bound)") and "[" in measured and "[" in times.rstrip(" |")


def test_the_confidence_level_is_the_campaigns(tmp_path):
    populate(tmp_path, confidence=0.9).close()
    out = build_report(tmp_path)
    summary, plan = out.summary.read_text(), out.plan.read_text()
    assert "[90% CI]" in summary and "Intervals are 90% bootstrap" in summary
    assert "intervals are 90% bootstrap" in plan
    assert "95%" not in summary and "95%" not in plan


def test_a_placement_that_does_not_match_is_said(tmp_path):
    store = populate(tmp_path)
    dep = next(d for d in store.deployments() if d.variant == "pd")
    dep.placement[1]["tree"]["999"] = "0-1"  # a decode child left on both CPUs
    store.put_deployment(dep.variant, dep.repeat, dep.levers, dep.spec, dep.inventory, dep.launch_script,
                         dep.placement, dep.url)
    store.close()
    summary = build_report(tmp_path).summary.read_text()
    assert "**Placement mismatch** in 1 process(es): decode (pid 200) allowed on CPUs 0-1, expected 1." in summary
