"""docs/plugins.md documents every hook of gpud/hookspecs.py, with its arguments and whether it is first-result."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from gpud import hookspecs

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def hooks() -> list:
    """Every hook spec, in the file's order."""
    found = [f for name, f in vars(hookspecs).items() if name.startswith("gpud_") and callable(f)]
    return sorted(found, key=lambda f: f.__code__.co_firstlineno)


def heading(hook) -> str:
    """The Markdown heading docs/plugins.md gives a hook."""
    return f"### `{hook.__name__}({', '.join(inspect.signature(hook).parameters)})`"


def first_result(hook) -> bool:
    opts = getattr(hook, "gpud_spec", {})
    return bool(opts.get("firstresult"))


def section(hook) -> str:
    """The reference section for a hook, as docs/plugins.md has it (its docstring, dedented)."""
    kind = "first result" if first_result(hook) else "all results"
    return f"{heading(hook)}\n\n*{kind}*\n\n{inspect.cleandoc(hook.__doc__)}\n"


def test_every_hook_is_documented_with_its_arguments() -> None:
    text = DOC.read_text()
    missing = [hook for hook in hooks() if heading(hook) not in text]
    assert not missing, "docs/plugins.md lacks these hooks; add:\n\n" + "\n".join(section(h) for h in missing)


def test_first_result_is_stated_right() -> None:
    text = DOC.read_text()
    for hook in hooks():
        after = text.split(heading(hook), 1)[1].lstrip()
        expected = "*first result*" if first_result(hook) else "*all results*"
        assert after.startswith(expected), f"{hook.__name__}: the line under its heading must be {expected}"


def test_no_hook_is_documented_that_does_not_exist() -> None:
    names = {hook.__name__ for hook in hooks()}
    documented = set(re.findall(r"^### `(gpud_\w+)\(", DOC.read_text(), flags=re.M))
    assert documented <= names, f"documented but not in hookspecs.py: {sorted(documented - names)}"


def test_every_hook_section_quotes_its_docstring() -> None:
    text = DOC.read_text()
    stale = [hook.__name__ for hook in hooks() if section(hook) not in text]
    assert not stale, ("docs/plugins.md quotes a hook's docstring that gpud/hookspecs.py has since changed: "
                       + ", ".join(stale) + "; paste each section again:\n\n"
                       + "\n".join(section(h) for h in hooks() if h.__name__ in stale))
