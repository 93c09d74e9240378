"""The knee of a concurrency sweep: where more concurrency stops adding throughput beyond noise.

Rule (docs/statistics.md): the best level is the one with the highest mean throughput; a level is on
the plateau when its mean is not below the best's by more than the noise margin
t_{df, (1+confidence)/2} * sqrt(se_level^2 + se_best^2), where se is the standard error of a level's mean
over its repeats, computed from the coefficient of variation pooled over all levels (df = sum of n - 1). The knee is the lowest level on the plateau. If that is the highest level swept,
throughput was still rising beyond noise at the top: the knee was not reached.
Uncertainty: resample each level's repeats, recompute the knee with the same margins, and take the
central `confidence` interval of the knee levels found.
With one repeat at some level there is no noise estimate: the plateau is "within SINGLE_REPEAT_TOLERANCE
of the best mean" and no interval is given.
"""

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from rooftop.bench.stats import bootstrap_ci

SINGLE_REPEAT_TOLERANCE = 0.05  # relative; only used when a level has a single repeat
N_RESAMPLES = 2000


@dataclass(slots=True)
class Knee:
    """Knee concurrency (None: not reached) with its interval, and the plateau throughput in tok/s."""

    concurrency: int | None
    low: int | None
    high: int | None
    plateau_tok_s: float
    plateau_low: float
    plateau_high: float
    method: str
    best_concurrency: int | None = None  # the level whose mean throughput is the plateau


def _knee_index(means: np.ndarray, margin: np.ndarray) -> np.ndarray:
    """Knee level index per row of means (R x L); margin[i, b] is the allowance of level i against best b."""
    best = means.argmax(axis=1)
    rows = np.arange(means.shape[0])
    best_mean = means[rows, best]
    on_plateau = means >= best_mean[:, None] - margin[:, best].T
    return on_plateau.argmax(axis=1)  # first True; the best level itself is always on the plateau


def _margins(samples: list[np.ndarray], confidence: float) -> np.ndarray:
    """margin[i, b]: noise allowance of level i against level b, from the pooled relative spread.

    Each level's spread is estimated from few repeats (often 3), so one level's standard deviation is
    itself very noisy; throughput noise is roughly proportional to throughput, so the coefficient of
    variation is pooled over all levels (sum of n_i - 1 degrees of freedom).
    """
    n = np.array([s.size for s in samples], dtype=float)
    means = np.array([s.mean() for s in samples])
    scale = np.where(means != 0, np.abs(means), 1.0)
    rel_var = np.array([s.var(ddof=1) for s in samples]) / scale**2
    df = float((n - 1).sum())
    cv2 = float(((n - 1) * rel_var).sum() / df)
    se2 = cv2 * scale**2 / n  # squared standard error of each level's mean
    q = sps.t.ppf((1 + confidence) / 2, df)
    return q * np.sqrt(se2[:, None] + se2[None, :])


def find_knee(levels: list[int], throughput_by_level: list[list[float]], confidence: float = 0.95,
              seed: int = 0) -> Knee:
    """Knee of a sweep: levels (concurrency) and, per level, the throughput of each repeat in tok/s."""
    if len(levels) != len(throughput_by_level):
        raise ValueError(f"{len(levels)} levels but {len(throughput_by_level)} throughput lists")
    pairs = sorted(((int(c), np.asarray(t, dtype=float).ravel()) for c, t in zip(levels, throughput_by_level, strict=True)),
                   key=lambda pair: pair[0])
    pairs = [(c, t[~np.isnan(t)]) for c, t in pairs]
    pairs = [(c, t) for c, t in pairs if t.size]  # a level with no valid repeat says nothing
    nan = float("nan")
    if not pairs:
        return Knee(None, None, None, nan, nan, nan, "no data")
    lv = [c for c, _ in pairs]
    samples = [t for _, t in pairs]
    means = np.array([t.mean() for t in samples])
    best = int(means.argmax())
    plateau = bootstrap_ci(samples[best], confidence=confidence, seed=seed)
    top = len(lv) - 1

    def result(k: int | None, low: int | None, high: int | None, method: str) -> Knee:
        return Knee(k, low, high, plateau.point, plateau.low, plateau.high, method, lv[best])

    if len(lv) == 1:
        return result(None, None, None, "one level: no knee can be located")

    if min(t.size for t in samples) < 2:
        allowed = SINGLE_REPEAT_TOLERANCE * means[best]
        k = int(np.argmax(means >= means[best] - allowed))
        method = f"single repeat: lowest level within {SINGLE_REPEAT_TOLERANCE:.0%} of the best mean; no interval"
        if k == top:
            return result(None, None, None, "not reached (still rising at the highest level); " + method)
        return result(lv[k], lv[k], lv[k], method)

    margin = _margins(samples, confidence)
    k = int(_knee_index(means[None, :], margin)[0])

    rng = np.random.default_rng(seed)
    boot_means = np.column_stack([
        t[rng.integers(0, t.size, (N_RESAMPLES, t.size))].mean(axis=1) for t in samples])
    boot_k = _knee_index(boot_means, margin)
    a = (1 - confidence) / 2
    lo_i = int(min(np.quantile(boot_k, a, method="lower"), k))
    hi_i = int(max(np.quantile(boot_k, 1 - a, method="higher"), k))
    method = f"bootstrap over repeats ({N_RESAMPLES} resamples, {confidence:.0%})"
    # An interval end at the top level means "not reached" in those resamples: no finite bound there.
    low = lv[lo_i] if lo_i < top else None
    high = lv[hi_i] if hi_i < top else None
    if k == top:
        return result(None, low, None, "not reached (still rising beyond noise at the highest level); " + method)
    return result(lv[k], low, high, method)


def shortfall(offered: float | None, achieved: float, tolerance: float = 0.05) -> bool:
    """True when achieved load fell short of offered load by more than tolerance (relative)."""
    if not offered or offered <= 0:
        return False
    return achieved < offered * (1 - tolerance)
