"""Give each JSON in docs/perf written before benchmarks recorded their own provenance a top-level "provenance"
from git history, since those runs cannot be repeated.

    .venv/bin/python benchmarks/stamp_provenance.py [docs/perf]

commit_added is the commit that added the file (the oldest, renames followed); where later commits changed the
file, commit_changed is the last of them. A file that names its own commit ("commit" at the top, or in each of
its "runs") also gets that commit, resolved to its full sha, as "commit", and "dirty" where its text says.
Files that already have "provenance" are left alone; a .json.gz or a JSON whose top level is not an object
is skipped with a note. Everything else in a file is kept as it was, in the same layout.
"""

import argparse
import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTE = ("written before benchmarks recorded their own provenance: {sha} is the commit that {how} (the run was at "
        "or before it); the document that cites it gives the command")
CLEAN = ("(working tree = HEAD)",)
DIRTY = ("modified", "uncommitted")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def history(path: Path) -> tuple[str, str]:
    """(the commit that added `path`, the last commit that changed it) — the same commit for most files."""
    rel = str(path.relative_to(ROOT))
    added = git("log", "--follow", "--diff-filter=A", "--format=%H", "--", rel).splitlines()
    changed = git("log", "-1", "--format=%H", "--", rel)
    if not added or not changed:
        raise SystemExit(f"{rel}: not in git history; commit it first (or give it a provenance by hand)")
    return added[-1], changed


def own_commit(doc: dict) -> tuple[list[str], str] | None:
    """The commit text(s) the file itself carries, and where: its top-level "commit" or each of its runs'."""
    if isinstance(doc.get("commit"), str):
        return [doc["commit"]], 'its "commit"'
    runs = doc.get("runs")
    if isinstance(runs, list) and runs and all(isinstance(r, dict) and isinstance(r.get("commit"), str) for r in runs):
        return [r["commit"] for r in runs], 'its runs\' "commit"'
    return None


def from_own(texts: list[str]) -> tuple[str | None, bool | None]:
    """The full sha the texts name (None where they disagree), and dirty: True if any says so, False if all say
    clean, None where they do not say."""
    shas = {re.match(r"[0-9a-f]{7,40}", t).group(0) for t in texts if re.match(r"[0-9a-f]{7,40}", t)}
    sha = git("rev-parse", "--verify", f"{shas.pop()}^{{commit}}") if len(shas) == 1 else None
    if any(word in t for t in texts for word in DIRTY):
        return sha, True
    if all(any(word in t for word in CLEAN) for t in texts):
        return sha, False
    return sha, None


def stamp(doc: dict, path: Path) -> dict:
    """The "provenance" for one old file."""
    added, changed = history(path)
    out = {"commit_added": added}
    if changed != added:
        out["commit_changed"] = changed
        out["note"] = NOTE.format(sha="commit_changed", how="last changed this file")
    else:
        out["note"] = NOTE.format(sha="commit_added", how="added this file")
    own = own_commit(doc)
    if own:
        texts, where = own
        sha, dirty = from_own(texts)
        if sha:
            out = {"commit": sha, "dirty": dirty, **out}
        named = ", ".join(sorted(set(texts)))
        out["note"] = (f"commit is the one this file names in {where} ({named}); " if sha else
                       f"this file names different commits in {where} ({named}); ") + out["note"]
    return out


def layout(text: str, doc: dict) -> dict | None:
    """json.dumps arguments that write `doc` back exactly as `text` was written, or None."""
    m = re.match(r"[\[{]\n( *)", text)
    indents = [len(m.group(1))] if m else [None]
    for indent in indents:
        for separators in (None, (",", ":")):
            for ensure_ascii in (True, False):
                kw = {"indent": indent, "separators": separators, "ensure_ascii": ensure_ascii}
                if json.dumps(doc, **kw) == text.rstrip("\n"):
                    return kw
    return None


def stamped_text(text: str, doc: dict, provenance: dict) -> str:
    """`text` with "provenance" first: dumped again in the file's own layout, or, for a layout json.dumps cannot
    write (rows laid out by hand), inserted after the opening brace as one line."""
    kw = layout(text, doc)
    if kw is not None:
        return json.dumps({"provenance": provenance, **doc}, **kw) + ("\n" if text.endswith("\n") else "")
    out = text.replace("{", '{"provenance":' + json.dumps(provenance, separators=(",", ":")) + ",\n", 1)
    assert json.loads(out) == {"provenance": provenance, **doc}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", type=Path, default=ROOT / "docs" / "perf")
    folder = ap.parse_args().folder.resolve()
    stamped = 0
    for path in sorted(folder.glob("*.json.gz")):
        print(f"skip {path.name}: compressed (a trace, not a result)")
    for path in sorted(folder.glob("*.json")):
        text = path.read_text()
        doc = json.loads(text)
        if not isinstance(doc, dict):
            print(f"skip {path.name}: its top level is a {type(doc).__name__}, not an object")
            continue
        if "provenance" in doc:
            continue
        path.write_text(stamped_text(text, doc, stamp(doc, path)))
        stamped += 1
    print(f"stamped {stamped} files in {folder}")


if __name__ == "__main__":
    main()
