"""Per-step summary of a trace: busy/idle, time by component, category and unit, top kernels, findings."""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rooftop.profile.attribute import Attribution, attribute, attribute_stream, component_name
from rooftop.profile.capacity import CapacityFinding, derived_sizes, static_findings
from rooftop.profile.classify import TENSOR, UNKNOWN, Classification, classify_kernel, classify_op
from rooftop.profile.components import component_of, generic_path
from rooftop.profile.kernel_code import existing, read_verdicts
from rooftop.profile.mapping import COMPILED_MARKERS, apply_map, map_notes
from rooftop.profile.step_window import StepWindow
from rooftop.profile.totals import Totals, TotalsBuilder
from rooftop.profile.trace import Trace, is_graph_launch

HOST_BOUND_IDLE_SHARE = 0.2


@dataclass(slots=True)
class ComponentTime:
    """Time of one component (indexer, attention, ...) per step, its main path and units."""

    name: str
    path: str
    share: float
    ms_per_step: float
    unit_shares: dict[str, float]
    paths: list[tuple[str, float]] = field(default_factory=list)  # (generic path, ms per step)


@dataclass(slots=True)
class KernelTime:
    """Time of one kernel (or CPU op) name per step, with its classification."""

    name: str
    category: str
    unit: str
    rule: str
    component: str
    ms_per_step: float
    share: float
    calls_per_step: float


@dataclass(slots=True)
class ProfileSummary:
    """What a trace says, per step; `to_json_dict()` is the `rooftop profile --json` schema."""

    trace: str
    basis: str  # "kernels" (GPU time) or "cpu_ops" (CPU op self time)
    granularity: str  # "module" or "op"
    arch: str | None
    steps: int
    gpu_busy_ms_per_step: float
    gpu_idle_share: float
    components: list[ComponentTime]
    categories: dict[str, float]
    unit_shares: dict[str, float]
    tensor_core_share: float
    capacity_findings: list[CapacityFinding]
    top_kernels: list[KernelTime]
    notes: list[str]
    attribution_source: str = ""  # nn.Module frames, CPU op names and shapes, or an eager map
    unattributed_share: float = 0.0  # share of the step's time in no component ("other")
    devices: int = 1  # GPUs whose kernels are in the steps: every ms per step is per GPU

    def to_json_dict(self) -> dict:
        return {
            "trace": self.trace,
            "steps": self.steps,
            "gpu_busy_ms_per_step": self.gpu_busy_ms_per_step,
            "gpu_idle_share": self.gpu_idle_share,
            "components": [
                {"name": c.name, "path": c.path, "share": c.share, "ms_per_step": c.ms_per_step,
                 "unit_shares": c.unit_shares, "paths": [[p, ms] for p, ms in c.paths]}
                for c in self.components
            ],
            "categories": self.categories,
            "unit_shares": self.unit_shares,
            "tensor_core_share": self.tensor_core_share,
            "capacity_findings": [
                {"dim": f.dim, "derived_from": f.derived_from, "ops": f.ops, "component": f.component,
                 "path": f.path, "ms_per_step": f.ms_per_step, "share": f.share}
                for f in self.capacity_findings
            ],
            "top_kernels": [
                {"name": k.name, "category": k.category, "unit": k.unit, "rule": k.rule, "component": k.component,
                 "ms_per_step": k.ms_per_step, "share": k.share, "calls_per_step": k.calls_per_step}
                for k in self.top_kernels
            ],
            "basis": self.basis,
            "attribution": self.granularity,
            "attribution_source": self.attribution_source,
            "unattributed_share": self.unattributed_share,
            "devices": self.devices,
            "arch": self.arch,
            "findings": self.findings(),
            "notes": self.notes,
        }

    @classmethod
    def from_json_dict(cls, d: dict) -> "ProfileSummary":
        """The summary `to_json_dict` wrote (its "findings" are sentences made again from the rest).

        Also the older shapes campaigns stored, here and nowhere else: before the trace, the overall
        unit shares, each component's paths and each capacity finding's path and share were written
        (empty or 0 where missing), and, older still, before `attribution_source` (the granularity
        stands for it, as the documents showed), `unattributed_share` (the "other" component's share,
        as `analyze` takes it) and `devices` (1)."""
        components = [
            ComponentTime(name=c["name"], path=c.get("path", ""), share=c["share"], ms_per_step=c["ms_per_step"],
                          unit_shares=dict(c.get("unit_shares") or {}),
                          paths=[(p, ms) for p, ms in c.get("paths", [])])
            for c in d.get("components", [])
        ]
        granularity = d.get("attribution", "op")
        return cls(
            trace=d.get("trace", ""),
            basis=d["basis"],
            granularity=granularity,
            arch=d.get("arch"),
            steps=d["steps"],
            gpu_busy_ms_per_step=d["gpu_busy_ms_per_step"],
            gpu_idle_share=d["gpu_idle_share"],
            components=components,
            categories=dict(d.get("categories") or {}),
            unit_shares=dict(d.get("unit_shares") or {}),
            tensor_core_share=d["tensor_core_share"],
            capacity_findings=[
                CapacityFinding(dim=f["dim"], derived_from=f["derived_from"], ops=list(f["ops"]),
                                component=f["component"], path=f.get("path", ""), ms_per_step=f["ms_per_step"],
                                share=f.get("share", 0.0))
                for f in d.get("capacity_findings", [])
            ],
            top_kernels=[KernelTime(**k) for k in d.get("top_kernels", [])],
            notes=list(d.get("notes") or []),
            attribution_source=d.get("attribution_source", granularity),
            unattributed_share=d.get("unattributed_share",
                                     next((c.share for c in components if c.name == "other"), 0.0)),
            devices=d.get("devices", 1),
        )

    def findings(self) -> list[str]:
        """The summary in sentences, most important first."""
        where = "GPU time" if self.basis == "kernels" else "CPU op self time"
        out = []
        for f in self.capacity_findings[:3]:
            out.append(
                f"The {f.component} ({f.path}) runs {', '.join(f.ops[:6])} on tensors with a dimension of {f.dim} = "
                f"{f.derived_from}: {f.ms_per_step:.3f} ms per step, {f.share:.0%} of {where}. This work is "
                "sized by the allocated capacity, not by the requests' actual context; cap the context length "
                "or size it by the actual lengths."
            )
        if self.components:
            top = self.components[0]
            units = ", ".join(f"{share:.0%} on {unit}" for unit, share in top.unit_shares.items() if share >= 0.01)
            out.append(
                f"The top component is {top.name} ({top.path}): {top.share:.0%} of {where}, "
                f"{top.ms_per_step:.3f} ms per step" + (f" ({units})." if units else ".")
            )
        busy = f"{self.gpu_busy_ms_per_step:.3f} ms busy per step over {self.steps} step(s)"
        if self.basis == "kernels":
            verdict = (
                "the GPU waits on the host for a large part of each step (host-bound)"
                if self.gpu_idle_share >= HOST_BOUND_IDLE_SHARE
                else "the GPU is kept busy (not host-bound)"
            )
            out.append(f"GPU: {busy}, idle {self.gpu_idle_share:.0%}: {verdict}.")
            out.append(
                f"Tensor cores run {self.tensor_core_share:.0%} of GPU time; "
                + ", ".join(f"{u} {s:.0%}" for u, s in self.unit_shares.items())
                + "."
            )
        else:
            out.append(f"CPU: {busy}, idle {self.gpu_idle_share:.0%} of the step's wall time.")
        return out


def analyze(trace: Trace, *, context_length: int | None = None, page_size: int | None = None,
            max_batch: int | None = None, top: int = 15, eager_map: Trace | None = None,
            model_dims: set[int] | None = None, kernel_code: list[Path] | None = None) -> ProfileSummary:
    """Attribute and summarise a trace per step; capacity hints enable static capacity findings.

    `eager_map`: a trace of the same step run eagerly, whose module paths the trace's items inherit
    (for compiled steps, whose module frames are gone; see profile/mapping.py). `model_dims`: the
    model's weight widths (roofline.weights.model_dims), which no capacity finding may be made of.
    `kernel_code`: compiler caches (profile/kernel_code.py) where generated kernels' code is read for
    their tensor-core verdict.
    The trace is streamed (attribute_stream): memory does not grow with its size; the eager map is
    attributed whole."""
    att, totals = _attributed_totals(trace, eager_map)
    if eager_map is None and _ran_compiled(trace):
        att.notes.append(
            "the step ran a torch.compile graph, which hides the module frames inside it: time there is "
            "attributed by op names only; pass --eager-trace with a trace of the same engine run eagerly "
            "(vLLM --enforce-eager) to attribute it to modules")
    path_component = [component_name(p, att.granularity) for p in totals.paths]
    kinds = _classify(trace, att.basis, totals, kernel_code, att.notes)
    _by_name_where_unattributed(trace, totals, path_component, kinds, att.notes)
    n_steps = max(len(att.steps), 1)
    # per GPU, like busy time: a step's kernel time on N GPUs is N times one GPU's
    per = n_steps * att.devices
    if att.devices > 1:
        att.notes.append(f"kernels ran on {att.devices} GPUs: busy time and every ms per step are per GPU (the "
                         f"mean over the {att.devices}), calls per step too; shares are of all GPUs' kernel time")
    dur = totals.dur_ns.astype(np.float64)
    total_ns = float(dur.sum()) or 1.0

    item_key = totals.name * 4 + totals.kind
    cls_of = [kinds[int(key)] for key in item_key.tolist()]
    units = sorted({c.unit for c in kinds.values()})
    unit_idx = np.array([units.index(c.unit) for c in cls_of], dtype=np.int64)
    comp_names = sorted(set(path_component))
    comp_of_path = np.array([comp_names.index(c) for c in path_component], dtype=np.int64)
    comp_idx = comp_of_path[totals.path] if len(comp_of_path) else np.zeros(0, dtype=np.int64)

    components = _components(totals, path_component, att.granularity, comp_names, comp_idx, unit_idx, units, dur,
                             total_ns, per)
    categories: dict[str, float] = {}
    for c, d in zip(cls_of, dur.tolist(), strict=True):
        categories[c.category] = categories.get(c.category, 0.0) + d
    categories = {k: v / total_ns for k, v in sorted(categories.items(), key=lambda kv: -kv[1])}
    unit_ns = np.bincount(unit_idx, weights=dur, minlength=len(units))
    unit_shares = {u: float(unit_ns[i] / total_ns) for i, u in sorted(enumerate(units), key=lambda iu: -unit_ns[iu[0]])}

    busy_ms = float(att.busy_ns.sum()) / n_steps / 1e6
    wall_ns = float(att.wall_ns.sum())
    idle = 1.0 - float(att.busy_ns.sum()) / wall_ns if wall_ns > 0 else 0.0
    sizes = derived_sizes(context_length, page_size, max_batch, model_dims)
    findings = static_findings(trace, totals, path_component, per, sizes)
    notes = list(att.notes)
    kept = {d.value for d in sizes}
    hidden = [d for d in derived_sizes(context_length, page_size, max_batch) if d.value not in kept]
    if hidden:
        notes.append(", ".join(f"{d.derived_from} = {d.value}" for d in hidden) + " equals a width of the model's "
                     "own weights: tensors of that size are not taken for capacity-sized work")
    if context_length is None and max_batch is None:
        notes.append("no --context-length given: static capacity findings need it (and --page-size, --max-batch)")
    return ProfileSummary(
        trace=trace.path,
        basis=att.basis,
        granularity=att.granularity,
        arch=trace.arch,
        steps=len(att.steps) or 1,
        gpu_busy_ms_per_step=busy_ms,
        gpu_idle_share=max(0.0, idle),
        components=components,
        categories=categories,
        unit_shares=unit_shares,
        tensor_core_share=unit_shares.get(TENSOR, 0.0),
        capacity_findings=findings,
        top_kernels=_top_kernels(trace, totals, kinds, comp_names, comp_idx, dur, total_ns, per, top),
        notes=notes,
        attribution_source=att.source,
        unattributed_share=next((c.share for c in components if c.name == "other"), 0.0),
        devices=att.devices,
    )


# Categories of work that name the component they belong to, whatever module ran them.
_NAMED_COMPONENTS = {"attention": "attention", "moe": "moe"}


def _attributed_totals(trace: Trace, eager_map: Trace | None) -> tuple[Attribution, Totals]:
    """Stream the trace's attribution into totals, through the eager map when one is given; also the
    trace's steps, busy and wall time and notes."""
    totals = TotalsBuilder()
    if eager_map is None:
        att = attribute_stream(trace, lambda chunk, _rows, _done_ns: totals.add(chunk))
        return att, totals.build()
    map_att = attribute(eager_map)
    basis = "kernels" if trace.has_kernels else "cpu_ops"
    empty = np.zeros(0, dtype=np.int64)
    # the map is checked before the trace is read: a map without modules is refused even for an empty trace
    nothing = Attribution(basis, "", *(empty,) * 7, paths=[()], path_component=[], steps=[], busy_ns=empty,
                          wall_ns=empty, ts_ns=empty, op_name=empty, op_dims=empty)
    apply_map(nothing, trace, map_att, eager_map, eager_map.path)
    window = StepWindow(trace, map_att, eager_map, eager_map.path, totals)
    att = attribute_stream(trace, window.add)
    window.flush(np.iinfo(np.int64).max)
    att.notes = map_notes(att.notes, window.stats())
    att.granularity, att.source = "module", f"eager map {eager_map.path}"
    return att, totals.build()


def hides_modules(trace: Trace) -> str | None:
    """What keeps the trace's steps from showing their modules: "CUDA graphs" (kernels replayed from a
    graph), "torch.compile" (a compiled region), or None. Read off the trace's names, not its events."""
    if any(is_graph_launch(name) for name in trace.names):
        return "CUDA graphs"
    return "torch.compile" if _ran_compiled(trace) else None


def _ran_compiled(trace: Trace) -> bool:
    """Whether the trace's CPU ops or record_function ranges include a torch.compile region."""
    ids = {i for i, n in enumerate(trace.names) if n.startswith(COMPILED_MARKERS)}
    return bool(ids & (trace.tables["ops"].name_ids | trace.tables["annotations"].name_ids))


def _by_name_where_unattributed(trace: Trace, totals: Totals, path_component: list[str],
                                kinds: dict[int, Classification], notes: list[str]) -> None:
    """Items that no module path places (component "other", or a CUDA-graph block) but whose name says
    where they belong go to that component: by category (vLLM's attention and fused-MoE ops,
    FlashAttention kernels) or by the name itself (a kernel called `_indexer_logits_kernel`)."""
    unplaced = np.array([c in ("other", "cuda_graph") for c in path_component], dtype=bool)
    if not unplaced.any() or not len(totals.path):
        return
    named_by: dict[int, str] = {}
    for k in np.unique(totals.name * 4 + totals.kind).tolist():
        comp = _NAMED_COMPONENTS.get(kinds[int(k)].category) or component_of((trace.names[k // 4],))
        named_by[k] = comp if comp not in ("other", "runtime") else ""
    named = np.array([named_by[int(k)] for k in (totals.name * 4 + totals.kind).tolist()])
    move = unplaced[totals.path] & (named != "")
    if not move.any():
        return
    for comp in np.unique(named[move]).tolist():
        synthetic = (f"({comp} by op name)",)
        if synthetic not in totals.paths:
            totals.paths.append(synthetic)
            path_component.append(component_name(synthetic, "module"))
        totals.path[move & (named == comp)] = totals.paths.index(synthetic)
    share = float(totals.dur_ns[move].sum()) / max(float(totals.dur_ns.sum()), 1.0)
    notes.append(f"{share:.0%} of the step's time had no module path and was placed by its op or kernel name")


def _classify(trace: Trace, basis: str, totals: Totals, kernel_code: list[Path] | None = None,
              notes: list[str] | None = None) -> dict[int, Classification]:
    """Classification per (name id, kind), computed once per distinct kernel or op name; a kernel whose
    name leaves its unit unknown (Triton, Inductor) is judged by its compiled code where `kernel_code`
    (compiler cache directories) holds it."""
    keys = np.unique(totals.name * 4 + totals.kind).tolist()
    out = {}
    for key in keys:
        name, kind = trace.names[key // 4], key % 4
        out[key] = classify_kernel(name, trace.arch, kind=kind) if basis == "kernels" else classify_op(name)
    unknown = {trace.names[key // 4]: key for key, c in out.items() if c.unit == UNKNOWN}
    if kernel_code and unknown and basis == "kernels":
        verdicts = read_verdicts(unknown, kernel_code)
        for name, verdict in verdicts.items():
            c = out[unknown[name]]
            out[unknown[name]] = Classification(c.category, verdict.unit, f"compiled code: {verdict.evidence}")
        if notes is not None:
            read = existing(kernel_code)
            ambiguous = sum(v.unit == UNKNOWN for v in verdicts.values())
            notes.append(
                f"{len(unknown)} kernel name(s) that name no unit were looked up in the compiled code of "
                + (", ".join(map(str, read)) if read else "no compiler cache (none of " + ", ".join(map(str, kernel_code))
                   + " exists)")
                + f": {len(verdicts) - ambiguous} judged, {ambiguous} ambiguous (cached copies disagree), "
                f"{len(unknown) - len(verdicts)} not found")
    return out


def _components(totals, path_component, granularity, comp_names, comp_idx, unit_idx, units, dur, total_ns,
                n_steps) -> list[ComponentTime]:
    comp_ns = np.bincount(comp_idx, weights=dur, minlength=len(comp_names))
    path_ns = np.bincount(totals.path, weights=dur, minlength=len(totals.paths))
    out = []
    for ci, name in enumerate(comp_names):
        if comp_ns[ci] <= 0:
            continue
        sel = comp_idx == ci
        u_ns = np.bincount(unit_idx[sel], weights=dur[sel], minlength=len(units))
        generic: dict[str, float] = {}
        for p in np.flatnonzero(path_ns > 0).tolist():
            if path_component[p] == name:
                g = generic_path(totals.paths[p]) if granularity == "module" else totals.paths[p][0]
                generic[g] = generic.get(g, 0.0) + float(path_ns[p])
        ranked = sorted(generic.items(), key=lambda kv: -kv[1])
        out.append(
            ComponentTime(
                name=name,
                path=ranked[0][0] if ranked else "",
                share=float(comp_ns[ci] / total_ns),
                ms_per_step=float(comp_ns[ci]) / n_steps / 1e6,
                unit_shares={units[u]: float(u_ns[u] / comp_ns[ci]) for u in np.flatnonzero(u_ns > 0).tolist()},
                paths=[(g, ns / n_steps / 1e6) for g, ns in ranked[:5]],
            )
        )
    out.sort(key=lambda c: -c.share)
    return out


def _top_kernels(trace, totals, kinds, comp_names, comp_idx, dur, total_ns, n_steps, top):
    uniq, inv = np.unique(totals.name * 4 + totals.kind, return_inverse=True)
    ns = np.bincount(inv, weights=dur, minlength=len(uniq))
    calls = np.bincount(inv, weights=totals.calls, minlength=len(uniq))
    out = []
    for u in np.argsort(-ns)[:top].tolist():
        sel = inv == u
        comp = comp_names[int(np.bincount(comp_idx[sel], weights=dur[sel]).argmax())] if sel.any() else "other"
        c = kinds[int(uniq[u])]
        out.append(
            KernelTime(
                name=trace.names[int(uniq[u]) // 4],
                category=c.category,
                unit=c.unit,
                rule=c.rule,
                component=comp,
                ms_per_step=float(ns[u]) / n_steps / 1e6,
                share=float(ns[u] / total_ns),
                calls_per_step=float(calls[u]) / n_steps,
            )
        )
    return out
