"""The ESP-DL v3 exponent search through the MindSpore adapter (``export_espdl(net, ...,
format="espdl", calibration_data=x)``, x NCHW as the net takes it): a small net ending in
``nn.Dense(..., activation="softmax")`` is judged on its logits, and the SNR the search reports
is the one numpy computes from the written file's simulated logits and the net's own float
logits (its cells up to the Dense, then x·Wᵀ + b)."""

from __future__ import annotations

import re

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

import amct_bridge.mindspore as ams
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.espdl.v3.evaluation import quantize_input


class Net(nn.Cell):
    """conv-relu, Flatten, Dense(3) with its own softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, has_bias=True, pad_mode="valid")
        self.relu = nn.ReLU()
        self.flat = nn.Flatten()
        self.fc = nn.Dense(64, 3, activation="softmax")

    def features(self, x):
        return self.flat(self.relu(self.conv(x)))

    def construct(self, x):
        return self.fc(self.features(x))


def _snr(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10((ref**2).sum() / ((ref - got) ** 2).sum()))


@pytest.mark.parametrize("target", ["esp32s3", "esp32p4"])
def test_v3_search_on_a_mindspore_softmax_head(tmp_path, target):
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (64, 1, 6, 6)).astype(np.float32)
    labels = (x.reshape(64, -1) @ rng.normal(0, 1, (36, 3))).argmax(1)
    net = Net()
    step = nn.TrainOneStepCell(
        nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.5)
    )
    step.set_train(True)
    for _ in range(15):
        step(Tensor(x), Tensor(np.eye(3, dtype=np.float32)[labels]))
    net.set_train(False)
    feats = net.features(Tensor(x)).asnumpy().astype(np.float64)
    logits = feats @ net.fc.weight.asnumpy().T.astype(np.float64) + net.fc.bias.asnumpy()
    record = tmp_path / "r.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    x_chip = x.transpose(0, 2, 3, 1)
    opts = {"sample_input": (1, 1, 6, 6), "format": "espdl", "target": target}
    snrs = []
    for name, data in (("max", None), ("search", x)):
        path = tmp_path / f"{name}.espdl"
        res = ams.export_espdl(net, record, path, calibration_data=data, **opts)
        model = read_espdl(path)
        chip = simulate_espdl(model, quantize_input(model, x_chip, target)).values
        tensor = "fc/linear"  # the Gemm's logits, before the Softmax node
        snrs.append(_snr(logits, chip[tensor] * 2.0 ** res.exponents[tensor][0]))
    note = next(w for w in res.warnings if w.startswith("exponents searched"))
    said = re.search(r"output SNR (-?[\d.]+) dB with the range rule, (-?[\d.]+) dB searched", note)
    assert said, note
    assert abs(float(said.group(1)) - snrs[0]) < 0.06, note
    assert abs(float(said.group(2)) - snrs[1]) < 0.06, note
    assert snrs[1] >= snrs[0], note
