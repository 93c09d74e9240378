"""DESIGN.md: `rooftop/engine/` imports nothing of rooftop outside itself (it could become its own package)."""

import ast
from pathlib import Path

import rooftop.engine


def test_the_engine_imports_nothing_of_rooftop_outside_it():
    root = Path(rooftop.engine.__file__).parent
    outside = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            outside += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names
                        if (n == "rooftop" or n.startswith("rooftop.")) and not n.startswith("rooftop.engine")]
    assert len(list(root.rglob("*.py"))) > 20 and not outside, outside
