"""The real AMCT records load, validate, round-trip byte for byte and convert between flavors."""

from pathlib import Path

import pytest

from amct_bridge.records import convert, dumps, load, loads, save, validate

AMCT = Path(__file__).parent.parent / "data" / "amct"
MOBILENET = AMCT / "tf_mobilenet_v2_record_quantized.txt"
PRUNE = AMCT / "prune_record_single_conv.txt"


def test_mobilenet_record_loads_as_tf_flavor_and_validates():
    record = load(MOBILENET)
    assert record.flavor == "tf"
    assert len(record.layers) == MOBILENET.read_text().count("key:") == 54
    first = record.layers["MobilenetV2/expanded_conv_2/depthwise/depthwise"]
    assert first.offset_d == -128 and abs(first.scale_d - 6 / 255) < 1e-9
    assert len(first.scale_w) == len(first.offset_w) == 144
    assert validate(record) == []


@pytest.mark.parametrize("path", [MOBILENET, PRUNE], ids=lambda p: p.name)
def test_real_records_are_rewritten_byte_for_byte(path, tmp_path):
    # AMCT's own files come back identical: same field order, same float spelling.
    record = load(path)
    assert dumps(record) == path.read_text()
    out = tmp_path / "again.txt"
    save(record, out)
    assert out.read_bytes() == path.read_bytes()


def test_save_is_stable_after_the_first_save(tmp_path):
    record = loads(
        'record { key: "c" value { scale_d: 0.1 offset_d: 3 scale_w: 0.333333333 offset_w: 0 } }'
    )
    first, second = tmp_path / "1.txt", tmp_path / "2.txt"
    save(record, first)
    save(load(first), second)
    assert first.read_bytes() == second.read_bytes()


def test_binary_round_trip_and_detection(tmp_path):
    record = load(MOBILENET)
    out = tmp_path / "record.pb"
    save(record, out, binary=True)
    again = load(out)
    assert again == record and again.flavor == "tf"
    save(again, tmp_path / "again.pb", binary=True)
    assert (tmp_path / "again.pb").read_bytes() == out.read_bytes()


def test_prune_record_loads_as_inner():
    record = load(PRUNE)
    assert record.flavor == "inner"
    (group,) = record.prune_records
    assert [n.name for n in group.producers] == ["layer1.0"]
    assert [(n.name, n.get("type"), n.get("begin"), n.get("end")) for n in group.consumers] == [
        ("layer1.1", "BatchNormalization", 0, 64),
        ("layer2.0", "Conv", 0, 64),
    ]
    assert validate(record) == []


def test_flavor_conversion_chain_drops_and_reports(tmp_path):
    inner = loads(
        'record { key: "conv1" value { scale_d: 0.5 offset_d: 1 scale_w: 0.1 offset_w: 0 '
        'shift_bit: 3 dst_type: "INT4" act_type: "INT8" wts_type: "INT8" '
        'tensor_balance_factor: 1.5 prune_producer: "conv2" } }' + PRUNE.read_text(),
        "inner",
    )
    tf, dropped_tf = convert(inner, "tf")
    assert sorted(dropped_tf) == sorted(
        [
            "layer 'conv1': shift_bit (1 values)",
            "layer 'conv1': dst_type ('INT4')",
            "layer 'conv1': prune_producer (1 values)",
            "layer 'conv1': tensor_balance_factor (1 values)",
            "1 prune_record entries",
        ]
    )
    assert validate(tf) == [] and tf.layers["conv1"].act_type == "INT8"
    ms, dropped_ms = convert(tf, "mindspore")
    assert dropped_ms == ["layer 'conv1': act_type ('INT8')", "layer 'conv1': wts_type ('INT8')"]
    assert validate(ms) == []
    # What AMCT's MindSpore parser would read: the text parses with the MindSpore schema.
    out = tmp_path / "ms.txt"
    save(ms, out)
    assert load(out, "mindspore").layers["conv1"].scale_w == [pytest.approx(0.1)]
    # The original is untouched.
    assert inner.layers["conv1"].dst_type == "INT4" and inner.prune_records


def test_real_mobilenet_converts_to_mindspore_without_loss():
    record = load(MOBILENET)
    ms, dropped = convert(record, "mindspore")
    assert dropped == []
    assert ms.layers == record.layers
