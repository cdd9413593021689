"""Messages about records read right (issue 14, bug 5): articles, flavor words, wrong files."""

import json
import re
import zipfile

import numpy as np
import pytest

from amct_bridge.errors import RecordError
from amct_bridge.records import LayerFactors, PruneNode, PruneRecord, Record, load, loads, save
from amct_bridge.records.flavors import a_record
from amct_bridge.records.sniff import describe_bytes, describe_file
from amct_bridge.records.summary import flavor_phrase
from amct_bridge.records.validate import validate


@pytest.mark.parametrize(
    "flavor, phrase",
    [
        ("inner", "an 'inner' record"),
        ("tf", "a 'tf' record"),
        ("mindspore", "a 'mindspore' record"),
    ],
)
def test_article_fits_the_flavor(flavor, phrase):
    assert a_record(flavor) == phrase


def test_errors_say_an_inner_record(tmp_path):
    with pytest.raises(RecordError, match="parsed as an 'inner' record"):
        loads("record {", "inner")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\xff\xfe\x00\x01garbage")
    with pytest.raises(RecordError, match="junk.bin: not an 'inner' record"):
        load(junk)


def test_no_message_says_a_inner():
    """Every message that names a flavor, for each flavor: never "a 'inner'"."""
    texts = []
    for flavor in ("inner", "tf", "mindspore"):
        with pytest.raises(RecordError) as err:
            loads("record {", flavor)
        texts.append(str(err.value))
        rec = Record({"c": LayerFactors(scale_d=0.5, offset_d=0, dst_type="INT4", shift_bit=[1])})
        texts += [p.message for p in validate(rec, flavor)]
    pruned = Record(prune_records=[PruneRecord([PruneNode.channel("c", "Conv2D", 0, 4)], [])])
    texts += [p.message for p in validate(pruned, "tf")]
    assert any("an 'inner' record" in t for t in texts)
    assert any("a 'tf' record" in t for t in texts)
    assert not [t for t in texts if "a 'inner'" in t]


@pytest.mark.parametrize(
    "factors, phrase",
    [
        (LayerFactors(scale_d=0.5, offset_d=0), "a 'tf' record (also valid as 'inner')"),
        (LayerFactors(scale_d=0.5, offset_d=0, dst_type="INT4"), "an 'inner' record"),
    ],
)
def test_flavor_phrase_is_what_inspect_and_writers_print(factors, phrase, tmp_path):
    """One phrase whatever flavor the writer used: the file reads the same either way."""
    for written_as in ("inner", "tf") if factors.dst_type is None else ("inner",):
        save(Record({"conv": factors}), tmp_path / "r.txt", flavor=written_as)
        assert flavor_phrase(load(tmp_path / "r.txt")) == phrase
        assert flavor_phrase(load(tmp_path / "r.txt", flavor="inner")) == phrase


def test_mindspore_phrase_lists_both_wider_flavors():
    rec = Record({"layer1.0.conv1": LayerFactors(scale_d=0.5, offset_d=0)})
    assert flavor_phrase(rec) == "a 'mindspore' record (also valid as 'tf' and 'inner')"


# --- a wrong file given as a record ---------------------------------------------------------------
def _npy(path):
    with open(path, "wb") as f:  # np.save(path) would add ".npy" to the name
        np.save(f, np.zeros(3))


def _npz(path):
    with open(path, "wb") as f:
        np.savez(f, a=np.zeros(2), b=np.ones(2))


def _keras_like(path):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("metadata.json", "{}")
        z.writestr("config.json", "{}")
        z.writestr("model.weights.h5", b"\x89HDF\r\n\x1a\n")


def _hdf5(path):
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(64))


def _json(path):
    path.write_text(json.dumps({"layers": [{"name": "conv"}]}))


@pytest.mark.parametrize(
    "make, looks",
    [
        (_npy, r"a NumPy \.npy file \(magic \\x93NUMPY\)"),
        (_npz, r"a NumPy \.npz archive \(zip of 2 \.npy arrays\)"),
        (_keras_like, r"a Keras \.keras model archive"),
        (_hdf5, "an HDF5 file"),
        (_json, "a JSON file"),
    ],
)
def test_a_non_record_file_is_named_for_what_it_looks_like(tmp_path, make, looks):
    path = tmp_path / "given.txt"
    make(path)
    with pytest.raises(RecordError) as err:
        load(path)
    message = str(err.value)
    assert message.startswith(f"{path}: not a record file: it looks like ")
    assert re.search(looks, message), message
    assert "Wire format" not in message and "InnerScaleOffsetRecord" in message


def test_real_records_are_not_mistaken_for_other_files(tmp_path, data_dir):
    """Text and binary records (every fixture) pass the sniffing untouched."""
    rec = Record({"conv": LayerFactors(scale_d=0.5, offset_d=0, scale_w=[0.25], offset_w=[0])})
    save(rec, tmp_path / "r.bin", binary=True)
    assert load(tmp_path / "r.bin").layers == rec.layers
    records = sorted((data_dir / "amct").glob("*record*.txt"))
    assert records
    for path in records:
        assert describe_file(path) is None, path
        load(path)


def test_describe_bytes_leaves_unknown_bytes_alone():
    assert describe_bytes(b"") is None
    assert describe_bytes(b"\x0a\x05\x0a\x01c\x12\x00") is None  # a binary record
    assert describe_bytes(b"{ not json") is None


def test_a_shift_bit_record_is_inner_and_validates():
    """joint_quant writes shift_bit: in convert_model's schema but refused there, so the record
    is "inner" (it read as 'tf' and failed validate with "shift_bit is not supported")."""
    from amct_bridge.records import detect_flavor, dumps, loads, validate
    from amct_bridge.records.summary import flavor_phrase

    rec = Record(
        {"c1": LayerFactors(scale_d=0.5, offset_d=0, scale_w=[0.1], offset_w=[0], shift_bit=[3])}
    )
    assert detect_flavor(rec) == "inner" and flavor_phrase(rec) == "an 'inner' record"
    again = loads(dumps(rec, "inner"))
    assert again.flavor == "inner" and validate(again) == []


def test_a_sidecar_that_is_not_text_is_named_for_what_it_looks_like(tmp_path):
    """A .npy (or other binary) given as the sidecar was a UnicodeDecodeError (exit 70)."""
    from amct_bridge.records.calibration import load_stats

    path = tmp_path / "r.txt.calib.json"
    np.save(tmp_path / "x.npy", np.zeros(3))
    path.write_bytes((tmp_path / "x.npy").read_bytes())
    with pytest.raises(
        RecordError, match=r"not a calibration sidecar: it looks like a NumPy \.npy"
    ):
        load_stats(path)
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(RecordError, match="not a calibration sidecar: it looks like"):
        load_stats(path)
