"""report.html: SUMMARY.md as one self-contained page, plots inlined, tables sortable by a click."""

from __future__ import annotations

import base64
import mimetypes

from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml

# Everything the page needs is in the page: no fonts, scripts or images are fetched, so it works offline.
CSS = """
body { font-family: sans-serif; line-height: 1.45; color: #1f2328; margin: 2rem auto; max-width: 76rem;
       padding: 0 1.5rem; }
h1 { border-bottom: 2px solid #d0d7de; padding-bottom: .3rem; }
h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2rem; margin-top: 2.2rem; }
blockquote { margin: 1rem 0; padding: .6rem 1rem; background: #fff8e1; border-left: 4px solid #e0a800; }
blockquote p { margin: .2rem 0; }
table { border-collapse: collapse; margin: .8rem 0; display: block; overflow-x: auto; font-size: .92rem; }
th, td { border: 1px solid #d0d7de; padding: .25rem .55rem; vertical-align: top; }
th { background: #f0f3f6; cursor: pointer; user-select: none; white-space: nowrap; }
th:hover { background: #e2e8ee; }
th[aria-sort=ascending]::after { content: " \\25B2"; }
th[aria-sort=descending]::after { content: " \\25BC"; }
tbody tr:nth-child(even) { background: #f8f9fa; }
td.num { text-align: right; white-space: nowrap; }
code { background: #f0f3f6; padding: 0 .2rem; border-radius: 3px; }
pre { background: #f6f8fa; padding: .8rem; overflow-x: auto; }
pre code { background: none; padding: 0; }
img { max-width: 100%; border: 1px solid #d0d7de; margin: .5rem 0; }
"""

# A cell sorts as a number when it starts with one ("123.0 [113.4, 141.7]", "×1.31 [1.15, 1.51]",
# "70.0%", "2.000 (bound)"); "0-15" or "None" sort as text. Empty and "–" cells sort last either way.
# On load the page records how many of its images decoded (data-images, data-images-loaded on <body>).
JS = r"""
(function () {
  var NUM = /^×?\s*(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)(?:×|%)?(?=\s|$)/i;
  var FIGURE = /^×?\s*-?\d+(?:\.\d+)?(?:×|%)?(?: \[[-\d., ]+\])?$/;  // a figure alone: right-aligned
  function text(row, col) { var c = row.cells[col]; return c ? c.textContent.trim() : ""; }
  function blank(s) { return s === "" || s === "–" || s === "-"; }
  function number(s) { var m = NUM.exec(s); return m ? parseFloat(m[1]) : null; }
  function sortBy(table, th, col) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var numeric = rows.every(function (r) { var s = text(r, col); return blank(s) || number(s) !== null; });
    var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
    var keyed = rows.map(function (r, i) {
      var s = text(r, col);
      return { row: r, i: i, blank: blank(s), key: numeric ? number(s) : s };
    });
    keyed.sort(function (a, b) {
      if (a.blank !== b.blank) return a.blank ? 1 : -1;
      var d = a.blank ? 0 : numeric ? a.key - b.key : a.key.localeCompare(b.key, undefined, { numeric: true });
      return d !== 0 ? dir * d : a.i - b.i;
    });
    table.querySelectorAll("thead th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
    keyed.forEach(function (k) { body.appendChild(k.row); });
  }
  document.querySelectorAll("table").forEach(function (table) {
    if (!table.tBodies.length) return;
    var rows = Array.prototype.slice.call(table.tBodies[0].rows);
    table.querySelectorAll("thead th").forEach(function (th, col) {
      th.title = "sort by this column";
      th.addEventListener("click", function () { sortBy(table, th, col); });
      rows.forEach(function (r) { var c = r.cells[col]; if (c && FIGURE.test(c.textContent.trim())) c.className = "num"; });
    });
  });
  window.addEventListener("load", function () {
    var images = Array.prototype.slice.call(document.images);
    document.body.dataset.images = images.length;
    document.body.dataset.imagesLoaded = images.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  });
})();
"""


def render(markdown_text: str, images: dict[str, bytes]) -> str:
    """One self-contained HTML page of a markdown document; an image whose src is a key of `images`
    is inlined as a data URI, any other image is replaced by its alt text (nothing is fetched), and a
    link stays the text it was written as (nothing points outside the page)."""
    # raw HTML in the text stays text; so do links and autolinks (a goal or hypothesis the user wrote may
    # hold '[x](http://...)'), which SUMMARY.md never makes itself
    md = MarkdownIt("commonmark", {"html": False}).enable("table").disable(["link", "autolink"])
    tokens = md.parse(markdown_text)
    for block in tokens:
        for tok in block.children or []:
            if tok.type != "image":
                continue
            src = str(tok.attrGet("src"))
            if src in images:
                mime = mimetypes.guess_type(src)[0] or "application/octet-stream"
                tok.attrSet("src", f"data:{mime};base64,{base64.b64encode(images[src]).decode()}")
            else:
                tok.type, tok.tag, tok.children = "text", "", None
                tok.content = f"[image not found: {src}]"
    body = md.renderer.render(tokens, md.options, {})
    title = next((line[2:].strip() for line in markdown_text.splitlines() if line.startswith("# ")), "rooftop report")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{escapeHtml(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"{body}<script>{JS}</script>\n</body>\n</html>\n"
    )
