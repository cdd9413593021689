"""Prune groups name a SeparableConv2D's parts as records and the export do, and say that the
model's output layer is the model output (issue 23 §6)."""

from __future__ import annotations

import keras
import pytest

from amct_bridge.graph.reasons import Reason
from amct_bridge.keras.espdl_weights import source_layers
from amct_bridge.keras.prune import prune_discovery, prune_record
from amct_bridge.records.model import LayerFactors, Record

L = keras.layers


def _separable_model(head: str) -> keras.Model:
    x = keras.Input((8, 8, 3), name="img")
    y = L.Conv2D(4, 3, padding="same", name="c1")(x)
    y = L.SeparableConv2D(6, 3, padding="same", name="sep")(y)
    y = L.Conv2D(5, 1, name="c2")(y)
    y = L.GlobalAveragePooling2D(name="gap")(y)
    if head == "fused":
        return keras.Model(x, L.Dense(3, activation="softmax", name="fc")(y))
    y = L.Dense(3, name="fc")(y)
    if head == "softmax_layer":
        return keras.Model(x, L.Softmax(name="sm")(y))
    if head == "sigmoid":
        return keras.Model(x, L.Activation("sigmoid", name="act")(L.Dropout(0.1)(y)))
    return keras.Model(x, y)


def test_separable_parts_have_the_record_and_export_names():
    model = _separable_model("linear")
    d = prune_discovery(model)
    names = {m.name for g in d.groups for m in g.members} | {r.layer for r in d.refusals}
    assert {"sep/depthwise", "sep/pointwise"} <= names
    assert "sep" not in names
    # the export's (and the record's) names for the same layer
    exported = {s.name for s in source_layers(model) if s.attrs.get("part_of") == "sep"}
    assert exported == {"sep/depthwise", "sep/pointwise"}
    producers = {p.name for g in d.groups for p in g.producers}
    assert "sep/pointwise" in producers
    # the record's pointwise entry gets its prune fields (it got none under the name "sep")
    keys = ["c1", "sep/depthwise", "sep/pointwise", "c2", "fc"]
    record = prune_record(model, record=Record({k: LayerFactors() for k in keys}))
    pw = record.layers["sep/pointwise"]
    assert pw.prune_consumer == ["c2"]
    assert "c1" in pw.prune_producer
    assert record.layers["c2"].prune_producer == ["sep/pointwise"]


@pytest.mark.parametrize("head", ["linear", "fused", "softmax_layer", "sigmoid"])
def test_output_layer_is_refused_as_the_model_output(head):
    d = prune_discovery(_separable_model(head))
    by_layer = {r.layer: r for r in d.refusals}
    assert by_layer["fc"].reason is Reason.MODEL_OUTPUT, by_layer["fc"]
    assert "model output" in by_layer["fc"].detail
    assert Reason.CHANNEL_MIXING not in {r.reason for r in d.refusals}
    # the layers before it are still grouped: only the output layer is refused
    assert {p.name for g in d.groups for p in g.producers} == {"c1", "sep/pointwise", "c2"}


def test_a_producer_reaching_the_output_through_pooling_is_not_the_model_output():
    x = keras.Input((8, 8, 3))
    c = L.Conv2D(4, 3, name="c1")(x)
    model = keras.Model(x, [L.GlobalAveragePooling2D(name="gap")(c), L.Dense(2, name="fc")(c)])
    by_layer = {r.layer: r.reason for r in prune_discovery(model).refusals}
    assert by_layer == {"c1": Reason.REACHES_OUTPUT, "fc": Reason.MODEL_OUTPUT}
