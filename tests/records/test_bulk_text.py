"""Bulk reading of long number runs (issue 32: `validate` of a 13 MB record with 10^6 scale_w
lines took 60 s): the message is always the one protobuf's text_format gives, and its errors
name the file's own line."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st

from amct_bridge.errors import RecordError
from amct_bridge.records import loads
from amct_bridge.records.bulk_text import MIN_RUN, _runs, parse_text
from amct_bridge.records.flavors import get_flavor

MOBILENET = (
    Path(__file__).resolve().parents[1] / "data" / "amct" / "tf_mobilenet_v2_record_quantized.txt"
)


def _both(text: str, flavor: str = "inner"):
    slow, fast = get_flavor(flavor).new_message(), get_flavor(flavor).new_message()
    text_format.Parse(text, slow)
    parse_text(text, fast)
    return slow, fast


def test_a_real_record_reads_the_same_and_in_bulk():
    text = MOBILENET.read_text()
    runs = _runs(text.split("\n"), get_flavor("tf").new_message().DESCRIPTOR)
    assert runs, "the fixture's per-channel scale_w runs are taken in bulk"
    slow, fast = _both(text, "tf")
    assert slow.SerializeToString() == fast.SerializeToString()


def _record(blocks):
    out = []
    for key, fields in blocks:
        out += ["record {", f'  key: "{key}"', "  value {"]
        out += [f"    {name}: {value}" for name, value in fields]
        out += ["  }", "}"]
    return "\n".join(out) + "\n"


NUMBERS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.sampled_from(["0", "-0", "1e-3", ".5", "5.", "1E5", "3f", "0x10", "inf", "-nan", "007"]),
)
FIELDS = st.lists(
    st.one_of(
        st.tuples(st.just("scale_w"), NUMBERS),
        st.tuples(st.just("offset_w"), st.integers(-(2**40), 2**40).map(str)),
        st.tuples(st.just("scale_d"), NUMBERS),
    ),
    max_size=5,
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            FIELDS,
            st.integers(0, 2 * MIN_RUN),
            st.sampled_from(["scale_w", "offset_w"]),
            st.booleans(),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_any_record_reads_as_text_format_reads_it(blocks):
    """Runs around single fields, the same field before and after a run, bad spellings, ints
    beyond int32, duplicate keys: the same message or the same refusal."""
    built = []
    for key, fields, run, name, before in blocks:
        value = "0.25" if name == "scale_w" else "7"
        body = [(name, value)] * run
        built.append((key, fields + body if before else body + fields))
    text = _record(built)
    slow = get_flavor("inner").new_message()
    try:
        text_format.Parse(text, slow)
    except text_format.ParseError as err:
        with pytest.raises(text_format.ParseError) as fast_err:
            parse_text(text, get_flavor("inner").new_message())
        assert (fast_err.value.GetLine(), str(fast_err.value)) == (err.GetLine(), str(err))
        return
    fast = get_flavor("inner").new_message()
    parse_text(text, fast)
    assert slow.SerializeToString() == fast.SerializeToString()


def test_an_error_after_a_run_names_the_files_line():
    text = _record([("a", [("scale_w", "0.5")] * 500 + [("bogus", "1")])])
    with pytest.raises(RecordError) as err:
        loads(text, source="r.txt")
    assert str(err.value).startswith("r.txt:504:5: ")  # record, key, value, 500 runs, bogus
    assert "bogus" in str(err.value)
