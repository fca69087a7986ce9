"""gpuctl's JSON (gpud.quickjson) and URL helpers write and read exactly what json and urllib.parse do."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from urllib.parse import quote, quote_plus, urlencode, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpud import client, quickjson

SCALARS = st.none() | st.booleans() | st.integers() | st.integers(min_value=-2**70, max_value=2**70) | \
    st.floats() | st.text()
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                      max_leaves=20)


def same(a, b) -> bool:
    """Equal, NaN counting as equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_dumps_writes_what_json_writes(value):
    assert quickjson.dumps(value) == json.dumps(value, separators=(",", ":"))


@settings(max_examples=300, deadline=None)
@given(VALUES, st.sampled_from(["", " ", "\n", "\r\n\t "]), st.booleans())
def test_loads_reads_what_json_reads(value, space, as_bytes):
    text = f"{space}{json.dumps(value, indent=1 if space else None)}{space}"
    assert same(quickjson.loads(text.encode() if as_bytes else text), json.loads(text))


@pytest.mark.parametrize("text", ["", " ", "{", '{"a": 1} x', "[1,]", "nul", '"\x01"', '{"a" 1}', "\ufeff[1]", "[1] [2]"])
def test_loads_refuses_what_json_refuses_with_its_message(text):
    with pytest.raises(ValueError) as ours:
        quickjson.loads(text)
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    assert str(ours.value) == str(theirs.value)


def test_dumps_refuses_what_json_refuses():
    with pytest.raises(TypeError, match="Object of type set is not JSON serializable"):
        quickjson.dumps({"a": {1}})
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        quickjson.dumps(loop)


def test_reading_and_writing_import_neither_json_nor_re():
    # (Against the modules there at start: an editable install's finder imports re on every start.)
    code = ("import sys; before = set(sys.modules); from gpud import quickjson; "
            "quickjson.loads(quickjson.dumps({'a': [1, 2.5, None, 'é']})); "
            "print(sorted(m for m in ('json', 're', 'enum') if m in set(sys.modules) - before))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


HOSTS = st.sampled_from(["127.0.0.1", "localhost", "CTRL.Example.org", "ctl-1", "[::1]", "ho st", "a@b", "é.example"])
PORTS = st.sampled_from(["", ":6830", ":0", ":65535", ":65536", ":", ":x", ":08"])
PATHS = st.sampled_from(["", "/", "/gpud", "/a/b/", "/a?b=1", "/a#x", "/a b", "/%41"])


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["http", "https", "ftp", "HTTP"]), HOSTS, PORTS, PATHS)
def test_a_controller_url_is_taken_apart_as_urlsplit_does(scheme, host, port, path):
    url = f"{scheme}://{host}{port}{path}"
    ours, theirs = client._split_url(url), urlsplit(url)
    assert (ours.scheme, ours.netloc, ours.path, ours.hostname) == \
        (theirs.scheme, theirs.netloc, theirs.path, theirs.hostname)
    try:
        expected = theirs.port
    except ValueError:
        with pytest.raises(ValueError):
            ours.port  # noqa: B018  (the same refusal, when the client connects)
        return
    assert ours.port == expected


@given(st.text(st.characters(blacklist_categories=("Cs",))))
def test_ids_and_queries_are_quoted_as_urllib_quotes_them(text):
    assert client._quote(text) == quote(text, safe="")
    assert client._quote(text, plus=True) == quote_plus(text)
    query = {"state": text, "limit": 5000, text or "k": True}
    assert client._urlencode(query) == urlencode(query)
