"""Aligning a compiled (or graphed) step with its eager map: matched, fused, split, missing and extra items."""

import numpy as np
import pytest

from rooftop.errors import RooftopError
from rooftop.profile.attribute import Attribution
from rooftop.profile.mapping import ENCLOSED, FILLED, MATCHED, _align, apply_map

ATTN = ("M", "Layer_0", "Attention_0")
MLP = ("M", "Layer_0", "MLP_0")
NORM = ("M", "Layer_0", "RMSNorm_0")


def eager_map(items: list[tuple[str, tuple[str, ...], int]]):
    """A one-step map attribution: (name, module path, duration ns) per item, in order."""
    paths = [(), *dict.fromkeys(p for _, p, _ in items)]
    att = Attribution(basis="cpu_ops", granularity="module", name=np.arange(len(items)),
                      kind=np.zeros(len(items), dtype=np.int64), dur_ns=np.array([d for _, _, d in items]),
                      step=np.zeros(len(items), dtype=np.int64), path=np.array([paths.index(p) for _, p, _ in items]),
                      op=np.arange(len(items)), graph=np.zeros(len(items), dtype=bool), paths=paths,
                      path_component=[], steps=[], busy_ns=np.zeros(1, dtype=np.int64),
                      wall_ns=np.zeros(1, dtype=np.int64))
    return att, [n for n, _, _ in items]


EAGER = [("norm_pow", NORM, 10), ("norm_mean", NORM, 10), ("mm", ATTN, 50), ("attn", ATTN, 100), ("mm", ATTN, 40),
         ("mm", MLP, 60), ("silu", MLP, 20), ("mul", MLP, 20), ("mm", MLP, 60)]


def plan_of(target: list[str]):
    att, names = eager_map(EAGER)
    return _align(target, list(range(len(EAGER))), names, att)


def test_identical_sequences_match_one_to_one():
    plan = plan_of([n for n, _, _ in EAGER])
    assert [p[0][0] for p in plan] == [p for _, p, _ in EAGER]
    assert [p for p in plan] == [[(path, 1.0, MATCHED, j)] for j, (_, path, _) in enumerate(EAGER)]


def test_a_fused_kernel_shares_its_time_among_the_ops_it_replaced():
    # norm_pow + norm_mean became one kernel; silu + mul became another
    plan = plan_of(["fused_norm", "mm", "attn", "mm", "mm", "fused_silu_mul", "mm"])
    assert plan[0] == [(NORM, 1.0, FILLED, 0)]  # both norms are 10 ns: the first stands for them
    assert plan[5] == [(MLP, 1.0, FILLED, 6)]
    assert plan[1] == [(ATTN, 1.0, MATCHED, 2)] and plan[4] == [(MLP, 1.0, MATCHED, 5)]


def test_a_kernel_fused_across_modules_is_split_by_eager_time():
    # the attention's output mm and the MLP's first mm fused into one
    plan = plan_of(["norm_pow", "norm_mean", "mm", "attn", "fused_mm_mm", "silu", "mul", "mm"])
    shares = {path: share for path, share, how, _ in plan[4]}
    assert shares == pytest.approx({ATTN: 40 / 100, MLP: 60 / 100})
    assert {how for _, _, how, _ in plan[4]} == {FILLED}
    assert {path: j for path, _, _, j in plan[4]} == {ATTN: 4, MLP: 5}  # each part keeps its eager op


def test_an_extra_item_takes_the_module_enclosing_its_neighbours():
    plan = plan_of(["norm_pow", "norm_mean", "mm", "attn", "extra", "mm", "mm", "silu", "mul", "mm"])
    # between two attention ops ("attn" and the output "mm") an unknown op sits in attention
    assert plan[4] == [(ATTN, 1.0, ENCLOSED, -1)]
    plan = plan_of(["norm_pow", "norm_mean", "mm", "attn", "mm", "extra", "mm", "silu", "mul", "mm"])
    assert plan[5] == [(("M", "Layer_0"), 1.0, ENCLOSED, -1)]  # between attention and MLP: the layer


def test_missing_items_leave_the_rest_matched():
    plan = plan_of(["mm", "attn", "mm", "mm", "mm"])  # norms and the activation gone (fused into nothing visible)
    assert [p[0][0] for p in plan] == [ATTN, ATTN, ATTN, MLP, MLP]
    assert all(p[0][2] == MATCHED for p in plan)
    assert [p[0][3] for p in plan] == [2, 3, 4, 5, 8]


def test_a_reordered_item_is_matched_where_the_rest_agrees():
    plan = plan_of(["norm_pow", "norm_mean", "attn", "mm", "mm", "mm", "silu", "mul", "mm"])  # attn before its mm
    assert all(len(p) >= 1 for p in plan)
    assert plan[0][0][0] == NORM and plan[-1] == [(MLP, 1.0, MATCHED, 8)]


def test_a_map_without_modules_is_refused():
    att, _ = eager_map(EAGER)
    att.granularity = "op"
    with pytest.raises(RooftopError, match="has no module stacks"):
        apply_map(att, None, att, None, "map.json")
