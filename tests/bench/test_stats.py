"""Statistics on known distributions: percentiles, thin flags, bootstrap coverage, A/B verdicts."""

import numpy as np
import pytest

from rooftop.bench.stats import NO_DIFFERENCE, bootstrap_ci, compare, describe

TRIALS = 400


def test_describe_matches_numpy_linear_percentiles():
    x = np.random.default_rng(1).lognormal(3, 1, 2000)
    d = describe(x)
    assert d.n == 2000
    assert d.mean == pytest.approx(x.mean())
    assert d.median == pytest.approx(np.percentile(x, 50))
    assert d.p90 == pytest.approx(np.percentile(x, 90))
    assert d.p99 == pytest.approx(np.percentile(x, 99))
    assert d.thin == []


def test_describe_small_known_values_and_nan():
    # 1..10: linear interpolation gives median 5.5, p90 = 9.1, p99 = 9.91; NaN (a failed request) is ignored.
    d = describe([*range(1, 11), float("nan")])
    assert (d.n, d.mean, d.median) == (10, 5.5, 5.5)
    assert d.p90 == pytest.approx(9.1)
    assert d.p99 == pytest.approx(9.91)


@pytest.mark.parametrize(("n", "thin"), [
    (10, ["median", "p90", "p99"]),
    (19, ["median", "p90", "p99"]),
    (20, ["p90", "p99"]),
    (99, ["p90", "p99"]),
    (100, ["p99"]),
    (999, ["p99"]),
    (1000, []),
])
def test_thin_flags_follow_ten_samples_beyond(n, thin):
    assert describe(np.arange(n, dtype=float)).thin == thin


def test_describe_empty_is_nan():
    d = describe([])
    assert d.n == 0 and np.isnan(d.mean) and np.isnan(d.p99)


def test_single_and_empty_intervals():
    one = bootstrap_ci([42.0])
    assert (one.low, one.high, one.point, one.n, one.method) == (42.0, 42.0, 42.0, 1, "single")
    assert bootstrap_ci([]).n == 0


def test_constant_samples_give_a_point_interval():
    for n in (3, 8):
        iv = bootstrap_ci([7.0] * n)
        assert (iv.low, iv.high, iv.point) == (7.0, 7.0, 7.0)


def test_interval_is_reproducible_with_a_seed_and_brackets_the_point():
    x = [101.0, 97.5, 103.2, 99.9]
    a, b = bootstrap_ci(x, seed=3), bootstrap_ci(x, seed=3)
    assert (a.low, a.high) == (b.low, b.high)
    assert a.low < a.point < a.high
    assert a.method == "widened percentile"
    assert bootstrap_ci(x * 2).method == "bootstrap-t"


def _coverage(draw, true_mean, n):
    rng = np.random.default_rng(1000 + n)
    hits = 0
    for t in range(TRIALS):
        iv = bootstrap_ci(draw(rng, n), n_resamples=1000, seed=t)
        hits += iv.low <= true_mean <= iv.high
    return hits / TRIALS


@pytest.mark.parametrize("n", [3, 5, 10, 30])
def test_bootstrap_covers_normal_mean_at_nominal_rate(n):
    cover = _coverage(lambda rng, k: rng.normal(50.0, 5.0, k), 50.0, n)
    assert 0.90 <= cover <= 0.98, cover


@pytest.mark.parametrize("n", [5, 10, 30])
def test_bootstrap_covers_lognormal_mean_at_nominal_rate(n):
    cover = _coverage(lambda rng, k: rng.lognormal(0.0, 0.5, k), float(np.exp(0.125)), n)
    assert 0.90 <= cover <= 0.98, cover


def test_bootstrap_of_another_statistic_brackets_it():
    x = np.random.default_rng(5).normal(10, 1, 40)
    iv = bootstrap_ci(x, statistic=np.median, n_resamples=2000)
    assert iv.point == pytest.approx(np.median(x))
    assert iv.low < iv.point < iv.high
    assert iv.method == "widened percentile"


@pytest.mark.parametrize("n", [3, 5, 10])
def test_compare_same_distribution_is_no_difference_at_about_nominal_rate(n):
    rng = np.random.default_rng(77 + n)
    same = sum(
        compare(rng.normal(500, 25, n), rng.normal(500, 25, n), n_resamples=1000, seed=t).verdict == NO_DIFFERENCE
        for t in range(300))
    assert 0.90 <= same / 300 <= 0.99


def test_compare_clear_shift_in_throughput_and_latency():
    base = [500.0, 510.0, 495.0]
    fast = [560.0, 571.0, 566.0]
    e = compare(base, fast)
    assert e.verdict == "faster"
    assert e.ratio == pytest.approx(np.mean(fast) / np.mean(base))
    assert 1.0 < e.ratio_low < e.ratio < e.ratio_high
    assert e.diff == pytest.approx(np.mean(fast) - np.mean(base))
    assert 0 < e.diff_low < e.diff < e.diff_high
    # For a latency, lower is better: the same numbers read the other way.
    assert compare(base, fast, higher_is_better=False).verdict == "slower"
    assert compare(fast, base, higher_is_better=False).verdict == "faster"
    assert compare(fast, base).verdict == "slower"


def test_compare_overlapping_noise_is_no_difference():
    e = compare([500.0, 540.0, 470.0], [515.0, 480.0, 530.0])
    assert e.verdict == NO_DIFFERENCE
    assert e.ratio_low < 1.0 < e.ratio_high


def test_compare_single_repeat_makes_no_claim():
    e = compare([100.0], [200.0])
    assert e.verdict == NO_DIFFERENCE and e.ratio == 2.0 and np.isnan(e.ratio_low)
    assert e.method == "too few samples"


def test_compare_values_of_both_signs_uses_the_difference():
    e = compare([-1.0, 1.0, 0.5, -0.5, 0.0], [10.0, 11.0, 9.0, 10.5, 9.5])
    assert e.verdict == "faster"
    assert e.diff_low > 5


def test_an_interval_is_cut_at_the_floor_of_its_quantity():
    wild = [10.0, 200.0, 15.0]  # three repeats, one far off: the widened interval reaches below 0
    plain = bootstrap_ci(wild)
    assert plain.low < 0
    cut = bootstrap_ci(wild, floor=0.0)
    assert cut.low == 0.0 and (cut.high, cut.point) == (plain.high, plain.point)
