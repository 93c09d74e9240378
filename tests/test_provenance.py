"""The provenance every result carries: a real commit and dirty flag from a real git, null outside a checkout,
and every JSON in docs/perf traceable to a commit."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from rooftop.provenance import COMMIT_ENV, provenance

ROOT = Path(__file__).resolve().parents[1]
SHA = re.compile(r"[0-9a-f]{40}")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout.strip()


def test_a_checkout_gives_its_head_and_whether_tracked_files_changed(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "commit", "-q", "-m", "first")
    head = git(tmp_path, "rev-parse", "HEAD")

    clean = provenance(["python3", "bench.py"], repo=tmp_path)
    assert (clean["commit"], clean["dirty"]) == (head, False)
    assert "note" not in clean

    (tmp_path / "new.txt").write_text("untracked\n")  # untracked files are not the code that ran
    assert provenance([], repo=tmp_path)["dirty"] is False
    (tmp_path / "a.txt").write_text("two\n")
    assert provenance([], repo=tmp_path)["dirty"] is True


def test_outside_a_checkout_the_commit_is_null_with_why_unless_the_caller_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    monkeypatch.delenv(COMMIT_ENV, raising=False)
    bare = provenance([], repo=tmp_path)
    assert (bare["commit"], bare["dirty"]) == (None, None)
    assert "not a git repository" in bare["note"] and COMMIT_ENV in bare["note"]

    monkeypatch.setenv(COMMIT_ENV, "0791955")
    named = provenance([], repo=tmp_path)
    assert (named["commit"], named["dirty"]) == ("0791955", None)
    assert COMMIT_ENV in named["note"]

    gone = provenance([], repo=tmp_path / "missing")
    assert gone["commit"] == "0791955" and "is not a folder" in gone["note"]


def test_the_command_is_shell_quoted_and_its_secrets_redacted():
    got = provenance(["rooftop", "bench", "--api-key", "sk-live", "--dataset", "my prompts.jsonl"])
    assert shlex.split(got["command"]) == ["rooftop", "bench", "--api-key", "<redacted>", "--dataset",
                                           "my prompts.jsonl"]


def test_by_default_the_command_is_this_process_and_torch_is_not_imported():
    code = ("import json, sys; from rooftop.provenance import provenance; "
            "p = provenance(); print(json.dumps([p, 'torch' in sys.modules]))")
    p, torch_loaded = json.loads(subprocess.run([sys.executable, "-c", code, "--flag"], cwd=ROOT, check=True,
                                                capture_output=True, text=True).stdout)
    assert shlex.split(p["command"])[-1] == "--flag" and shlex.split(p["command"])[0] == sys.executable
    assert SHA.fullmatch(p["commit"]) and isinstance(p["dirty"], bool)  # the suite runs in a checkout
    assert not torch_loaded and "gpu" not in p["machine"]
    assert p["machine"]["cpu_count"] >= 1 and p["machine"]["cpu_model"]


def test_every_json_in_docs_perf_names_a_commit_git_knows():
    missing, shas = [], {}
    for path in sorted((ROOT / "docs" / "perf").glob("*.json")):
        doc = json.loads(path.read_text())
        stamp = (doc.get("provenance") if isinstance(doc, dict) else None) or {}
        sha = stamp.get("commit") or stamp.get("commit_added")
        if not (isinstance(sha, str) and SHA.fullmatch(sha)):
            missing.append(path.name)
        else:
            shas[path.name] = sha
    assert not missing, (f"{len(missing)} files in docs/perf without provenance.commit (a full sha): "
                         f"{missing[:10]}; write them through rooftop.provenance, or run "
                         "benchmarks/stamp_provenance.py for old ones")
    known = subprocess.run(["git", "cat-file", "--batch-check=%(objecttype)"], cwd=ROOT, check=True,
                           input="".join(f"{s}\n" for s in shas.values()), capture_output=True, text=True)
    unknown = [name for name, kind in zip(shas, known.stdout.splitlines(), strict=True) if kind != "commit"]
    assert not unknown, f"provenance names a commit this repository does not have: {unknown[:10]}"


def test_every_benchmark_that_writes_json_stamps_it():
    """A grep-level check: a script under benchmarks/ that dumps JSON calls provenance() (or writes through
    kernels_gpu.write_result, which does)."""
    writes = re.compile(r"json\.dump\(|write_text\(json\.dumps")
    unstamped = [p.name for p in sorted((ROOT / "benchmarks").glob("*.py"))
                 if writes.search(p.read_text()) and "provenance(" not in p.read_text()]
    assert not unstamped, f"benchmarks that write JSON without rooftop.provenance: {unstamped}"
