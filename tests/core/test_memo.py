"""The core's one memo mechanism: answers come back only under their stamp, and every memo is listed
with its stamp in gpud/core/memo.py, the invalidation rule a new code path is checked against."""

from __future__ import annotations

import ast
from pathlib import Path

import gpud
from gpud.core.memo import Memo

# The sources, read as text: a compiled core's modules carry no docstrings.
CORE = Path(gpud.__file__).resolve().parent / "core"


def test_an_answer_comes_back_only_under_the_stamp_it_was_stored_with() -> None:
    kept: Memo[str, list[int]] = Memo()
    answer = kept.put("q", 3, [1, 2])
    assert kept.get("q", 3) is answer
    assert kept.get("q", 4) is None  # a counter moved: stale
    assert kept.stamp_of("q") == 3
    request = ("a", 1)
    kept.put("r", request, [5])
    assert kept.get("r", ("a", 1)) == [5]  # an equal stamp serves as well as the same object
    kept.forget("q")
    assert kept.get("q", 3) is None and kept.stamp_of("q") is None
    kept.forget()
    assert len(kept) == 0


def memos_in_the_core() -> set[str]:
    """Every attribute of a core class that holds a ``Memo`` made in that module."""
    found = set()
    for path in CORE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call)
                    and isinstance(node.value.func, ast.Name) and node.value.func.id == "Memo"
                    and isinstance(node.target, ast.Attribute)):
                found.add(node.target.attr)
    return found


def test_every_memo_of_the_core_is_listed_with_its_stamp_in_the_rule() -> None:
    found = memos_in_the_core()
    assert len(found) >= 10, found  # the search itself still sees the memos
    rule = ast.get_docstring(ast.parse((CORE / "memo.py").read_text())) or ""
    missing = sorted(name for name in found if f"{name}``" not in rule)
    assert not missing, f"memos not listed in gpud/core/memo.py's table: {missing}"
