"""Knee detection on synthetic sweeps with a known knee, and the achieved-versus-offered check."""

import numpy as np
import pytest

from rooftop.bench.knee import find_knee, shortfall

LEVELS = [1, 2, 4, 8, 16, 32, 64]
CAP_TOK_S = 800.0


def _saturating(seed: int, repeats: int = 3, noise: float = 0.05, knee: int = 8) -> list[list[float]]:
    """throughput = min(c * cap / knee, cap), times (1 + noise * N(0, 1)) per repeat."""
    rng = np.random.default_rng(seed)
    return [list(min(c * CAP_TOK_S / knee, CAP_TOK_S) * (1 + noise * rng.standard_normal(repeats)))
            for c in LEVELS]


def test_known_knee_found_in_most_seeds_and_inside_its_interval():
    found = contained = 0
    for seed in range(30):
        k = find_knee(LEVELS, _saturating(seed), seed=seed)
        found += k.concurrency == 8
        hi = np.inf if k.high is None else k.high
        contained += k.low is not None and k.low <= 8 <= hi
    assert found >= 27
    assert contained >= 27


def test_knee_at_32_with_five_repeats():
    hits = sum(find_knee(LEVELS, _saturating(s, repeats=5, knee=32), seed=s).concurrency == 32 for s in range(10))
    assert hits >= 9


def test_plateau_is_the_best_level_with_its_interval():
    tp = _saturating(3)
    k = find_knee(LEVELS, tp)
    best = int(np.argmax([np.mean(t) for t in tp]))
    assert k.best_concurrency == LEVELS[best]
    assert k.plateau_tok_s == pytest.approx(np.mean(tp[best]))
    assert k.plateau_low < k.plateau_tok_s < k.plateau_high
    assert abs(k.plateau_tok_s - CAP_TOK_S) < 0.1 * CAP_TOK_S


def test_levels_in_any_order():
    tp = _saturating(4)
    order = [6, 0, 3, 5, 1, 4, 2]
    shuffled = find_knee([LEVELS[i] for i in order], [tp[i] for i in order], seed=1)
    assert shuffled == find_knee(LEVELS, tp, seed=1)


def test_rising_curve_says_not_reached():
    rng = np.random.default_rng(0)
    tp = [list(c * 10.0 * (1 + 0.03 * rng.standard_normal(3))) for c in LEVELS]
    k = find_knee(LEVELS, tp)
    assert k.concurrency is None and k.high is None
    assert "not reached" in k.method
    assert k.best_concurrency == 64


def test_single_repeat_has_no_interval():
    k = find_knee(LEVELS, [[min(c * 100.0, 800.0)] for c in LEVELS])
    assert (k.concurrency, k.low, k.high) == (8, 8, 8)
    assert "single repeat" in k.method and "no interval" in k.method
    rising = find_knee(LEVELS, [[c * 100.0] for c in LEVELS])
    assert rising.concurrency is None and "not reached" in rising.method


def test_declining_after_the_peak_keeps_the_knee_at_saturation():
    # Overload: throughput falls past 16; the knee is still where it first reached the top.
    rng = np.random.default_rng(2)
    shape = [100, 200, 400, 800, 810, 700, 600]
    tp = [list(v * (1 + 0.02 * rng.standard_normal(4))) for v in shape]
    assert find_knee(LEVELS, tp).concurrency == 8


def test_degenerate_inputs():
    assert find_knee([], []).method == "no data"
    assert find_knee([8], [[500.0, 510.0]]).concurrency is None
    assert find_knee([1, 2], [[], [float("nan")]]).method == "no data"
    with pytest.raises(ValueError):
        find_knee([1, 2], [[1.0]])


@pytest.mark.parametrize(("offered", "achieved", "short"), [
    (10.0, 9.6, False),
    (10.0, 9.4, True),
    (10.0, 12.0, False),
    (None, 3.0, False),
    (0.0, 0.0, False),
])
def test_shortfall(offered, achieved, short):
    assert shortfall(offered, achieved) is short
