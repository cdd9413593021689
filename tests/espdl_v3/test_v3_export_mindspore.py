"""ESP-DL v3 export of MindSpore networks (issue 22 §2), and a Keras twin giving equal integers.

The MindSpore net and its Keras twin carry the same weights (converted with explicit loops in
tests/mindspore/twin_weights.py, independently of the adapters) and the same layer names.
Calibrated once with the Keras callback, the record and sidecar serve both exports, so the two
``.espdl`` files must hold the same integers: filters, biases, exponents and, for the same
input, the same test outputs. The MindSpore export's simulated chip output then follows the
MindSpore net's own float output.
"""

from __future__ import annotations

import keras
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops
from twin_weights import copy_weights

import amct_bridge.keras as akeras
import amct_bridge.mindspore as ams
from amct_bridge.errors import ExportError
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl

BN_EPS = 1e-5  # MindSpore's default; the Keras twin uses it too


class Net(nn.Cell):
    """conv-bn-relu, 1x1 conv + Sigmoid gating (functional multiply), max pool, Tanh, Flatten,
    Dense, Softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, pad_mode="pad", padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pw = nn.Conv2d(8, 8, 1, has_bias=True)
        self.sig = nn.Sigmoid()
        self.mp = nn.MaxPool2d(2, 2)
        self.tanh = nn.Tanh()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(8 * 4 * 4, 5)
        self.sm = nn.Softmax()

    def construct(self, x):
        y = self.relu(self.bn(self.conv(x)))
        y = y * self.sig(self.pw(y))
        y = self.tanh(self.mp(y))
        return self.sm(self.fc(self.flatten(y)))


def _keras_twin() -> keras.Model:
    L = keras.layers
    x = keras.Input((8, 8, 3), name="input0")
    y = L.Conv2D(8, 3, padding="same", use_bias=False, name="conv")(x)
    y = L.BatchNormalization(epsilon=BN_EPS, name="bn")(y)
    y = L.ReLU(name="relu")(y)
    g = L.Conv2D(8, 1, name="pw")(y)
    g = L.Activation("sigmoid", name="sig")(g)
    y = L.Multiply(name="mul_op0")([y, g])
    y = L.MaxPooling2D(2, name="mp")(y)
    y = L.Activation("tanh", name="tanh")(y)
    y = L.Flatten(name="flatten")(y)
    y = L.Dense(5, name="fc")(y)
    return keras.Model(x, L.Softmax(name="sm")(y))


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    ms.set_seed(0)
    net = Net()
    rng = np.random.default_rng(0)
    for name in ("moving_mean", "moving_variance", "gamma", "beta"):
        param = getattr(net.bn, name)
        low = 0.5 if name in ("moving_variance", "gamma") else -0.3
        param.set_data(ms.Tensor(rng.uniform(low, low + 1.0, 8).astype(np.float32)))
    net.set_train(False)
    model = _keras_twin()
    copy_weights(model, net, flatten_chw=("fc", 8, 16))  # fc reads an NCHW Flatten
    x = rng.uniform(0, 1, (16, 8, 8, 3)).astype(np.float32)
    nchw = x.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(
        net(ms.Tensor(nchw)).asnumpy(), model.predict(x, verbose=0), atol=1e-5
    )  # the same float function
    record = tmp_path_factory.mktemp("twin") / "record.txt"
    akeras.calibrate(model, x, record, algorithm="minmax")
    return net, model, x, record


@pytest.mark.parametrize(("target", "feature_type"), [("esp32s3", "s8"), ("esp32p4", "s16")])
def test_mindspore_twin_gives_the_keras_integers(twins, tmp_path, target, feature_type):
    net, model, x, record = twins
    options = {"format": "espdl", "target": target, "feature_type": feature_type}
    k_out, m_out = tmp_path / "keras.espdl", tmp_path / "ms.espdl"
    akeras.export_espdl(model, record, k_out, test_input=x[:1], **options)
    res = ams.export_espdl(
        net,
        record,
        m_out,
        sample_input=(1, 3, 8, 8),
        test_input=x[:1].transpose(0, 3, 1, 2),
        **options,
    )
    assert {r.status for r in res.layers} <= {"exported", "fused"}
    k, m = read_espdl(k_out), read_espdl(m_out)
    assert [n.op_type for n in k.nodes] == [n.op_type for n in m.nodes]
    assert [n.name for n in k.nodes] == [n.name for n in m.nodes]
    assert k.initializers.keys() == m.initializers.keys()
    for name, tensor in k.initializers.items():
        np.testing.assert_array_equal(tensor.data, m.initializers[name].data, err_msg=name)
        assert tensor.exponents == m.initializers[name].exponents, name
    assert [(v.name, v.exponents) for v in k.value_info] == [
        (v.name, v.exponents) for v in m.value_info
    ]
    np.testing.assert_array_equal(k.test_inputs[0].data, m.test_inputs[0].data)
    np.testing.assert_array_equal(k.test_outputs[0].data, m.test_outputs[0].data)
    # the chip follows the MindSpore float net (softmax probabilities, range 1)
    step = 2.0 ** m.inputs[0].exponent
    bits = 8 if feature_type == "s8" else 16
    q = np.clip(np.round(x / step), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    chip = simulate_espdl(m, q.astype(np.int8 if bits == 8 else np.int16)).outputs["sm"]
    want = net(ms.Tensor((q * step).astype(np.float32).transpose(0, 3, 1, 2))).asnumpy()
    assert np.abs(chip - want).max() <= (0.06 if bits == 8 else 0.01)


def test_mindspore_bad_input(twins, tmp_path):
    net, _, _, record = twins
    out = tmp_path / "m.espdl"
    with pytest.raises(ExportError, match="target 'esp32-s3'"):
        ams.export_espdl(
            net, record, out, sample_input=(1, 3, 8, 8), format="espdl", target="esp32-s3"
        )
    assert not out.exists()


class Net2(nn.Cell):
    """conv-bn-ReLU6, depthwise + LeakyReLU, residual add, HSwish and a 1x1 conv + SiLU
    concatenated on channels, average pool, global average pool, Flatten, Dense."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, pad_mode="pad", padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu6 = nn.ReLU6()
        self.dw = nn.Conv2d(8, 8, 3, group=8, pad_mode="pad", padding=1, has_bias=True)
        self.lrelu = nn.LeakyReLU(0.1)
        self.side = nn.Conv2d(8, 4, 1, has_bias=True)
        self.silu = nn.SiLU()
        self.hswish = nn.HSwish()
        self.ap = nn.AvgPool2d(2, 2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(12, 5)

    def construct(self, x):
        y = self.relu6(self.bn(self.conv(x)))
        y = y + self.lrelu(self.dw(y))
        c = ops.concat((self.hswish(y), self.silu(self.side(y))), 1)
        return self.fc(self.flatten(self.gap(self.ap(c))))


def _keras_twin2(net: Net2) -> keras.Model:
    L = keras.layers
    x = keras.Input((8, 8, 3), name="input0")
    y = L.Conv2D(8, 3, padding="same", use_bias=False, name="conv")(x)
    y = L.BatchNormalization(epsilon=BN_EPS, name="bn")(y)
    y = L.ReLU(6.0, name="relu6")(y)
    z = L.DepthwiseConv2D(3, padding="same", name="dw")(y)
    z = L.LeakyReLU(0.1, name="lrelu")(z)
    y = L.Add(name="add_op0")([y, z])
    h = L.Activation("hard_silu", name="hswish")(y)
    s = L.Activation("silu", name="silu")(L.Conv2D(4, 1, name="side")(y))
    c = L.Concatenate(name="concat_op0")([h, s])
    c = L.AveragePooling2D(2, name="ap")(c)
    c = L.GlobalAveragePooling2D(keepdims=True, name="gap")(c)
    model = keras.Model(x, L.Dense(5, name="fc")(L.Flatten(name="flatten")(c)))
    copy_weights(model, net)  # fc reads a 1x1 map: its rows need no reordering
    return model


def test_mindspore_twin_with_more_cells(tmp_path):
    ms.set_seed(1)
    net = Net2()
    net.set_train(False)
    model = _keras_twin2(net)
    x = np.random.default_rng(2).uniform(-1, 1, (16, 8, 8, 3)).astype(np.float32)
    want = net(ms.Tensor(x.transpose(0, 3, 1, 2))).asnumpy()
    np.testing.assert_allclose(want, model.predict(x, verbose=0), atol=1e-5)
    record = tmp_path / "record.txt"
    akeras.calibrate(model, x, record, algorithm="minmax")
    options = {"format": "espdl", "target": "esp32s3", "feature_type": "s8"}
    akeras.export_espdl(model, record, tmp_path / "k.espdl", test_input=x[:1], **options)
    res = ams.export_espdl(
        net, record, tmp_path / "m.espdl", sample_input=(1, 3, 8, 8),
        test_input=x[:1].transpose(0, 3, 1, 2), **options,
    )  # fmt: skip
    assert {r.status for r in res.layers} <= {"exported", "fused"}
    k, m = read_espdl(tmp_path / "k.espdl"), read_espdl(tmp_path / "m.espdl")
    # the same nodes (the two graphs order the independent branches differently)
    assert {n.name: n.op_type for n in m.nodes} == {n.name: n.op_type for n in k.nodes}
    assert {"Clip", "LeakyRelu", "Add", "HardSwish", "Swish", "Concat", "AveragePool"} <= {
        n.op_type for n in m.nodes
    }
    for name, tensor in k.initializers.items():
        np.testing.assert_array_equal(tensor.data, m.initializers[name].data, err_msg=name)
    np.testing.assert_array_equal(k.test_outputs[0].data, m.test_outputs[0].data)
    step = 2.0 ** m.inputs[0].exponent
    q = np.clip(np.round(x / step), -128, 127)
    chip = simulate_espdl(m, q.astype(np.int8)).outputs["fc"] * 2.0 ** m.value("fc").exponent
    ref = net(ms.Tensor((q * step).astype(np.float32).transpose(0, 3, 1, 2))).asnumpy()
    assert np.abs(chip - ref).max() <= 0.06 * np.ptp(ref)
