"""MindSpore nn.LayerNorm -> the v3 runtime's LayerNormalization: over (C, H, W) of an NCHW map
(the chip's H, W, C: gamma and beta transposed) and over a Dense's features. The simulated chip
follows the MindSpore net's own float output: s16 within 1 % of the output range."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

import amct_bridge.mindspore as ams
from amct_bridge.errors import ExportError
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl


class Net(nn.Cell):
    def __init__(self, begin: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        shape = (4, 4, 4)[begin - 1 :]
        self.ln = nn.LayerNorm(shape, begin_norm_axis=begin, begin_params_axis=begin)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(64, 6)
        self.ln2 = nn.LayerNorm((6,), epsilon=1e-5)

    def construct(self, x):
        return self.ln2(self.fc(self.flatten(self.ln(self.conv(x)))))


def _net(begin: int = 1) -> Net:
    ms.set_seed(0)
    net = Net(begin)
    rng = np.random.default_rng(1)
    for cell in (net.ln, net.ln2):  # gamma and beta that are not 1 and 0, and not symmetric
        cell.gamma.set_data(Tensor(rng.uniform(0.5, 1.5, cell.gamma.shape).astype(np.float32)))
        cell.beta.set_data(Tensor(rng.uniform(-0.5, 0.5, cell.beta.shape).astype(np.float32)))
    net.set_train(False)
    return net


def test_mindspore_layer_norm_follows_the_net(tmp_path):
    net = _net()
    x = np.random.default_rng(0).uniform(-1, 1, (8, 3, 4, 4)).astype(np.float32)
    record = tmp_path / "r.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    out = tmp_path / "m.espdl"
    res = ams.export_espdl(net, record, out, sample_input=(1, 3, 4, 4), format="espdl",
                           target="esp32s3", feature_type="s16")  # fmt: skip
    status = {r.name: r.status for r in res.layers}
    assert status["ln"] == status["ln2"] == "exported"
    back = read_espdl(out)
    nodes = {n.name: n for n in back.nodes if n.op_type == "LayerNormalization"}
    assert nodes["ln"].attributes["axis"] == 1 and nodes["ln2"].attributes["axis"] == 1
    gamma = back.initializers["ln/gamma"]
    want_g = net.ln.gamma.asnumpy().transpose(1, 2, 0).reshape(-1)  # (C, H, W) -> H, W, C
    np.testing.assert_allclose(gamma.data * 2.0 ** gamma.exponents[0], want_g, atol=2e-4)
    step = 2.0 ** back.inputs[0].exponent
    q = np.clip(np.round(x.transpose(0, 2, 3, 1) / step), -32768, 32767).astype(np.int16)
    sim = simulate_espdl(back, q)
    xq = Tensor((q * step).astype(np.float32).transpose(0, 3, 1, 2))
    mid = net.ln(net.conv(xq)).asnumpy().transpose(0, 2, 3, 1)
    got = sim.values["ln"] * 2.0 ** back.value("ln").exponent
    assert np.abs(got - mid).max() <= 0.01 * np.ptp(mid)
    ref = net(xq).asnumpy()
    chip = sim.outputs["ln2"] * 2.0 ** back.value("ln2").exponent
    assert np.abs(chip - ref).max() <= 0.01 * np.ptp(ref)


def test_mindspore_layer_norm_over_h_w_is_refused(tmp_path):
    net = _net(begin=2)  # H, W of NCHW: not the trailing axes of the chip's NHWC
    x = np.random.default_rng(0).uniform(-1, 1, (4, 3, 4, 4)).astype(np.float32)
    record = tmp_path / "r.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    with pytest.raises(ExportError, match=r"'ln' \(LayerNorm\).*trailing axes"):
        ams.export_espdl(net, record, tmp_path / "m.espdl", sample_input=(1, 3, 4, 4),
                         format="espdl", target="c")  # fmt: skip
