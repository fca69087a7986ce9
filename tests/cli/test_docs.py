"""The guides: every gpuctl and gpud command line they show parses, and the fair-share example holds."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gpud.cli import gpud_main, gpuctl

DOCS = Path(__file__).resolve().parents[2] / "docs"
GUIDES = ("user-guide.md", "admin-guide.md")


def command_lines(name: str) -> list[str]:
    """Lines of the guide's sh blocks that run gpuctl or gpud (comments and substitutions dropped)."""
    text = (DOCS / name).read_text()
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            line = re.sub(r"\$\([^)]*\)", "1", line)
            line = re.sub(r"\$\w+", "1", line)
            if line.startswith(("gpuctl ", "gpud ")):
                lines.append(line.split(" && ")[0].split(" | ")[0].split(" > ")[0])
    return lines


@pytest.mark.parametrize("name", GUIDES)
def test_every_command_line_parses(name: str) -> None:
    lines = command_lines(name)
    assert lines
    for line in lines:
        argv = shlex.split(line)
        program, args = argv[0], argv[1:]
        if "--" in args:
            args = args[:args.index("--")]
        verb = next((a for a in args if not a.startswith("-")), None)
        parser = gpuctl.build_parser(verb) if program == "gpuctl" else gpud_main.build_parser()
        try:
            parser.parse_args(args)
        except SystemExit as exc:
            if exc.code == 0:  # --version, --help
                continue
            pytest.fail(f"{name}: `{line}` does not parse (exit {exc.code})")


def test_the_user_guide_names_every_gpuctl_verb() -> None:
    text = (DOCS / "user-guide.md").read_text()
    for verb in gpuctl.VERBS:
        if verb not in ("policy", "token", "drain", "resume"):  # admin verbs: the admin guide
            assert f"gpuctl {verb}" in text, verb


def test_the_fair_share_example_holds() -> None:
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "simulate",
                             str(DOCS / "examples" / "fair-share.toml")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    guide = (DOCS / "admin-guide.md").read_text()
    assert "vision 10.67, nlp 3, scratch 2.33" in guide
