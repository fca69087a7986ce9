"""Durations, sizes and array specs as people type them, and as gpuctl prints them back."""

import pytest
from hypothesis import example, given, strategies as st

from gpud.cli.units import (format_duration, format_number, format_size_gib, parse_array, parse_duration,
                            parse_size_gib)


@pytest.mark.parametrize("text, seconds", [
    ("90", 5400), ("1:30", 90), ("1:30:00", 5400), ("2-00:00:00", 172800), ("1-12", 129600),
    ("1-0:30", 88200), ("90m", 5400), ("30s", 30), ("1.5h", 5400), ("2d", 172800), (" 2H ", 7200),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0m", "1:60", "1:00:60", "x-1", "1:2:3:4", "-5", "1w", "1.5", "abc"])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="bad time"):
        parse_duration(text)


@pytest.mark.parametrize("seconds, text", [
    (0, "0:00"), (59.9, "0:59"), (61, "1:01"), (3723, "1:02:03"), (90000, "1-01:00:00"), (None, "-"), (-5, "0:00"),
])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@given(st.integers(min_value=1, max_value=10**7))
def test_printed_durations_read_back(seconds):
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize("text, gib", [
    ("16G", 16), ("16g", 16), ("20GiB", 20), ("20GB", 20), ("512M", 0.5), ("1.5T", 1536), ("16", 16),
    ("1048576K", 1), ("1 G", 1),
])
def test_sizes(text, gib):
    assert parse_size_gib(text) == gib


@pytest.mark.parametrize("text", ["", "0G", "G", "-1G", "16X", "1.2.3G", "16 GiBs"])
def test_bad_sizes(text):
    with pytest.raises(ValueError, match="bad size"):
        parse_size_gib(text)


@pytest.mark.parametrize("gib, text", [(16, "16G"), (0.5, "512M"), (1536, "1.5T"), (80.0, "80G"), (None, "-")])
def test_format_size(gib, text):
    assert format_size_gib(gib) == text


@pytest.mark.parametrize("value, text", [(2, "2"), (2.0, "2"), (0.5, "0.5"), (1.25, "1.25"), (1 / 3, "0.33"),
                                         (None, "-")])
def test_format_number(value, text):
    assert format_number(value) == text


@pytest.mark.parametrize("spec, count, limit", [
    ("0-99", 100, None), ("0-99%8", 100, 8), ("1,3,5-7", 5, None), ("7", 1, None), ("0-15:4", 4, None),
    ("0-10:5,3", 4, None), ("0-999999999%1", 10**9, 1),
])
def test_arrays(spec, count, limit):
    assert parse_array(spec) == (count, limit)


@pytest.mark.parametrize("spec, message", [
    ("", "use ranges"), ("a-b", "use ranges"), ("1-", "use ranges"), ("-3", "use ranges"), ("1,,2", "use ranges"),
    ("0-9%", "use ranges"), ("5-1", "runs backwards"), ("0-9%0", "at least 1"), ("1-4:0", "step"),
    ("0-5,5", "appears twice"), ("1,1", "appears twice"),
])
def test_bad_arrays(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_array(spec)


# The grammars as regular expressions, as gpuctl read them before it stopped importing re: the str-method readers
# must take exactly the same texts, with the same values.
SUFFIXED = r"^(\d+(?:\.\d+)?)([smhd])$"
SIZE = r"(?i)^(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:i?B)?$"
ARRAY = r"^(\d+(?:-\d+(?::\d+)?)?(?:,\d+(?:-\d+(?::\d+)?)?)*)(?:%(\d+))?$"
GIB_PER_UNIT = {"": 1.0, "K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0, "P": 1024.0**2}
# Digits of other scripts are digits to \d and int(); the rest are the characters of the grammars and a few near them.
GRAMMAR = st.text(alphabet=st.sampled_from("0123456789٣.-:,%smhdSMHDkKmMgGtTpPiIbB \t\n\xa0x"), max_size=10)


def _outcome(read, text):
    try:
        return read(text)
    except ValueError:
        return "refused"


def _size_by_regex(text):
    import re
    match = re.match(SIZE, text.strip())
    if not match or float(match[1]) <= 0:
        raise ValueError(text)
    return float(match[1]) * GIB_PER_UNIT[match[2].upper()]


@given(GRAMMAR)
@example("16GiB")
@example(" 1.5 tb ")
@example(".5G")
@example("1.G")
@example("٣G")
def test_sizes_are_read_as_the_regex_read_them(text):
    assert _outcome(parse_size_gib, text) == _outcome(_size_by_regex, text)


@given(GRAMMAR)
@example("1.5h")
@example("1.h")
@example(".5m")
@example("٣m")
def test_durations_with_a_unit_are_read_as_the_regex_read_them(text):
    import re
    match = re.match(SUFFIXED, text.strip().lower())
    if match and float(match[1]) > 0:
        assert parse_duration(text) == float(match[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]
    elif text.strip()[-1:].lower() in ("s", "m", "h", "d"):
        with pytest.raises(ValueError, match="bad time"):
            parse_duration(text)


@given(GRAMMAR)
@example("0-99%8")
@example("1,3,5-7")
@example("0-15:4")
@example("1-:2")
@example("0-9%")
@example("٣-٥")
def test_arrays_are_read_as_the_regex_read_them(text):
    import re
    match = re.match(ARRAY, text.strip())
    try:
        count, limit = parse_array(text)
    except ValueError as exc:
        assert (match is None) == ("use ranges and indices" in str(exc))
    else:
        assert match is not None and limit == (int(match[2]) if match[2] is not None else None)


@pytest.mark.parametrize("text", ["1\u212a", "1\u0130B"])
def test_a_unit_that_only_case_folds_to_ascii_is_refused(text):
    # re's case folding took the Kelvin sign for K (then failed on it) and U+0130 for i.
    with pytest.raises(ValueError, match="bad size"):
        parse_size_gib(text)
