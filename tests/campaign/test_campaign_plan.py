"""The plan: A/B alternation, cumulative steps, what resume skips."""

from rooftop.campaign.plan import campaign_plan, independent_plan, remaining_keys, total_blocks
from rooftop.spec.campaign import parse_campaign

TOML = """
[campaign]
name = "p"
mode = "{mode}"
[deployment]
engine = "embedded"
model = "tiny"
[bench]
concurrency = [1]
repeats = 3
[[lever]]
name = "a"
args = {{ context-length = 4096 }}
quality_check = true
[[lever]]
name = "b"
args = {{ max-running-requests = 2 }}
"""


def _spec(mode):
    return parse_campaign(TOML.format(mode=mode))


def test_independent_rounds_alternate_and_profile_once():
    blocks = independent_plan(_spec("independent"))
    order = [(b.variant, b.repeat) for b in blocks]
    assert order == [("baseline", 0), ("a", 0), ("b", 0), ("b", 1), ("a", 1), ("baseline", 1),
                     ("baseline", 2), ("a", 2), ("b", 2)]
    assert [b.variant for b in blocks if b.profile] == ["baseline", "a", "b"]
    # Quality: the baseline decodes the reference once; lever a is compared against it.
    q = [(b.variant, b.quality_base) for b in blocks if b.quality]
    assert q == [("baseline", None), ("a", "baseline")]
    assert blocks[0].stages == ["deploy", "verify", "warmup", "sweep", "quality", "profile", "teardown"]
    assert blocks[3].stages == ["deploy", "verify", "warmup", "sweep", "teardown"]
    assert total_blocks(_spec("independent")) == len(blocks) == 9


def test_cumulative_winner_joins_the_base_of_the_next_step():
    spec = _spec("cumulative")
    lost = campaign_plan(spec, joined=set())
    won = campaign_plan(spec, joined={"a"})
    assert len(lost) == len(won) == total_blocks(spec) == 12
    step2_lost = {(b.variant, tuple(b.levers)) for b in lost if b.series == "b"}
    step2_won = {(b.variant, tuple(b.levers)) for b in won if b.series == "b"}
    assert step2_lost == {("baseline", ()), ("b", ("b",))}
    assert step2_won == {("a", ("a",)), ("baseline+a+b", ("a", "b"))}
    # Within a step, base and candidate alternate: base first in round 0, candidate first in round 1.
    step1 = [(b.variant, b.repeat) for b in won if b.series == "a"]
    assert step1 == [("baseline", 0), ("a", 0), ("a", 1), ("baseline", 1), ("baseline", 2), ("a", 2)]
    # The variant "a" was profiled in step 1, so step 2 does not profile it again.
    assert [b.variant for b in won if b.profile] == ["baseline", "a", "baseline+a+b"]


def test_remaining_keys_skip_done_units():
    blocks = independent_plan(_spec("independent"))
    units = {k: "done" for b in blocks[:4] for k in b.measuring_keys()}
    units[blocks[4].key("sweep")] = "running"  # killed mid-sweep: still to do
    left = remaining_keys(blocks, units)
    assert blocks[4].key("sweep") in left
    assert not any(k in left for b in blocks[:4] for k in b.measuring_keys())
    assert len(left) == sum(len(b.measuring_keys()) for b in blocks[4:])
