"""The documents a user reads point at things that exist: the README stays inside the repository, and
every module docs/architecture.md names is a file of the code."""

import re
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
