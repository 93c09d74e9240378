"""Small formatting helpers shared by the documents: numbers with intervals, tables, redaction."""

from __future__ import annotations

import math
import re

from rooftop.campaign.evidence import LevelEffect, LevelStat
from rooftop.redact import is_secret as env_is_secret
from rooftop.redact import is_secret_flag

_ASSIGN = re.compile(r"(?P<name>\b[A-Za-z_][A-Za-z0-9_]*)(?P<sep>=|: )(?P<value>'[^']*'|\"[^\"]*\"|\S+)")


def is_secret(name: str) -> bool:
    """An environment-style NAME holding KEY/TOKEN/...; a data key only when one of its words is one
    (`hf_token` is, `max_tokens` is not)."""
    return env_is_secret(name) if name.isupper() else is_secret_flag(name)


def redact_text(text: str) -> str:
    """Replace the value of every NAME=value whose NAME looks like a secret."""
    def sub(m: re.Match) -> str:
        return f"{m['name']}{m['sep']}<redacted>" if is_secret(m["name"]) else m.group(0)
    return _ASSIGN.sub(sub, text)


def redact(value):
    """A copy of nested data with secret-looking keys' values replaced."""
    if isinstance(value, dict):
        return {k: ("<redacted>" if is_secret(str(k)) and not isinstance(v, dict | list) else redact(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def num(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def with_ci(mean: float, low: float | None, high: float | None, digits: int = 1) -> str:
    """'24.5 [23.9, 25.1]'; '24.5 (no interval)' where there is none (one repeat)."""
    if low is None or high is None or any(isinstance(v, float) and math.isnan(v) for v in (low, high)) \
            or low == high == mean:
        nan = mean is None or (isinstance(mean, float) and math.isnan(mean))
        return num(mean, digits) + ("" if nan else " (no interval)")
    return f"{num(mean, digits)} [{num(low, digits)}, {num(high, digits)}]"


def effect(e: LevelEffect | None) -> str:
    """'×5.12 [4.60, 5.71] faster'."""
    if e is None:
        return "–"
    if math.isnan(e.ratio_low):
        return f"×{num(e.ratio, 2)} ({e.verdict})"
    return f"×{num(e.ratio, 2)} [{num(e.ratio_low, 2)}, {num(e.ratio_high, 2)}] {e.verdict}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    if not rows:
        return "_(none)_\n"
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def pct(confidence: float) -> str:
    """0.95 -> '95%', 0.975 -> '97.5%'."""
    return f"{confidence * 100:g}%"


def level_table(levels: list[LevelStat], confidence: float) -> str:
    """A variant's levels, every figure with its interval across repeats; with the server's own decode
    step where it exports one (TPOT also counts the prefill steps interleaved with decode)."""
    steps = any(lv.decode_step_ms is not None for lv in levels)
    slo = any(lv.slo_attainment is not None for lv in levels)
    gpu = any(lv.telemetry is not None for lv in levels)
    rows = []
    for lv in levels:
        step = (with_ci(lv.decode_step_ms, lv.decode_step_low, lv.decode_step_high, 2)
                if lv.decode_step_ms is not None else "–")
        rows.append([lv.label or str(lv.concurrency), with_ci(lv.tok_s, lv.tok_s_low, lv.tok_s_high),
                     with_ci(lv.ttft_ms, lv.ttft_low, lv.ttft_high), with_ci(lv.tpot_ms, lv.tpot_low, lv.tpot_high, 2),
                     *([step] if steps else []), *(slo_cells(lv) if slo else []),
                     *(telemetry_cells(lv) if gpu else []), str(lv.repeats), "yes" if lv.valid else "**no**"])
    ci = f"[{pct(confidence)} CI]"
    return table(["level" if any(lv.label for lv in levels) else "C", f"output tok/s {ci}", f"TTFT ms {ci}",
                  f"TPOT ms {ci}",
                  *([f"decode step ms {ci}"] if steps else []),
                  *([f"goodput req/s {ci}", f"SLO met % {ci}"] if slo else []),
                  *([f"GPU util % {ci}", f"SM MHz {ci}", f"power W {ci}", f"J/tok {ci}"] if gpu else []),
                  "repeats", "valid"], rows)


# (telemetry figure over all GPUs, digits) in the level table's GPU columns
TELEMETRY_COLUMNS = (("sm_util_mean_pct", 0), ("sm_clock_mean_mhz", 0), ("power_total_w", 0),
                     ("j_per_output_token", 3))


def telemetry_cells(lv: LevelStat) -> list[str]:
    """A level's GPU utilization, SM clock, power (all GPUs) and energy per output token, each with its
    interval across repeats; '–' without telemetry."""
    if lv.telemetry is None:
        return ["–"] * len(TELEMETRY_COLUMNS)
    figs = lv.telemetry["all"]
    return [with_ci(figs[k]["mean"], figs[k]["ci_low"], figs[k]["ci_high"], nd) if figs[k]["mean"] is not None
            else "–" for k, nd in TELEMETRY_COLUMNS]


def slo_cells(lv: LevelStat) -> list[str]:
    """A level's goodput and SLO attainment (in %), each with its interval; '–' without them."""
    if lv.slo_attainment is None:
        return ["–", "–"]

    def pct_or_none(x: float | None) -> float | None:
        return None if x is None else 100 * x

    return [with_ci(lv.goodput_req_s, lv.goodput_low, lv.goodput_high, 2),
            with_ci(100 * lv.slo_attainment, pct_or_none(lv.attainment_low), pct_or_none(lv.attainment_high), 0)]
