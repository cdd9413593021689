"""Issue 30, MindSpore: activations and element-wise ops the ESP-DL v3 export lowers, with a
Keras twin.

The net: two convs ``a``, ``b``; ``nn.ELU()(ops.maximum(a, b))`` and the exact
``nn.GELU(approximate=False)(ops.minimum(a, b))``, concatenated; bilinear upsampling by
``nn.Upsample(size=..., mode="bilinear", align_corners=False)`` and by
``ops.interpolate(scale_factor=2.0, mode="bilinear")`` (half-pixel centres, TF's bilinear);
a 1x1 conv. Its Keras twin: ``Maximum`` / ``Minimum`` / ``ELU`` / ``Activation("gelu")`` /
``UpSampling2D(interpolation="bilinear")``, weights converted in twin_weights.py.

- Calibrated by MindSpore, exported for esp32s3 and esp32p4 at s8 and s16; the written file
  passes ``espdl-run --check``; at s16 the simulated chip follows the net's float output within
  1 % of its range.
- Both exports of one record (the twin's) hold the same integers.
- ``nn.GELU()`` (MindSpore's default, the tanh approximation) has no Keras layer twin (Keras'
  ``"gelu"`` is the exact one): its own table, checked against MindSpore's float output.
- Functional math (:class:`Maths`): ``ops.sqrt`` / ``exp`` / ``log`` / ``-x`` / ``ops.pow`` /
  ``x / y``, ``ops.amax`` / ``amin`` / ``sum`` over axes (NCHW axes, the chip's NHWC ones), the
  core's Sqrt / Exp / Log / Neg / Pow / Div / Reduce* nodes; its keras.ops twin exports the same
  integers.
- nn.Embedding of integer tokens (a LUT per feature), with its Keras twin; ``ops.mean`` over
  the channel axis (the chip's last: a ReduceMean over axis 3).
"""

from __future__ import annotations

import keras
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops
from ms_v3_helpers import (
    COMBOS,
    chip_error,
    export_checked,
    rename_ops,
    twin_exports_equal,
)
from twin_weights import copy_weights

import amct_bridge.keras as akeras
import amct_bridge.mindspore as ams
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl

L = keras.layers


class Acts(nn.Cell):
    """Module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, pad_mode="same", has_bias=True)
        self.b = nn.Conv2d(3, 4, 3, pad_mode="same", has_bias=True)
        self.elu = nn.ELU()
        self.gelu = nn.GELU(approximate=False)
        self.up = nn.Upsample(size=(12, 12), mode="bilinear", align_corners=False)
        self.head = nn.Conv2d(8, 3, 1, has_bias=True)

    def construct(self, x):
        a, b = self.a(x), self.b(x)
        y = ops.concat((self.elu(ops.maximum(a, b)), self.gelu(ops.minimum(a, b))), 1)
        y = ops.interpolate(self.up(y), scale_factor=2.0, mode="bilinear",
                            recompute_scale_factor=True)  # fmt: skip
        return self.head(y)


def _twin() -> keras.Model:
    x = keras.Input((6, 6, 3), name="input0")
    a = L.Conv2D(4, 3, padding="same", name="a")(x)
    b = L.Conv2D(4, 3, padding="same", name="b")(x)
    e = L.ELU(name="elu")(L.Maximum(name="maximum_op0")([a, b]))
    g = L.Activation("gelu", name="gelu")(L.Minimum(name="minimum_op0")([a, b]))
    y = L.Concatenate(name="concat_op0")([e, g])
    # MindIR scopes both resize primitives under no cell: functional ops by the graph's names
    y = L.UpSampling2D(2, interpolation="bilinear", name="resizebilinearv2_op0")(y)
    y = L.UpSampling2D(2, interpolation="bilinear", name="resizebilinearv2_op1")(y)
    return keras.Model(x, L.Conv2D(3, 1, name="head")(y))


def _net() -> Acts:
    ms.set_seed(8)
    net = Acts()
    net.set_train(False)
    return net


def _x(n: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.5, 1.5, (n, 3, 6, 6)).astype(np.float32)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    net = _net()
    record = tmp_path_factory.mktemp("acts") / "record.txt"
    ams.calibrate(net, _x(), record, algorithm="minmax")
    return net, record


@pytest.mark.parametrize(("target", "feature_type"), COMBOS)
def test_activations_export_and_follow_the_net(calibrated, tmp_path, target, feature_type):
    net, record = calibrated
    x = _x()
    res, model = export_checked(net, record, tmp_path / "m.espdl", x, target, feature_type)
    assert {r.status for r in res.layers} <= {"exported", "fused"}, res.layers
    kinds = {r.name: r.kind for r in res.layers}
    assert kinds["elu"] == "ELU" and kinds["maximum_op0"] == "Maximum"
    assert kinds["resizebilinearv2_op0"] == kinds["resizebilinearv2_op1"] == "UpSampling2D"
    written = {n.op_type for n in model.nodes}
    assert {"ReduceMax", "ReduceMin"} <= written
    if feature_type == "s16":
        err, span = chip_error(model, net, x, target)
        assert err <= 0.01 * span, (err, span)


def test_keras_twin_exports_equal_integers(tmp_path):
    net = _net()
    model = _twin()
    copy_weights(model, net)
    x = _x(seed=1).transpose(0, 2, 3, 1)
    nchw = x.transpose(0, 3, 1, 2)
    want = net(ms.Tensor(nchw)).asnumpy()
    np.testing.assert_allclose(model.predict(x, verbose=0).transpose(0, 3, 1, 2), want, atol=1e-5)
    record = tmp_path / "record.txt"
    akeras.calibrate(model, x, record, algorithm="minmax")
    twin_exports_equal(model, net, record, tmp_path, x, nchw, (1, 3, 6, 6))


class TanhGelu(nn.Cell):
    """conv, ``nn.GELU()`` (the tanh approximation, MindSpore's default), 1x1 conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, pad_mode="same", has_bias=True)
        self.gelu = nn.GELU()
        self.head = nn.Conv2d(6, 3, 1, has_bias=True)

    def construct(self, x):
        return self.head(self.gelu(self.conv(x)))


def test_tanh_gelu_cell_exports_its_own_table(tmp_path):
    ms.set_seed(9)
    net = TanhGelu()
    net.set_train(False)
    x = _x()
    record = tmp_path / "record.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    for target, feature_type in COMBOS:
        out = tmp_path / f"{target}_{feature_type}.espdl"
        res, model = export_checked(net, record, out, x, target, feature_type)
        assert {r.name: r.status for r in res.layers}["gelu"] == "exported"
        if feature_type == "s16":
            assert "gelu" in {n.name for n in model.nodes if n.op_type == "LUT"}
            err, span = chip_error(model, net, x, target)
            assert err <= 0.01 * span, (err, span)


class Maths(nn.Cell):
    """``ops.sqrt`` / ``exp`` / ``log`` / ``-x`` / ``ops.pow`` / a division of two tensors,
    ``ops.amax`` / ``amin`` over the channel axis, ``ops.sum`` over H and W, nn.Dense."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="same", has_bias=True)
        self.fc = nn.Dense(4, 3)

    def construct(self, x):
        y = self.conv(x)
        b = ops.exp(-y)
        a = ops.sqrt(ops.relu(y) + b)
        c = ops.log(a + 1.0)  # the tables in one order (their initializers are numbered)
        d = ops.pow(y, 2.0) / (a + b)
        m = ops.amax(d, 1, keepdims=True) - ops.amin(c, 1, keepdims=True)
        s = ops.sum(m * y, (2, 3))
        return self.fc(s + ops.mean(b, (2, 3)))


def _maths_twin() -> keras.Model:
    """Maths with keras.ops on NHWC (the reductions over the last axis / axes 1, 2)."""
    x = keras.Input((6, 6, 3), name="input0")
    y = L.Conv2D(4, 3, padding="same", name="conv")(x)
    b = keras.ops.exp(-y)
    a = keras.ops.sqrt(L.ReLU(name="relu_op0")(y) + b)
    c = keras.ops.log(a + 1.0)
    d = keras.ops.power(y, 2.0) / (a + b)
    mx = keras.ops.max(d, axis=-1, keepdims=True)
    m = mx - keras.ops.min(c, axis=-1, keepdims=True)
    s = keras.ops.sum(m * y, axis=(1, 2))
    y = L.Dense(3, name="fc")(s + L.GlobalAveragePooling2D(name="reducemean_op0")(b))
    model = keras.Model(x, y)
    # the raw ops in Keras' order, named as the MindSpore graph names them
    names = ["neg_op0", "exp_op0", "add_op0", "sqrt_op0", "pow_op0", "add_op1", "add_op2",
             "div_op0", "log_op0", "reducemax_op0", "reducemin_op0", "sub_op0", "mul_op0",
             "sumext_op0", "add_op3"]  # fmt: skip
    rename_ops(model, names)
    return model


def _maths() -> tuple[Maths, keras.Model, np.ndarray, np.ndarray]:
    """(net, its Keras twin, NHWC data, the same NCHW)."""
    ms.set_seed(10)
    net = Maths()
    net.set_train(False)
    model = _maths_twin()
    copy_weights(model, net)
    x = np.random.default_rng(2).uniform(-1, 1, (16, 6, 6, 3)).astype(np.float32)
    return net, model, x, x.transpose(0, 3, 1, 2)


def test_math_ops_keras_twin_exports_equal_integers(tmp_path):
    net, model, x, nchw = _maths()
    want = net(ms.Tensor(nchw)).asnumpy()
    np.testing.assert_allclose(model.predict(x, verbose=0), want, rtol=1e-5, atol=1e-5)
    record = tmp_path / "record.txt"
    akeras.calibrate(model, x, record, algorithm="minmax")
    m_out = twin_exports_equal(model, net, record, tmp_path, x, nchw, (1, 3, 6, 6))
    written = {n.op_type for n in read_espdl(m_out).nodes}
    assert {"Sqrt", "Exp", "Log", "Neg", "Pow", "Div", "ReduceMax", "ReduceMin",
            "ReduceSum"} <= written  # fmt: skip


@pytest.mark.parametrize("calibration", ["keras", "mindspore"])
def test_math_ops_export_and_follow_the_net(tmp_path, calibration):
    """With either calibration the chip follows MindSpore's float output within 1 % at s16.
    Keras observes every raw op; MindSpore's calibration a functional op only where a cell
    reads or writes its tensor (``relu(y) + b`` before ``ops.sqrt`` has none): the export
    takes those exponents from bounds (measured here: 0.6 % of the range)."""
    net, model, x, nchw = _maths()
    record = tmp_path / "record.txt"
    if calibration == "keras":
        akeras.calibrate(model, x, record, algorithm="minmax")
    else:
        ams.calibrate(net, nchw, record, algorithm="minmax")
    for target, feature_type in COMBOS:
        out = tmp_path / f"{target}_{feature_type}.espdl"
        res, written = export_checked(net, record, out, nchw, target, feature_type)
        assert {r.status for r in res.layers} <= {"exported", "fused"}, res.layers
        if feature_type == "s16":
            err, span = chip_error(written, net, nchw, target)
            assert err <= 0.01 * span, (err, span)


class Tokens(nn.Cell):
    """nn.Embedding(20, 8) of (N, 6) integer tokens, the mean over the tokens, nn.Dense(4)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.fc = nn.Dense(8, 4)

    def construct(self, t):
        return self.fc(ops.mean(self.emb(t), 1))


def test_embedding_looks_the_table_up_and_has_a_keras_twin(tmp_path):
    """nn.Embedding is the core's Embedding (a LUT per feature on the integer input: the
    runtime's Gather takes constant indices only); MindSpore's calibration observes its input
    (the model input). The chip follows the net at s16 within 1 %, and the Keras twin's export
    holds the same integers."""
    ms.set_seed(11)
    net = Tokens()
    net.set_train(False)
    tokens = np.random.default_rng(3).integers(0, 20, (24, 6)).astype(np.int32)
    record = tmp_path / "record.txt"
    ams.calibrate(net, tokens, record, algorithm="minmax")
    want = net(ms.Tensor(tokens)).asnumpy()
    for target, feature_type in COMBOS:
        out = tmp_path / f"{target}_{feature_type}.espdl"
        res, model = export_checked(net, record, out, tokens, target, feature_type)
        assert {r.name: r.status for r in res.layers}["emb"] == "exported"
        assert "Gather" not in {n.op_type for n in model.nodes}
        if feature_type == "s16":
            info, head = model.inputs[0], model.outputs[0]
            q = (tokens * 2.0**-info.exponent).astype(np.int16)  # the index · 2^k
            chip = simulate_espdl(model, q, target).outputs[head.name] * 2.0**head.exponent
            assert np.abs(chip - want).max() <= 0.01 * np.ptp(want)
    t = keras.Input((6,), dtype="int32", name="input0")
    e = L.Embedding(20, 8, name="emb")(t)
    y = L.Dense(4, name="fc")(L.GlobalAveragePooling1D(name="reducemean_op0")(e))
    twin = keras.Model(t, y)
    twin.get_layer("emb").set_weights([net.emb.embedding_table.asnumpy()])
    twin.get_layer("fc").set_weights([net.fc.weight.asnumpy().T, net.fc.bias.asnumpy()])
    np.testing.assert_allclose(twin.predict(tokens, verbose=0), want, atol=1e-5)
    akeras.calibrate(twin, tokens, tmp_path / "k.txt", algorithm="minmax")
    twin_exports_equal(twin, net, tmp_path / "k.txt", tmp_path, tokens, tokens, tokens[:1])


class ChannelMean(nn.Cell):
    """conv, ``ops.mean`` over the channel axis (keep_dims: (N, 1, H, W)) times the map, 1x1."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, pad_mode="same", has_bias=True)
        self.head = nn.Conv2d(6, 3, 1, has_bias=True)

    def construct(self, x):
        y = self.conv(x)
        return self.head(y * ops.mean(y, 1, keep_dims=True))


def test_mean_over_the_channel_axis_is_a_reduce_mean_over_the_chips_last_axis(tmp_path):
    ms.set_seed(12)
    net = ChannelMean()
    net.set_train(False)
    x = _x()
    record = tmp_path / "record.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    for target, feature_type in COMBOS:
        out = tmp_path / f"{target}_{feature_type}.espdl"
        res, model = export_checked(net, record, out, x, target, feature_type)
        (node,) = [n for n in model.nodes if n.op_type == "ReduceMean"]
        assert model.initializers[node.inputs[1]].data.tolist() == [3]  # NCHW axis 1: C last
        if feature_type == "s16":
            err, span = chip_error(model, net, x, target)
            assert err <= 0.01 * span, (err, span)
