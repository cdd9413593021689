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
within 1 % of its range. QAT likewise: the QAT cell of that LayerNorm tracks its input too, so
the QAT sidecar gives the model input's range. ``espdl-eval`` of the token net's ``.espdl``
gives the chip the (N, T, D) data as it is and compares each cell's output as it is (not as NCW
maps). A whole Transformer block: tests/mindspore/test_ms_v3_attention.py.
"""

from __future__ import annotations

import json

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import nn, ops
from mindspore.train import Model
from ms_v3_helpers import COMBOS, chip_error, export_checked

import amct_bridge.mindspore as ams
from amct_bridge.cli import main
from amct_bridge.espdl.evaluation import snr_db
from amct_bridge.espdl.v3 import simulate_espdl
from amct_bridge.mindspore.qat import quantize_aware, save_qat_record, strip_qat
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


@pytest.mark.parametrize("mode", ["pynative"], indirect=True)
def test_qat_layer_norm_first_observes_the_model_input(mode, tmp_path):
    """quantize_aware of the token net: its nn.LayerNorm reads the model input, which no other
    cell observes; the QAT cell tracks the LayerNorm's input too, so the QAT sidecar gives the
    model input's range (before: "model input 'input0': no calibrated range") and the stripped
    net exports."""
    net = _net("tokens")
    x = _x("tokens")
    y = np.random.default_rng(1).integers(0, 5, len(x)).astype(np.int32)
    qat = quantize_aware(net, ema_decay=0.0, sample_input=(1, 8, 8))
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    data = ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False).batch(len(x))
    Model(qat, loss, nn.SGD(qat.trainable_params(), 0.0)).train(1, data)  # weights kept
    record = tmp_path / "qat.txt"
    save_qat_record(qat, record)
    entry = json.loads(sidecar_path(record).read_text())["layers"]["ln"]
    # ema_decay 0, one batch: the range of that batch, here all of x
    assert (entry["input"]["min"], entry["input"]["max"]) == pytest.approx((x.min(), x.max()))
    plain = strip_qat(qat)
    res, model = export_checked(plain, record, tmp_path / "q.espdl", x, "esp32p4", "s16")
    assert res.exponents["input0"][1] == "sidecar input range of 'ln'"
    err, span = chip_error(model, plain, x, "esp32p4")
    assert err <= 0.01 * span, (err, span)


def token_net() -> nn.Cell:
    """The token net (``--mindspore test_ms_v3_layer_norm.py:token_net``)."""
    return _net("tokens")


def test_espdl_eval_of_a_token_net_compares_tokens_as_they_are(tmp_path, capsys):
    """``espdl-eval`` of the token net's ``.espdl``: the data (N, T, D) goes to the chip as it
    is (the export's input layout "NTD"; T = D here, so transposing it as NCW would run and
    compare the wrong values). The figures are recomputed here: the chip's from the simulator
    on the untransposed data, a layer's SNR from the cell's own output."""
    net = token_net()
    x = _x("tokens", 32)
    y = net(ms.Tensor(x)).asnumpy().argmax(axis=1)  # float accuracy 1 by construction
    record = tmp_path / "record.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    out = tmp_path / "t.espdl"
    _, model = export_checked(net, record, out, x, "esp32p4", "s8")
    ms.save_checkpoint(net, str(tmp_path / "w.ckpt"))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    argv = ["espdl-eval", "--export", str(out), "--mindspore", f"{__file__}:token_net"]
    argv += ["--ckpt", str(tmp_path / "w.ckpt")]
    argv += ["--data", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy")]
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    lines = capsys.readouterr().out.splitlines()
    figures = {k: v.split()[0] for k, _, v in (ln.partition(":") for ln in lines[1:4])}
    step = 2.0 ** model.inputs[0].exponent
    q = np.clip(np.rint(x / step), -128, 127).astype(np.int8)  # esp32p4 rounds half to even
    sim = simulate_espdl(model, q, "esp32p4")
    info = model.outputs[0]
    chip = sim.outputs[info.name] * 2.0**info.exponent
    assert float(figures["float accuracy"]) == 1.0
    assert float(figures["chip accuracy"]) == pytest.approx(np.mean(chip.argmax(1) == y), abs=1e-4)
    ev = ams.evaluate_espdl(out, net, x, y)
    rows = {e.name: e for e in ev.layers}
    for name, cell in (("ln", net.ln), ("fc1", net.fc1)):
        ref = cell(ms.Tensor(x if name == "ln" else net.ln(ms.Tensor(x)).asnumpy())).asnumpy()
        e = next(v.exponent for v in model.value_info if v.name == name)
        got = sim.values[name] * 2.0**e
        assert ref.shape == got.shape == (32, 8, ref.shape[-1])
        assert rows[name].snr_db == pytest.approx(snr_db(ref, got), rel=1e-9), name
        assert rows[name].snr_db > 20.0, name  # tokens against tokens: s8's error only
