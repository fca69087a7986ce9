"""How many examples a hypothesis property tries, as the loaded profile says (tests/conftest.py).

The "ci" profile (CI set, as .ci/run runs) tries every property's full number; the "dev"
profile, the README's test command on a developer's machine, a quarter of it.
"""

from __future__ import annotations

from hypothesis import settings

FULL = 100  # the max_examples of the "ci" profile: a property's full number is tried under it


def examples(full: int) -> int:
    """``full`` under the "ci" profile; that share of it which the loaded profile's max_examples is of 100."""
    return max(5, round(full * settings.default.max_examples / FULL))
