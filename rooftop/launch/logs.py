"""What a process's log says: its first error, its last lines, as an error message quotes them."""

import os
import re
from pathlib import Path

LOG_TAIL_LINES = 20

# A log line as vLLM/SGLang prefix it: "(Worker pid=1) ERROR 12-01 15:19:54 [file.py:953] ".
_LOG_PREFIX = re.compile(r"^\([^)]*\)\s+(?:ERROR|INFO|WARNING|DEBUG|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s?")
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::.*)?$")
LINE_CHARS = 300  # a log line quoted in an error is cut here (vLLM prints lists of thousands of characters)


def first_error(lines: list[str]) -> str | None:
    """The first exception a log reports ("ValueError: ..."), the usual root cause where later ones wrap
    it; a bare name ("AssertionError") with the statement above it, a header with its indented detail."""
    text = [_LOG_PREFIX.sub("", line).rstrip() for line in lines]
    for i, line in enumerate(text):
        if not _ERROR_LINE.match(line.strip()):
            continue
        found = line.strip()
        if ":" not in found:
            above = next((t.strip() for t in reversed(text[:i]) if t.strip() and set(t.strip()) - {"^", "~"}), "")
            if above and not above.startswith("File "):
                found += f" at `{above}`"
        elif i + 1 < len(text) and text[i + 1].startswith((" ", "\t")) and not text[i + 1].strip().startswith("File "):
            found += " " + text[i + 1].strip()
        return _cut(found)
    return None


def _cut(line: str, limit: int = LINE_CHARS) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"


def log_lines(path: str | Path, max_bytes: int = 4 << 20) -> list[str]:
    """The lines of the last `max_bytes` of a log (empty if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode(errors="replace").splitlines()
    except OSError:
        return []


def log_report(path: str | Path, n: int = LOG_TAIL_LINES) -> str:
    """"; its log's first error: X; last lines of PATH:" and the lines, each cut to LINE_CHARS."""
    lines = log_lines(path)
    cause = first_error(lines)
    tail = "\n".join(f"    {_cut(line)}" for line in lines[-n:])
    return (f"; first error in its log: {cause}" if cause else "") + f"; last lines of {path}:\n{tail}"
