"""Printing rich tables on any screen or pipe: no figure is ever cut to fit (every command's tables)."""

from __future__ import annotations

import os
import re
import sys

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

# A figure: a number, with a unit sign, or a pair or range of them ("12.3", "85%,", "1.2/3.4", "(1.0–2.0)").
_FIGURE = re.compile(r"[-+]?\d[\d.,]*(?:e[-+]?\d+)?[%x]?(?:[/–-][-+]?\d[\d.,]*(?:e[-+]?\d+)?[%x]?)*")
# Words of text (names, paths) may fold inside a column this narrow; figures never fold.
_TEXT_MIN_WIDTH = 10
_PIPED_WIDTH = 150


def stdout_console() -> Console:
    """The console tables go to: the terminal's width; piped, $COLUMNS or 150 (a file has no width)."""
    return Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else _PIPED_WIDTH)


def print_table(console: Console, table: Table) -> None:
    """Print `table` within the console's width without cutting a figure: cells wrap between words,
    then the table drops its borders, then each row becomes lines of `header value` pairs."""
    for compact in (False, True):
        if compact:
            table.box, table.show_edge, table.pad_edge, table.padding = box.SIMPLE_HEAD, False, False, (0, 0, 0, 1)
        widths = _fit_widths(console, table)
        if widths is not None:
            for column, width in zip(table.columns, widths, strict=True):
                column.width, column.overflow = width, "fold"
            console.print(table)
            return
    _print_rows(console, table)


def _cell_text(console: Console, cell) -> Text | None:
    if isinstance(cell, Text):
        return cell
    if isinstance(cell, str):
        return console.render_str(cell, highlight=False)
    return None


def _narrowest(console: Console, cells: list) -> tuple[int, int]:
    """How narrow a column may be with every word whole, and with text words folded at _TEXT_MIN_WIDTH
    (figures stay whole either way)."""
    figure, text = 1, 0
    for cell in cells:
        t = _cell_text(console, cell)
        for word in (t.plain.split() if t is not None else []):
            if _FIGURE.fullmatch(word.strip("()[],;:")):
                figure = max(figure, cell_len(word))
            else:
                text = max(text, cell_len(word))
    return max(figure, text), max(figure, min(text, _TEXT_MIN_WIDTH))


def _fit_widths(console: Console, table: Table) -> list[int] | None:
    """Content widths that fit the console with every figure whole, or None when none do."""
    wide = console.options.update_width(100_000)
    widest, whole, folded = [], [], []
    for column in table.columns:
        cells = [column.header, *column.cells, *([column.footer] if table.show_footer else [])]
        widest.append(max(Measurement.get(console, wide, c).maximum for c in cells))
        words, text_folded = (widest[-1], widest[-1]) if column.no_wrap else _narrowest(console, cells)
        whole.append(min(widest[-1], words))
        folded.append(min(widest[-1], text_folded))
    chrome = Measurement.get(console, wide, table).maximum - sum(widest)  # borders and padding
    if sum(folded) + chrome > console.width:
        return None
    widths = list(widest)
    excess = sum(widths) + chrome - console.width
    # Wrap between words first, widest column first; fold long words of text only if that is not enough.
    for floor in (whole, folded):
        while excess > 0 and any(w > f for w, f in zip(widths, floor, strict=True)):
            i = max((i for i in range(len(widths)) if widths[i] > floor[i]), key=lambda i: widths[i])
            widths[i] -= 1
            excess -= 1
    return widths


def _print_rows(console: Console, table: Table) -> None:
    """The table as lines: each row's first cell, then `header value` pairs, wrapped between pairs."""
    if table.title:
        console.print(table.title, highlight=False)
    columns = table.columns
    headers = [_cell_text(console, c.header) or Text(str(c.header)) for c in columns]
    for row in zip(*(list(c.cells) for c in columns), strict=True):
        cells = [_cell_text(console, cell) or Text(str(cell)) for cell in row]
        line, sep = cells[0].copy(), " "
        line.append(":")
        for header, cell in zip(headers[1:], cells[1:], strict=True):
            if not cell.plain:
                continue
            pair = Text.assemble(header, " ", cell)
            if sep != " " and cell_len(line.plain) + cell_len(sep) + cell_len(pair.plain) > console.width:
                console.print(line, soft_wrap=True, highlight=False)
                line, sep = Text("  "), ""
            line.append(sep)
            line.append_text(pair)
            sep = " · "
        console.print(line, soft_wrap=True, highlight=False)
