"""report.html rendered by headless Chromium: its text, its inlined plots, its sortable tables, its screenshot."""

import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).parents[1] / "campaign"))

from sample_store import populate  # noqa: E402

from rooftop.report import html  # noqa: E402
from rooftop.report.build import build_report  # noqa: E402

WIDTH, HEIGHT = 1280, 2000


class Page(HTMLParser):
    """The dumped DOM: its text, the attributes of every element, and each table's header and rows as text."""

    def __init__(self, dom: str):
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.elements: list[tuple[str, dict]] = []
        self.tables: list[dict] = []
        self._cell: list[str] | None = None
        self._skip = 0  # inside <script> or <style>
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs))
        if tag in ("script", "style"):
            self._skip += 1
        elif tag == "table":
            self.tables.append({"header": [], "sort": [], "rows": []})
        elif tag == "tr":
            self._row: list[str] = []
        elif tag in ("th", "td"):
            self._cell = []
            if tag == "th":
                self.tables[-1]["sort"].append(attrs.get("aria-sort"))

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1
        elif tag in ("th", "td") and self._cell is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr":
            table = self.tables[-1]
            if table["header"]:
                table["rows"].append(self._row)
            else:
                table["header"] = self._row

    def handle_data(self, data):
        if self._skip:
            return
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def plain(self) -> str:
        return " ".join("".join(self.text).split())

    def table(self, column: str) -> dict:
        return next(t for t in self.tables if column in t["header"])

    def column(self, column: str) -> list[str]:
        t = self.table(column)
        i = t["header"].index(column)
        return [row[i] for row in t["rows"]]


def _chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("chromium is not installed: run `make chromium` "
                    "(apt-get install -y --no-install-recommends chromium)")
    return path


def _headless(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([_chromium(), "--headless=new", "--no-sandbox", "--disable-gpu",
                          f"--user-data-dir={tmp_path / 'chromium-profile'}", *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _first_number(cell: str) -> float:
    return float(re.match(r"×?(-?\d+(?:\.\d+)?)", cell).group(1))


def test_render_inlines_known_images_and_fetches_nothing():
    text = ("# run — summary\n\nHF_TOKEN: <redacted> <img src=\"http://example.com/x.png\">\n\n"
            "![throughput](plots/throughput.png) ![gone](plots/gone.png)\n\n| a | b |\n|---|---|\n| 1 | x |\n")
    page = html.render(text, {"plots/throughput.png": b"\x89PNG-bytes"})
    assert "<title>run — summary</title>" in page
    assert 'src="data:image/png;base64,iVBORy1ieXRlcw=="' in page  # base64 of the bytes given
    assert "[image not found: plots/gone.png]" in page
    # Raw HTML in the markdown is text, not markup: nothing is fetched, nothing is lost.
    assert "&lt;redacted&gt;" in page and "&lt;img src=" in page and "<img src=\"http" not in page
    assert "<table>" in page and "<td>1</td>" in page


def test_links_written_in_the_text_stay_text():
    """A goal or hypothesis may hold markdown links: report.html shows them as written and links nowhere."""
    text = "# run\n\nGoal: see [the plan](http://evil.example/x), <https://evil.example/y> or [local](plots/a.png)\n"
    page = html.render(text, {})
    assert "href" not in page
    assert "see [the plan](http://evil.example/x), &lt;https://evil.example/y&gt; or [local](plots/a.png)" in page


def test_report_html_in_headless_chromium(tmp_path):
    populate(tmp_path).close()
    out = build_report(tmp_path)
    assert out.html == tmp_path / "report.html"
    url = out.html.as_uri()
    shot = tmp_path / "report.png"
    _headless(tmp_path, f"--screenshot={shot}", f"--window-size={WIDTH},{HEIGHT}", url)
    page = Page(_headless(tmp_path, "--dump-dom", url).stdout)

    # The text a reader sees: the finding and a level's figures from SUMMARY.md, the secret redacted.
    text = page.plain()
    summary = " ".join(out.summary.read_text().split())
    finding = ("The indexer does work sized by the allocated capacity, not by the requests' context: ops "
               "(aten::bmm, aten::mul, aten::relu, aten::sum) on dim 65536")
    assert finding in summary and finding in text
    assert "70% of the step (196.00 of 280.00 ms)" in text
    assert page.table("output tok/s [95% CI]")["rows"][1][:2] == ["4", "14.0 [12.5, 15.5]"]  # the baseline's
    assert "14.0 [12.5, 15.5]" in summary
    assert "HF_TOKEN=<redacted>" in text and "hf_abc123" not in out.html.read_text()

    # Every plot is inlined and decoded; nothing points outside the file.
    images = [attrs["src"] for tag, attrs in page.elements if tag == "img"]
    assert len(images) == len(out.plots) == 4
    assert all(src.startswith("data:image/png;base64,") for src in images)
    body = next(attrs for tag, attrs in page.elements if tag == "body")
    assert body["data-images"] == "4" and body["data-images-loaded"] == "4"
    for tag, attrs in page.elements:
        for name in ("src", "href"):
            assert not re.match(r"(https?:)?//", attrs.get(name) or ""), (tag, attrs)
    assert not any(tag == "link" for tag, _ in page.elements)

    # The screenshot is the page drawn: the requested size, mostly white with dark text, the finding's
    # yellow box from the inline CSS, and more than a handful of colours.
    with Image.open(shot) as im:
        assert im.size == (WIDTH, HEIGHT)
        pixels = np.asarray(im.convert("RGB")).reshape(-1, 3).astype(int)
    dark = (pixels.sum(axis=1) < 300).sum()
    finding_box = (pixels == (255, 248, 225)).all(axis=1).sum()
    assert dark > 0.01 * len(pixels)
    assert finding_box > 100 * 30
    assert len(np.unique(pixels, axis=0)) > 50


# Clicks the real headers the way a reader would; the dumped DOM shows the rows in their new order.
CLICKS = """<script>
function header(name) {
  return Array.from(document.querySelectorAll("thead th")).find(function (th) { return th.textContent.trim() === name; });
}
header("tok/s ratio").click(); header("tok/s ratio").click();
header("× floor [95% CI]").click();
header("finding").click();
</script>
"""


def test_tables_sort_by_clicking_a_header(tmp_path):
    populate(tmp_path).close()
    out = build_report(tmp_path)
    before = Page(out.html.read_text())
    clicked = tmp_path / "clicked.html"
    clicked.write_text(out.html.read_text().replace("</body>", CLICKS + "</body>"), encoding="utf-8")
    after = Page(_headless(tmp_path, "--dump-dom", clicked.as_uri()).stdout)

    # Two clicks: descending, by the ratio's number ("×5.00 [4.56, 5.48] faster" sorts as 5.00).
    ratios = after.column("tok/s ratio")
    assert [_first_number(r) for r in ratios] == [5.0, 4.5, 4.5, 4.2, 1.01, 1.01, 1.0, 0.99]
    assert sorted(ratios) == sorted(before.column("tok/s ratio")) and ratios != before.column("tok/s ratio")
    # The rows moved whole: the lever beside the largest ratio is context-cap at C=4.
    lever = after.table("tok/s ratio")
    assert (lever["rows"][0][0], lever["rows"][0][2]) == ("context-cap", "4")
    assert lever["sort"][lever["header"].index("tok/s ratio")] == "descending"

    # One click: ascending, as numbers (as text "140.1" would come before "28.5").
    floors = after.column("× floor [95% CI]")
    assert [_first_number(f) for f in floors] == [28.5, 31.8, 140.1, 140.9, 143.2]
    assert after.column("variant") == ["context-cap", "indexer-actual", "max-running", "baseline", "pd"]

    # Text columns sort as text.
    findings = after.column("finding")
    assert findings == sorted(before.column("finding"), key=str.casefold) != before.column("finding")
