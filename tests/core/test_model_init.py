"""Every type of the model is made from its fields as a dataclass is: by name or by place, with its defaults.

Some types write their ``__init__`` out (gpud.model says why); these tests
hold each to the fields the dataclass declares, so a field added to a type
and left out of its ``__init__``, or taken in the wrong place, fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import types
import typing
from collections.abc import Mapping
from pathlib import Path

import pytest

import gpud.model as model

TYPES = [cls for _, cls in inspect.getmembers(model, inspect.isclass)
         if dataclasses.is_dataclass(cls) and cls.__module__ == model.__name__]
_counter = itertools.count(1)


def _sample(hint: typing.Any) -> typing.Any:
    """A value of type ``hint`` unlike any default and any other sample."""
    n = next(_counter)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _sample(next(arg for arg in typing.get_args(hint) if arg is not type(None)))
    if origin is tuple:
        return (_sample(typing.get_args(hint)[0]),)
    if origin in (Mapping, dict) or hint in (Mapping, dict):
        return {f"key{n}": f"value{n}"}
    if hint is bool:
        return True  # ``_samples`` turns a field's default over instead
    if hint is str:
        return f"text{n}"
    if hint is int:
        return 1000 + n
    if hint is float:
        return 1000.5 + n
    if dataclasses.is_dataclass(hint):
        return hint(*(_sample(h) for _, h in _init_hints(hint)))
    raise AssertionError(f"no sample for {hint!r}")


def _annotations() -> dict[str, dict[str, str]]:
    """Each class's field annotations as gpud/model.py writes them: a compiled model keeps only their
    outline at run time (``int | None`` becomes ``type``), so they are read from the source."""
    tree = ast.parse((Path(__file__).parents[2] / "gpud" / "model.py").read_text())
    return {node.name: {item.target.id: ast.unparse(item.annotation) for item in node.body
                        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
            for node in tree.body if isinstance(node, ast.ClassDef)}


ANNOTATIONS = _annotations()


def _init_hints(cls: type) -> list[tuple[str, typing.Any]]:
    """The type's fields taken by ``__init__``, in order, with their types."""
    written = ANNOTATIONS[cls.__name__]
    return [(f.name, eval(written[f.name], vars(model))) for f in dataclasses.fields(cls) if f.init]


def _samples(cls: type) -> dict[str, typing.Any]:
    """A sample for every field, each unlike the field's default."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    return {name: not defaults[name] if hint is bool and defaults[name] is not dataclasses.MISSING else _sample(hint)
            for name, hint in _init_hints(cls)}


def test_the_model_has_types_to_check():
    assert {"JobSpec", "Resources", "Blocker", "Evicted", "Plan"} <= {cls.__name__ for cls in TYPES}


@pytest.mark.parametrize("cls", TYPES, ids=lambda cls: cls.__name__)
def test_every_field_is_set_from_its_name_and_from_its_place(cls):
    values = _samples(cls)
    by_name = cls(**values)
    by_place = cls(*values.values())
    for name, value in values.items():
        assert getattr(by_name, name) == value, f"{cls.__name__}.{name} by name"
        assert getattr(by_place, name) == value, f"{cls.__name__}.{name} by place"
    assert by_name == by_place
    assert dataclasses.replace(by_name) == by_name


@pytest.mark.parametrize("cls", TYPES, ids=lambda cls: cls.__name__)
def test_a_field_left_out_takes_its_declared_default(cls):
    values = _samples(cls)
    required = {f.name: values[f.name] for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    first, second = cls(**required), cls(**required)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            assert getattr(first, f.name) == f.default, f"{cls.__name__}.{f.name}"
        elif f.default_factory is not dataclasses.MISSING:
            assert getattr(first, f.name) == f.default_factory(), f"{cls.__name__}.{f.name}"
            assert getattr(first, f.name) is not getattr(second, f.name), f"{cls.__name__}.{f.name} is shared"


@pytest.mark.parametrize("cls", TYPES, ids=lambda cls: cls.__name__)
def test_a_made_value_cannot_be_changed(cls):
    made = cls(**_samples(cls))
    name = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, name, getattr(made, name))
