"""Issue 30: Keras GRU, LSTM and Bidirectional -> the runtime's GRU / LSTM modules
(amct_bridge/espdl/v3/lowering/rnn.py).

Tiny keyword-spotting nets (16 steps of 10 features) with random weights and random biases
(so that a wrong gate order or bias half shows), calibrated, exported for esp32s3 and esp32p4
at s8 and s16, written, read back and checked as ``espdl-run --check`` does (the embedded test
outputs are what the simulator computes for the file read back); then the simulated chip, one
sample at a time (the runtime runs batch 1), against the Keras float model run on the chip's
own quantized input: s16 within 1 % of the output range with the arg max equal on >= 95 % of
the inputs; s8 within 3 % (measured: about 1 to 1.5 %). The simulator's GRU / LSTM rest on
esp-dl's sources alone (no Espressif test file covers them, see ops/_rnn.py). Layers the
runtime cannot compute are refused by name with the reason."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from v3_checks import assert_self_check, chip_input

from amct_bridge.cli import main
from amct_bridge.errors import ExportError
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.keras import calibrate, export_espdl

L = keras.layers
STEPS, FEATURES, SAMPLES = 16, 10, 48
CASES = [(t, ft) for t in ("esp32s3", "esp32p4") for ft in ("s8", "s16")]


def _randomize(model: keras.Model, seed: int) -> keras.Model:
    """Random biases (Keras initializes them to zeros or ones) and kernels scaled up a little,
    so every gate block and both bias halves matter."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        weights = layer.get_weights()
        if weights:
            layer.set_weights(
                [w * 1.5 if w.ndim > 1 else rng.normal(0, 0.5, w.shape) for w in weights]
            )
    return model


def _gru_net(seed: int = 1, hidden: int = 0) -> keras.Model:
    """GRU(16) -> [Dense(hidden, relu) "fc1"] -> Dense(4) "fc", randomized with ``seed``."""
    x = keras.Input((STEPS, FEATURES), name="mfcc")
    h = L.GRU(16, name="gru")(x)
    if hidden:
        h = L.Dense(hidden, activation="relu", name="fc1")(h)
    return _randomize(keras.Model(x, L.Dense(4, name="fc")(h)), seed)


def _lstm_net(seed: int = 2) -> keras.Model:
    x = keras.Input((STEPS, FEATURES), name="mfcc")
    h = L.LSTM(16, return_sequences=True, name="lstm1")(x)
    h = L.LSTM(16, name="lstm2")(h)
    return _randomize(keras.Model(x, L.Dense(4, name="fc")(h)), seed)


def _directions_net() -> keras.Model:
    """Bidirectional sequences, a go_backwards layer, a Bidirectional last state."""
    x = keras.Input((STEPS, FEATURES), name="mfcc")
    h = L.Bidirectional(L.GRU(8, return_sequences=True), name="bigru")(x)
    h = L.LSTM(8, return_sequences=True, go_backwards=True, name="back")(h)
    h = L.Bidirectional(L.LSTM(4), name="bilstm")(h)
    return _randomize(keras.Model(x, L.Dense(4, name="fc")(h)), 3)


NETS = {"gru": _gru_net, "lstm": _lstm_net, "directions": _directions_net}


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """Each net calibrated once: (model, record path, data)."""
    keras.utils.set_random_seed(0)
    root = tmp_path_factory.mktemp("rnn")
    data = np.random.default_rng(5).normal(0, 1, (SAMPLES, STEPS, FEATURES)).astype("float32")
    out = {}
    for name, build in NETS.items():
        model = build()
        record = root / f"{name}.txt"
        calibrate(model, data[:32], record, algorithm="minmax")
        out[name] = (model, record, data)
    return out


def _chip(back, q: np.ndarray) -> np.ndarray:
    """The simulated chip's float output, one sample per run (the runtime runs batch 1)."""
    info = back.outputs[0]
    rows = [simulate_espdl(back, q[i : i + 1]).outputs[info.name] for i in range(len(q))]
    return np.concatenate(rows) * 2.0**info.exponent


@pytest.mark.parametrize("net", list(NETS))
@pytest.mark.parametrize(("target", "ft"), CASES)
def test_recurrent_net_exports_and_follows_keras(calibrated, tmp_path, net, target, ft):
    model, record, data = calibrated[net]
    out = tmp_path / "m.espdl"
    res = export_espdl(model, record, out, format="espdl", target=target, feature_type=ft,
                       test_input=data[:1])  # fmt: skip
    assert {x.status for x in res.layers} <= {"exported"}, res.layers
    back = read_espdl(out)
    assert_self_check(back)  # espdl-run --check: the file's own test values
    bits = 8 if ft == "s8" else 16
    dtype = np.int8 if bits == 8 else np.int16
    for node in back.nodes:
        if node.op_type not in ("GRU", "LSTM"):
            continue
        gates = 3 if node.op_type == "GRU" else 4
        dirs = 2 if node.attributes["direction"] == "bidirectional" else 1
        hidden = node.attributes["hidden_size"]
        assert node.attributes["gate_exponent"] == -9 and node.attributes["layout"] == 1
        assert node.attributes.get("linear_before_reset", 1) == 1
        w, r, b = (back.initializers[n] for n in node.inputs[1:4])
        assert w.data.dtype == r.data.dtype == dtype and b.data.dtype == np.int16
        assert list(r.data.shape) == [dirs, gates * hidden, hidden]
        assert b.exponents == [-9] and list(b.data.shape) == [dirs, 2 * gates * hidden]
    q, xq = chip_input(back, data, bits)
    got = _chip(back, q)
    ref = model.predict(xq.astype("float32"), verbose=0)
    err = np.abs(got - ref).max() / np.ptp(ref)
    agree = np.mean(got.argmax(1) == ref.argmax(1))
    if bits == 16:
        assert err <= 0.01 and agree >= 0.95, (err, agree)
    else:
        assert err <= 0.03, err


def test_espdl_run_check_on_an_lstm_file(calibrated, tmp_path, capsys):
    model, record, data = calibrated["lstm"]
    out = tmp_path / "kws.espdl"
    export_espdl(model, record, out, format="espdl", target="esp32p4", feature_type="s16",
                 test_input=data[:1])  # fmt: skip
    capsys.readouterr()
    assert main(["espdl-run", str(out), "--check"]) == 0
    assert "test outputs equal: 1/1" in capsys.readouterr().out


def test_large_gate_sums_raise_the_gate_exponent(tmp_path):
    """Weights whose gate sums could pass int16 at 2^-9 (±64): the caches would wrap, so the
    gate exponent is raised (with a note) and the chip still follows Keras."""
    x = keras.Input((6, 4), name="x")
    h = L.GRU(8, return_sequences=True, name="gru")(x)
    model = keras.Model(x, L.Dense(2, name="fc")(h))
    k, rk, b = model.get_layer("gru").get_weights()
    model.get_layer("gru").set_weights([k * 30, rk, b])
    data = np.random.default_rng(0).normal(0, 1, (8, 6, 4)).astype("float32")
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    res = export_espdl(model, record, None, format="espdl", target="esp32s3", feature_type="s16")
    node = next(n for n in res.model.nodes if n.op_type == "GRU")
    assert node.attributes["gate_exponent"] > -9
    assert any("gate exponent raised" in n and "'gru'" in n for n in res.notes)
    q, xq = chip_input(res.model, data, 16)
    ref = model.predict(xq.astype("float32"), verbose=0)
    got = _chip(res.model, q)
    assert np.abs(got - ref).max() <= 0.01 * np.ptp(ref)


def _single(layer) -> keras.Model:
    x = keras.Input((6, 4), name="x")
    h = layer(x)
    if isinstance(h, list | tuple):  # return_state: the output and the state
        h = L.Concatenate(name="cat")(list(h))
    return keras.Model(x, L.Dense(2, name="fc")(h))


@pytest.mark.parametrize(
    ("layer", "kind", "why"),
    [
        (lambda: L.GRU(4, reset_after=False, name="rnn"), "GRU", "linear_before_reset=1"),
        (lambda: L.LSTM(4, activation="relu", name="rnn"), "LSTM", "tanh and sigmoid tables"),
        (
            lambda: L.Bidirectional(L.LSTM(4), merge_mode="sum", name="rnn"),
            "Bidirectional",
            "merge_mode='concat'",
        ),
        (
            lambda: L.Bidirectional(L.SimpleRNN(4), name="rnn"),
            "Bidirectional",
            "recurrent modules are GRU and LSTM",
        ),
        (lambda: L.SimpleRNN(4, name="rnn"), "SimpleRNN", "recurrent modules are GRU and LSTM"),
        (lambda: L.GRU(4, return_state=True, name="rnn"), "GRU", "return_state"),
    ],
)
def test_recurrent_layers_the_runtime_cannot_run_are_refused(tmp_path, layer, kind, why):
    model = _single(layer())
    record = tmp_path / "r.txt"
    data = np.random.default_rng(0).normal(0, 1, (4, 6, 4)).astype("float32")
    calibrate(model, data, record, algorithm="minmax")
    with pytest.raises(ExportError, match=rf"layer 'rnn' \({kind}\): .*{why}") as err:
        export_espdl(model, record, None, format="espdl", target="c")
    assert "ESP-DL v1" not in str(err.value)
