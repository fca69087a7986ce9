"""GPUD_COMPILE=1 builds a wheel whose scheduling core is compiled by mypyc; editable installs stay Python.

CI builds such a wheel and runs the whole suite on it once more (GPUD_EXPECT_COMPILED=1), so
the compiled core is held to every test the Python one is.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

import gpud.core
import gpud.model

ROOT = Path(__file__).resolve().parents[2]
# setuptools warns about its own configuration and the wheel package while it answers the backend.
pytestmark = pytest.mark.filterwarnings("ignore::Warning:setuptools", "ignore::FutureWarning")


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """gpud's build backend, run as pip runs it, in a copy of the sources (setuptools writes there)."""
    for name in ("gpud", "build_support"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("gpud_build", tmp_path / "build_support" / "gpud_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compiling_asks_for_mypy_and_what_the_core_imports(backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_COMPILE", "1")
    requires = backend.get_requires_for_build_wheel()
    assert any(r.startswith("mypy") for r in requires) and any(r.startswith("pluggy") for r in requires)


@pytest.mark.parametrize("value", ["", "0", "no"])
def test_a_plain_build_asks_for_nothing_more(backend, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("GPUD_COMPILE", value)
    assert not [r for r in backend.get_requires_for_build_wheel() if r.startswith("mypy")]


def test_an_editable_install_is_never_compiled(backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_COMPILE", "1")
    requires = backend.get_requires_for_build_editable()
    assert not [r for r in requires if r.startswith("mypy")]
    assert "GPUD_COMPILE" not in os.environ  # so setup.py, run next in this process, builds pure Python


@pytest.mark.skipif(os.environ.get("GPUD_EXPECT_COMPILED") != "1",
                    reason="CI's compiled-core stage sets GPUD_EXPECT_COMPILED=1 for an installation built "
                           "with GPUD_COMPILE=1")
def test_the_installation_under_test_runs_the_compiled_core() -> None:
    assert gpud.core.COMPILED
    for module in (gpud.core.cycle, gpud.core.queue_walk, gpud.core.evict, gpud.model):
        assert not module.__file__.endswith(".py"), module.__file__


def test_victims_are_judged_only_as_they_are_read() -> None:
    # Reclaim and preempt judge each victim after the evictions made before it; a compiled generator
    # expression would be read whole up front, so the core uses generator functions there. The
    # compiled-core stage of CI runs this on the compiled core.
    from gpud.core.evict import judged
    from gpud.core.state import Victim
    from gpud.model import JobSpec, TaskRequest

    victims = [Victim(JobSpec(f"j{i}", "p", TaskRequest(1)), None, [0], 0.0) for i in range(3)]
    seen: list[str] = []

    def keep(victim: Victim) -> bool:
        seen.append(victim.job.id)
        return True

    first = next(judged(iter(victims), keep))
    assert first is victims[0] and seen == ["j0"]
