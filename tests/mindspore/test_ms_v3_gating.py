"""Issue 30, MindSpore: nets written the model-zoo way export to ESP-DL v3.

- squeeze-excite: ``y * hsigmoid(fc2(relu(fc1(ops.mean(y, (2, 3), True)))))``, a Mul of an NCHW
  map (1, C, H, W) by (1, C, 1, 1), the chip's (1, H, W, C) by (1, 1, 1, C);
- a hard sigmoid written by hand, ``ops.relu6(y + 3.0) * (1.0 / 6.0)`` (scalar operands), and
  ``y / 6.0`` (a multiplication by 1 / 6);
- ``ops.mean(y, (2, 3))`` (keep_dims False) before an nn.Dense: the ``.espdl`` output has the
  network's shape (N, 10), not (1, 1, 1, 10).

Each net is calibrated by MindSpore, exported for esp32s3 and esp32p4 at s8 and s16, the written
file passes ``espdl-run --check``, and at s16 the simulated chip follows the net's own float
output within 1 % of its range. Each has a Keras twin (same weights, converted independently in
twin_weights.py; raw ops renamed as the MindSpore graph names them) calibrated by Keras: both
exports of that record hold the same integers.
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

L = keras.layers


class SqueezeExcite(nn.Cell):
    """conv-relu, then MobileNetV3's SE block as the MindSpore model zoo writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        self.relu = nn.ReLU()
        self.fc1 = nn.Conv2d(8, 4, 1, has_bias=True)
        self.relu2 = nn.ReLU()
        self.fc2 = nn.Conv2d(4, 8, 1, has_bias=True)
        self.hsig = nn.HSigmoid()
        self.head = nn.Conv2d(8, 4, 1, has_bias=True)

    def construct(self, x):
        y = self.relu(self.conv(x))
        s = self.hsig(self.fc2(self.relu2(self.fc1(ops.mean(y, (2, 3), True)))))
        return self.head(y * s)


def _se_twin() -> keras.Model:
    x = keras.Input((8, 8, 3), name="input0")
    y = L.ReLU(name="relu")(L.Conv2D(8, 3, padding="same", name="conv")(x))
    s = L.GlobalAveragePooling2D(keepdims=True, name="reducemean_op0")(y)
    s = L.ReLU(name="relu2")(L.Conv2D(4, 1, name="fc1")(s))
    s = L.Activation("hard_sigmoid", name="hsig")(L.Conv2D(8, 1, name="fc2")(s))
    y = L.Multiply(name="mul_op0")([y, s])
    return keras.Model(x, L.Conv2D(4, 1, name="head")(y))


class HardSigmoid(nn.Cell):
    """``relu6(y + 3) * (1 / 6)`` (MobileNetV3's hard sigmoid by hand), then ``(3.0 - z) / 6``:
    scalars on either side, and a division by a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, pad_mode="pad", padding=1, has_bias=True)
        self.head = nn.Conv2d(6, 4, 1, has_bias=True)

    def construct(self, x):
        y = self.conv(x) * 4.0
        z = ops.relu6(y + 3.0) * (1.0 / 6.0)
        return self.head((3.0 - z) / 6.0)


def _hard_sigmoid_twin() -> keras.Model:
    x = keras.Input((8, 8, 3), name="input0")
    y = L.Conv2D(6, 3, padding="same", name="conv")(x) * 4.0
    z = L.ReLU(6.0, name="relu6_op0")(y + 3.0) * (1.0 / 6.0)
    model = keras.Model(x, L.Conv2D(4, 1, name="head")((3.0 - z) * (1.0 / 6.0)))
    # MindSpore names the raw ops per primitive (Muls, Add, Sub, Divs), in call order
    rename_ops(model, ["muls_op0", "add_op0", "muls_op1", "sub_op0", "divs_op0"])
    return model


class MeanDense(nn.Cell):
    """conv-relu, ``ops.mean`` over H, W (keep_dims False: (N, C)), nn.Dense."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        self.relu = nn.ReLU()
        self.fc = nn.Dense(8, 10)

    def construct(self, x):
        return self.fc(ops.mean(self.relu(self.conv(x)), (2, 3)))


def _mean_dense_twin() -> keras.Model:
    x = keras.Input((8, 8, 3), name="input0")
    y = L.ReLU(name="relu")(L.Conv2D(8, 3, padding="same", name="conv")(x))
    y = L.GlobalAveragePooling2D(name="reducemean_op0")(y)  # keepdims False
    return keras.Model(x, L.Dense(10, name="fc")(y))


NETS = {
    "squeeze_excite": (SqueezeExcite, _se_twin),
    "hard_sigmoid": (HardSigmoid, _hard_sigmoid_twin),
    "mean_dense": (MeanDense, _mean_dense_twin),
}


def _net(name: str) -> nn.Cell:
    ms.set_seed(3)
    net = NETS[name][0]()
    net.set_train(False)
    return net


def squeeze_excite() -> nn.Cell:
    """The SE net (``--mindspore test_ms_v3_gating.py:squeeze_excite``)."""
    return _net("squeeze_excite")


@pytest.fixture(scope="module", params=list(NETS))
def calibrated(request, tmp_path_factory):
    """(name, net, x NCHW, MindSpore's own record) per net."""
    net = _net(request.param)
    x = np.random.default_rng(0).uniform(-1, 1, (16, 3, 8, 8)).astype(np.float32)
    record = tmp_path_factory.mktemp(request.param) / "record.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    return request.param, net, x, record


@pytest.mark.parametrize(("target", "feature_type"), COMBOS)
def test_exports_checks_and_follows_the_net(calibrated, tmp_path, target, feature_type):
    name, net, x, record = calibrated
    out = tmp_path / f"{name}.espdl"
    res, model = export_checked(net, record, out, x, target, feature_type)
    assert {r.status for r in res.layers} <= {"exported", "fused"}, res.skipped
    want_shape = list(net(ms.Tensor(x[:1])).shape)
    if len(want_shape) == 4:  # NCHW -> the chip's NHWC
        want_shape = [want_shape[0], *want_shape[2:], want_shape[1]]
    assert [list(v.shape) for v in model.outputs] == [want_shape]
    ops_written = {n.op_type for n in model.nodes}
    if name == "squeeze_excite":
        mul = next(n for n in model.nodes if n.name == "mul_op0")
        assert mul.op_type == "Mul"
        assert [model.value(t).shape for t in mul.inputs] == [[1, 8, 8, 8], [1, 1, 1, 8]]
    if name == "hard_sigmoid":
        assert {"Add", "Clip", "Mul", "Sub"} <= ops_written
    if name == "mean_dense":
        assert {"GlobalAveragePool", "Flatten", "Gemm"} <= ops_written
    if feature_type == "s16":
        err, span = chip_error(model, net, x, target)
        assert err <= 0.01 * span, (err, span)


@pytest.mark.parametrize("name", list(NETS))
def test_keras_twin_exports_equal_integers(name, tmp_path):
    net = _net(name)
    model = NETS[name][1]()
    copy_weights(model, net)
    x = np.random.default_rng(1).uniform(-1, 1, (16, 8, 8, 3)).astype(np.float32)
    nchw = x.transpose(0, 3, 1, 2)
    want = net(ms.Tensor(nchw)).asnumpy()
    got = model.predict(x, verbose=0)
    np.testing.assert_allclose(got if got.ndim == 2 else got.transpose(0, 3, 1, 2), want, atol=1e-5)
    record = tmp_path / "record.txt"
    akeras.calibrate(model, x, record, algorithm="minmax")
    twin_exports_equal(model, net, record, tmp_path, x, nchw, (1, 3, 8, 8))
