"""Power-of-two QAT in MindSpore (``quantize_aware(..., power_of_two=True)``): the graph ops
against the core's numpy reference and the exporter's exponent rule, one training step by hand
in GRAPH and PyNative mode, and a tiny digits net whose ESP-DL v3 export has the trained
exponents and computes (on the simulated esp32s3) the QAT network's integers.

Independent references: ``amct_bridge.quant.espdl`` (the exporter's rules), the v3 simulator,
numpy formulas written here.
"""

from __future__ import annotations

import math

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Model
from sklearn.datasets import load_digits

import amct_bridge.mindspore as ams
from amct_bridge.errors import QuantError
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.espdl.v3.evaluation import quantize_input
from amct_bridge.mindspore.qat import quantize_aware, save_qat_record, strip_qat
from amct_bridge.mindspore.qat.fake_quant import (
    fake_quant_pow2,
    threshold_exponent,
    weight_exponent,
)
from amct_bridge.mindspore.qat.model import pow2_quantizers
from amct_bridge.quant import qat as core
from amct_bridge.quant.espdl import auto_exponent, range_to_exponent
from amct_bridge.records import load, validate
from amct_bridge.records.calibration import load_stats, sidecar_path


def test_ops_match_the_numpy_reference_and_the_exporter():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 4, 2000).astype(np.float32)
    x[:6] = [0.5, -0.5, 2.5, -2.5, 900.0, -900.0]
    for e in (-6, -2, 0, 1):
        got = fake_quant_pow2(Tensor(x), Tensor(np.float32(e))).asnumpy()
        assert np.array_equal(got, core.fake_quant_pow2(x, e)), e
    for t in (0.02, 1.0, 6.0, 127.0, 128.0):
        e = threshold_exponent(Tensor(np.float32(np.log2(t)))).asnumpy()
        assert float(e) == range_to_exponent(-t, t), t
    for k in (-8, -3, 0, 2):
        top = np.float32(127 * 2.0**k)
        for v in (top, np.nextafter(top, np.float32(0)), np.nextafter(top, np.float32(1e9))):
            kernel = np.float32([[0.3 * v, -v], [0.0, 0.1 * v]])
            assert float(weight_exponent(Tensor(kernel)).asnumpy()) == auto_exponent(kernel)
    assert float(weight_exponent(Tensor(np.zeros(3, np.float32))).asnumpy()) == 0.0


def test_tqt_gradient_of_the_log2_threshold():
    x = Tensor(np.float32([0.3, -0.7, 9.0, -20.0]))
    weights = np.float32([1, 2, 3, 4])

    def total(log2t):
        return (fake_quant_pow2(x, threshold_exponent(log2t)) * Tensor(weights)).sum()

    got = float(ms.grad(total)(Tensor(np.float32(np.log2(6.0)))).asnumpy())  # e = -4
    s = 2.0**-4
    v = x.asnumpy().astype(np.float64) / s
    q = np.clip(np.floor(v + 0.5), -128, 127)
    per = math.log(2) * s * np.where((v >= -128) & (v <= 127), q - v, q)
    assert got == pytest.approx(float(np.sum(per * weights)), rel=1e-5)


class TwoDense(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(5, 4)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(4, 3)

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def reference_step(net, x):
    """The first training step's forward pass of power-of-two QAT, in numpy: each threshold
    starts at its tensor's first-batch max |x| (learned), fc1's input and output and fc2's
    output are quantized, fc2 reads the ReLU of fc1's quantized output as it is."""
    w1, b1 = net.fc1.weight.asnumpy(), net.fc1.bias.asnumpy()
    w2, b2 = net.fc2.weight.asnumpy(), net.fc2.bias.asnumpy()

    def fq(v, e):
        return core.fake_quant_pow2(v, e)

    def exp_of(v):
        return core.threshold_exponent(core.log2_threshold(v.min(), v.max()))

    def dense(v, w, b, e_in):
        e_w = core.weight_exponent(w)
        bq = np.floor(b / 2.0 ** (e_in + e_w) + 0.5) * 2.0 ** (e_in + e_w)  # the chip's bias
        return (v @ fq(w, e_w).T + bq).astype(np.float32)

    e_x = exp_of(x)
    h = dense(fq(x, e_x), w1, b1, e_x)
    e_h = exp_of(h)
    h = np.maximum(fq(h, e_h), 0)
    y = dense(h, w2, b2, e_h)
    return fq(y, exp_of(y)), {"fc1:input": e_x, "fc1": e_h, "fc2": exp_of(y)}


def test_one_training_step_matches_numpy(mode):
    """GRAPH and PyNative: the forward pass of the first step, the thresholds it sets and the
    EMAs it moves (in GRAPH_MODE an unused EMA update was once dropped by the compiler)."""
    ms.set_seed(0)
    net = TwoDense()
    x = np.random.default_rng(0).normal(0, 1.5, (8, 5)).astype(np.float32)
    qat = quantize_aware(net, sample_input=(1, 5), power_of_two=True)
    assert not qat.relu.quantize_output  # the ReLU keeps fc1's grid
    want, exponents = reference_step(net, x)
    qat.set_train(True)
    got = qat(Tensor(x)).asnumpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    quantizers = pow2_quantizers(qat)
    for name, e in exponents.items():
        log2t, (lo, hi, seen) = quantizers[name]
        assert core.threshold_exponent(float(log2t.asnumpy())) == e, name
        assert float(seen.asnumpy()) == 1.0 and float(hi.asnumpy()) > float(lo.asnumpy())
    assert float(qat.fc1.in_min.asnumpy()) == pytest.approx(float(x.min()))


def test_what_one_exponent_per_cell_cannot_train_is_refused():
    with pytest.raises(QuantError, match="dst_type must be 'INT8'"):
        quantize_aware(TwoDense(), "INT4", sample_input=(1, 5), power_of_two=True)
    with pytest.raises(QuantError, match="give sample_input"):
        quantize_aware(TwoDense(), power_of_two=True)

    class SharedSigmoid(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.act = nn.Dense(4, 4), nn.Dense(4, 2), nn.Sigmoid()

        def construct(self, x):
            return self.act(self.fc2(self.act(self.fc1(x))))

    with pytest.raises(QuantError, match="'act' is called at several sites"):
        quantize_aware(SharedSigmoid(), sample_input=(1, 4), power_of_two=True)


# --- a tiny digits net and its ESP-DL v3 export ----------------------------------------------


class Tiny(nn.Cell):
    """Conv+BN+ReLU, Conv(stride 2)+BN+HSwish, Flatten, Dense (8x8 digits, NCHW)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, has_bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(4, 8, 3, stride=2, has_bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.act2 = nn.HSwish()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(8 * 4 * 4, 10)

    def construct(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.act2(self.bn2(self.conv2(x)))
        return self.fc(self.flatten(x))


def fit(net, x, y, epochs, lr):
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    data = ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False).batch(32)
    Model(net, loss, nn.Adam(net.trainable_params(), lr)).train(epochs, data)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None]
    y = data.target.astype(np.int32)
    x_tr, y_tr, x_te, y_te = x[:1000], y[:1000], x[1000:1400], y[1000:1400]
    net = Tiny()
    fit(net, x_tr, y_tr, 3, 1e-2)
    qat = quantize_aware(net, sample_input=(1, 1, 8, 8), power_of_two=True)
    fit(qat, x_tr, y_tr, 1, 1e-3)
    out = tmp_path_factory.mktemp("ms_pow2")
    save_qat_record(qat, out / "qat.txt")
    plain = strip_qat(qat)
    ams.export_espdl(plain, out / "qat.txt", out / "qat.espdl", sample_input=(1, 1, 8, 8),
                     format="espdl", target="esp32s3", feature_type="s8")  # fmt: skip
    espdl = read_espdl(out / "qat.espdl")
    sim = simulate_espdl(espdl, quantize_input(espdl, x_te.transpose(0, 2, 3, 1), "esp32s3"))
    qat.set_train(False)
    yield dict(qat=qat, espdl=espdl, sim=sim, x=x_te, y=y_te, record=out / "qat.txt")
    ms.set_context(mode=before)


def test_the_export_has_the_trained_exponents(exported):
    qat, sim, espdl = exported["qat"], exported["sim"], exported["espdl"]
    trained = {
        name: core.threshold_exponent(float(log2t.asnumpy()))
        for name, (log2t, _) in pow2_quantizers(qat).items()
    }
    # conv1 + bn1 + relu1 are one Conv on the chip (named after the ReLU), the BN's output
    # quantizer holds it; likewise conv2 + bn2
    assert sorted(trained) == ["act2", "bn1", "bn2", "conv1:input", "fc"]
    chip = {"conv1:input": "x", "bn1": "relu1", "bn2": "bn2", "act2": "act2", "fc": "fc"}
    inputs = {v.name for v in espdl.inputs}
    for name, tensor in chip.items():
        tensor = next(iter(inputs)) if tensor == "x" else tensor
        assert sim.exponents[tensor] == trained[name], name
    filters = {n.name: espdl.initializers[n.inputs[1]].exponents[0] for n in espdl.nodes
               if n.op_type in ("Conv", "Gemm")}  # fmt: skip
    for key in ("conv1", "conv2", "fc"):
        kernel = getattr(qat, key).cell.weight.asnumpy()
        assert filters[key] == auto_exponent(kernel), key
    record = load(exported["record"])
    assert validate(record) == []
    assert record.layers["conv2"].scale_d == 2.0 ** trained["bn1"]  # conv2 reads relu1
    assert record.layers["fc"].scale_d == 2.0 ** trained["act2"]
    stats = load_stats(sidecar_path(exported["record"]))
    assert stats.algorithm == "qat-pow2-learned"
    for node, name in (("bn1", "bn1"), ("relu1", "bn1"), ("act2", "act2"), ("fc", "fc")):
        rng = stats.layers[node].output
        assert range_to_exponent(rng.min, rng.max) == trained[name], node


def test_the_chip_computes_the_qat_networks_outputs(exported):
    """Tolerance: at most one step in 0.1 % of any tensor's integers (measured: all equal, in
    every tensor); the chip's accuracy is the QAT network's. The cells run one by one in
    PyNative mode (in GRAPH_MODE each call would compile a graph of its own)."""
    qat, sim, espdl = exported["qat"], exported["sim"], exported["espdl"]
    x = Tensor(exported["x"])
    ms.set_context(mode=ms.PYNATIVE_MODE)  # the fixture restores the mode after the module
    h1 = qat.relu1(qat.bn1(qat.conv1(x)))
    h2 = qat.bn2(qat.conv2(h1))
    h3 = qat.act2(h2)
    logits = qat.fc(qat.flatten(h3))
    for tensor, value in (("relu1", h1), ("bn2", h2), ("act2", h3), ("fc", logits)):
        value = value.asnumpy()
        if value.ndim == 4:
            value = value.transpose(0, 2, 3, 1)  # the chip is NHWC
        e = sim.exponents[tensor]
        steps = np.abs(sim.values[tensor].reshape(value.shape) * 2.0**e - value) / 2.0**e
        assert steps.max() <= 1 and np.mean(steps == 0) >= 0.999, (tensor, np.mean(steps == 0))
    assert np.array_equal(qat(x).asnumpy(), logits.asnumpy())
    chip = sim.outputs[espdl.outputs[0].name].argmax(axis=1)
    assert np.array_equal(chip, logits.asnumpy().argmax(axis=1))
    assert np.mean(chip == exported["y"]) > 0.9
