"""Issue 30, MindSpore: what the exporters cannot write is refused naming the cell and why.

- ``nn.Dense(..., activation="softmax")`` before another layer (ESP-DL v1: only a final one is
  left to the host) names the activation;
- ``nn.Dense(..., activation="gelu")`` runs nn.GELU(), the tanh approximation: the v3 export
  writes that function's own table (``"gelu_tanh"``), not the exact GELU's; at s16 the chip
  follows the net's float output within 1 % of its range;
- a functional op with a Parameter operand, ``ops.max`` over an axis (values and indices):
  named, with what to do.

Also the command line of the issue: ``amct-bridge calibrate`` / ``export-espdl --format espdl
--mindspore file.py:factory --ckpt ...`` on the squeeze-excite net, then ``espdl-run --check``.
"""

from __future__ import annotations

import re
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops
from ms_v3_helpers import chip_error, export_checked

import amct_bridge.mindspore as ams
from amct_bridge.cli import main
from amct_bridge.errors import ExportError
from amct_bridge.espdl.v3 import read_espdl
from amct_bridge.mindspore.espdl_weights import source_layers


class Head(nn.Cell):
    """conv, mean over H and W, then nn.Dense with its own activation (and one more Dense)."""

    def __init__(self, activation: str, more: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, has_bias=True)
        self.fc = nn.Dense(4, 6, activation=activation)
        self.more = more
        self.out = nn.Dense(6, 3)

    def construct(self, x):
        y = self.fc(ops.mean(self.conv(x), (2, 3)))
        return self.out(y) if self.more else y


class Odd(nn.Cell):
    """``y * self.scale`` (a Parameter operand) or ``ops.max(y, 1)`` (values and indices; a
    division by a tensor exports: test_ms_v3_twins_math.py)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.conv = nn.Conv2d(3, 4, 3, has_bias=True)
        self.conv2 = nn.Conv2d(3, 4, 3, has_bias=True)
        self.scale = Parameter(Tensor(np.full((1, 4, 1, 1), 0.5, np.float32)), name="scale")

    def construct(self, x):
        y = self.conv(x)
        if self.how == "param":
            return y * self.scale
        return ops.max(y, 1, keepdims=True)[0] + self.conv2(x)


def _x(n: int = 4) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (n, 3, 8, 8)).astype(np.float32)


def _refusal(net: nn.Cell, tmp_path: Path, format: str = "espdl") -> str:
    net.set_train(False)
    record = tmp_path / "record.txt"
    ams.calibrate(net, _x(), record, algorithm="minmax")
    out = tmp_path / ("m.espdl" if format == "espdl" else "set")
    with pytest.raises(ExportError) as err:
        ams.export_espdl(net, record, out, sample_input=(1, 3, 8, 8), format=format)
    assert not out.exists()
    return str(err.value)


def test_v1_names_the_dense_activation_it_cannot_fuse(tmp_path):
    message = _refusal(Head("softmax", more=True), tmp_path, format="v1")
    assert "layer 'fc' (Dense): activation 'softmax'" in message, message


def test_dense_softmax_exports_to_v3(tmp_path):
    net = Head("softmax", more=False)
    net.set_train(False)
    record = tmp_path / "record.txt"
    ams.calibrate(net, _x(), record, algorithm="minmax")
    res = ams.export_espdl(net, record, tmp_path / "m.espdl", sample_input=(1, 3, 8, 8),
                           format="espdl", test_input=_x()[:1])  # fmt: skip
    assert "Softmax" in {n.op_type for n in res.model.nodes}
    assert main(["espdl-run", str(tmp_path / "m.espdl"), "--check"]) == 0


def test_dense_with_the_tanh_gelu_exports_its_own_table(tmp_path):
    net = Head("gelu", more=False)
    net.set_train(False)
    x = _x(16)
    record = tmp_path / "record.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    res, model = export_checked(net, record, tmp_path / "m.espdl", x, "esp32p4", "s16")
    assert {r.status for r in res.layers} <= {"exported", "fused"}, res.skipped
    assert "fc/gelu_tanh" in {n.name for n in model.nodes}
    err, span = chip_error(model, net, x, "esp32p4")
    assert err <= 0.01 * span, (err, span)
    # the core's name of the tanh approximation (not "gelu", the exact erf one)
    assert source_layers(net, (1, 3, 8, 8), format="espdl")[-1].attrs["activation"] == "gelu_tanh"


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("param", r"'mul_op0' \(Mul\): Mul with a constant tensor operand .*fold it into"),
        (
            "max",
            r"'argmaxwithvalue_op0' \(ArgMaxWithValue\): functional ArgMaxWithValue \(ops.max "
            r"over an axis: values and indices\): .* use ops.amax\(x, axis, keepdims\)",
        ),
    ],
)
def test_odd_operands_are_refused_by_name(how, why, tmp_path):
    ms.set_seed(0)
    message = _refusal(Odd(how), tmp_path)
    assert re.search(why, message), message


SPEC = f"{Path(__file__).with_name('test_ms_v3_gating.py')}:squeeze_excite"


def test_command_line_exports_the_squeeze_excite_net(tmp_path, capsys):
    import test_ms_v3_gating as gating

    net = gating.squeeze_excite()
    weight = net.conv.weight  # weights the factory does not make: the checkpoint must load
    weight.set_data(Tensor(weight.asnumpy() * 1.5))
    ms.save_checkpoint(net, str(tmp_path / "se.ckpt"))
    x = _x(16)
    np.save(tmp_path / "x.npy", x)
    record = tmp_path / "record.txt"
    spec = ["--mindspore", SPEC, "--ckpt", str(tmp_path / "se.ckpt")]
    assert main(["calibrate", *spec, "--data", str(tmp_path / "x.npy"), "-o", str(record),
                 "--algorithm", "minmax"]) == 0  # fmt: skip
    for target, feature_type in (("esp32s3", "s8"), ("esp32p4", "s16")):
        out = tmp_path / f"se_{target}.espdl"
        argv = ["export-espdl", "--format", "espdl", *spec, "--input-shape", "1,3,8,8"]
        argv += ["--record", str(record), "--out", str(out), "--target", target]
        argv += ["--feature-type", feature_type, "--test-input", str(tmp_path / "x.npy")]
        assert main(argv) == 0, capsys.readouterr().err
        assert main(["espdl-run", str(out), "--check"]) == 0
        # the file is the one the Python API writes from the same record
        options = {"target": target, "feature_type": feature_type, "test_input": x[:1]}
        res = ams.export_espdl(net, record, None, sample_input=(1, 3, 8, 8), format="espdl",
                               **options)  # fmt: skip
        written = read_espdl(out)
        for name, tensor in res.model.initializers.items():
            np.testing.assert_array_equal(written.initializers[name].data, tensor.data)
        np.testing.assert_array_equal(written.test_outputs[0].data, res.model.test_outputs[0].data)
