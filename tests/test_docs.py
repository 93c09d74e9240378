"""The documents a user reads point at things that exist: the README stays inside the repository, every
module docs/architecture.md names is a file of the code, and every JSON a document cites is a file kept."""

import fnmatch
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_links_stay_inside_the_repository():
    readme = (ROOT / "README.md").read_text()
    assert "../shared" not in readme and "DESIGN.md" not in readme
    for target in re.findall(r"\]\(([^)#]+)\)", readme):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_every_module_the_architecture_page_names_exists():
    text = (ROOT / "docs" / "architecture.md").read_text()
    files = {p.name for p in (ROOT / "rooftop").rglob("*.py")} | {p.name for p in (ROOT / "tests").rglob("*.py")} \
        | {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    named = set(re.findall(r"\b([a-z_][a-z0-9_]*\.py)\b", text))
    assert len(named) > 40  # the page walks through the packages module by module
    assert sorted(named - files) == []
    for package in re.findall(r"`rooftop/([a-z_]+)/`", text):
        assert (ROOT / "rooftop" / package / "__init__.py").is_file(), package


# --- every JSON a document cites is a file ------------------------------------------------------------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "perf").glob("*.md")),
        *sorted((ROOT / "docs" / "examples").glob("*/README.md"))]
# A token ending in .json or .json.gz: `{a,b}` alternatives are expanded, a leading "…" stands for the part of
# the name the text left out (any kept file ending in the rest), and a glob must match at least one file.
CITED_JSON = re.compile(r"(?:[\w.~$/…*+-]|\{[^{}\s]*\})+\.json(?:\.gz)?(?![\w.])")
# Names that are not citations of a kept file, each with why.
NOT_KEPT_FILES = {
    "config.json": "an HF model's config as a concept (`--model-config config.json`) or what `model init` writes",
    "summary.json": "what `rooftop bench --out` writes",
    "results.json": "what a campaign run writes (the examples keep theirs, cited by directory)",
    "timeline.json.gz": "what `rooftop bench --out` writes beside requests.jsonl once server spans joined",
    "inventory.json": "what a deployment writes into its run directory",
    "traces/baseline/rooftop-1796151608-single.json.gz":
        "the H200 demo's baseline trace, in its command line; its README says the traces were left out",
    "traces/baseline-eager-map/rooftop-1796151608-single.json.gz": "the same run's eager map, left out as well",
}
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*\.json(?:\.gz)?")  # COMPILED.json.gz, SMALL.json: a name the reader picks
# where a recorded command wrote on the machine that ran it (the kept copy is cited by its own name)
WRITTEN_BY_A_COMMAND = re.compile(r"(?:--out[ =]|--trace[ =])$")


def _alternatives(token: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    return [name for part in m.group(1).split(",") for name in _alternatives(token[:m.start()] + part + token[m.end():])]


def _is_file(name: str, doc_dir: Path) -> bool:
    bases = [doc_dir, ROOT, ROOT / "docs" / "perf"]
    if name.startswith("…"):
        pattern = "*" + name[1:]
        return any(fnmatch.fnmatch(p.name, pattern) for base in bases for p in base.iterdir())
    if any(c in name for c in "*?["):
        return any(any(base.glob(name)) for base in bases)
    return any((base / name).is_file() for base in bases)


def _in_history(commit: str, path: str) -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}:{path}"], capture_output=True).returncode == 0


def dangling_json(text: str, doc_dir: Path) -> list[str]:
    """The JSON names in `text` (a document in `doc_dir`) that name no file: not beside the document, not
    from the repository's root, not in docs/perf/, and not `COMMIT:path` in the history."""
    out = []
    for m in CITED_JSON.finditer(text):
        token, before = m.group(0), text[:m.start()]
        if (token in NOT_KEPT_FILES or token.rsplit("/", 1)[-1] in NOT_KEPT_FILES or PLACEHOLDER.fullmatch(token)
                or token.startswith(("$OUT/", "/tmp/", "//")) or WRITTEN_BY_A_COMMAND.search(before)):
            continue
        commit = re.search(r"\b([0-9a-f]{7,40}):$", before)
        for name in _alternatives(token):
            if not (_in_history(commit.group(1), name) if commit else _is_file(name, doc_dir)):
                out.append(name)
    return out


def test_every_json_a_document_cites_exists():
    assert len(DOCS) > 15
    missing = [f"{doc.relative_to(ROOT)}: {name}" for doc in DOCS for name in dangling_json(doc.read_text(), doc.parent)]
    assert missing == []


def test_a_made_up_json_name_is_caught():
    perf = ROOT / "docs" / "perf"
    text = ("The step took 2.49 ms (`engine-decode-h200-288-e697160-1.json`, `…-e697160-2.json`); C=64 in "
            "`engine-serve-h200-made-up-c64.json`, `…-nowhere-c1.json`, `decode-{ab-h200-2047993,xx-h200}.json`, "
            "`engine-decode-h200-288-zz*.json` and `0123abc:docs/perf/made-up.json`; written with `--out F.json` "
            "and `--out /tmp/x/made-up.json`, from the model's `config.json`.")
    assert dangling_json(text, perf) == ["engine-serve-h200-made-up-c64.json", "…-nowhere-c1.json", "decode-xx-h200.json",
                                         "engine-decode-h200-288-zz*.json", "docs/perf/made-up.json"]
