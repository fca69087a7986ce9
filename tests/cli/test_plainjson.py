"""gpud.plainjson reads and writes JSON exactly as the json module does, without importing it."""

import json
import math
import os
import subprocess
import sys

import pytest
from hypothesis import example, given, strategies as st

from gpud import plainjson

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)


def _same(a, b) -> bool:
    """Equal values, NaN equal to NaN (json reads NaN as a float that equals nothing)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _outcome(read, text):
    try:
        return "value", read(text)
    except ValueError as exc:
        return "refused", type(exc).__name__, str(exc)


@given(VALUES)
def test_writes_what_json_writes(value):
    assert plainjson.dumps(value) == json.dumps(value, separators=(",", ":"))


@given(VALUES, st.sampled_from(["", " ", "\n\t ", "\r\n"]))
def test_reads_back_what_json_reads(value, space):
    text = space + json.dumps(value, ensure_ascii=False) + space
    assert _same(plainjson.loads(text), json.loads(text))
    assert _same(plainjson.loads(text.encode("utf-8")), json.loads(text.encode("utf-8")))


@given(st.text(alphabet=st.sampled_from('{}[]",:0123456789.eE+- \n\r\t\f\x0b\xa0trufalsnNIiy\\\ufeff'), max_size=12)
       | st.binary(max_size=8))
@example('{"a": 1} x')
@example("\f1")  # JSON's whitespace is space, tab, CR and LF only
@example("[1]\xa0")
@example("\ufeff[1]")
@example(b"\xff\xfe[\x001\x00]\x00")
@example(b'"\xc3"')
@example("")
def test_refuses_what_json_refuses_with_its_message(text):
    mine, theirs = _outcome(plainjson.loads, text), _outcome(json.loads, text)
    assert mine[0] == theirs[0]
    assert mine[1:] == theirs[1:] if mine[0] == "refused" else _same(mine[1], theirs[1])


def test_cannot_write_what_json_cannot():
    with pytest.raises(TypeError, match="Object of type set is not JSON serializable"):
        plainjson.dumps({"a": {1}})
    looped: list = []
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular reference"):
        plainjson.dumps(looped)


def test_imports_neither_json_nor_re():
    code = ("import sys; from gpud import plainjson; plainjson.dumps(plainjson.loads(b'{\"ids\": [\"1\"]}')); "
            "print(sorted({'json', 're', 'enum'} & set(sys.modules)))")
    # -S: no site, whose editable-install finder imports re on every start.
    root = os.path.dirname(os.path.dirname(plainjson.__file__))
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": root}, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
