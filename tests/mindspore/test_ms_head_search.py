"""The exponent search (``calibration_data=``) on a MindSpore net ending in ``nn.Dense(...,
activation="softmax")`` or in a Dense followed by ``nn.Softmax``: ESP-DL v1 leaves the softmax
to the host, so the chip computes the logits. The search compared them with the net's
PROBABILITIES (the Dense cell's hooked output): on the softmax Dense below it reported "-8.0 dB
with the range rule" for an export whose logits were at 27.0 dB, and "improved" it into an
export whose logits were at 1.4 dB. It now compares the chip's logits with the float logits (as
Keras, commit 0561e7e): 27.0 -> 34.3 dB. The SNR it reports is checked against one computed in
numpy from the chip simulator's logits and logits from the net's own cells. (The nn.Softmax
cell was already scored on the Dense's logits, by the search's fallback to the chip's output;
it is now named so: the layer the dropped head reads.)
"""

from __future__ import annotations

import re

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

import amct_bridge.mindspore as ams
from amct_bridge.espdl.v1.chip import simulate_chip
from amct_bridge.espdl.v1.search import search_samples


class Net(nn.Cell):
    """conv-relu, Flatten, Dense(3) with its own softmax ("dense") or an nn.Softmax after it."""

    def __init__(self, head: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, has_bias=True, pad_mode="valid")
        self.relu = nn.ReLU()
        self.flat = nn.Flatten()
        self.fc = nn.Dense(64, 3, activation="softmax" if head == "dense" else None)
        self.sm = nn.Softmax() if head == "softmax_cell" else None

    def features(self, x):
        return self.flat(self.relu(self.conv(x)))

    def construct(self, x):
        y = self.fc(self.features(x))
        return self.sm(y) if self.sm is not None else y


def _snr(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10((ref**2).sum() / ((ref - got) ** 2).sum()))


def _trained(head: str) -> tuple[Net, np.ndarray]:
    """A few SGD steps (MSE on the probabilities, one-hot labels of a fixed projection)."""
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (64, 1, 6, 6)).astype(np.float32)
    labels = (x.reshape(64, -1) @ rng.normal(0, 1, (36, 3))).argmax(1)
    onehot = np.eye(3, dtype=np.float32)[labels]
    net = Net(head)
    step = nn.TrainOneStepCell(
        nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.5)
    )
    step.set_train(True)
    for _ in range(15):
        step(Tensor(x), Tensor(onehot))
    net.set_train(False)
    return net, x


# "softmax_cell" (Dense + nn.Softmax) is kept in _trained; the suite runs the Dense(softmax)
# head only, the case the search got wrong (the other read the Dense's logits already)
@pytest.mark.parametrize("head", ["dense"])
def test_search_on_a_softmax_head_reports_and_improves_the_logits_snr(head, tmp_path):
    net, x = _trained(head)
    assert len(search_samples(x)) == len(x)  # the search scores every sample here
    # independent float logits: the net's own cells up to the Dense's input, then x·Wᵀ + b
    feats = net.features(Tensor(x)).asnumpy().astype(np.float64)
    logits = feats @ net.fc.weight.asnumpy().T.astype(np.float64) + net.fc.bias.asnumpy()
    probs = net(Tensor(x)).asnumpy()
    e = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(e / e.sum(1, keepdims=True), probs, atol=1e-5)  # the same head

    record = tmp_path / "r.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    x_chip = x.transpose(0, 2, 3, 1)
    ams.export_espdl(net, record, tmp_path / "max", sample_input=(1, 1, 6, 6))
    chip_max = simulate_chip(tmp_path / "max", x_chip).output.to_float()
    res = ams.export_espdl(
        net, record, tmp_path / "s", sample_input=(1, 1, 6, 6), calibration_data=x
    )
    chip_search = simulate_chip(tmp_path / "s", x_chip).output.to_float()
    note = next(w for w in res.warnings if w.startswith("exponents searched"))
    said = float(re.search(r"output SNR (-?[\d.]+) dB with the range rule", note).group(1))
    searched = float(re.search(r"(-?[\d.]+) dB searched", note).group(1))
    assert _snr(logits, chip_max) > 15, note  # a sound export: the comparison means something
    assert abs(said - _snr(logits, chip_max)) < 0.2, note  # said -8.0 dB for a 27 dB one
    assert abs(searched - _snr(logits, chip_search)) < 0.2, note
    assert _snr(logits, chip_search) >= _snr(logits, chip_max) - 0.1, note
