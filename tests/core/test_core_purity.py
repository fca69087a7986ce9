"""The scheduling core is pure: no event loop, no GPUs, no clock, no filesystem, no network, no database."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import gpud

PACKAGE = Path(gpud.__file__).resolve().parent
FORBIDDEN = {"asyncio", "aiohttp", "pynvml", "psutil", "time", "datetime", "os", "pathlib", "socket", "sqlite3"}
CORE_FILES = sorted([*(PACKAGE / "core").glob("*.py"), *(PACKAGE / "policies").glob("*.py")])
# gpud modules the core may import besides its own: each must be pure too.
SHARED_MODULES = {"gpud": "__init__.py", "gpud.model": "model.py", "gpud.policy": "policy.py",
                  "gpud.hookspecs": "hookspecs.py", "gpud.errors": "errors.py",
                  "gpud.node.slicer": "node/slicer.py", "gpud.task_defaults": "task_defaults.py"}
KNOWN_IMPURE: dict[str, str] = {}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth of its code (TYPE_CHECKING blocks included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            found.add(str(node.args[0].value))
    return found


def relative_name(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


def params():
    for path in CORE_FILES:
        name = relative_name(path)
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_IMPURE[name])] if name in KNOWN_IMPURE else []
        yield pytest.param(path, id=name, marks=marks)


def test_there_is_a_core_to_check():
    names = {relative_name(p) for p in CORE_FILES}
    assert "core/cycle.py" in names and "policies/binpack.py" in names


@pytest.mark.parametrize("path", list(params()))
def test_core_module_imports_nothing_impure(path):
    bad = sorted(m for m in imported_modules(path) if m.split(".")[0] in FORBIDDEN)
    assert not bad, f"{relative_name(path)} imports {bad}"


@pytest.mark.parametrize("path", CORE_FILES, ids=relative_name)
def test_core_imports_only_pure_parts_of_gpud(path):
    allowed = set(SHARED_MODULES)
    for module in imported_modules(path):
        if module.startswith("."):
            pytest.fail(f"{relative_name(path)} uses a relative import {module!r}; the check needs absolute ones")
        if module.split(".")[0] != "gpud":
            continue
        assert module in allowed or module.startswith(("gpud.core.", "gpud.policies.")), (
            f"{relative_name(path)} imports {module}, which is outside the pure core")


@pytest.mark.parametrize("module", sorted(SHARED_MODULES))
def test_gpud_modules_the_core_uses_are_pure(module):
    path = PACKAGE / SHARED_MODULES[module]
    bad = sorted(m for m in imported_modules(path) if m.split(".")[0] in FORBIDDEN)
    assert not bad, f"{module} imports {bad}"
    inner = sorted(m for m in imported_modules(path) if m.split(".")[0] == "gpud"
                   and m not in SHARED_MODULES and not m.startswith(("gpud.core.", "gpud.policies.")))
    assert not inner, f"{module} imports {inner}"


def test_importing_the_core_loads_no_io_library():
    # A fresh interpreter imports the core and the built-in policies and nothing else of gpud.
    from gpud.plugins import BUILTIN_PLUGINS
    code = (f"import importlib, sys\nimport gpud.core\n"
            f"for name in {list(BUILTIN_PLUGINS)!r}: importlib.import_module(name)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{{'asyncio', 'aiohttp', 'pynvml', 'psutil', 'socket', 'sqlite3'}}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout
