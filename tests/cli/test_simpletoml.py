"""The client config's fast reader answers exactly as tomllib does, or leaves the file to tomllib."""

import tomllib

from hypothesis import given, settings, strategies as st
from hypothesis_budget import examples

from gpud.simpletoml import read_simple

KEYS = st.sampled_from(["a", "b", "url", "token_file", "x-1", "a b", "a.b", '"q"', "", "é"])
VALUES = st.text(alphabet=st.sampled_from(list("ab #'\"\\\t\x01\x7f=") + ["é"]), max_size=5)
LINES = st.one_of(
    st.builds(lambda k, q, v, tail: f"{k} = {q}{v}{q}{tail}", KEYS, st.sampled_from(['"', "'", '"""']), VALUES,
              st.sampled_from(["", "  # note", " x", "#", " \t"])),
    st.builds(lambda k, v: f"{k}={v}", KEYS, st.sampled_from(["1", "true", "[1]", "{a=1}", "'x", ""])),
    st.sampled_from(["", "# a comment", "[table]", "  ", "\t# tab", "a.b = 'x'", "\x7f"]),
)


@settings(max_examples=examples(1500), deadline=None)
@given(st.lists(LINES, max_size=6), st.sampled_from(["\n", "\r\n"]))
def test_agrees_with_tomllib_wherever_it_answers(lines, newline):
    text = newline.join(lines)
    simple = read_simple(text)
    try:
        expected = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        assert simple is None
        return
    assert simple is None or simple == expected


def test_the_config_gpud_up_writes_is_read_without_tomllib():
    text = '# written by gpud up\nurl = "http://127.0.0.1:6830"\ntoken = \'abc-123\'  # admin\n\n'
    assert read_simple(text) == {"url": "http://127.0.0.1:6830", "token": "abc-123"}


def test_anything_else_is_left_to_tomllib():
    for text in ('timeout = 5\n', 'a = "x\\ty"\n', 'url = "x"\nurl = "y"\n', '[client]\nurl = "x"\n',
                 'url = """x"""\n'):
        assert read_simple(text) is None
