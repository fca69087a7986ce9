"""Node names in Slurm's hostlist form (``node[01-03],gpu7``) and back, as squeue and SLURM_JOB_NODELIST show them.

A module of its own, so that the Slurm commands that print node lists
import only this, not the task environment's dataclasses.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing (and collections, under collections.abc) is not imported at run time
if TYPE_CHECKING:
    from collections.abc import Sequence

_RANGE = r"^(\d+)(?:-(\d+))?$"  # compiled by re when a hostlist is expanded; printing one needs no re


def hostlist(names: Sequence[str]) -> str:
    """Node names in Slurm's hostlist form, in the order given: node01,node02,node03,gpu7 -> ``node[01-03],gpu7``.

    Duplicates count once. Neighbouring names that end in digits of the same
    width and share the rest are folded into one bracket, runs of numbers
    into ranges; :func:`expand_hostlist` gives the names back in the same
    order, so a job's first node (``scontrol show hostnames | head -1``) is
    the node of its rank 0.
    """
    groups: list[tuple[str, int, list[int]]] = []  # (prefix, width, numbers) or (name, -1, [])
    for name in dict.fromkeys(names):
        split = _trailing_number(name)
        if split is None or "[" in name or "," in name:
            groups.append((name, -1, []))
        elif groups and groups[-1][:2] == (split[0], len(split[1])):
            groups[-1][2].append(int(split[1]))
        else:
            groups.append((split[0], len(split[1]), [int(split[1])]))
    parts = []
    for prefix, width, numbers in groups:
        if width < 0:
            parts.append(prefix)
            continue
        ranges = _ranges(numbers)
        text = ",".join(f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in ranges)
        parts.append(prefix + (text if len(numbers) == 1 else f"[{text}]"))
    return ",".join(parts)


def _trailing_number(name: str) -> tuple[str, str] | None:
    """``name`` split before the digits it ends in (``node``, ``01``), None when it ends in none: what the
    pattern ``^(.*?)(\\d+)$`` matches (a newline ends a name, and only at its end), without importing re."""
    body = name[:-1] if name.endswith("\n") else name
    start = len(body)
    while start and body[start - 1].isdecimal():
        start -= 1
    if start == len(body) or "\n" in body[:start]:
        return None
    return body[:start], body[start:]


def expand_hostlist(text: str) -> list[str]:
    """Every node name of a hostlist such as ``gpu7,node[01-03,07]``, in order; ValueError for a malformed one."""
    out: list[str] = []
    for part in _split_top(text):
        prefix, bracket, rest = part.partition("[")
        if not bracket:
            out.append(part)
            continue
        body, close, suffix = rest.partition("]")
        if not close:
            raise ValueError(f"unbalanced '[' in hostlist {text!r}")
        import re
        for item in body.split(","):
            match = re.match(_RANGE, item)
            if match is None:
                raise ValueError(f"bad range {item!r} in hostlist {text!r}")
            low, high = match[1], match[2] or match[1]
            width = len(low)
            out.extend(f"{prefix}{n:0{width}d}{suffix}" for n in range(int(low), int(high) + 1))
    return out


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p]


def _ranges(numbers: list[int]) -> list[tuple[int, int]]:
    """Runs of numbers that each follow the one before: 1,2,3,7,5 -> (1, 3), (7, 7), (5, 5)."""
    out: list[tuple[int, int]] = []
    for n in numbers:
        if out and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out
