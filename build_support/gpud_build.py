"""gpud's build backend: setuptools', plus mypy when ``GPUD_COMPILE=1`` asks for a compiled core.

A wheel built with ``GPUD_COMPILE=1`` has the scheduling core (``gpud/core``) and the
model it works on (``gpud/model.py``) compiled to C extensions with mypyc, which runs a
warm scheduling cycle about 2.4 times as fast; the same sources stay the definition of what it
does. Without the variable, and always for an editable install (where compiled files
would shadow the sources being edited), gpud is pure Python.
"""

from __future__ import annotations

import os
import sys

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (the PEP 517 hooks not redefined here)

# mypyc type-checks the compiled modules, so what they import must be there to be read.
COMPILE_REQUIRES = ["mypy>=1.11,<3", "pluggy>=1.3"]


def compile_requested() -> bool:
    """True when ``GPUD_COMPILE`` asks for a compiled core (1, yes, true, on)."""
    return os.environ.get("GPUD_COMPILE", "").strip().lower() in ("1", "yes", "true", "on")


def get_requires_for_build_wheel(config_settings=None):
    """setuptools' requirements, and mypy (for mypyc) when the core is to be compiled."""
    # setuptools runs setup.py to answer, before mypy is installed: ask it as for a pure build.
    extra = COMPILE_REQUIRES if compile_requested() else []
    return _pure(_setuptools.get_requires_for_build_wheel)(config_settings) + extra


def _pure(hook, say: bool = False):
    """The setuptools hook run for a pure-Python build, whatever ``GPUD_COMPILE`` says."""
    def run(*args, **kwargs):
        if compile_requested():
            os.environ.pop("GPUD_COMPILE", None)
            if say:
                print("GPUD_COMPILE is ignored for an editable install: compiled modules would shadow "
                      "the sources being edited", file=sys.stderr)
        return hook(*args, **kwargs)
    return run


get_requires_for_build_editable = _pure(_setuptools.get_requires_for_build_editable)
prepare_metadata_for_build_editable = _pure(_setuptools.prepare_metadata_for_build_editable)
build_editable = _pure(_setuptools.build_editable, say=True)
