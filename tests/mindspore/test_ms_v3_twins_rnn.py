"""Issue 30, MindSpore: nn.GRU and nn.LSTM (batch_first, one layer, either direction) export to
ESP-DL v3 as the runtime's GRU / LSTM nodes, through the core's rnn lowering.

Tiny keyword-spotting nets, input (N, T=8, F=6): an nn.GRU / nn.LSTM of 8 units, then its last
step ``y[:, -1]`` (one direction: the layer's last state, ``return_sequences=False``) or the
mean over the steps (bidirectional), then nn.Dense(4). Weights and biases are random (biases
scaled up, so a wrong gate order or bias half shows).

- Calibrated by MindSpore (which observes the cell's input and output sequence), exported for
  esp32s3 and esp32p4 at s8 and s16; the written file passes ``espdl-run --check``; at s16 the
  simulated chip, one sample at a time (the runtime runs batch 1), follows the net's own float
  output within 1 % of its range with the arg max equal on >= 95 % of the inputs.
- Each has a Keras twin (GRU ``reset_after=True`` / LSTM / Bidirectional, weights converted
  here gate by gate with explicit loops: MindSpore's GRU gates r, z, n are Keras' z, r, h in
  another order, its two LSTM biases Keras' one): the twins compute the same function, and both
  exports of one record hold the same integers.
- What the runtime cannot run is refused naming the cell and why.
"""

from __future__ import annotations

import keras
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops
from ms_v3_helpers import COMBOS, export_checked, twin_exports_equal

import amct_bridge.keras as akeras
import amct_bridge.mindspore as ams
from amct_bridge.errors import ExportError
from amct_bridge.espdl.v3 import simulate_espdl

L = keras.layers
T, F, H = 8, 6, 8


class Kws(nn.Cell):
    """``cell`` ("GRU" / "LSTM") over (N, T, F), its last step (one direction) or the mean over
    the steps (bidirectional), then nn.Dense(4)."""

    def __init__(self, cell: str, bidirectional: bool = False) -> None:
        super().__init__()
        self.bidirectional = bidirectional
        self.rnn = getattr(nn, cell)(F, H, batch_first=True, bidirectional=bidirectional)
        self.fc = nn.Dense(2 * H if bidirectional else H, 4)

    def construct(self, x):
        y, _ = self.rnn(x)
        return self.fc(ops.mean(y, 1) if self.bidirectional else y[:, -1])


NETS = {"gru": ("GRU", False), "lstm": ("LSTM", False), "bigru": ("GRU", True),
        "bilstm": ("LSTM", True)}  # fmt: skip


def _net(name: str) -> Kws:
    ms.set_seed(2)
    net = Kws(*NETS[name])
    rng = np.random.default_rng(7)
    for p in net.rnn.get_parameters():
        value = p.asnumpy()
        value = rng.normal(0, 0.4, value.shape) if value.ndim == 1 else value * 1.5
        p.set_data(ms.Tensor(value.astype(np.float32)))
    net.set_train(False)
    return net


def _x(n: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (n, T, F)).astype(np.float32)


def _chip(model, net, x: np.ndarray, target: str) -> tuple[np.ndarray, np.ndarray]:
    """(simulated chip, net float output) on ``x`` quantized at the file's input exponent (the
    net runs on the same quantized values), one sample per run: the runtime runs batch 1."""
    info, out = model.inputs[0], model.outputs[0]
    bits = 8 if info.elem_type == 3 else 16
    step = 2.0**info.exponent
    rounded = np.rint(x / step) if target == "esp32p4" else np.floor(x / step + 0.5)
    q = np.clip(rounded, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    q = q.astype(np.int8 if bits == 8 else np.int16)
    rows = [simulate_espdl(model, q[i : i + 1], target).outputs[out.name] for i in range(len(q))]
    chip = np.concatenate(rows) * 2.0**out.exponent
    want = net(ms.Tensor((q * step).astype(np.float32))).asnumpy()
    return chip, want


@pytest.fixture(scope="module", params=list(NETS))
def calibrated(request, tmp_path_factory):
    net = _net(request.param)
    record = tmp_path_factory.mktemp(request.param) / "record.txt"
    ams.calibrate(net, _x(), record, algorithm="minmax")
    return request.param, net, record


@pytest.mark.parametrize(("target", "feature_type"), COMBOS)
def test_recurrent_net_exports_and_follows_the_net(calibrated, tmp_path, target, feature_type):
    name, net, record = calibrated
    x = _x()
    res, model = export_checked(net, record, tmp_path / "kws.espdl", x, target, feature_type)
    statuses = {r.name: r.status for r in res.layers}
    assert statuses["rnn"] == "exported" and statuses["fc"] == "exported", res.layers
    assert "refused" not in statuses.values()
    cell, bidirectional = NETS[name]
    (node,) = [n for n in model.nodes if n.op_type in ("GRU", "LSTM")]
    assert node.op_type == cell and node.name == "rnn"
    assert node.attributes["direction"] == ("bidirectional" if bidirectional else "forward")
    if not bidirectional:  # y[:, -1] is the layer's last state: nothing else written
        assert statuses["stridedslice_op0"] == "passthrough"
    if feature_type == "s16":
        chip, want = _chip(model, net, _x(24, seed=3), target)
        err = np.abs(chip - want).max() / np.ptp(want)
        agree = np.mean(chip.argmax(1) == want.argmax(1))
        assert err <= 0.01 and agree >= 0.95, (err, agree)


def _gates(m: np.ndarray, cell: str) -> np.ndarray:
    """MindSpore gate blocks (axis 0) in Keras' order, block by block: GRU r, z, n -> z, r, h;
    LSTM i, f, g, o as they are."""
    order = (1, 0, 2) if cell == "GRU" else (0, 1, 2, 3)
    out = np.empty_like(m)
    for k, src in enumerate(order):
        for j in range(H):
            out[k * H + j] = m[src * H + j]
    return out


def _keras_weights(net: Kws, cell: str, direction: int) -> list[np.ndarray]:
    """One direction's Keras weights [kernel (F, G·H), recurrent (H, G·H), bias]."""
    rnn = net.rnn

    def get(params) -> np.ndarray:
        return params[direction].asnumpy()

    kernel = _gates(get(rnn.w_ih_list), cell).T.copy()
    recurrent = _gates(get(rnn.w_hh_list), cell).T.copy()
    b_ih, b_hh = _gates(get(rnn.b_ih_list), cell), _gates(get(rnn.b_hh_list), cell)
    bias = np.stack([b_ih, b_hh]) if cell == "GRU" else b_ih + b_hh
    return [kernel, recurrent, bias]


def _twin(name: str, net: Kws) -> keras.Model:
    cell, bidirectional = NETS[name]
    x = keras.Input((T, F), name="input0")
    make = getattr(L, cell)
    if bidirectional:
        rnn = L.Bidirectional(make(H, return_sequences=True), name="rnn")
        y = L.GlobalAveragePooling1D(name="reducemean_op0")(rnn(x))
    else:
        rnn = make(H, name="rnn")
        y = rnn(x)
    model = keras.Model(x, L.Dense(4, name="fc")(y))
    weights = _keras_weights(net, cell, 0)
    if bidirectional:
        weights += _keras_weights(net, cell, 1)
    rnn.set_weights(weights)
    model.get_layer("fc").set_weights([net.fc.weight.asnumpy().T, net.fc.bias.asnumpy()])
    return model


@pytest.mark.parametrize("name", list(NETS))
def test_keras_twin_exports_equal_integers(name, tmp_path):
    net = _net(name)
    model = _twin(name, net)
    x = _x(16, seed=1)
    want = net(ms.Tensor(x)).asnumpy()
    np.testing.assert_allclose(model.predict(x, verbose=0), want, atol=1e-5)
    record = tmp_path / "record.txt"
    akeras.calibrate(model, x, record, algorithm="minmax")
    twin_exports_equal(model, net, record, tmp_path, x, x, (1, T, F))


class Odd(nn.Cell):
    """An nn.GRU the runtime cannot run as written (``how``)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        layers = 2 if how == "layers" else 1
        bidirectional = how == "bidirectional_last"
        time_major = how == "time_major"
        self.rnn = nn.GRU(F, H, layers, batch_first=not time_major, bidirectional=bidirectional)
        self.fc = nn.Dense(2 * H if bidirectional else H, 4)

    def construct(self, x):
        y, h = self.rnn(x)
        if self.how == "state":
            return self.fc(h[0])
        if self.how == "time_major":
            return self.fc(y[-1])
        return self.fc(y[:, -1])


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("layers", r"'rnn' \(GRU\): .*num_layers=2 \(the runtime's GRU node is one layer: stack"),
        ("state", r"'rnn' \(GRU\): .*its final states h_n / c_n read"),
        ("time_major", r"'rnn' \(GRU\): .*batch_first=False \(the runtime reads a sequence"),
        (
            "bidirectional_last",
            r"'stridedslice_op0' \(StridedSlice\): y\[:, -1\] of the bidirectional GRU 'rnn': "
            r"its backward half at the last step has read one step only",
        ),
    ],
)
def test_what_the_runtime_cannot_run_is_refused_by_name(how, why, tmp_path):
    ms.set_seed(0)
    net = Odd(how)
    net.set_train(False)
    sample = (T, 1, F) if how == "time_major" else (1, T, F)  # time-major: (T, N, F)
    x = np.random.default_rng(0).normal(0, 1, (4, T, F)).astype(np.float32)
    if how == "time_major":
        x = x.transpose(1, 0, 2)
    record = tmp_path / "record.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    with pytest.raises(ExportError, match=why):
        ams.export_espdl(net, record, tmp_path / "m.espdl", sample_input=sample, format="espdl",
                         target="esp32s3")  # fmt: skip
    assert not (tmp_path / "m.espdl").exists()
