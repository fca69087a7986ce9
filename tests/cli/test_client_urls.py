"""The client takes a controller URL apart, and quotes ids and queries, exactly as urllib.parse does."""

from __future__ import annotations

from urllib.parse import quote, quote_plus, urlencode, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud import client

HOSTS = st.sampled_from(["127.0.0.1", "localhost", "CTRL.Example.org", "ctl-1", "[::1]", "ho st", "a@b", "é.example"])
PORTS = st.sampled_from(["", ":6830", ":0", ":65535", ":65536", ":", ":x", ":08"])
PATHS = st.sampled_from(["", "/", "/gpud", "/a/b/", "/a?b=1", "/a#x", "/a b", "/%41"])


@settings(max_examples=examples(300), deadline=None)
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
