"""The scheduling core's modules import one another without a cycle, TYPE_CHECKING imports included.

A cycle means no module of it can be read, changed or tested without the
others; the core's layering (model and leaves, then the state, then the
actions, then the cycle) is kept by this test.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# The import graph and its cycles are bench/core_map.py's, which prints them for any checkout.
_spec = importlib.util.spec_from_file_location("core_map", Path(__file__).resolve().parents[2] / "bench" / "core_map.py")
assert _spec is not None and _spec.loader is not None
core_map = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(core_map)
import_graph, cycles = core_map.import_graph, core_map.cycles


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
