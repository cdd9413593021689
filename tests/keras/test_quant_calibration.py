"""QuantCalibration on real Keras models: minmax factors against numpy on extracted activations."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from calib_models import (
    bn_fold,
    branchy_model,
    images,
    nested_model,
    randomize_bn,
    ref_act_factors,
    ref_arq,
    sequential_model,
)

from amct_bridge.keras import QuantCalibration
from amct_bridge.records import load, validate
from amct_bridge.records.calibration import load_stats, sidecar_path


def _features(model, tensors, x):
    outs = keras.Model(model.inputs, tensors).predict(x, batch_size=16, verbose=0)
    return outs if isinstance(outs, list) else [outs]


def _assert_act(factors, data):
    scale, offset = ref_act_factors(np.min(data), np.max(data))
    assert factors.scale_d == pytest.approx(scale, rel=1e-6)
    assert factors.offset_d == offset


def _assert_w(factors, expected):
    np.testing.assert_allclose(factors.scale_w, expected, rtol=2e-6)
    assert factors.offset_w == [0] * len(expected)


def test_sequential_minmax_matches_numpy(tmp_path):
    model, x = sequential_model(), images()
    path = tmp_path / "record.txt"
    model.predict(
        x, batch_size=16, verbose=0, callbacks=[QuantCalibration(path, algorithm="minmax")]
    )
    record = load(path)
    assert list(record.layers) == ["c1", "ap", "fc"]
    assert validate(record) == []
    c1_in, ap_in, fc_in, r1_out, bn1_out = _features(
        model,
        [model.get_layer(n).input for n in ("c1", "ap", "fc")]
        + [model.get_layer(n).output for n in ("r1", "bn1")],
        x,
    )
    _assert_act(record.layers["c1"], c1_in)
    _assert_act(record.layers["ap"], ap_in)
    _assert_act(record.layers["fc"], fc_in)
    c1, bn1 = model.get_layer("c1"), model.get_layer("bn1")
    _assert_w(record.layers["c1"], ref_arq(bn_fold(c1.kernel, bn1), 3))
    _assert_w(record.layers["fc"], ref_arq(model.get_layer("fc").kernel))
    assert record.layers["ap"].scale_w == []
    stats = load_stats(sidecar_path(path))
    assert stats.algorithm == "minmax" and stats.batches == 3
    assert list(stats.layers) == ["c1", "bn1", "r1", "ap", "fc"]
    assert stats.layers["r1"].output.max == pytest.approx(float(r1_out.max()))
    assert stats.layers["r1"].output.min == pytest.approx(float(r1_out.min()))
    assert stats.layers["c1"].input.observed_max == pytest.approx(float(x.max()))
    # c1's BN is folded: its output is what the folded conv computes, the BN output
    assert stats.layers["c1"].output.max == pytest.approx(float(bn1_out.max()), rel=1e-6)
    assert stats.layers["c1"].output.min == pytest.approx(float(bn1_out.min()), rel=1e-6)
    assert stats.layers["bn1"].output == stats.layers["c1"].output


def test_branches_separable_transpose_shared(tmp_path, branchy):
    model, x = branchy
    path = tmp_path / "record.txt"
    model.evaluate(
        x,
        np.zeros((len(x), 4)),
        batch_size=8,
        verbose=0,
        callbacks=[QuantCalibration(path, algorithm="minmax")],
    )
    record = load(path)
    keys = ["ca", "dw", "pw", "sep/depthwise", "sep/pointwise", "tr", "ap", "shared"]
    assert sorted(record.layers) == sorted(keys)
    g = model.get_layer
    add_out, bn_dw_out, act_out, tr_out, gap_out = _features(
        model,
        [g("add").output, g("bn_dw").output, g("act").output, g("tr").output, g("gap").output],
        x,
    )
    sep = g("sep")
    mid = tf.nn.depthwise_conv2d(add_out, sep.depthwise_kernel, (1, 1, 1, 1), "SAME").numpy()
    shared = g("shared")
    w, b = shared.kernel.numpy(), shared.bias.numpy()
    _assert_act(record.layers["ca"], x)
    _assert_act(record.layers["dw"], x)
    _assert_act(record.layers["pw"], bn_dw_out)
    _assert_act(record.layers["sep/depthwise"], add_out)
    _assert_act(record.layers["sep/pointwise"], mid)
    _assert_act(record.layers["tr"], act_out)
    _assert_act(record.layers["ap"], tr_out)
    _assert_act(
        record.layers["shared"], np.concatenate([gap_out.ravel(), (gap_out @ w + b).ravel()])
    )
    dw_kernel = bn_fold(g("dw").kernel, g("bn_dw"), out_shape=(4, 1))
    _assert_w(record.layers["dw"], ref_arq(dw_kernel.reshape(3, 3, 4), 2))
    _assert_w(record.layers["ca"], ref_arq(g("ca").kernel, 3))
    _assert_w(
        record.layers["sep/depthwise"], ref_arq(np.reshape(sep.depthwise_kernel, (3, 3, 6)), 2)
    )
    _assert_w(
        record.layers["sep/pointwise"], ref_arq(bn_fold(sep.pointwise_kernel, g("bn_sep")), 3)
    )
    _assert_w(record.layers["tr"], ref_arq(g("tr").kernel, 2))
    _assert_w(record.layers["shared"], ref_arq(w))
    stats = load_stats(sidecar_path(path))
    assert stats.layers["sep/depthwise"].output.max == pytest.approx(float(mid.max()), rel=1e-6)
    assert stats.layers["act"].kind == "Activation"


def test_nested_model_keys_and_ranges(tmp_path):
    model = nested_model()
    x = np.random.default_rng(0).normal(size=(32, 8, 8, 3)).astype("float32")
    path = tmp_path / "record.txt"
    model.predict(
        x, batch_size=16, verbose=0, callbacks=[QuantCalibration(path, algorithm="minmax")]
    )
    record = load(path)
    assert list(record.layers) == ["stem", "block/ic", "head"]
    inner = model.get_layer("block")
    (ic_in,) = _features(model, [model.get_layer("stem").output], x)  # the block's input
    _assert_act(record.layers["block/ic"], ic_in)
    folded = bn_fold(inner.get_layer("ic").kernel, inner.get_layer("ibn"))
    _assert_w(record.layers["block/ic"], ref_arq(folded, 3))
    stats = load_stats(sidecar_path(path))
    assert "block/ir" in stats.layers


def test_mobilenet_v2_every_conv_folded_and_keyed(tmp_path, mobilenet):
    model, x = mobilenet
    path = tmp_path / "record.txt"
    model.predict(
        x, batch_size=4, verbose=0, callbacks=[QuantCalibration(path, algorithm="minmax")]
    )
    record = load(path)
    convs = [
        lay for lay in model.layers if type(lay).__name__ in ("Conv2D", "DepthwiseConv2D", "Dense")
    ]
    assert sorted(record.layers) == sorted(lay.name for lay in convs)
    assert validate(record) == []
    ins = _features(model, [lay.input for lay in convs], x)
    for layer, act in zip(convs, ins, strict=True):
        _assert_act(record.layers[layer.name], act)
    # a BN follows every conv of MobileNetV2: the record must describe the folded kernels
    bn = model.get_layer("block_3_depthwise_BN")
    dw = model.get_layer("block_3_depthwise")
    c = dw.kernel.shape[2]
    expected = ref_arq(bn_fold(dw.kernel, bn, out_shape=(c, 1)).reshape(3, 3, c), 2)
    _assert_w(record.layers["block_3_depthwise"], expected)


@pytest.fixture
def branchy():

    model = branchy_model()
    model.compile(loss="mse")
    x = np.random.default_rng(3).normal(size=(24, 10, 10, 4)).astype("float32")
    return model, x


@pytest.fixture(scope="module")
def mobilenet():
    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(
        input_shape=(96, 96, 3), alpha=0.35, weights=None, classes=10
    )

    randomize_bn(model)
    x = np.random.default_rng(1).uniform(-1, 1, size=(8, 96, 96, 3)).astype("float32")
    return model, x


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__(name="net")
        self.conv = keras.layers.Conv2D(4, 3, name="c")
        self.relu = keras.layers.ReLU(name="r")
        self.dense = keras.layers.Dense(2, name="d")

    def call(self, x):
        return self.dense(keras.ops.mean(self.relu(self.conv(x)), axis=(1, 2)))


def test_subclassed_model_without_call_graph(tmp_path):
    model = _Subclassed()
    x = np.random.default_rng(2).uniform(-1, 2, (16, 8, 8, 3)).astype("float32")
    model(x)
    path = tmp_path / "r.txt"
    model.predict(
        x, batch_size=8, verbose=0, callbacks=[QuantCalibration(path, algorithm="minmax")]
    )
    record = load(path)
    assert list(record.layers) == ["c", "d"]
    _assert_act(record.layers["c"], x)
    _assert_w(record.layers["c"], ref_arq(model.conv.kernel, 3))
    assert load_stats(sidecar_path(path)).layers["r"].output.min == 0.0
