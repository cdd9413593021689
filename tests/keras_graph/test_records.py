"""Channel-pruning PruneRecords from Keras models: AMCT layout, text round trip, layer fields."""

from __future__ import annotations

import keras
from keras import layers

from amct_bridge.graph.prune_records import discovery_records, fill_prune_fields
from amct_bridge.keras.prune import prune_discovery, prune_record
from amct_bridge.records import LayerFactors, Record, dumps, load, loads, save

#: ONNX op types (AMCT PyTorch records) -> the TF op types AMCT-TF writes.
ONNX_TO_TF = {"Conv": "Conv2D", "BatchNormalization": "FusedBatchNormV3"}


def node_tuple(node, type_map=None) -> tuple:
    op = node.get("type")
    return (node.name, (type_map or {}).get(op, op), node.get("begin"), node.get("end"))


def single_conv_model() -> keras.Model:
    """The model of AMCT's record_SingleConv test: conv(64) -> BN -> conv."""
    x = keras.Input((8, 8, 3))
    y = layers.Conv2D(64, 3, name="layer1.0")(x)
    y = layers.BatchNormalization(name="layer1.1")(y)
    y = layers.Conv2D(8, 1, name="layer2.0")(y)
    return keras.Model(x, layers.Dense(2, name="fc")(layers.Flatten(name="flat")(y)))


def test_single_conv_matches_amct_record_fixture(data_dir):
    fixture = load(data_dir / "amct" / "prune_record_single_conv.txt").prune_records[0]
    ours = discovery_records(prune_discovery(single_conv_model()))[0]
    assert [node_tuple(n) for n in ours.producers] == [
        node_tuple(n, ONNX_TO_TF) for n in fixture.producers
    ]
    assert [node_tuple(n) for n in ours.consumers] == [
        node_tuple(n, ONNX_TO_TF) for n in fixture.consumers
    ]


def test_channel_records_round_trip_through_text_and_file(tmp_path):
    x = keras.Input((4, 4, 3))
    y = layers.DepthwiseConv2D(1, depth_multiplier=2, name="dw")(layers.Conv2D(4, 1, name="c1")(x))
    y = layers.Dense(3, name="fc1")(layers.Flatten(name="flat")(y))
    record = prune_record(keras.Model(x, layers.Dense(2, name="fc2")(y)))
    path = tmp_path / "prune.txt"
    save(record, path)
    back = load(path)
    assert back.prune_records == loads(dumps(record)).prune_records == record.prune_records
    dense = next(n for r in back.prune_records for n in r.consumers if n.name == "fc1")
    # 4 conv channels x multiplier 2 = 8 channels per position, 16 positions
    assert (dense.get("begin"), dense.get("end")) == (0, 8)
    assert (dense.get("multiplier"), dense.get("tile"), dense.get("stride")) == (2, 16, 8)


def test_quantized_layers_list_their_related_layers():
    model = single_conv_model()
    base = Record(
        layers={k: LayerFactors(scale_d=0.1, offset_d=0) for k in ("layer1.0", "layer2.0")}
    )
    record = prune_record(model, record=base)
    assert record.layers["layer1.0"].prune_consumer == ["layer1.1", "layer2.0"]
    assert record.layers["layer2.0"].prune_producer == ["layer1.0"]
    assert record.layers["layer2.0"].prune_consumer == ["flat", "fc"]
    assert "layer1.1" not in record.layers  # only quantized layers carry the fields
    text = dumps(record)
    assert 'prune_producer: "layer1.0"' in text


def test_fill_prune_fields_clears_stale_entries():
    record = Record(layers={"a": LayerFactors(prune_producer=["old"])})
    assert fill_prune_fields(record).layers["a"].prune_producer == []
