"""A network whose input is read by a Flatten (an MLP: Flatten -> Dense -> Softmax) exports to
ESP-DL v3: the Flatten has no sidecar entry of its own, so the input's range is the Dense's
input range, read through the Flatten (before: "model input ... no calibrated range")."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

import amct_bridge.mindspore as ams
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl


class Mlp(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.flat = nn.Flatten()
        self.fc = nn.Dense(16, 4)
        self.sm = nn.Softmax()

    def construct(self, x):
        return self.sm(self.fc(self.flat(x)))


def test_an_mlp_whose_input_a_flatten_reads_exports_and_follows_the_net(tmp_path):
    ms.set_seed(0)
    net = Mlp()
    net.set_train(False)
    x = np.random.default_rng(0).uniform(-1, 1, (32, 1, 4, 4)).astype(np.float32)
    record = tmp_path / "r.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    out = tmp_path / "mlp.espdl"
    res = ams.export_espdl(
        net, record, out, sample_input=(1, 1, 4, 4), format="espdl", feature_type="s16"
    )
    assert {r.name: r.status for r in res.layers}["fc"] == "exported"
    back = read_espdl(out)
    e_in = back.inputs[0].exponent
    top = float(np.abs(x).max())  # minmax: the calibrated input range, the smallest cover
    assert 2.0 ** (e_in - 1) * 32768 < top <= 2.0**e_in * 32768
    chip_x = x.transpose(0, 2, 3, 1)  # 1x4x4 NCHW with C=1: the same order as NHWC
    q = np.clip(np.round(chip_x / 2.0**e_in), -32768, 32767).astype(np.int16)
    sim = simulate_espdl(back, q)
    name = back.outputs[0].name
    got = sim.outputs[name] * 2.0 ** back.value(name).exponent
    ref = net(Tensor(x)).asnumpy()
    assert np.abs(got - ref).max() <= 0.01 * (ref.max() - ref.min())  # s16: 1 % of the range
