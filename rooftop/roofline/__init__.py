"""Roofline: what a model must cost on a GPU, from its config.json, per component."""

from rooftop.roofline.config import ModelShape, load_model_shape
from rooftop.roofline.costs import ComponentCost, StepCost, decode_costs, prefill_costs
from rooftop.roofline.experts import expected_distinct_experts
from rooftop.roofline.floors import Gap, StepFloor, TokRate, family_floor_ms, floors, gap, predict_tok_s
from rooftop.roofline.params import Params, count_params

__all__ = [
    "ComponentCost",
    "Gap",
    "ModelShape",
    "Params",
    "StepCost",
    "StepFloor",
    "TokRate",
    "count_params",
    "decode_costs",
    "expected_distinct_experts",
    "family_floor_ms",
    "floors",
    "gap",
    "load_model_shape",
    "predict_tok_s",
    "prefill_costs",
]
