"""The report's figures (matplotlib Agg): throughput with interval bands, latency, SLO attainment, GPU
telemetry, roofline gap, profile."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: figures go to files only
import matplotlib.pyplot as plt  # noqa: E402

from rooftop.bench.slo import share_text  # noqa: E402
from rooftop.campaign.diagnosis import family  # noqa: E402
from rooftop.campaign.evidence import Evidence  # noqa: E402
from rooftop.report import latency_plots  # noqa: E402


def _finite(x: float) -> bool:
    return x is not None and not math.isnan(x)


def _concurrency_axis(ax, ev: Evidence) -> None:
    """Log-2 x axis labelled with the levels actually swept (1, 4, 16), not powers of two."""
    levels = sorted({lv.concurrency for v in ev.variants.values() for lv in v.levels})
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _grid_legend(ax) -> None:
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def throughput(ev: Evidence, path: Path) -> Path | None:
    """Output tok/s against concurrency, one line per variant with its interval band."""
    if not any(v.levels for v in ev.variants.values()):
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for v in ev.variants.values():
        if not v.levels:
            continue
        c = [lv.concurrency for lv in v.levels]
        line, = ax.plot(c, [lv.tok_s for lv in v.levels], marker="o", label=f"{v.name} ({v.topology})")
        ax.fill_between(c, [lv.tok_s_low for lv in v.levels], [lv.tok_s_high for lv in v.levels],
                        color=line.get_color(), alpha=0.2)
    _concurrency_axis(ax, ev)
    ax.set_ylabel(f"output tok/s (mean, {ev.confidence * 100:g}% interval across repeats)")
    ax.set_title(f"{ev.campaign}: throughput")
    _grid_legend(ax)
    return _save(fig, path)


def latency(ev: Evidence, path: Path) -> Path | None:
    """Mean TTFT and TPOT against concurrency, per variant."""
    if not any(v.levels for v in ev.variants.values()):
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for v in ev.variants.values():
        c = [lv.concurrency for lv in v.levels]
        a1.plot(c, [lv.ttft_ms for lv in v.levels], marker="o", label=v.name)
        a2.plot(c, [lv.tpot_ms for lv in v.levels], marker="o", label=v.name)
    for ax, title in ((a1, "TTFT (ms, mean)"), (a2, "TPOT (ms, mean)")):
        _concurrency_axis(ax, ev)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    a2.legend(fontsize=8)
    return _save(fig, path)


def slo(ev: Evidence, path: Path) -> Path | None:
    """SLO attainment against concurrency, per variant with its interval band, and the target line:
    where a line crosses it is the variant's SLO capacity."""
    if ev.slo is None or not any(lv.slo_attainment is not None for v in ev.variants.values() for lv in v.levels):
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for v in ev.variants.values():
        levels = [lv for lv in v.levels if lv.slo_attainment is not None]
        if not levels:
            continue
        c = [lv.concurrency for lv in levels]
        line, = ax.plot(c, [100 * lv.slo_attainment for lv in levels], marker="o", label=v.name)
        ax.fill_between(c, [100 * lv.attainment_low for lv in levels], [100 * lv.attainment_high for lv in levels],
                        color=line.get_color(), alpha=0.2)
    ax.axhline(100 * ev.slo["attainment"], color="black", linestyle="--", linewidth=1,
               label=f"target {share_text(ev.slo['attainment'])}")
    _concurrency_axis(ax, ev)
    ax.set_ylim(-2, 102)
    ax.set_ylabel(f"requests meeting the SLO, % ({ev.confidence * 100:g}% interval)")
    ax.set_title(f"{ev.campaign}: {ev.slo['describe'].rsplit(' for ', 1)[0]}", fontsize=10)
    _grid_legend(ax)
    return _save(fig, path)


def telemetry(ev: Evidence, path: Path) -> Path | None:
    """GPU telemetry against concurrency, per variant: energy per output token (with its interval band),
    power over all GPUs, and GPU utilization."""
    def fig(lv, key):
        f = lv.telemetry["all"][key] if lv.telemetry else None
        return (f["mean"], f["ci_low"], f["ci_high"]) if f and f["mean"] is not None else None

    series = {v.name: [lv for lv in v.levels if fig(lv, "j_per_output_token")] for v in ev.variants.values()}
    if not any(series.values()):
        return None
    panels = (("j_per_output_token", "J per output token"), ("power_total_w", "power, all GPUs (W)"),
              ("sm_util_mean_pct", "GPU utilization (%, time a kernel ran)"))
    out, axes = plt.subplots(1, 3, figsize=(13, 4))
    for name, levels in series.items():
        if not levels:
            continue
        c = [lv.concurrency for lv in levels]
        for ax, (key, _) in zip(axes, panels, strict=True):
            vals = [fig(lv, key) for lv in levels]
            pts = [(x, v) for x, v in zip(c, vals, strict=True) if v is not None]
            if not pts:
                continue
            line, = ax.plot([x for x, _ in pts], [v[0] for _, v in pts], marker="o", label=name)
            if all(v[1] is not None and v[2] is not None for _, v in pts):
                ax.fill_between([x for x, _ in pts], [v[1] for _, v in pts], [v[2] for _, v in pts],
                                color=line.get_color(), alpha=0.2)
    for ax, (_, title) in zip(axes, panels, strict=True):
        _concurrency_axis(ax, ev)
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    out.suptitle(f"{ev.campaign}: GPU telemetry per level (mean, {ev.confidence * 100:g}% interval across repeats)",
                 fontsize=10)
    return _save(out, path)


def roofline_gap(ev: Evidence, path: Path) -> Path | None:
    """Measured ms per component (profile shares of the measured step) beside its roofline floor."""
    roof = ev.rooflines.get(ev.baseline)
    prof = ev.profiles.get(ev.baseline)
    if roof is None or prof is None or not prof.components or not _finite(roof.measured_step_ms or math.nan):
        return None
    measured: dict[str, float] = {}
    for c in prof.components:
        measured[family(c.name)] = measured.get(family(c.name), 0.0) + c.share * roof.measured_step_ms
    floors: dict[str, float] = {}
    for name, ms in roof.component_floor_ms.items():
        floors[family(name)] = floors.get(family(name), 0.0) + ms
    names = sorted(set(measured) | set(floors), key=lambda n: -measured.get(n, 0.0))
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar([i - 0.2 for i in x], [measured.get(n, 0.0) for n in names], width=0.4, label="measured")
    ax.bar([i + 0.2 for i in x], [floors.get(n, 0.0) for n in names], width=0.4, label="roofline floor")
    ax.set_xticks(list(x), names, rotation=30, ha="right")
    ax.set_ylabel("ms per decode step")
    ax.set_yscale("log")
    ax.set_title(f"{ev.baseline}: measured step by component vs floor (batch {roof.batch}, ctx {roof.context})")
    ax.legend()
    return _save(fig, path)


def profile_breakdown(ev: Evidence, path: Path, top: int = 7) -> Path | None:
    """Share of step time by component, one stacked bar per profiled variant."""
    if not ev.profiles:
        return None
    names: list[str] = []
    for p in ev.profiles.values():
        for c in p.components[:top]:
            if c.name not in names:
                names.append(c.name)
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(ev.profiles) + 2))
    variants = list(ev.profiles)
    left = [0.0] * len(variants)
    for name in names:
        widths = [(ev.profiles[v].component(name).share if ev.profiles[v].component(name) else 0.0)
                  for v in variants]
        ax.barh(variants, widths, left=left, label=name)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.barh(variants, [max(0.0, 1 - x) for x in left], left=left, label="rest", color="lightgrey")
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of step time")
    ax.set_title("profile breakdown by component")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    return _save(fig, path)


def write_all(ev: Evidence, out_dir: Path, timeline: Path | None = None) -> dict[str, Path]:
    """Every figure the evidence supports, under out_dir; returns {name: path} of those written (`timeline`: a
    bench's timeline.json.gz, for the swimlane)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    made = {}
    for name, fn in (("throughput", throughput), ("latency", latency), ("slo", slo), ("telemetry", telemetry),
                     ("roofline_gap", roofline_gap),
                     ("profile", profile_breakdown), ("ttft_breakdown", latency_plots.ttft_breakdown),
                     ("swimlane", lambda _ev, p: latency_plots.swimlane(timeline, p))):
        p = fn(ev, out_dir / f"{name}.png")
        if p is not None:
            made[name] = p
    return made
