"""Reading an engine's step histogram: series, labels, counter resets."""

from rooftop.bench.engine_steps import parse_step_totals, step_delta


def test_labels_in_any_order_exponents_timestamps_and_braces_in_values():
    text = "\n".join([
        "# HELP rooftop_engine_step_seconds Wall time of one engine step, by kind.",
        'rooftop_engine_step_seconds_bucket{kind="decode",le="+Inf",model_name="m"} 3.0',
        'rooftop_engine_step_seconds_sum{model_name="a}b",kind="decode"} 1.5e-02',
        'rooftop_engine_step_seconds_count{kind="decode",model_name="a}b"} 3.0 1700000000000',
        'rooftop_engine_step_seconds_sum{subkind="x",kind="prefill"} 0.25',
        'rooftop_engine_step_seconds_count{subkind="x",kind="prefill"} 1.0',
        'rooftop_engine_step_seconds_created{kind="decode",model_name="m"} 1.7e+09',
        'rooftop_engine_step_seconds_sum{model_name="m"} 9.0',  # no kind: not counted
    ])
    assert parse_step_totals(text) == {"decode": (0.015, 3.0), "prefill": (0.25, 1.0)}


def test_delta_drops_a_kind_whose_totals_went_down():
    """A restarted server starts its counters again: a negative time is no step time."""
    before = {"decode": (10.0, 1000.0), "prefill": (1.0, 10.0)}
    after = {"decode": (0.5, 1100.0), "prefill": (1.5, 12.0)}
    assert step_delta(before, after) == {"prefill": {"steps": 2, "ms_per_step": 250.0}}
    assert step_delta(before, {"decode": (0.5, 1100.0)}) is None
