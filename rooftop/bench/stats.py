"""Summary statistics, bootstrap confidence intervals across repeats, and A/B comparison with a verdict.

Pure functions of numbers; definitions and measured coverage are in docs/statistics.md.

Interval method, chosen by measurement (coverage of a nominal 95% interval for the true mean, 2000
trials each; the table and the script are in docs/statistics.md):
- n >= 5 and the statistic is the mean: studentized bootstrap (bootstrap-t); it corrects for skew.
  Normal: 0.947 / 0.954 / 0.944 at n = 5 / 10 / 30; lognormal(sigma 0.5): 0.922 / 0.936 / 0.946.
- otherwise (n = 2..4, or another statistic): percentile bootstrap widened around the point by
  sqrt(n/(n-1)) * t_{n-1} / z. The plain percentile bootstrap under-covers at small n (0.75 at n = 3,
  0.84 at n = 5: at n = 3 its interval cannot leave [min, max]); the factor undoes the bootstrap's
  (n-1)/n variance bias and swaps the normal quantile for Student's. Normal: 0.957 at n = 3;
  lognormal(0.5): 0.923 at n = 3.
- n = 1: no spread can be estimated; the interval is (point, point), method "single".
Heavily skewed data (lognormal sigma 1) under-covers at every n (0.85 to 0.91): repeat more.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as sps

PERCENTILES = {"median": 50, "p90": 90, "p99": 99}  # in percent, integers so the thin test is exact
MIN_TAIL_SAMPLES = 10  # a percentile p is "thin" when fewer than this many samples lie beyond it
STUDENTIZED_MIN_N = 5  # below this the bootstrap-t is unstable (many degenerate resamples)
_MAX_CELLS = 2_000_000  # resample in chunks of at most this many values, to bound memory

NO_DIFFERENCE = "no difference within noise"


@dataclass(slots=True)
class Distribution:
    """Location and tail of one metric's samples (same unit as the input)."""

    n: int
    mean: float
    median: float
    p90: float
    p99: float
    thin: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Interval:
    """A confidence interval for one statistic: [low, high] around point, from n samples."""

    low: float
    high: float
    point: float
    n: int
    method: str


@dataclass(slots=True)
class Effect:
    """Candidate versus baseline: ratio of means and difference of means with their intervals."""

    ratio: float
    ratio_low: float
    ratio_high: float
    diff: float
    diff_low: float
    diff_high: float
    verdict: str
    method: str = ""


def describe(values) -> Distribution:
    """Mean, median, p90, p99 (linear interpolation) of values, ignoring NaN; thin names weak percentiles."""
    x = np.asarray(values, dtype=float).ravel()
    x = x[~np.isnan(x)]
    n = x.size
    if n == 0:
        nan = float("nan")
        return Distribution(0, nan, nan, nan, nan, thin=list(PERCENTILES))
    median, p90, p99 = np.percentile(x, list(PERCENTILES.values()), method="linear")
    thin = [name for name, pct in PERCENTILES.items() if n * (100 - pct) < MIN_TAIL_SAMPLES * 100]
    return Distribution(n, float(x.mean()), float(median), float(p90), float(p99), thin)


def _t_over_z(df: float, confidence: float) -> float:
    """How much wider Student's quantile with df degrees of freedom is than the normal one."""
    a = (1 - confidence) / 2
    return float(sps.t.ppf(1 - a, df) / sps.norm.ppf(1 - a))


def _chunks(n: int, n_resamples: int):
    rows = max(1, _MAX_CELLS // max(n, 1))
    for start in range(0, n_resamples, rows):
        yield min(rows, n_resamples - start)


def _resampled_stat(x: np.ndarray, statistic: Callable, n_resamples: int, rng) -> np.ndarray:
    """statistic of n_resamples bootstrap resamples of x (vectorised when statistic takes axis=)."""
    out = []
    for rows in _chunks(x.size, n_resamples):
        xs = x[rng.integers(0, x.size, (rows, x.size))]
        try:
            out.append(np.asarray(statistic(xs, axis=1), dtype=float))
        except TypeError:
            out.append(np.array([statistic(row) for row in xs], dtype=float))
    return np.concatenate(out)


def _resampled_mean_sd(x: np.ndarray, n_resamples: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Means and sample standard deviations of n_resamples bootstrap resamples of x."""
    means, sds = [], []
    for rows in _chunks(x.size, n_resamples):
        xs = x[rng.integers(0, x.size, (rows, x.size))]
        means.append(xs.mean(axis=1))
        sds.append(xs.std(axis=1, ddof=1))
    return np.concatenate(means), np.concatenate(sds)


def _widened(point: float, boot: np.ndarray, k: float, confidence: float) -> tuple[float, float]:
    """Percentile interval of boot, its distances from point multiplied by k (keeps any asymmetry)."""
    a = (1 - confidence) / 2
    lo, hi = np.percentile(boot, [100 * a, 100 * (1 - a)])
    return point - k * (point - lo), point + k * (hi - point)


def _studentized(point: float, se: float, t_boot: np.ndarray, confidence: float) -> tuple[float, float]:
    """Bootstrap-t interval: point minus the bootstrap quantiles of t, scaled by the standard error."""
    t_boot = t_boot[np.isfinite(t_boot)]
    if se == 0 or t_boot.size == 0:
        return point, point
    a = (1 - confidence) / 2
    t_lo, t_hi = np.percentile(t_boot, [100 * a, 100 * (1 - a)])
    return point - t_hi * se, point - t_lo * se


def bootstrap_ci(samples, statistic: Callable = np.mean, confidence: float = 0.95,
                 n_resamples: int = 10_000, seed: int = 0, floor: float | None = None) -> Interval:
    """Confidence interval of statistic(samples) across repeats (method in the module docstring).

    `floor`: the smallest value the quantity can take (0 for rates and latencies); a widened
    small-n interval that reaches below it is cut there, which keeps its coverage.
    """
    ci = _bootstrap_ci(samples, statistic, confidence, n_resamples, seed)
    if floor is not None and ci.n > 1:
        ci = Interval(max(ci.low, floor), max(ci.high, floor), ci.point, ci.n, ci.method)
    return ci


def _bootstrap_ci(samples, statistic: Callable, confidence: float, n_resamples: int, seed: int) -> Interval:
    x = np.asarray(samples, dtype=float).ravel()
    x = x[~np.isnan(x)]
    n = x.size
    if n == 0:
        nan = float("nan")
        return Interval(nan, nan, nan, 0, "empty")
    point = float(statistic(x))
    if n == 1:
        return Interval(point, point, point, 1, "single")
    rng = np.random.default_rng(seed)
    if statistic is np.mean and n >= STUDENTIZED_MIN_N:
        se = float(x.std(ddof=1) / np.sqrt(n))
        means, sds = _resampled_mean_sd(x, n_resamples, rng)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_boot = (means - point) / (sds / np.sqrt(n))
        low, high = _studentized(point, se, t_boot, confidence)
        return Interval(float(low), float(high), point, n, "bootstrap-t")
    boot = _resampled_stat(x, statistic, n_resamples, rng)
    k = np.sqrt(n / (n - 1)) * _t_over_z(n - 1, confidence)
    low, high = _widened(point, boot, k, confidence)
    return Interval(float(low), float(high), point, n, "widened percentile")


def _welch_df(var_a: float, n_a: int, var_b: float, n_b: int) -> float:
    """Welch-Satterthwaite degrees of freedom for the difference of two means (var_* are variances/n)."""
    num = (var_a + var_b) ** 2
    den = var_a**2 / (n_a - 1) + var_b**2 / (n_b - 1)
    return num / den if den > 0 else float("inf")


def _bias_fix(var_a: float, n_a: int, var_b: float, n_b: int) -> float:
    """sqrt(true variance / bootstrap variance) of a two-group statistic; the bootstrap shrinks each by (n-1)/n."""
    boot = var_a * (n_a - 1) / n_a + var_b * (n_b - 1) / n_b
    return float(np.sqrt((var_a + var_b) / boot)) if boot > 0 else 1.0


def _verdict(low: float, high: float, higher_is_better: bool) -> str:
    """Verdict from an interval for log(candidate/baseline) or candidate - baseline (0 = no change)."""
    if low > 0:
        return "faster" if higher_is_better else "slower"
    if high < 0:
        return "slower" if higher_is_better else "faster"
    return NO_DIFFERENCE


def compare(baseline_samples, candidate_samples, confidence: float = 0.95, higher_is_better: bool = True,
            seed: int = 0, n_resamples: int = 10_000) -> Effect:
    """Effect of candidate versus baseline: ratio and difference of means, intervals, and a verdict.

    Both groups are resampled independently. Intervals: bootstrap-t when both groups have >= 5 samples,
    else the widened percentile bootstrap (Welch degrees of freedom). The ratio interval is built on the
    log scale when every value is positive; "faster" means the whole interval lies on the better side of 1.
    """
    b = np.asarray(baseline_samples, dtype=float).ravel()
    c = np.asarray(candidate_samples, dtype=float).ravel()
    b, c = b[~np.isnan(b)], c[~np.isnan(c)]
    nan = float("nan")
    if b.size == 0 or c.size == 0:
        return Effect(nan, nan, nan, nan, nan, nan, NO_DIFFERENCE, "empty")
    mb, mc = float(b.mean()), float(c.mean())
    ratio = mc / mb if mb != 0 else nan
    diff = mc - mb
    if b.size < 2 or c.size < 2:
        # One repeat says nothing about noise: no interval, and no claim of a difference.
        return Effect(ratio, nan, nan, diff, nan, nan, NO_DIFFERENCE, "too few samples")

    nb, nc = b.size, c.size
    vb, vc = float(b.var(ddof=1)) / nb, float(c.var(ddof=1)) / nc  # squared standard errors of the means
    rng = np.random.default_rng(seed)
    mb_s, sb_s = _resampled_mean_sd(b, n_resamples, rng)
    mc_s, sc_s = _resampled_mean_sd(c, n_resamples, rng)
    positive = bool((b > 0).all() and (c > 0).all())
    studentized = min(nb, nc) >= STUDENTIZED_MIN_N

    with np.errstate(divide="ignore", invalid="ignore"):
        if studentized:
            se_d = np.sqrt(vb + vc)
            t_d = (mc_s - mb_s - diff) / np.sqrt(sb_s**2 / nb + sc_s**2 / nc)
            diff_low, diff_high = _studentized(diff, float(se_d), t_d, confidence)
        else:
            # The bootstrap spreads each group's mean by (n-1)/n of its variance: undo that, then widen
            # by Student's quantile over the normal one.
            k = _bias_fix(vb, nb, vc, nc) * _t_over_z(_welch_df(vb, nb, vc, nc), confidence)
            diff_low, diff_high = _widened(diff, mc_s - mb_s, k, confidence)

        if positive:
            log_r = float(np.log(mc / mb))
            rb, rc = vb / mb**2, vc / mc**2  # delta method: relative variances of the means
            if studentized:
                se_l = np.sqrt(rb + rc)
                se_l_s = np.sqrt(sb_s**2 / (nb * mb_s**2) + sc_s**2 / (nc * mc_s**2))
                t_l = (np.log(mc_s / mb_s) - log_r) / se_l_s
                l_low, l_high = _studentized(log_r, float(se_l), t_l, confidence)
            else:
                k = _bias_fix(rb, nb, rc, nc) * _t_over_z(_welch_df(rb, nb, rc, nc), confidence)
                l_low, l_high = _widened(log_r, np.log(mc_s / mb_s), k, confidence)
            ratio_low, ratio_high = float(np.exp(l_low)), float(np.exp(l_high))
            verdict = _verdict(l_low, l_high, higher_is_better)
        else:
            # Values of both signs: a ratio interval means little, so the verdict rests on the difference.
            ends = sorted([1 + diff_low / mb, 1 + diff_high / mb]) if mb != 0 else [nan, nan]
            ratio_low, ratio_high = ends
            verdict = _verdict(diff_low, diff_high, higher_is_better)

    method = "bootstrap-t" if studentized else "widened percentile"
    return Effect(ratio, float(ratio_low), float(ratio_high), diff, float(diff_low), float(diff_high),
                  verdict, method)
