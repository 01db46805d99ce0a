"""Size bounds of the code (issue 19's acceptance): no module over 400 lines, no class over 250. A module that grows
past them is asking to be split along a seam."""

from __future__ import annotations

import ast
from pathlib import Path

import extproc

ROOT = Path(extproc.__file__).parent
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 250


def test_no_module_over_400_lines_and_no_class_over_250() -> None:
    too_long = []
    for path in sorted(ROOT.rglob("*.py")):
        name = str(path.relative_to(ROOT))
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > MAX_CLASS_LINES:
                    too_long.append(f"{name}: class {node.name} {length} lines")
    assert too_long == []
