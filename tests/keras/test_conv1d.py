"""Issue 33 §1: Conv1D, DepthwiseConv1D and SeparableConv1D are quantized as the 2-D convs of
height 1 they are (AMCT's Conv2D rules), in calibrate(), the callback in fit, keys="tf_op" with
the frozen graph, simulate and QAT; a layer with weights left float is named in a warning.

Before the fix the record of the issue's model held only ``fc`` and simulate() ran the convs in
float (near-float results), silently."""

from __future__ import annotations

import json
import logging

import keras
import numpy as np
import pytest
import tensorflow as tf
from conv1d_models import conv1d_net, height1_twin, samples, snr_db

from amct_bridge.graph import discover_groups
from amct_bridge.keras import QuantCalibration, calibrate, simulate
from amct_bridge.keras.graph import extract_graph
from amct_bridge.keras.qat import qat_record, quantize_aware, strip_qat
from amct_bridge.records import load, validate

CONVS = ("c1", "dw", "c2")


def _check_conv_entries(record, keys=CONVS, channels=8):
    """Each conv has AMCT's conv fields: scale_d/offset_d and one scale_w/offset_w per output
    channel (channel-wise ARQ)."""
    for key in keys:
        f = record.layers[key]
        assert f.scale_d is not None and f.offset_d is not None, key
        assert len(f.scale_w) == channels and f.offset_w == [0] * channels, key


def test_calibrate_quantizes_every_1d_conv(tmp_path):
    model = conv1d_net()
    record = calibrate(model, samples(64), tmp_path / "r.txt", algorithm="minmax")
    assert list(record.layers) == [*CONVS, "fc"]
    _check_conv_entries(record)
    assert validate(load(tmp_path / "r.txt")) == []
    stats = json.loads((tmp_path / "r.txt.calib.json").read_text())
    assert "warnings" not in stats  # every layer with weights is quantized
    assert {"c1", "dw", "c2", "gap", "fc"} <= set(stats["layers"])  # the 1-D pool too


def test_record_is_the_height_1_conv2d_twins(tmp_path):
    """AMCT's Conv2D rules on [1, k, cin, cout]: the 1-D model's record is, byte for byte,
    the one of its 2-D twin of height 1 with the same weights on the same data (also IFMR,
    folding and DMQ are the twin's)."""
    model = conv1d_net()
    x = samples(64)
    twin = height1_twin(model)
    np.testing.assert_array_equal(model.predict(x, verbose=0), twin.predict(x[:, None], verbose=0))
    options = {"algorithm": "ifmr", "migration_strength": 0.5, "joint_quant": True}
    calibrate(model, x, tmp_path / "one.txt", **options)
    calibrate(twin, x[:, None], tmp_path / "two.txt", **options)
    assert (tmp_path / "one.txt").read_text() == (tmp_path / "two.txt").read_text()


def test_callback_in_fit_and_simulate_follow_the_convs(tmp_path):
    model = conv1d_net(separable=True)
    x, y = samples(64), np.zeros((64, 4), "float32")
    model.compile("sgd", "mse")
    cb = QuantCalibration(tmp_path / "fit.txt", algorithm="minmax")
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[cb])
    record = load(tmp_path / "fit.txt")
    assert list(record.layers) == ["c1", "dw", "sep/depthwise", "sep/pointwise", "c2", "fc"]
    _check_conv_entries(record, ("c1", "dw", "c2", "sep/pointwise"))
    assert len(record.layers["sep/depthwise"].scale_w) == 8  # C * M
    # simulate quantizes the convs: the error is the quantization's, not zero
    test = samples(128, seed=2)
    ref = model.predict(test, verbose=0)
    sim = simulate(model, record).predict(test, verbose=0)
    assert 25.0 <= snr_db(ref, sim) < 80.0
    convs_only = record.layers.copy()
    del convs_only["fc"]
    record.layers = convs_only  # the convs alone already move the output
    assert snr_db(ref, simulate(model, record).predict(test, verbose=0)) < 80.0


def test_tf_op_keys_and_frozen_graph_with_a_folded_bn(tmp_path):
    """keys="tf_op": a Conv1D is TF's Conv2D op (on inputs expanded to height 1); the frozen
    graph gives it a Const filter [1, k, cin, cout] with the BN folded in, and still computes
    the model."""
    model = conv1d_net(bn=True)
    x = samples(32)
    pb = tmp_path / "g.pb"
    calibrate(model, x, tmp_path / "r.txt", algorithm="minmax", keys="tf_op", frozen_graph_path=pb)
    record = load(tmp_path / "r.txt")
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(pb.read_bytes())
    nodes = {n.name: n for n in graph_def.node}
    c2 = next(k for k in record.layers if "/c2_" in k)
    assert nodes[c2].op == "Conv2D"
    assert next(nodes[k].op for k in record.layers if "/dw_" in k) == "DepthwiseConv2dNative"
    node = nodes[nodes[c2].input[1].split(":")[0]]
    while node.op == "Identity":
        node = nodes[node.input[0]]
    assert node.op == "Const"
    filt = tf.make_ndarray(node.attr["value"].tensor)
    bn = model.get_layer("bn")
    gamma, _, _, var = (np.asarray(w) for w in bn.get_weights())
    folded = model.get_layer("c2").kernel.numpy() * gamma / np.sqrt(var + bn.epsilon)
    np.testing.assert_allclose(filt, folded[None], rtol=1e-6)
    # its scale_w are those of the folded kernel, per output channel (ARQ /127 or /128)
    top, low = filt.max(axis=(0, 1, 2)), filt.min(axis=(0, 1, 2))
    expected = np.where(-low >= top, -low / 128, top / 127)
    np.testing.assert_allclose(record.layers[c2].scale_w, expected, rtol=2e-6)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    inp = next(n.name for n in graph_def.node if n.op == "Placeholder")
    out = graph.get_operations()[-1].outputs[0]
    with tf.compat.v1.Session(graph=graph) as sess:
        y = sess.run(out, {inp + ":0": x})
    np.testing.assert_allclose(y, model.predict(x, verbose=0), rtol=1e-4, atol=1e-5)


def test_qat_trains_the_1d_convs_and_strips_to_the_float_model(tmp_path):
    model = conv1d_net(separable=True)
    x = samples(64)
    target = model.predict(x, verbose=0)
    qat = quantize_aware(model)
    assert {type(qat.get_layer(n)).__name__ for n in ("c1", "dw", "sep", "c2")} == {"QATQuant"}
    qat.compile("adam", "mse")
    qat.fit(x, target, epochs=2, batch_size=16, verbose=0)
    record = qat_record(qat)
    assert list(record.layers) == ["c1", "dw", "sep/depthwise", "sep/pointwise", "c2", "fc"]
    assert all(f.dst_type == "INT8" for f in record.layers.values())
    _check_conv_entries(record, ("c1", "dw", "c2", "sep/pointwise"))
    plain = strip_qat(qat)
    assert [type(plain.get_layer(n)).__name__ for n in ("c1", "dw", "sep")] == [
        "Conv1D",
        "DepthwiseConv1D",
        "SeparableConv1D",
    ]
    # the fake-quantized model and the simulated record agree
    fq = qat.predict(x, verbose=0)
    sim = simulate(plain, record).predict(x, verbose=0)
    assert snr_db(fq, sim) > 40.0


def test_causal_conv1d_is_quantized_in_simulate_and_qat(tmp_path):
    """Conv1D(padding="causal") pads in its call: QAT and simulate recompute it so."""
    keras.utils.set_random_seed(3)
    x = keras.Input((16, 2))
    h = keras.layers.Conv1D(4, 3, padding="causal", name="causal")(x)
    model = keras.Model(x, keras.layers.Dense(2, name="fc")(keras.layers.Flatten()(h)))
    data = np.random.default_rng(0).normal(size=(32, 16, 2)).astype("float32")
    record = calibrate(model, data, tmp_path / "r.txt", algorithm="minmax")
    assert list(record.layers) == ["causal", "fc"]
    assert (
        snr_db(model.predict(data, verbose=0), simulate(model, record).predict(data, verbose=0))
        > 25
    )
    qat = quantize_aware(model)
    np.testing.assert_allclose(  # before training: inputs pass, kernels fake-quantized
        qat.predict(data, verbose=0), model.predict(data, verbose=0), rtol=0.1, atol=0.05
    )


def test_prune_groups_of_the_1d_model():
    """prune-groups follows channels through the 1-D convs (the depthwise conv passes them).
    The graph rules knew Conv1D before issue 33 (this guards it); the MindSpore twin did not
    (tests/mindspore/test_conv1d.py)."""
    found = discover_groups(extract_graph(conv1d_net()))
    members = [sorted(m.name for m in g.producers + g.consumers) for g in found.groups]
    assert ["c1", "c2", "dw"] in members
    assert ["c2", "fc", "gap"] in members


def test_a_layer_with_weights_left_float_is_named(tmp_path, caplog):
    """A Conv3D (no AMCT rule) and a LayerNormalization keep float weights: the calibration
    says so, naming them, and the sidecar keeps one line per layer; QAT says it too."""
    keras.utils.set_random_seed(0)
    x = keras.Input((4, 4, 4, 2), name="vol")
    h = keras.layers.Conv3D(3, 3, name="c3d")(x)
    h = keras.layers.Reshape((8, 3), name="flat")(h)
    h = keras.layers.Conv1D(4, 3, name="c1")(h)
    h = keras.layers.LayerNormalization(name="ln")(h)
    y = keras.layers.Dense(2, name="fc")(keras.layers.Flatten()(h))
    model = keras.Model(x, y)
    data = np.random.default_rng(0).normal(size=(8, 4, 4, 4, 2)).astype("float32")
    with caplog.at_level(logging.WARNING):
        record = calibrate(model, data, tmp_path / "r.txt", algorithm="minmax")
    assert list(record.layers) == ["c1", "fc"]
    text = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "2 layers have weights but no record entry: AMCT and simulate run them in float" in text
    assert "'c3d' (Conv3D: not a quantizable type)" in text
    assert "'ln' (LayerNormalization: not a quantizable type)" in text
    stats = json.loads((tmp_path / "r.txt.calib.json").read_text())
    assert stats["warnings"] == [
        "layer 'c3d' (Conv3D) has weights but no record entry: AMCT and simulate run it in "
        "float (not a quantizable type)",
        "layer 'ln' (LayerNormalization) has weights but no record entry: AMCT and simulate "
        "run it in float (not a quantizable type)",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        quantize_aware(model)
    assert "'c3d' (Conv3D: not a quantizable type)" in caplog.text


def test_skipped_and_folded_layers_are_not_named(tmp_path, caplog):
    """Float by request (skip_layers) or folded (BN into the conv): no warning (a guard
    against a noisy warning, so it passed before the fix too)."""
    model = conv1d_net(bn=True)
    with caplog.at_level(logging.WARNING):
        calibrate(model, samples(16), tmp_path / "r.txt", algorithm="minmax", skip_layers=["dw"])
    assert "no record entry" not in caplog.text
    assert "dw" not in load(tmp_path / "r.txt").layers


@pytest.mark.parametrize("kind", ["LSTM"])
def test_a_recurrent_layer_is_named(tmp_path, caplog, kind):
    x = keras.Input((6, 3))
    h = keras.layers.Conv1D(4, 3, name="c1")(x)
    h = getattr(keras.layers, kind)(5, name="rnn")(h)
    model = keras.Model(x, keras.layers.Dense(2, name="fc")(h))
    data = np.random.default_rng(0).normal(size=(8, 6, 3)).astype("float32")
    with caplog.at_level(logging.WARNING):
        calibrate(model, data, tmp_path / "r.txt", algorithm="minmax")
    assert (
        f"layer 'rnn' ({kind}) has weights but no record entry: AMCT and simulate run it in "
        "float (not a quantizable type)"
    ) in caplog.text
