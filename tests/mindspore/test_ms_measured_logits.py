"""Issue 31, "measured logit ranges", through the MindSpore adapter: the calibration probes the
input of an ``nn.Dense(activation="softmax")``'s activation cell (its logits), the sidecar keeps
that range as the Dense's ``preactivation``, and the plain ESP-DL exports (no
``calibration_data``) quantize the logits at it.

The net: Flatten, Dense(64, 32, relu), Dense(32, 10, softmax) with the weights of a
scikit-learn MLP trained on the digits, the head's weights then +1.0 each: a shift common to all
logits that the softmax and the arg max do not see (see tests/keras/test_measured_logits.py).
Before, v3 estimated the logits from the probabilities and clipped them (11 % of the held-out
digits kept the net's arg max); v1 bounded them through the weights (exponent 1, 98.5 %). With
the measured range: 99.2 % on both, exponent 0.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from mindspore import Tensor, nn
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier

import amct_bridge.mindspore as ams
from amct_bridge.espdl.v1.chip import simulate_chip
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.espdl.v3.evaluation import quantize_input
from amct_bridge.records.calibration import load_stats

#: float32 MindSpore against a float64 numpy recomputation of the same logits
TOLERANCE = {"rtol": 1e-5, "atol": 1e-4}
SAMPLE = (1, 1, 8, 8)


class Mlp(nn.Cell):
    """Flatten, Dense(64, 32, relu), Dense(32, 10, softmax)."""

    def __init__(self) -> None:
        super().__init__()
        self.flat = nn.Flatten()
        self.hid = nn.Dense(64, 32, activation="relu")
        self.fc = nn.Dense(32, 10, activation="softmax")

    def construct(self, x):
        return self.fc(self.hid(self.flat(x)))


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    data = load_digits()
    x = (data.images / 16.0)[:, None].astype(np.float32)  # NCHW
    idx = np.random.default_rng(0).permutation(len(x))
    train, test = idx[:1400], idx[1400:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPClassifier((32,), max_iter=200, random_state=0)
        mlp.fit(x[train].reshape(len(train), -1), data.target[train])
    net = Mlp()
    w1, w2 = mlp.coefs_
    net.hid.weight.set_data(Tensor(w1.T.astype(np.float32)))
    net.hid.bias.set_data(Tensor(mlp.intercepts_[0].astype(np.float32)))
    net.fc.weight.set_data(Tensor((w2.T + 1.0).astype(np.float32)))
    net.fc.bias.set_data(Tensor(mlp.intercepts_[1].astype(np.float32)))
    net.set_train(False)
    tmp = tmp_path_factory.mktemp("ms_logits")
    ams.calibrate(net, x[train[:256]], tmp / "r.txt", algorithm="minmax")
    return {
        "net": net,
        "record": tmp / "r.txt",
        "calib": x[train[:256]],
        "x": x[test],
        "float": net(Tensor(x[test])).asnumpy().argmax(-1),
        "tmp": tmp,
    }


def _logits(net, x: np.ndarray) -> np.ndarray:
    """The head's logits in float64 numpy from the cells' weights."""
    w1, b1 = (np.float64(p.asnumpy()) for p in (net.hid.weight, net.hid.bias))
    w2, b2 = (np.float64(p.asnumpy()) for p in (net.fc.weight, net.fc.bias))
    hidden = np.maximum(x.reshape(len(x), -1).astype(np.float64) @ w1.T + b1, 0.0)
    return hidden @ w2.T + b2


def test_the_sidecar_holds_the_measured_logit_range(digits):
    d = digits
    stats = load_stats(d["tmp"] / "r.txt.calib.json")
    pre = stats.layers["fc"].preactivation
    logits = _logits(d["net"], d["calib"])
    np.testing.assert_allclose([pre.min, pre.max], [logits.min(), logits.max()], **TOLERANCE)
    assert stats.layers["fc"].output.max <= 1.0  # the probabilities
    assert stats.layers["hid"].preactivation is None  # relu: its output range tells
    assert type(d["net"].fc.activation).__name__ == "Softmax"  # the probe is gone


def test_v1_plain_s8_export_quantizes_the_measured_logits(digits):
    d = digits
    out = d["tmp"] / "v1"
    res = ams.export_espdl(d["net"], d["record"], out, sample_input=SAMPLE, target="esp32s3")
    (head,) = [x for x in res.layers if x.name == "fc"]
    assert head.sources["output_exponent"] == "sidecar logit range of 'fc' (before its softmax)"
    logits = simulate_chip(out, d["x"].transpose(0, 2, 3, 1)).output.to_float()
    assert (logits.reshape(len(d["x"]), -1).argmax(-1) == d["float"]).mean() >= 0.95


@pytest.mark.parametrize("target", ["esp32s3", "esp32p4"])
def test_v3_plain_s8_export_quantizes_the_measured_logits(digits, target):
    d = digits
    path = d["tmp"] / f"{target}.espdl"
    res = ams.export_espdl(
        d["net"], d["record"], path, sample_input=SAMPLE, format="espdl", target=target
    )
    exp, source = res.exponents["fc/linear"]  # the Gemm's logits, before its Softmax node
    assert source == "sidecar pre-activation range of 'fc' (before its softmax)"
    assert 2.0**exp * 127 >= np.abs(_logits(d["net"], d["calib"])).max()  # nothing clips
    model = read_espdl(path)
    x_chip = quantize_input(model, d["x"].transpose(0, 2, 3, 1), target)
    logits = simulate_espdl(model, x_chip, target).values["fc/linear"]
    assert (logits.reshape(len(d["x"]), -1).argmax(-1) == d["float"]).mean() >= 0.95
