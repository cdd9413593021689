"""Keras: a layer applied twice back to back (``d(d(x))``) is one graph node per call.

Keras keeps one call-graph node per call, so nothing merges (MindSpore's MindIR does not: see
tests/mindspore/test_graph_back_to_back.py); this pins it, also for a nested model.
"""

from __future__ import annotations

import keras
from keras import layers

from amct_bridge.keras.espdl_weights import source_layers
from amct_bridge.keras.graph import extract_graph


def test_a_dense_applied_back_to_back_is_two_nodes():
    x = keras.Input((6,), name="x")
    d = layers.Dense(6, name="d")
    model = keras.Model(x, d(d(x)))
    graph = extract_graph(model)
    got = [(n.name, n.layer, n.call_index, n.inputs, n.outputs, n.shared) for n in graph]
    assert got == [
        ("d", "d", 0, ["x:0"], ["d:0"], True),
        ("d@1", "d", 1, ["d:0"], ["d@1:0"], True),
    ]
    assert graph.outputs == ["d@1:0"]
    assert [s.name for s in source_layers(model)][-2:] == ["d", "d@1"]


def test_a_nested_model_applied_back_to_back_is_two_calls_of_each_layer():
    inner_x = keras.Input((6,))
    inner = keras.Model(
        inner_x, layers.ReLU(name="r")(layers.Dense(6, name="e")(inner_x)), name="blk"
    )
    x = keras.Input((6,), name="x")
    graph = extract_graph(keras.Model(x, inner(inner(x))))
    assert [(n.name, n.inputs) for n in graph] == [
        ("blk/e", ["x:0"]),
        ("blk/r", ["blk/e:0"]),
        ("blk/e@1", ["blk/r:0"]),
        ("blk/r@1", ["blk/e@1:0"]),
    ]
