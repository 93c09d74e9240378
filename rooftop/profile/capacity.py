"""Work that scales with allocated capacity rather than with the requests' actual context.

Static: an op's `Input Dims` hold a size derived from the capacity hints (the context length, that
rounded up to whole pages, one page more, the max batch). Dynamic: the same workload profiled at two
capacities; components whose time grows with the capacity.
"""

from dataclasses import dataclass

import numpy as np

from rooftop.profile.components import generic_path
from rooftop.profile.totals import Totals
from rooftop.profile.trace import Trace

DEFAULT_PAGE_SIZE = 64  # the indexer's block size in public DSA implementations (FACTS.md)


@dataclass(slots=True)
class DerivedSize:
    """A tensor dimension that capacity hints predict, and how it was derived."""

    value: int
    derived_from: str


@dataclass(slots=True)
class CapacityFinding:
    """Ops whose inputs carry a capacity-derived dimension, where they run and what they cost."""

    dim: int
    derived_from: str
    ops: list[str]
    component: str
    path: str
    ms_per_step: float
    share: float


def derived_sizes(context_length: int | None, page_size: int | None, max_batch: int | None,
                  model_dims: set[int] | None = None) -> list[DerivedSize]:
    """The sizes a capacity-shaped tensor would have, each with the formula that gives it; none that
    equals one of `model_dims` (a weight's width: a 1024-wide MLP is no 1024-token context)."""
    sizes: list[DerivedSize] = []
    if context_length:
        page = page_size or DEFAULT_PAGE_SIZE
        pages = -(-context_length // page)
        page_note = f"page {page}" + ("" if page_size else ", the default")
        sizes.append(DerivedSize(context_length, f"context length {context_length}"))
        sizes.append(DerivedSize(pages * page, f"ceil({context_length}/{page})*{page} (context in whole pages, {page_note})"))
        sizes.append(DerivedSize(pages * page + page, f"ceil({context_length}/{page})*{page} + {page} (one page more)"))
    if max_batch and max_batch > 1:
        sizes.append(DerivedSize(max_batch, f"max batch {max_batch}"))
    seen: set[int] = set(model_dims or ())
    return [s for s in sizes if not (s.value in seen or seen.add(s.value))]


def static_findings(trace: Trace, totals: Totals, path_component: list[str], n_steps: int,
                    sizes: list[DerivedSize]) -> list[CapacityFinding]:
    """Ops (with the in-step time attributed to them) whose Input Dims contain a capacity-derived size."""
    # shapes come from the items' CPU ops, their own or (through an eager map) their eager twins'
    if not sizes or not len(totals.op_dims) or not (totals.op_dims >= 0).any():
        return []
    by_value = {s.value: s for s in sizes}
    dims_hit: dict[int, set[int]] = {}  # shape id -> derived values it holds
    for sid, shape in enumerate(trace.shapes):
        hit = set(_ints(shape)) & by_value.keys()
        if hit:
            dims_hit[sid] = hit
    if not dims_hit:
        return []
    total_ns = float(totals.dur_ns.sum()) or 1.0
    hit = np.isin(totals.op_dims, np.fromiter(dims_hit, dtype=np.int64))
    acc: dict[int, dict] = {}
    for i in np.flatnonzero(hit).tolist():
        for value in dims_hit.get(int(totals.op_dims[i]), ()):
            a = acc.setdefault(value, {"ns": 0, "ops": {}, "comp": {}, "path": {}})
            d = int(totals.dur_ns[i])
            a["ns"] += d
            op_name = trace.names[totals.op_name[i]]
            a["ops"][op_name] = a["ops"].get(op_name, 0) + d
            p = int(totals.path[i])
            a["comp"][path_component[p]] = a["comp"].get(path_component[p], 0) + d
            a["path"][p] = a["path"].get(p, 0) + d
    findings = []
    for value, a in acc.items():
        if a["ns"] <= 0:
            continue
        component = max(a["comp"], key=a["comp"].get)
        in_component = {p: ns for p, ns in a["path"].items() if path_component[p] == component}
        # ops that cost under 1% of the finding (views, strides) would only bury the ones that matter
        ops = [op for op, ns in sorted(a["ops"].items(), key=lambda kv: -kv[1]) if ns >= 0.01 * a["ns"]]
        findings.append(
            CapacityFinding(
                dim=value,
                derived_from=by_value[value].derived_from,
                ops=ops,
                component=component,
                path=generic_path(totals.paths[max(in_component, key=in_component.get)]),
                ms_per_step=a["ns"] / n_steps / 1e6,
                share=a["ns"] / total_ns,
            )
        )
    findings.sort(key=lambda f: f.ms_per_step, reverse=True)
    return findings


def _ints(shape) -> list[int]:
    out: list[int] = []
    for d in shape:
        if isinstance(d, tuple):
            out.extend(_ints(d))
        elif isinstance(d, int) and not isinstance(d, bool):
            out.append(d)
    return out
