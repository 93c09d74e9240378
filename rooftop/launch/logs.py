"""What a process's log says: its first error, its last lines, as an error message quotes them."""

import os
import re
from pathlib import Path

LOG_TAIL_LINES = 20

# A log line as vLLM/SGLang prefix it: "(Worker pid=1) ERROR 12-01 15:19:54 [file.py:953] ".
_LOG_PREFIX = re.compile(r"^\([^)]*\)\s+(?:ERROR|INFO|WARNING|DEBUG|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s?")
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::.*)?$")
# argparse's refusal of a command line: "vllm: error: unrecognized arguments: --x" (after its usage lines).
_USAGE_ERROR = re.compile(r"^[\w.-]+(?: [\w.-]+)*: error: .+$")
LINE_CHARS = 300  # a log line quoted in an error is cut here (vLLM prints lists of thousands of characters)


def first_error(lines: list[str]) -> str | None:
    """The first exception a log reports ("ValueError: ..."), the usual root cause where later ones wrap
    it; a bare name ("AssertionError") with the statement above it, a header with its indented detail;
    or a command line refused by argparse ("vllm: error: unrecognized arguments: ...")."""
    text = [_LOG_PREFIX.sub("", line).rstrip() for line in lines]
    for i, line in enumerate(text):
        if _USAGE_ERROR.match(line.strip()):
            return _cut(line.strip())
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


def log_tail(path: str | Path, n: int = LOG_TAIL_LINES) -> str:
    """The last `n` lines of a log, indented, each cut to LINE_CHARS."""
    return "\n".join(f"    {_cut(line)}" for line in log_lines(path)[-n:])


def log_report(path: str | Path, n: int = LOG_TAIL_LINES) -> str:
    """"; its log's first error: X; last lines of PATH:" and the lines, each cut to LINE_CHARS."""
    cause = first_error(log_lines(path))
    return (f"; first error in its log: {cause}" if cause else "") + f"; last lines of {path}:\n{log_tail(path, n)}"


def logs_report(logs: list[tuple[str, str | Path]], n: int = LOG_TAIL_LINES) -> str:
    """What several processes' logs say ([(name, path)]): each one's first error, and the last lines of the
    first that reports one (of the first, where none does); `log_report` for one."""
    if len(logs) == 1:
        return log_report(logs[0][1], n)
    causes = [(name, path, first_error(log_lines(path))) for name, path in logs]
    said = "; ".join(f"{name}: {cause or 'none'}" for name, _, cause in causes)
    worst = next((path for _, path, cause in causes if cause), logs[0][1])
    return f"; first error in each one's log: {said}; last lines of {worst}:\n{log_tail(worst, n)}"


def known_fix(path: str | Path, fixes: list[tuple[str, str]]) -> str | None:
    """The fix of the first (regex, fix) whose regex a line of the log matches (None for none)."""
    lines = log_lines(path, max_bytes=256 << 10)
    for pattern, fix in fixes:
        if any(re.search(pattern, line) for line in lines):
            return fix
    return None
