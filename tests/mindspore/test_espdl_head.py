"""A MindSpore network ending in nn.Softmax / nn.Sigmoid: the cell is left to the host, the chip
computes the Dense's logits, and espdl-eval scores them with the function applied (issue 23 §2).
The arg max is compared with the network's own output."""

from __future__ import annotations

import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

import amct_bridge.mindspore as ams
from amct_bridge.espdl.v1.chip import simulate_chip


class _Head(nn.Cell):
    def __init__(self, function: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, has_bias=True, pad_mode="valid")
        self.relu = nn.ReLU()
        self.flat = nn.Flatten()
        self.fc = nn.Dense(4 * 4 * 4, 3)
        self.head = nn.Softmax() if function == "softmax" else nn.Sigmoid()

    def construct(self, x):
        return self.head(self.fc(self.flat(self.relu(self.conv(x)))))


@pytest.mark.parametrize("function", ["softmax", "sigmoid"])
def test_final_softmax_or_sigmoid_cell_is_left_to_the_host(function, tmp_path):
    ms.set_seed(0)
    net = _Head(function)
    x = np.random.default_rng(0).normal(0, 1, (32, 1, 6, 6)).astype(np.float32)
    probs = net(Tensor(x)).asnumpy()
    y = probs.argmax(axis=1)
    record = tmp_path / "r.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    out = tmp_path / "espdl"
    res = ams.export_espdl(net, record, out, sample_input=(1, 1, 6, 6), feature_type="s16")
    assert res.skipped == []
    (host,) = json.loads((out / "export.json").read_text())["host"]
    assert (host["layer"], host["function"], host["reads"]) == ("head", function, "fc")
    logits = simulate_chip(out, x.transpose(0, 2, 3, 1)).output.to_float()
    assert np.array_equal(logits.argmax(axis=1), y)
    ev = ams.evaluate_espdl(out, net, x, y)
    assert ev.chip_acc == ev.float_acc == 1.0
    assert f"whose {function} is applied on the host" in ev.chip_note
    assert {e.source for e in ev.layers} >= {"fc"}
