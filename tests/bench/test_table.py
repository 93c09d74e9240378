"""The bench table prints an interval only where one exists: one repeat gives '(no interval)', not a
zero-width interval that reads as certainty."""

from rich.console import Console

from rooftop.bench.summary import _interval, _share
from rooftop.bench.table import summary_notes, summary_table


def _level(per_repeat: list[float], label: str = "C=4") -> dict:
    lat = {"mean": 10.0, "median": 10.0, "p90": 11.0, "p99": 12.0, "n": 8, "thin": []}
    tc = {"output_len_mismatch": 0, "usage_vs_client_output": 0, "usage_vs_client_input": 0, "examples": []}
    return {"label": label, "completed": 8, "failed": 0, "valid": True, "load_shortfall": False,
            "repeats_run": len(per_repeat), "output_tok_s": _interval(per_repeat, 0.95, 0),
            "goodput_req_s": _interval([x / 100 for x in per_repeat], 0.95, 0),
            "slo_attainment": _share([0.9] * len(per_repeat), 0.95, 0),
            "ttft_ms": lat, "tpot_ms": lat, "itl_ms": lat, "e2e_ms": lat, "token_check": tc}


def _text(summary: dict) -> str:
    console = Console(width=300, record=True, file=open("/dev/null", "w"))
    console.print(summary_table(summary))
    return console.export_text()


def test_one_repeat_says_no_interval():
    one = {"model": "m", "base_url": "u", "levels": [_level([405.25]), _level([812.5], "C=8")], "slo": {}}
    text = _text(one)
    assert "out tok/s (no interval)" in text and "SLO met (no interval)" in text
    assert "405.2" in text and "4.05" in text and "90%" in text
    assert "405.2–405.2" not in text and "(405.2" not in text
    assert summary_notes(one)[0].startswith("No intervals: one repeat per level.")


def test_a_level_without_an_interval_among_others_says_so_in_its_cell():
    mixed = {"model": "m", "base_url": "u", "levels": [_level([405.25]), _level([800.0, 812.0, 824.0], "C=8")],
             "slo": {}}
    text = _text(mixed)
    assert "out tok/s (CI)" in text and "405.2 (no interval)" in text and "90% (no interval)" in text
    assert not summary_notes(mixed)[0].startswith("No intervals")


def test_repeats_give_their_interval():
    three = {"model": "m", "base_url": "u", "levels": [_level([400.0, 405.0, 410.0])], "slo": {}}
    o = three["levels"][0]["output_tok_s"]
    assert o["ci_low"] < o["mean"] < o["ci_high"]
    assert f"405.0 ({o['ci_low']:.1f}–{o['ci_high']:.1f})" in _text(three)


def test_knee_plateau_from_one_repeat_has_no_interval():
    knee = {"concurrency": 4, "low": 4, "high": 4, "plateau_tok_s": 405.2, "plateau_low": 405.2,
            "plateau_high": 405.2}
    one = {"levels": [_level([405.2])], "knee": knee}
    assert "Knee at C=4: plateau 405.2 tok/s (no interval: one repeat)." in summary_notes(one)
    three = {"levels": [_level([400.0, 405.0, 410.0])], "knee": {**knee, "plateau_low": 398.0, "plateau_high": 412.0}}
    assert "Knee at C=4: plateau 405.2 tok/s (398.0–412.0)." in summary_notes(three)


def test_the_decode_forward_column_appears_where_the_engine_timed_it():
    plain = {"model": "m", "base_url": "u", "levels": [_level([405.25])]}
    assert "its forward on the device" not in _text(plain)
    timed = _level([405.25])
    timed |= {"engine_decode_step_ms": 1.0586,
              "engine_steps": {"decode": {"steps": 4032, "ms_per_step": 1.0586, "repeats": 1,
                                          "device_ms_per_step": 0.9612, "wall_over_device": 1.1013,
                                          "device_repeats": 1}}}
    text = _text({"model": "m", "base_url": "u", "levels": [timed, _level([800.0], "C=8")]})
    assert "its forward on the device ms" in text and "1.06" in text and "0.961" in text


def test_speculation_columns_and_note_appear_only_where_the_engine_speculated():
    from rooftop.bench.engine_metrics import spec_figures

    plain = {"model": "m", "base_url": "u", "levels": [_level([405.25])]}
    assert "draft accept" not in _text(plain) and not any("speculative" in n for n in summary_notes(plain))
    spec = spec_figures(36, 105, 85, [33, 28, 24]) | {"repeats": 1, "source": "vllm:spec_decode_*"}
    both = {"model": "m", "base_url": "u", "levels": [_level([405.25]) | {"spec_decode": spec}, _level([812.5], "C=8")]}
    text = _text(both)
    assert "draft accept %" in text and "accepted length" in text and "81.0" in text and "3.36" in text
    (note,) = [n for n in summary_notes(both) if "speculative" in n]
    assert note.startswith("C=4: speculative decoding accepted 85 of 105 draft tokens (81.0%) in 36 drafts")
    assert "draft position 92%, 78%, 67%" in note
