"""Mixed int8 / int16 through the MindSpore adapter: ``layer_bits`` and ``feature_type="auto"``
(``export_espdl(net, ..., format="espdl", calibration_data=x)``, x NCHW as the net takes it).
The file passes ``espdl-run --check``; the drop auto reports is re-measured here against the
net's own float output."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

import amct_bridge.mindspore as ams
from amct_bridge.cli import main
from amct_bridge.espdl.v3 import simulate_espdl
from amct_bridge.espdl.v3.evaluation import quantize_input


class Net(nn.Cell):
    """conv-relu, conv-relu, Flatten, Dense(1): a regression output (the RMS-error drop)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 3, has_bias=True, pad_mode="same")
        self.r1 = nn.ReLU()
        self.c2 = nn.Conv2d(4, 4, 3, has_bias=True, pad_mode="same")
        self.r2 = nn.ReLU()
        self.flat = nn.Flatten()
        self.fc = nn.Dense(144, 1)

    def construct(self, x):
        return self.fc(self.flat(self.r2(self.c2(self.r1(self.c1(x))))))


def test_mindspore_layer_bits_and_auto(tmp_path):
    ms.set_seed(0)
    x = np.random.default_rng(0).uniform(-1, 1, (64, 1, 6, 6)).astype(np.float32)
    net = Net()
    net.set_train(False)
    record = tmp_path / "r.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    opts = {"sample_input": (1, 1, 6, 6), "format": "espdl", "target": "esp32s3"}
    path = tmp_path / "mixed.espdl"
    res = ams.export_espdl(net, record, path, layer_bits={"c2": 16}, **opts)
    assert res.layer_bits == {"c2": 16}
    ops = [(n.op_type, n.attributes["quant_type"]) for n in res.model.nodes]
    assert ("RequantizeLinear", "S16") in ops and ("RequantizeLinear", "S8") in ops
    assert main(["espdl-run", str(path), "--check"]) == 0

    ref = net(Tensor(x)).asnumpy().astype(np.float64).ravel()

    def drop(result) -> float:
        chip_x = quantize_input(result.model, x.transpose(0, 2, 3, 1), "esp32s3")
        out = simulate_espdl(result.model, chip_x, "esp32s3").outputs["fc"].astype(np.float64)
        got = out.ravel() * 2.0 ** result.model.outputs[0].exponents[0]
        return float(np.sqrt(np.mean((got - ref) ** 2)) / (ref.max() - ref.min()))

    max_drop = 0.006
    auto = ams.export_espdl(
        net, record, None, feature_type="auto", max_drop=max_drop, calibration_data=x,
        exponents="max", **opts,
    )  # fmt: skip
    mixed = auto.mixed
    print(mixed.summary())
    assert mixed.metric == "error" and mixed.candidates == ["c1", "c2", "fc"]
    assert abs(drop(auto) - mixed.drop) < 1e-9 and mixed.drop <= max_drop
    assert abs(drop(ams.export_espdl(net, record, None, **opts)) - mixed.all_s8) < 1e-9
    assert mixed.all_s8 > max_drop and 0 < len(mixed.s16) < 3, mixed.summary()
    for name in mixed.s16:  # minimal: none can go back to int8
        fewer = {k: 16 for k in mixed.s16 if k != name}
        assert drop(ams.export_espdl(net, record, None, layer_bits=fewer, **opts)) > max_drop
