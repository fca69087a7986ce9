"""The compiled core: with GPUD_COMPILE=1 a wheel gets gpud/core and gpud/model.py compiled by mypyc.

Everything else about the package is in pyproject.toml; see build_support/gpud_build.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).parent / "build_support"))
from gpud_build import compile_requested  # noqa: E402


def compiled_modules() -> list:
    """mypyc's extension modules for the core and the model, or none for a pure-Python build."""
    if not compile_requested():
        return []
    from mypyc.build import mypycify

    root = Path(__file__).parent
    sources = sorted(str(p.relative_to(root)) for p in (root / "gpud" / "core").glob("*.py") if p.name != "__init__.py")
    # One shared library inside the package (gpud/native__mypyc), not a hashed name beside it.
    return mypycify([*sources, "gpud/model.py"], opt_level="3", separate=[([*sources, "gpud/model.py"], "gpud.native")])


setup(ext_modules=compiled_modules())
