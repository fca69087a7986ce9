"""The package stays easy to change: no class of gpud/ over 500 lines, and mypy checks every error code in it."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpud"
MAX_CLASS_LINES = 500


def classes_over(limit: int, package: Path = PACKAGE) -> list[tuple[str, int]]:
    """Each class in ``package`` longer than ``limit`` lines, as ("path/in/package.py:Class", lines)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append((f"{path.relative_to(package)}:{node.name}", lines))
    return found


def test_no_class_of_gpud_is_over_500_lines():
    assert classes_over(MAX_CLASS_LINES) == []


def test_the_class_size_check_finds_a_long_class(tmp_path):
    (tmp_path / "long.py").write_text("class Long:\n" + "    x = 1\n" * MAX_CLASS_LINES)
    (tmp_path / "short.py").write_text("class Short:\n    x = 1\n")
    assert classes_over(MAX_CLASS_LINES, tmp_path) == [("long.py:Long", MAX_CLASS_LINES + 1)]


def test_mypy_switches_no_error_code_off_for_gpud():
    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"].get("overrides", [])
    for override in overrides:
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        ours = [m for m in modules if m == "gpud" or m.startswith("gpud.")]
        assert not (ours and override.get("disable_error_code")), f"error codes switched off for {ours}"
        assert not (ours and override.get("ignore_errors")), f"errors ignored for {ours}"
