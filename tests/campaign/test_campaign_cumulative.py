"""Cumulative mode: a lever that wins joins the base of the next step, decided once and read back on resume."""

from rooftop.campaign.collect import COMPARISON, JOINED, KEPT
from rooftop.campaign.runner import Runner
from rooftop.campaign.store import Store
from rooftop.spec.campaign import parse_campaign

TOML = """
[campaign]
name = "cum"
mode = "cumulative"
[deployment]
engine = "embedded"
model = "tiny"
[bench]
concurrency = [1, 4]
repeats = 3
[profile]
enabled = false
[[lever]]
name = "a"
args = { context-length = 4096 }
[[lever]]
name = "b"
args = { max-running-requests = 2 }
"""


def _level(tok_s: float) -> dict:
    return {"output_tok_s": {"mean": tok_s}, "ttft_ms": {"mean": 100.0}, "tpot_ms": {"mean": 1000.0 / tok_s}}


def _measure(store, series, variant, tok_by_c, noise=(1.0, 0.97, 1.03)):
    for r, k in enumerate(noise):
        for c, tok in tok_by_c.items():
            store.put_level(series, variant, r, c, _level(tok * k), True)


def test_winner_joins_and_loser_stays_out(tmp_path):
    spec = parse_campaign(TOML)
    store = Store.create(tmp_path)
    store.put_run("cum", "", "cumulative", TOML, None)
    runner = Runner(spec, store)
    blocks = runner.blocks()
    step1 = [next(blocks) for _ in range(6)]
    assert {b.variant for b in step1} == {"baseline", "a"}
    _measure(store, "a", "baseline", {1: 10.0, 4: 14.0})
    _measure(store, "a", "a", {1: 40.0, 4: 70.0})  # a wins by far
    step2 = [next(blocks) for _ in range(6)]  # deciding step 1 happens before step 2 is planned
    assert {b.variant for b in step2} == {"a", "baseline+a+b"}
    assert [d.subject for d in store.decisions(JOINED)] == ["a"]
    _measure(store, "b", "a", {1: 40.0, 4: 70.0})
    _measure(store, "b", "baseline+a+b", {1: 40.5, 4: 69.0}, noise=(1.03, 1.0, 0.97))  # within noise
    assert list(blocks) == []
    assert [d.subject for d in store.decisions(KEPT)] == ["b"]
    cmp = {d.subject: d.payload for d in store.decisions(COMPARISON)}
    assert cmp["b"] == {"lever": "b", "variant": "baseline+a+b", "base_variant": "a", "series": "b"}
    # A resumed runner reads the decisions back instead of deciding again.
    again = list(Runner(spec, store).blocks())
    assert len(store.decisions(JOINED)) == 1 and len(store.decisions(KEPT)) == 1
    assert {b.variant for b in again[6:]} == {"a", "baseline+a+b"}
    store.close()


def test_a_faster_lever_that_lowers_the_slo_capacity_stays_out(tmp_path):
    """Under an SLO, tok/s alone does not decide: a lever twice as fast whose attainment falls below the
    target at C=4 (its capacity drops from C=4 to C=1) is kept out of the baseline."""
    toml = TOML.replace("[profile]", "[slo]\ntpot_ms = 50\nattainment = 0.9\n[profile]")
    spec = parse_campaign(toml)
    store = Store.create(tmp_path)
    store.put_run("cum", "", "cumulative", toml, None)
    blocks = Runner(spec, store).blocks()
    [next(blocks) for _ in range(6)]
    for r, k in enumerate((1.0, 0.97, 1.03)):
        for variant, c, tok, met in (("baseline", 1, 10.0, 1.0), ("baseline", 4, 14.0, 0.99),
                                     ("a", 1, 20.0, 1.0), ("a", 4, 28.0, 0.40 + 0.01 * r)):
            store.put_level("a", variant, r, c, {**_level(tok * k), "slo_attainment": {"mean": met}}, True)
    next(blocks)  # deciding step 1 happens before step 2 is planned
    assert [d.subject for d in store.decisions(KEPT)] == ["a"] and store.decisions(JOINED) == []
    assert store.decisions(KEPT)[0].payload["slo_capacity"].startswith("lower")
    store.close()
