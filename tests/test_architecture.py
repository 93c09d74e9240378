"""The house as docs/architecture.md draws it: packages on floors, every import (a lazy one inside a
function too) pointing down, no loop between packages or files, the embedded engine apart, and no class or
function too long to read in one sitting. The layering is written here once."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "rooftop"

# Top to bottom. A package may import a package on a lower floor, never one on its own floor or above.
FLOORS = [
    ["cli"],
    ["report"],
    ["campaign"],
    ["deploy"],  # bring_up: a deployment through its adapter and the supervisor
    ["adapters"],  # one module per engine: a deployment -> process specs, endpoints
    ["launch", "bench", "profile", "roofline", "models"],  # processes and SSH; load; traces; analytic costs
    ["spec"],  # what users write, checked
    ["hardware"],  # the machine: GPU peaks, topology, pinning
    ["provenance"],  # the command, commit and machine a result came from (redacts the command)
    ["errors", "redact", "auth"],  # leaves
]
# The embedded engine stands apart: it imports nothing of rooftop outside itself, and is imported only by
# the commands that run it in this process and, for its presets' config (pure dataclasses), by its adapter.
ENGINE = "engine"
ENGINE_IMPORTERS = {
    "rooftop.cli.serve": {"rooftop.engine.build", "rooftop.engine.model.config", "rooftop.engine.server"},
    "rooftop.cli.router": {"rooftop.engine.pd.router"},
    "rooftop.adapters.embedded": {"rooftop.engine.model.config"},
}
TOP = {"__main__", "__init__"}  # rooftop/__main__.py runs the cli

MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 100  # outside engine/kernels/, where a Triton kernel is one function by nature


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _resolve(module: str, path: Path, node: ast.ImportFrom | ast.Import) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".")
            if path.name != "__init__.py":
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        names = [origin] + [f"{origin}.{a.name}" for a in node.names]
    found = set()
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != "rooftop":
            found.add(name)
    return sorted(found)


def _imports() -> dict[str, set[str]]:
    """module -> the rooftop modules it imports, wherever the import stands (top level, function, TYPE_CHECKING)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges[module].update(t for t in _resolve(module, path, node) if t != module)
    return edges


EDGES = _imports()


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _floor(package: str) -> int | None:
    return next((i for i, floor in enumerate(FLOORS) if package in floor), None)


def test_every_package_stands_on_one_floor():
    packages = {_package(m) for m in MODULES} - TOP - {ENGINE}
    missing = sorted(p for p in packages if _floor(p) is None)
    assert not missing, f"packages on no floor: {missing}: add each to FLOORS in tests/test_architecture.py"
    assert sorted(sum(FLOORS, [])) == sorted(set(sum(FLOORS, []))), "a package on two floors"


def test_every_import_points_down():
    wrong = []
    for module, targets in EDGES.items():
        here = _package(module)
        if here in TOP or here == ENGINE:
            continue
        for target in targets:
            there = _package(target)
            if there == here or there == ENGINE or there in TOP:
                continue
            if _floor(there) <= _floor(here):
                wrong.append(f"{module} -> {target} ({here} is on floor {_floor(here)}, {there} on {_floor(there)})")
    assert not wrong, "imports that do not point down:\n" + "\n".join(sorted(wrong))


def test_the_embedded_engine_stands_apart():
    out = [f"{m} -> {t}" for m, ts in EDGES.items() if _package(m) == ENGINE for t in ts if _package(t) != ENGINE]
    assert not out, "the embedded engine imports rooftop outside itself:\n" + "\n".join(sorted(out))
    into = [f"{m} -> {t}" for m, ts in EDGES.items() if _package(m) != ENGINE for t in ts
            if _package(t) == ENGINE and t not in ENGINE_IMPORTERS.get(m, set())]
    assert not into, "imports of the embedded engine beyond its declared seams:\n" + "\n".join(sorted(into))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_loop_between_files():
    loops = _cycles(EDGES)
    assert not loops, "files that import each other in a loop:\n" + "\n".join(" <-> ".join(c) for c in loops)


def test_no_loop_between_packages():
    graph: dict[str, set[str]] = defaultdict(set)
    for module, targets in EDGES.items():
        for target in targets:
            if _package(module) != _package(target):
                graph[_package(module)].add(_package(target))
    loops = _cycles(graph)
    assert not loops, f"packages that import each other in a loop: {loops}"


def test_the_cycle_finder_finds_a_loop():
    """The checks above would pass on a finder that finds nothing: it must find these."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_class_or_function_too_long_to_read():
    long = []
    for module, path in MODULES.items():
        in_kernels = "kernels" in path.relative_to(PKG).parts
        for node in ast.walk(ast.parse(path.read_text())):
            lines = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, ast.ClassDef) and lines > MAX_CLASS_LINES:
                long.append(f"class {module}.{node.name}: {lines} lines (at most {MAX_CLASS_LINES})")
            if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not in_kernels
                    and lines > MAX_FUNCTION_LINES):
                long.append(f"function {module}.{node.name}: {lines} lines (at most {MAX_FUNCTION_LINES})")
    assert not long, "split these:\n" + "\n".join(sorted(long))
