"""Issue 30, MindSpore: a network starting with nn.LayerNorm calibrates and exports to ESP-DL v3.

The calibration observes nn.LayerNorm's input and output (it stays float: no record entry, as
the warning says), so the model input gets its range and the export goes on instead of
stopping at "model input 'input0': no calibrated range". Two tiny nets:

- an image net, nn.LayerNorm over (C, H, W) of the 8x8 NCHW input, then conv / ReLU / pool;
- a token net, (N, T, D) = (N, 8, 8): nn.LayerNorm over D, nn.Dense on the tokens, the exact
  nn.GELU, a mean over T and a Dense head (rank-3 tensors read by Dense / LayerNorm are
  sequences, which the chip holds as they are, not NCW maps).

Both are calibrated by MindSpore and exported for esp32s3 and esp32p4 at s8 and s16; the written
file passes ``espdl-run --check`` and at s16 the simulated chip follows the net's float output
within 1 % of its range. A Transformer-like block (LayerNorm, q / k / v, softmax(q kᵀ) v,
GELU MLP) is refused for the real reasons only: the MatMul of two activations and the tanh
GELU, with the LayerNorm, the Dense layers and the transpose of k translated.
"""

from __future__ import annotations

import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops
from ms_v3_helpers import COMBOS, chip_error, export_checked

import amct_bridge.mindspore as ams
from amct_bridge.errors import ExportError
from amct_bridge.espdl.v3 import simulate_espdl
from amct_bridge.records import load
from amct_bridge.records.calibration import sidecar_path


class ImageLN(nn.Cell):
    """nn.LayerNorm over (C, H, W) of the input, conv-relu, max pool, conv."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm((3, 8, 8), begin_norm_axis=1, begin_params_axis=1)
        self.conv = nn.Conv2d(3, 6, 3, pad_mode="pad", padding=1, has_bias=True)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.head = nn.Conv2d(6, 4, 1, has_bias=True)

    def construct(self, x):
        return self.head(self.pool(self.relu(self.conv(self.ln(x)))))


class TokenLN(nn.Cell):
    """(N, T, D) tokens: LayerNorm over D, Dense, exact GELU, Dense, + x, mean over T, head."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.ln = nn.LayerNorm((d,), epsilon=1e-5)
        self.fc1 = nn.Dense(d, 2 * d)
        self.gelu = nn.GELU(approximate=False)
        self.fc2 = nn.Dense(2 * d, d)
        self.head = nn.Dense(d, 5)

    def construct(self, x):
        y = x + self.fc2(self.gelu(self.fc1(self.ln(x))))
        return self.head(ops.mean(y, 1))


NETS = {"image": (ImageLN, (3, 8, 8)), "tokens": (TokenLN, (8, 8))}


def _net(name: str) -> nn.Cell:
    ms.set_seed(7)
    net = NETS[name][0]()
    rng = np.random.default_rng(2)
    ln = net.ln  # gamma and beta that are not 1 and 0
    ln.gamma.set_data(ms.Tensor(rng.uniform(0.5, 1.5, ln.gamma.shape).astype(np.float32)))
    ln.beta.set_data(ms.Tensor(rng.uniform(-0.5, 0.5, ln.beta.shape).astype(np.float32)))
    net.set_train(False)
    return net


def _x(name: str, n: int = 16) -> np.ndarray:
    shape = (n, *NETS[name][1])
    return np.random.default_rng(0).uniform(-2, 2, shape).astype(np.float32)


@pytest.fixture(scope="module", params=list(NETS))
def calibrated(request, tmp_path_factory):
    net = _net(request.param)
    record = tmp_path_factory.mktemp(request.param) / "record.txt"
    ams.calibrate(net, _x(request.param), record, algorithm="minmax")
    return request.param, net, record


def test_the_sidecar_has_the_layer_norm_ranges(calibrated):
    name, net, record = calibrated
    layers = json.loads(sidecar_path(record).read_text())["layers"]
    x = _x(name)
    y = net.ln(ms.Tensor(x)).asnumpy()
    entry = layers["ln"]
    assert (entry["input"]["min"], entry["input"]["max"]) == pytest.approx((x.min(), x.max()))
    assert (entry["output"]["min"], entry["output"]["max"]) == pytest.approx(
        (y.min(), y.max()), rel=1e-5
    )
    assert "ln" not in load(record).layers  # it stays float: no record entry


@pytest.mark.parametrize(("target", "feature_type"), COMBOS)
def test_layer_norm_first_exports_and_follows_the_net(calibrated, tmp_path, target, feature_type):
    name, net, record = calibrated
    x = _x(name)
    res, model = export_checked(net, record, tmp_path / "ln.espdl", x, target, feature_type)
    assert {r.status for r in res.layers} <= {"exported", "fused"}, res.skipped
    assert model.nodes[0].op_type == "LayerNormalization"
    assert model.nodes[0].inputs[0] == model.inputs[0].name
    want = list(net(ms.Tensor(x[:1])).shape)
    if len(want) == 4:  # NCHW -> the chip's NHWC
        want = [want[0], *want[2:], want[1]]
    assert [list(v.shape) for v in model.outputs] == [want]
    if name == "tokens":
        assert list(model.inputs[0].shape) == [1, 8, 8]  # (T, D) as the net holds it
        gelu = "Gelu" if feature_type == "s8" else "LUT"  # int16: a 65537-entry table
        assert {gelu, "Gemm", "GlobalAveragePool"} <= {n.op_type for n in model.nodes}
    if feature_type == "s16":
        err, span = chip_error(model, net, x, target)
        assert err <= 0.01 * span, (err, span)


class Block(nn.Cell):
    """A parallel Transformer block (GPT-J / PaLM): x + attention(LN(x)) + MLP(LN(x))."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.ln = nn.LayerNorm((d,))
        self.q, self.k, self.v = nn.Dense(d, d), nn.Dense(d, d), nn.Dense(d, d)
        self.softmax = nn.Softmax(-1)
        self.proj = nn.Dense(d, d)
        self.fc1, self.gelu, self.fc2 = nn.Dense(d, 2 * d), nn.GELU(), nn.Dense(2 * d, d)

    def construct(self, x):
        h = self.ln(x)
        a = self.softmax(ops.matmul(self.q(h), self.k(h).swapaxes(1, 2)) * 0.35)
        return x + self.proj(ops.matmul(a, self.v(h))) + self.fc2(self.gelu(self.fc1(h)))


def test_transformer_block_is_refused_for_the_real_reasons_only(tmp_path):
    net = Block()
    net.set_train(False)
    x = np.random.default_rng(0).uniform(-1, 1, (4, 8, 8)).astype(np.float32)
    record = tmp_path / "record.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    with pytest.raises(ExportError) as err:
        ams.export_espdl(net, record, tmp_path / "b.espdl", sample_input=(1, 8, 8),
                         format="espdl", target="esp32s3", feature_type="s16")  # fmt: skip
    lines = [ln.strip() for ln in str(err.value).splitlines()[1:] if ln.strip().startswith("layer")]
    assert [ln.split(":")[0] for ln in lines] == [
        "layer 'matmulext_op0' (MatMulExt)",
        "layer 'gelu' (GELU)",
    ]
    assert "of two activations" in lines[0] and "runtime has MatMul" in lines[0]
    assert "tanh approximation" in lines[1] and "approximate=False" in lines[1]
    assert not (tmp_path / "b.espdl").exists()
    # every other layer (LayerNorm, q / k / v, the transpose of k, fc1) was translated: a
    # refused one would be a line of its own; the rest only read the two
    assert "and 7 layer(s) that read or fuse into them" in str(err.value)


class TokenSoftmax(nn.Cell):
    """(N, T, D) tokens: LayerNorm, Dense, softmax over the last axis (per token)."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm((8,))
        self.fc = nn.Dense(8, 5)
        self.softmax = nn.Softmax(-1)

    def construct(self, x):
        return self.softmax(self.fc(self.ln(x)))


def test_token_softmax_is_per_token(tmp_path):
    ms.set_seed(8)
    net = TokenSoftmax()
    net.set_train(False)
    x = _x("tokens")
    record = tmp_path / "record.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    out = tmp_path / "s.espdl"
    _, model = export_checked(net, record, out, x, "esp32p4", "s16")
    softmax = next(n for n in model.nodes if n.op_type == "Softmax")
    assert softmax.attributes["axis"] == 2 and list(model.outputs[0].shape) == [1, 8, 5]
    step = 2.0 ** model.inputs[0].exponent
    q = np.clip(np.rint(x / step), -32768, 32767)
    chip = simulate_espdl(model, q.astype(np.int16), "esp32p4").outputs[model.outputs[0].name]
    want = net(ms.Tensor((q * step).astype(np.float32))).asnumpy()
    assert np.abs(chip - want).max() <= 0.01  # probabilities: range 1
