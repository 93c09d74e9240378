"""Open-loop arrivals as vllm bench serve spells them: gamma gaps (burstiness) and ramp-ups, seeded."""

import ast
import glob
import math
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from scipy import stats

from rooftop.bench.arrivals import ramp_mean_rate, ramp_rate
from rooftop.bench.loadgen import level_offsets_ns
from rooftop.bench.sweep import BenchConfig

ROOT = Path(__file__).resolve().parents[2]


def gaps_s(plan, seed=0) -> np.ndarray:
    return np.diff(np.array(level_offsets_ns(plan, seed))) / 1e9


def one_plan(**kw):
    (plan,) = BenchConfig(base_url="http://127.0.0.1:1", concurrency=[], **kw).plans()
    return plan


def test_burstiness_1_gives_exponential_gaps():
    plan = one_plan(request_rate=[20.0], burstiness=1.0, num_requests=3000)
    gaps = gaps_s(plan)
    assert stats.kstest(gaps, "expon", args=(0, 1 / 20.0)).pvalue > 0.01
    # and a gamma of another shape is told apart by the same test at the same level
    bursty = gaps_s(one_plan(request_rate=[20.0], burstiness=0.5, num_requests=3000))
    assert stats.kstest(bursty, "expon", args=(0, 1 / 20.0)).pvalue < 0.01


def test_burstiness_quarter_gives_a_coefficient_of_variation_of_2():
    gaps = gaps_s(one_plan(request_rate=[50.0], burstiness=0.25, num_requests=20000), seed=3)
    cv = gaps.std() / gaps.mean()
    assert abs(cv - 2.0) / 2.0 < 0.10, cv
    assert abs(gaps.mean() - 1 / 50.0) / (1 / 50.0) < 0.05  # the mean gap stays 1/rate
    # (no KS test against the gamma: ~1% of shape-0.25 gaps are under a nanosecond, the schedule's unit, and
    # read as 0)


def test_the_schedule_is_seeded():
    plan = one_plan(request_rate=[5.0], burstiness=0.25, num_requests=50)
    assert level_offsets_ns(plan, 7) == level_offsets_ns(plan, 7) != level_offsets_ns(plan, 8)
    assert level_offsets_ns(plan, 7)[0] == 0


def _vllm_rate_function():
    """vLLM's own `_get_current_request_rate`, taken from its source in .venv-vllm without importing vLLM."""
    found = glob.glob(str(ROOT / ".venv-vllm/lib/python*/site-packages/vllm/benchmarks/serve.py"))
    if not found:
        pytest.skip("no vLLM in .venv-vllm")
    tree = ast.parse(Path(found[0]).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_get_current_request_rate")
    space = {"Literal": Literal}
    exec(compile(ast.Module([fn], []), found[0], "exec"), space)  # noqa: S102 - vLLM's own code, read from disk
    return space["_get_current_request_rate"]


@pytest.mark.parametrize("strategy,start,end", [("linear", 1, 10), ("linear", 20, 2), ("exponential", 1, 64),
                                                ("exponential", 5, 3)])
def test_ramp_rates_match_vllms_formula(strategy, start, end):
    vllm_rate = _vllm_rate_function()
    for n in (1, 2, 7, 100):
        for i in range(n):
            assert math.isclose(ramp_rate(strategy, start, end, i, n),
                                vllm_rate(strategy, start, end, i, n, 123.0), rel_tol=1e-12)


def test_a_ramps_gaps_follow_its_rate():
    """Each gap drawn at its request's rate: gaps times rates are exponential with mean 1."""
    plan = one_plan(ramp_up_strategy="linear", ramp_up_start_rps=2.0, ramp_up_end_rps=200.0, num_requests=3000)
    assert plan.label == "ramp linear 2→200/s"
    gaps = gaps_s(plan, seed=5)
    rates = np.array([ramp_rate("linear", 2.0, 200.0, i, 3000) for i in range(1, 3000)])
    assert stats.kstest(gaps * rates, "expon").pvalue > 0.01
    # the level's offered rate is the ramp's mean: n - 1 gaps over their expected span
    assert math.isclose(plan.request_rate, 2999 / float(np.sum(1 / rates)))
    assert plan.request_rate == ramp_mean_rate("linear", 2.0, 200.0, 3000)
