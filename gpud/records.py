"""``Record``: typing.NamedTuple's class syntax, without importing typing or dataclasses.

The Slurm shims and ``gpuctl submit SCRIPT`` read directives on every call;
dataclasses (with inspect and ast) or typing would cost each call more than
Python's own start-up. A Record subclass is what ``typing.NamedTuple`` would
make of the same class body: collections.namedtuple's class with the annotated
fields, in order, and their defaults. Type checkers see typing.NamedTuple.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:
    class _RecordMeta(type):
        def __new__(mcls, name, bases, namespace):
            if not bases:  # Record itself
                return super().__new__(mcls, name, bases, namespace)
            from collections import namedtuple
            fields = list(namespace.get("__annotations__", {}))
            defaults = [namespace[field] for field in fields if field in namespace]
            made = namedtuple(name, fields, defaults=defaults, module=namespace["__module__"])
            made.__doc__ = namespace.get("__doc__")
            made.__qualname__ = namespace.get("__qualname__", name)
            return made

    class Record(metaclass=_RecordMeta):
        """Subclass with annotated fields (and defaults) for an immutable named tuple of them."""

__all__ = ["Record"]
