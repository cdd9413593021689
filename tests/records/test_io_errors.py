"""Parse errors name file, line and column; duplicates; detection; atomic writes."""

import os

import pytest

from amct_bridge.errors import AmctBridgeError, RecordError
from amct_bridge.records import LayerFactors, Record, detect_flavor, load, loads, save
from amct_bridge.records.atomic import check_writable


def test_unknown_field_error_gives_file_line_column_and_text(tmp_path):
    path = tmp_path / "record.txt"
    path.write_text('record {\n  key: "c"\n  value {\n    scal_d: 0.5\n  }\n}\n')
    with pytest.raises(RecordError) as err:
        load(path)
    message = str(err.value)
    assert message.startswith(f"{path}:4:")
    assert 'no field named "scal_d"' in message and "(text: 'scal_d: 0.5')" in message


def test_act_type_is_an_unknown_field_for_mindspore():
    with pytest.raises(RecordError, match=r"<string>:1:\d+: .*act_type.*'mindspore' record"):
        loads(
            'record { key: "c" value { scale_d: 0.5 offset_d: 0 act_type: "INT8" } }', "mindspore"
        )


def test_truncated_text_is_a_clear_error():
    with pytest.raises(RecordError, match=r"r.txt:2:\d+: .*cannot be parsed as an 'inner' record"):
        loads('record {\n  key: "c"\n', "inner", source="r.txt")


def test_not_a_record_at_all(tmp_path):
    path = tmp_path / "junk.bin"
    path.write_bytes(b"\xff\xfe\x00\x01garbage")
    with pytest.raises(RecordError, match="junk.bin: not an 'inner' record"):
        load(path)


def test_missing_file():
    with pytest.raises(RecordError, match="nope.txt: cannot read record file"):
        load("nope.txt")


DUP = (
    'record {\n  key: "a"\n  value { offset_d: 1 }\n}\n'
    'record {\n  key: "a"\n  value { offset_d: 2 }\n}\n'
)


def test_duplicate_layer_keys_are_an_error_by_default():
    with pytest.raises(RecordError, match=r"r.txt: layer 'a' is recorded twice \(lines 2 and 6\)"):
        loads(DUP, source="r.txt")


def test_duplicate_layer_keys_keep_last_on_request():
    record = loads(DUP, on_duplicate="keep_last")
    assert list(record.layers) == ["a"] and record.layers["a"].offset_d == 2


def test_optional_field_written_twice():
    text = 'record { key: "a" value { offset_d: 1 offset_d: 5 } }'
    with pytest.raises(RecordError, match='multiple "offset_d" fields'):
        loads(text)
    assert loads(text, on_duplicate="keep_last").layers["a"].offset_d == 5


def test_bad_on_duplicate_value():
    with pytest.raises(RecordError, match="on_duplicate must be one of"):
        loads("", on_duplicate="first")


@pytest.mark.parametrize(
    "factors, keys, expected",
    [
        (LayerFactors(scale_d=1.0, offset_d=0), ["net/conv/Conv2D"], "tf"),
        (LayerFactors(scale_d=1.0, offset_d=0), ["layer1.0.conv1"], "mindspore"),
        (LayerFactors(scale_d=1.0, offset_d=0), ["conv1", "head.fc"], "mindspore"),
        (LayerFactors(scale_d=1.0, offset_d=0), ["conv1"], "tf"),
        (LayerFactors(scale_d=1.0, offset_d=0, act_type="INT8"), ["conv1"], "tf"),
        (LayerFactors(scale_d=1.0, offset_d=0, dst_type="INT4"), ["conv1"], "inner"),
    ],
)
def test_flavor_detection(factors, keys, expected):
    assert detect_flavor(Record(dict.fromkeys(keys, factors))) == expected


def test_save_refuses_a_field_the_flavor_lacks(tmp_path):
    record = Record({"c": LayerFactors(scale_d=1.0, offset_d=0, dst_type="INT4")}, flavor="tf")
    with pytest.raises(
        RecordError, match="layer 'c': field 'dst_type' cannot be written in a 'tf'"
    ):
        save(record, tmp_path / "r.txt")
    assert list(tmp_path.iterdir()) == []


def test_failed_save_keeps_the_old_file(tmp_path):
    path = tmp_path / "record.txt"
    save(Record({"c": LayerFactors(scale_d=0.5, offset_d=0)}), path)
    before = path.read_bytes()
    bad = Record({"c": LayerFactors(scale_d="not a float", offset_d=0)})
    with pytest.raises(TypeError):
        save(bad, path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["record.txt"]  # no temp file left behind


def test_save_into_missing_directory(tmp_path):
    with pytest.raises(AmctBridgeError, match="cannot write here"):
        save(Record(), tmp_path / "missing" / "r.txt")


def test_check_writable(tmp_path):
    check_writable(tmp_path / "r.txt")
    with pytest.raises(AmctBridgeError, match="directory does not exist"):
        check_writable(tmp_path / "missing" / "r.txt")
    with pytest.raises(AmctBridgeError, match="is a directory"):
        check_writable(tmp_path)
