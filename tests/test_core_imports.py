"""The scheduling core's modules import one another without a cycle, TYPE_CHECKING imports included.

A cycle means no module of it can be read, changed or tested without the
others; the core's layering (model and leaves, then the state, then the
actions, then the cycle) is kept by this test.
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "gpud" / "core"


def core_imports(source: str, modules: set[str]) -> set[str]:
    """The core modules one module's source imports, wherever the import stands (functions and
    ``if TYPE_CHECKING:`` blocks included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "gpud.core":
                found.update(alias.name for alias in node.names if alias.name in modules)
            elif node.module.startswith("gpud.core."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.ImportFrom) and node.level == 1:  # from . import x / from .x import y
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[2] for alias in node.names if alias.name.startswith("gpud.core."))
    return found & modules


def import_graph(folder: Path = CORE) -> dict[str, set[str]]:
    """Each module of the core (``__init__`` aside: it only re-exports) with the core modules it imports."""
    files = {path.stem: path for path in folder.glob("*.py") if path.stem != "__init__"}
    names = set(files)
    return {name: core_imports(path.read_text(), names) - {name} for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for other in sorted(graph.get(name, ())):
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in on_stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == name:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def a_loop(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One import loop inside a component, as a -> b -> ... -> a, to say where to cut."""
    members = set(component)
    start = component[0]
    path = [start]
    seen = {start}
    while True:
        nxt = sorted(graph[path[-1]] & members)
        back = [n for n in nxt if n in seen]
        if back:
            return path[path.index(back[0]):] + [back[0]]
        path.append(nxt[0])
        seen.add(nxt[0])


def test_the_core_has_no_import_cycle() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles in gpud/core (TYPE_CHECKING imports count):\n" + "\n".join(
        f"  {', '.join(c)}; e.g. {' -> '.join(a_loop(graph, c))}" for c in found)


def test_the_check_sees_a_cycle_through_a_type_checking_import(tmp_path: Path) -> None:
    # Guards the test above: a cycle made only of a TYPE_CHECKING import and a function-level one is found.
    (tmp_path / "a.py").write_text("from typing import TYPE_CHECKING\n"
                                   "if TYPE_CHECKING:\n    from gpud.core.b import B\n")
    (tmp_path / "b.py").write_text("def f():\n    from gpud.core.c import C\n")
    (tmp_path / "c.py").write_text("from gpud.core import a\n")
    (tmp_path / "d.py").write_text("from gpud.core.a import A\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["a", "b", "c"]]
    assert a_loop(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
