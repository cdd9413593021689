"""Fuzz: record text and binary (valid and corrupted) through load/loads/save/dumps/validate/
convert, in the three flavors. Each call succeeds or raises a RecordError; what succeeds is
checked: text and binary round trips are exact, validate() returns Problems, a converted record
is writable in its flavor and has no field its schema lacks.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from fuzz_records import FLOAT32, NAMES, corrupt_bytes, corrupt_text, records
from fuzz_support import attempt, fuzz_settings
from hypothesis import example, given
from hypothesis import strategies as st

from amct_bridge.errors import RecordError
from amct_bridge.records import convert, dumps, load, loads, save, to_proto, validate
from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
from amct_bridge.records.flavors import FLAVORS
from amct_bridge.records.validate import Problem

FLAVOR_ARGS = st.sampled_from([None, "inner", "tf", "mindspore"])


def check_loaded(record, target: str) -> None:
    """What every successfully read record must satisfy."""
    problems, err = attempt(target, validate, record)
    assert err is None, err  # validate reports problems, it does not raise on bad values
    assert all(isinstance(p, Problem) and str(p) for p in problems)
    text, err = attempt(target, dumps, record)
    if err is None:  # a record read in its flavor writes back and reads back the same
        again = loads(text, record.flavor)
        assert dumps(again) == text
    for flavor in FLAVORS:
        out, dropped = convert(record, flavor)
        assert all(isinstance(d, str) for d in dropped)
        assert not [p for p in validate(out) if "not part of" in p.message]
        assert loads(dumps(out), flavor).layers.keys() == out.layers.keys()


@fuzz_settings("fast")
@given(records(), st.booleans())
def test_valid_records_round_trip_text_and_binary(record, binary):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "record.txt"
        _, err = attempt("records.save", save, record, path, binary=binary)
        assert err is None, err  # every field fits the flavor's schema
        back, err = attempt("records.load", load, path, record.flavor)
        assert err is None, err
    assert dumps(back) == dumps(record)  # canonical text: float32 values, AMCT's spelling
    if binary:  # bit for bit (text spells every NaN "nan": its sign and payload are not kept)
        assert to_proto(back).SerializeToString(deterministic=True) == to_proto(
            record
        ).SerializeToString(deterministic=True)

    def found(rec):  # layer problems (an attr value None and [] are both "nothing" in a file)
        return [(p.layer, p.field, p.message) for p in validate(rec) if p.layer is not None]

    assert found(back) == found(record)  # the same problems (the read one also has FILE:LINE)
    check_loaded(back, "records.load")


@fuzz_settings("fast")
@given(st.data(), records(), FLAVOR_ARGS, st.sampled_from(["error", "keep_last"]))
def test_corrupted_text_is_read_or_refused(data, record, flavor, on_duplicate):
    text = data.draw(corrupt_text(dumps(record)))
    got, err = attempt("records.loads(corrupt)", loads, text, flavor, on_duplicate=on_duplicate)
    if err is None:
        check_loaded(got, "records.loads(corrupt)")


@fuzz_settings("fast")
@given(st.text(max_size=80), FLAVOR_ARGS)
def test_arbitrary_text_is_read_or_refused(text, flavor):
    got, err = attempt("records.loads(text)", loads, text, flavor)
    if err is None:
        check_loaded(got, "records.loads(text)")


@fuzz_settings("fast")
@given(st.data(), records(), FLAVOR_ARGS, st.booleans())
def test_corrupted_files_are_read_or_refused(data, record, flavor, binary):
    raw = (
        to_proto(record).SerializeToString(deterministic=True) if binary else dumps(record).encode()
    )
    raw = data.draw(corrupt_bytes(raw) | st.binary(max_size=40))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "record.txt"
        path.write_bytes(raw)
        got, err = attempt("records.load(corrupt)", load, path, flavor)
    if err is None:
        check_loaded(got, "records.load(corrupt)")
    else:
        assert isinstance(err, RecordError)
        assert str(path) in str(err) or "<string>" not in str(err)  # names the file


# Found by this fuzzer: proto2 string fields parsed from binary are not UTF-8-checked, so
# protobuf returned bytes keys/values and flavor detection or writing raised TypeError /
# UnicodeDecodeError. Now a RecordError naming the file and entry.
NON_UTF8_BINARY = {
    "key of a later entry": b"\n\x04\n\x00\x12\x00\n\x06\n\x01\xc2\x80\x12\x00",
    "key with a NUL": b"\n\x04\n\x00\x12\x00\n\x0c\n\x02\x00\x80\x12\x06z\x04INT8",
    "wts_type": b"\n\x04\n\x00\x12\x00\n\x0b\n\x010\x12\x06z\x04\x80NT8",
}


def test_binary_records_with_non_utf8_strings_are_refused(tmp_path):
    for what, raw in NON_UTF8_BINARY.items():
        path = tmp_path / "record.pb"
        path.write_bytes(raw)
        for flavor in (None, "inner"):
            got, err = attempt("records.load(regression)", load, path, flavor)
            assert isinstance(err, RecordError), (what, got)
            assert str(path) in str(err) and "is not UTF-8 text" in str(err), what


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=4,
)


@st.composite
def sidecars(draw) -> str:
    """A calibration sidecar (JSON) with, sometimes, one value anywhere replaced."""
    stats = CalibrationStats(algorithm="minmax", batches=draw(st.integers(0, 3)))
    for name in draw(st.lists(NAMES, max_size=3, unique=True)):
        r = TensorRange(draw(FLOAT32), draw(FLOAT32))
        stats.layers[name] = LayerStats("Conv2D", r if draw(st.booleans()) else None, r)
    doc = json.loads(stats.to_json())
    if draw(st.integers(0, 4)):
        paths = [[]]  # every object position in doc
        for name, entry in doc["layers"].items():
            paths.append(["layers", name])
            paths += [["layers", name, k] for k in entry if isinstance(entry[k], dict)]
        where = draw(st.sampled_from(paths))
        target = doc
        for key in where:
            target = target[key]
        key = draw(st.sampled_from(sorted(target) + ["min", "kind", "batches", "layers", "x"]))
        target[key] = draw(JSON_VALUES)
    return json.dumps(doc)


@fuzz_settings("fast")
@given(sidecars())
@example('{"format": "amct_bridge.calibration/1", "batches": "x"}')
@example('{"format": "amct_bridge.calibration/1", "layers": []}')
@example(
    '{"format": "amct_bridge.calibration/1", "layers": {"a": {"kind": "K", "output": '
    '{"min": "a", "max": 1}}}}'
)
def test_calibration_sidecars_are_read_or_refused(text):
    """Found by this fuzzer: a wrong-typed batches/layers/range raised ValueError,
    AttributeError or was accepted (a string min); now a RecordError naming the sidecar."""
    stats, err = attempt("records.sidecar", CalibrationStats.from_json, text, "r.calib.json")
    if err is not None:
        assert "r.calib.json" in str(err)
        return
    for layer in stats.layers.values():
        for r in (layer.input, layer.output):
            assert r is None or all(isinstance(v, float) for v in (r.min, r.max))
    assert CalibrationStats.from_json(stats.to_json()).to_json() == stats.to_json()
