"""TF-op-keyed records and the frozen graph: keys name ops of the right type, weights agree."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from calib_models import bn_fold, branchy_model, nested_model, ref_arq

from amct_bridge.keras import QuantCalibration
from amct_bridge.keras.freeze import freeze_model
from amct_bridge.records import load, validate

#: Output-channel axis of the TF op's filter, per op type (None: one scale per tensor).
OUT_AXIS = {"Conv2D": 3, "DepthwiseConv2dNative": None, "Conv2DBackpropInput": 2, "MatMul": None}


def _graph_def(path):
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(path.read_bytes())
    return {node.name: node for node in graph_def.node}, graph_def


def _weights(nodes, op):
    node = nodes[op.input[1]]
    while node.op == "Identity":
        node = nodes[node.input[0]]
    assert node.op == "Const"
    return tf.make_ndarray(node.attr["value"].tensor)


def _layer(model, key):
    for name in key.split("/"):
        model = model.get_layer(name)
    return model


def _expected_scale_w(op_type, kernel):
    if op_type == "DepthwiseConv2dNative":  # HWIM: channel c*M + m
        return ref_arq(kernel.reshape(*kernel.shape[:2], -1), 2)
    return ref_arq(kernel, OUT_AXIS[op_type])


@pytest.mark.parametrize("make", [branchy_model, nested_model])
def test_tf_op_keys_and_frozen_weights_agree(tmp_path, make):
    model = make()
    shape = (16, *model.inputs[0].shape[1:])
    x = np.random.default_rng(0).normal(size=shape).astype("float32")
    record_path, pb_path = tmp_path / "record.txt", tmp_path / "model.pb"
    cb = QuantCalibration(
        record_path, algorithm="minmax", keys="tf_op", flavor="tf", frozen_graph_path=pb_path
    )
    model.predict(x, batch_size=8, verbose=0, callbacks=[cb])
    record = load(record_path, flavor="tf")
    assert validate(record) == []
    nodes, graph_def = _graph_def(pb_path)
    expected_types = {"Conv2D", "DepthwiseConv2dNative", "Conv2DBackpropInput", "MatMul", "AvgPool"}
    n_quantizable = 8 if make is branchy_model else 3
    # the shared Dense is two MatMul ops, both keyed
    assert len(record.layers) == n_quantizable + (1 if make is branchy_model else 0)
    for key, factors in record.layers.items():
        assert key in nodes, f"{key} is not an op of the frozen graph"
        op = nodes[key]
        assert op.op in expected_types
        if op.op == "AvgPool":
            assert factors.scale_w == []
            continue
        kernel = _weights(nodes, op)
        np.testing.assert_allclose(
            factors.scale_w, _expected_scale_w(op.op, kernel), rtol=2e-6, err_msg=key
        )
    # BN really is folded into the .pb: the keyed conv's constant is W * gamma / sqrt(var + eps)
    conv, bn = ("dw", "bn_dw") if make is branchy_model else ("block/ic", "block/ibn")
    layer, bn_layer = _layer(model, conv), _layer(model, bn)
    (op_name,) = [k for k in record.layers if f"/{conv.split('/')[-1]}_1/" in k]
    out_shape = (layer.kernel.shape[2], layer.kernel.shape[3]) if conv == "dw" else None
    np.testing.assert_allclose(
        _weights(nodes, nodes[op_name]), bn_fold(layer.kernel, bn_layer, out_shape), rtol=1e-6
    )
    # the frozen graph (BN folded into the weights) still computes the model
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    frozen = freeze_model(model)
    with tf.compat.v1.Session(graph=graph) as sess:
        y = sess.run(frozen.outputs[0], {frozen.inputs[0]: x})
    np.testing.assert_allclose(y, model.predict(x, verbose=0), rtol=1e-4, atol=1e-5)
    bn_ops = [n.op for n in graph_def.node if "/bn" in n.name or "/ibn" in n.name]
    assert "Rsqrt" not in bn_ops and "BiasAdd" in bn_ops  # BN became a bias add


def test_freeze_finds_each_op_type_by_tracing():
    frozen = freeze_model(branchy_model())
    types = {key: frozen.op_type(key) for key in frozen.op_names}
    assert types == {
        "ca": "Conv2D",
        "dw": "DepthwiseConv2dNative",
        "pw": "Conv2D",
        "sep/depthwise": "DepthwiseConv2dNative",
        "sep/pointwise": "Conv2D",
        "tr": "Conv2DBackpropInput",
        "ap": "AvgPool",
        "shared": "MatMul",
    }
    assert len(frozen.op_names["shared"]) == 2


def test_dense_on_3d_input_is_keyed_by_its_tensordot_matmul(tmp_path):
    """Keras 3 computes Dense on (batch, steps, features) with tensordot: the record key is
    that MatMul, whose weights are the kernel."""
    inp = keras.Input((5, 8))
    model = keras.Model(inp, keras.layers.Dense(4, name="fc")(inp), name="seq3d")
    record_path, pb_path = tmp_path / "record.txt", tmp_path / "model.pb"
    cb = QuantCalibration(record_path, algorithm="minmax", keys="tf_op", frozen_graph_path=pb_path)
    x = np.random.default_rng(1).normal(size=(16, 5, 8)).astype("float32")
    model.predict(x, batch_size=8, verbose=0, callbacks=[cb])
    nodes, _ = _graph_def(pb_path)
    [(key, factors)] = load(record_path).layers.items()
    assert nodes[key].op == "MatMul" and "Tensordot" in key
    kernel = model.get_layer("fc").kernel.numpy()
    np.testing.assert_array_equal(_weights(nodes, nodes[key]), kernel)
    np.testing.assert_allclose(factors.scale_w, ref_arq(kernel), rtol=2e-6)
