"""No import cycles between the modules of `extproc`, counting the imports made inside functions too: a cycle
hidden behind a function-level import is still a cycle (it only fails later, in whichever order the modules
happen to be imported first). Imports under `if TYPE_CHECKING:` are for the type checker only and do not count.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import extproc

ROOT = Path(extproc.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, modules: dict[str, Path]) -> Iterator[str]:
    """Every extproc module an import statement anywhere in `tree` needs complete (outside TYPE_CHECKING)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking_only(node):
            yield from (name for child in node.orelse for name in _imports(child, modules))
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            for alias in node.names:  # `from package import submodule` needs the submodule, not only the package
                submodule = f"{node.module}.{alias.name}"
                yield submodule if submodule in modules else node.module
        yield from _imports(node, modules)


def import_graph() -> dict[str, set[str]]:
    """module -> the modules it imports. Importing a.b.c runs a and a.b first, unless they are the importer's own
    packages (already being imported)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
        for target in _imports(ast.parse(path.read_text()), modules):
            parts = target.split(".")
            needed = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
            graph[name] |= {module for module in needed - own if module in modules}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_imports_in_functions_count_and_type_checking_ones_do_not() -> None:
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from extproc.gateway import records\n"
              "def load() -> None:\n    from extproc.config import loader\n")
    assert set(_imports(ast.parse(source), _modules())) == {"typing", "extproc.config.loader"}


def test_cycles_are_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_service_needs_no_redis_py() -> None:
    """Every Redis connection goes through the lean RESP client; redis-py is a test dependency only."""
    code = ("import sys; sys.modules['redis'] = None\n"  # any `import redis...` now raises ImportError
            "import extproc.cli, extproc.server.app, extproc.rollout.redis_store, extproc.bench.burst")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
