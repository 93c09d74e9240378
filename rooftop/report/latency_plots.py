"""The latency figures from the server's spans: the TTFT of the requests at p50/p90/p99 in parts, per level (a
stacked bar per percentile), and a swimlane of a slice of a bench's timeline.json.gz (a few requests and the
engine steps under them, on the timeline's one clock)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rooftop.bench.latency import PARTS  # noqa: E402
from rooftop.bench.timeline import REQUEST_TID  # noqa: E402
from rooftop.campaign.evidence import Evidence  # noqa: E402

PERCENTILES = ("p50", "p90", "p99")
COLORS = dict(zip(PARTS, ("#9e9e9e", "#8d6e63", "#e53935", "#1e88e5", "#90caf9", "#8e24aa", "#43a047"),
                  strict=True))
TRACK_PARTS = {"client wait": "client_wait", "client to server": "client_to_server", "queue": "queue",
               "prefill chunk": "prefill", "kv transfer": "kv_transfer", "emission": "emission"}


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def breakdown_bars(ev: Evidence) -> list[tuple[str, str, dict[str, float]]]:
    """(level, percentile, {part: ms}) for the baseline's levels with server spans: each part of the request at
    that TTFT percentile, mean over the repeats."""
    base = ev.variants.get(ev.baseline)
    out = []
    for lv in base.levels if base else []:
        for p in PERCENTILES:
            rows = [b[p] for s in lv.server_spans or [] if (b := s.get("ttft_breakdown"))]
            if rows:
                out.append((lv.at, p, {part: sum(r[f"{part}_ms"] for r in rows) / len(rows) for part in PARTS}))
    return out


def ttft_breakdown(ev: Evidence, path: Path) -> Path | None:
    """A stacked bar per level and TTFT percentile: the parts of that request's TTFT (ms)."""
    bars = breakdown_bars(ev)
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(bars) + 2), 4.5))
    x = range(len(bars))
    bottom = [0.0] * len(bars)
    for part in PARTS:
        h = [max(0.0, parts[part]) for _, _, parts in bars]
        if any(h):
            ax.bar(x, h, bottom=bottom, color=COLORS[part], label=part.replace("_", " "), width=0.7)
            bottom = [b + v for b, v in zip(bottom, h, strict=True)]
    ax.set_xticks(list(x), [f"{p}\n{at}" for at, p, _ in bars], fontsize=8)
    ax.set_ylabel("ms (mean over repeats)")
    ax.set_title(f"{ev.campaign}: TTFT in parts at p50/p90/p99 ({ev.baseline})")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def timeline_slice(doc: dict, n: int = 6) -> tuple[list[dict], list[dict]] | None:
    """The first level repeat's slowest-TTFT request and the n − 1 requests that started nearest it, with the
    engine steps that ran between the first one's start and the last one's end: (request events, steps)."""
    events = [e for e in doc.get("traceEvents", []) if e.get("ph") in ("X", "i")]
    if not events:
        return None
    pid = min(e["pid"] for e in events)
    ttfts = [e for e in events if e["pid"] == pid and e["name"] == "ttft"]
    if not ttfts:
        return None
    worst = max(ttfts, key=lambda e: e["dur"])
    tids = {e["tid"] for e in sorted(ttfts, key=lambda e: abs(e["ts"] - worst["ts"]))[:n]}
    reqs = [e for e in events if e["pid"] == pid and e["tid"] in tids]
    t0 = min(e["ts"] for e in reqs)
    t1 = max(e["ts"] + e.get("dur", 0) for e in reqs)
    steps = [e for e in events if e["pid"] == pid and e["tid"] < REQUEST_TID and e["ph"] == "X"
             and e["ts"] + e["dur"] >= t0 and e["ts"] <= t1]
    return reqs, steps


def swimlane(timeline: Path | None, path: Path, n: int = 6) -> Path | None:
    """A slice of a timeline: a lane per request (its TTFT parts, prefill chunks, decode, tokens) and the engine
    steps under them (prefill steps dark), ms from the slice's start."""
    if timeline is None or not timeline.is_file():
        return None
    cut = timeline_slice(json.loads(gzip.decompress(timeline.read_bytes())), n)
    if cut is None:
        return None
    reqs, steps = cut
    t0 = min(e["ts"] for e in reqs)
    lanes = sorted({e["tid"] for e in reqs})
    fig, ax = plt.subplots(figsize=(10, 0.5 * (len(lanes) + 1) + 1.5))
    for e in steps:
        prefill = e["args"].get("prefill_tokens", 0) > 0
        ax.barh(0, e["dur"] / 1000, left=(e["ts"] - t0) / 1000, height=0.6, color="#1e88e5" if prefill else "#bbdefb",
                edgecolor="white", linewidth=0.3)
    for y, tid in enumerate(lanes, start=1):
        for e in (e for e in reqs if e["tid"] == tid):
            left = (e["ts"] - t0) / 1000
            if e["name"] == "token":
                ax.plot([left, left], [y - 0.3, y + 0.3], color="black", linewidth=0.6)
            elif e["name"] == "decode":
                ax.barh(y, e["dur"] / 1000, left=left, height=0.25, color="#43a047", alpha=0.5)
            elif e["name"] in TRACK_PARTS:
                ax.barh(y, e["dur"] / 1000, left=left, height=0.6, color=COLORS[TRACK_PARTS[e["name"]]])
    ax.set_yticks(range(len(lanes) + 1), ["engine steps"] + [f"request {t - REQUEST_TID}" for t in lanes], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the slice's start (the client's clock)")
    ax.set_title("swimlane: the slowest-TTFT request, its neighbours, and the engine steps under them", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[p]) for p in ("queue", "prefill", "emission")]
    ax.legend(handles + [plt.Rectangle((0, 0), 1, 1, color="#43a047", alpha=0.5)],
              ["queue", "prefill chunk / prefill step", "emission", "decode"], fontsize=7, loc="lower right")
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, path)
