"""extract_graph on Keras 3 models: read-only, names, shapes, params, clear errors."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras import layers, ops
from kgraph_helpers import kname

from amct_bridge.errors import GraphError
from amct_bridge.graph import discover_groups
from amct_bridge.keras.graph import extract_graph


def test_extraction_never_modifies_the_model():
    x = keras.Input((6, 6, 3))
    y = layers.BatchNormalization(name="bn")(layers.Conv2D(4, 3, name="c")(x))
    model = keras.Model(x, y)
    before = [w.copy() for w in model.get_weights()]
    n_layers, n_ops = len(model.layers), len(model.operations)
    extract_graph(model)
    extract_graph(model)
    assert (len(model.layers), len(model.operations)) == (n_layers, n_ops)
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_raw_op_names_are_keras_own_per_model():
    def build():
        x = keras.Input((4,))
        a = layers.Dense(4, name="d")(x)
        return keras.Model(x, ops.relu(a + a) + a)

    for model in (build(), build()):  # Keras counts per process: the 2nd model has add_2...
        names = [n.name for n in extract_graph(model)]
        assert names == [op.name for op in model.operations[1:]]  # all but the InputLayer
        assert [n.name for n in extract_graph(model)] == names  # same model, same names


def test_shapes_and_params_come_from_the_model():
    x = keras.Input((8, 8, 3))
    y = layers.SeparableConv2D(5, 3, depth_multiplier=2, name="sep")(x)
    y = layers.Conv2DTranspose(6, 3, strides=2, use_bias=False, name="tr")(y)
    p, q = ops.split(y, [2], axis=-1)
    split = kname(p)
    g = extract_graph(keras.Model(x, [p, layers.Concatenate(axis=1, name="cat")([q, q])]))
    sep = g.node("sep").params
    assert sep["kernel_shape"] == (3, 3, 3, 2) and sep["pointwise_kernel_shape"] == (1, 1, 6, 5)
    assert g.node("tr").params["kernel_layout"] == "HWOI" and not g.node("tr").params["use_bias"]
    assert g.node(split).params == {"axis": -1, "split_sizes": [2, 4], "const_operands": 0}
    assert g.node("cat").params["axis"] == -3
    assert g.tensors[g.node("tr").outputs[0]].shape == (None, 13, 13, 6)
    assert len(g.outputs) == 2 and g.producer_of(g.outputs[0]).name == split


def test_constant_operand_is_counted_and_stops():
    x = keras.Input((4,))
    d = layers.Dense(4, name="d")(x)
    y = d * np.arange(4, dtype="float32")  # per-channel constant
    g = extract_graph(keras.Model(x, layers.Dense(2, name="o")(y)))
    assert g.node(kname(y)).params["const_operands"] == 1
    refused = {r.layer: r.reason.value for r in discover_groups(g).refusals}
    assert refused["d"] == "CONSTANT_OPERAND"


def test_unbuilt_sequential_and_subclassed_models_are_refused():
    with pytest.raises(GraphError, match="Sequential model 'seq' is not built"):
        extract_graph(keras.Sequential([layers.Dense(2)], name="seq"))

    class Sub(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(GraphError, match="subclassed models cannot"):
        extract_graph(Sub(name="sub"))
