"""The wheel ships the gpud package and nothing else; both commands report the one version."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

import gpud

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy so the build's scratch files never land in the working tree.
    source = tmp_path_factory.mktemp("source")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", ".venv", "*.pyc")
    for name in ("gpud", "build_support", "tests", "plugins", "examples", "etc", "systemd", "docs"):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)]
    if importlib.util.find_spec("wheel") is not None:
        command.insert(4, "--no-build-isolation")  # offline: setuptools and wheel are already here
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (built,) = out.glob("gpud-*.whl")
    return built


def test_the_wheel_holds_only_the_gpud_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"gpud", f"gpud-{gpud.__version__}.dist-info"}
    assert "gpud/hookspecs.py" in names and "gpud/cli/gpuctl.py" in names
    assert not [n for n in names if "/tests/" in n or n.startswith(("plugins/", "tests/")) or "gpud_" in n.split("/")[0]]
    assert not [n for n in names if n.endswith(".pyc")]


def test_the_wheel_declares_both_commands_and_the_runtime_dependencies(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    info = f"gpud-{gpud.__version__}.dist-info"
    scripts = archive.read(f"{info}/entry_points.txt").decode()
    assert "gpud = gpud.cli.gpud_main:main" in scripts and "gpuctl = gpud.cli.gpuctl:main" in scripts
    metadata = archive.read(f"{info}/METADATA").decode()
    for dependency in ("aiohttp", "jinja2", "pluggy", "psutil", "nvidia-ml-py"):
        assert f"Requires-Dist: {dependency}" in metadata
    assert f"Version: {gpud.__version__}" in metadata


def test_every_package_directory_is_in_the_wheel(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "gpud"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    # The dashboard's templates and static files travel with its code.
    missing = [path for path in tracked if (path.endswith(".py") or path.startswith("gpud/ui/")) and path not in names]
    assert not missing


@pytest.mark.parametrize("command", ["gpud", "gpuctl"])
def test_version_comes_from_one_place(command: str) -> None:
    script = Path(sys.executable).parent / command
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == f"{command} {gpud.__version__}"
    assert version("gpud") == gpud.__version__
