"""Issue 31: the v3 exponent search scores a model with GRU / LSTM layers one sample at a time
(the runtime, and the simulator, run them at batch 1), on the first ``V3_RNN_SAMPLES``
calibration samples (amct_bridge/espdl/v3/search.py).

Small keyword-spotting nets (16 steps of 10 features, random weights and biases as in
test_v3_lower_rnn.py), calibrated, exported with the range rule and with
``calibration_data``: the searched file passes ``espdl-run --check``, its note says it searched
on those samples, and its output SNR against Keras on them (each sample simulated on its own,
independently of the search's loop) is at least the range rule's. ``feature_type="auto"``
(amct_bridge/espdl/v3/mixed.py) judges such a net one sample at a time as well."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from test_v3_lower_rnn import FEATURES, STEPS
from test_v3_lower_rnn import _gru_net as gru_net
from test_v3_lower_rnn import _lstm_net as lstm_net
from v3_checks import chip_input

from amct_bridge.cli import main
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.espdl.v3.search import V3_RNN_SAMPLES
from amct_bridge.keras import calibrate, export_espdl

SAMPLES = 64


def _gru_net() -> keras.Model:
    return gru_net(seed=11, hidden=16)


def _lstm_net() -> keras.Model:
    return lstm_net(seed=12)


def _snr(back, data: np.ndarray, ref: np.ndarray) -> float:
    """The simulated chip's output SNR (dB) against ``ref``, one sample per run."""
    q, _ = chip_input(back, data, 8)
    info = back.outputs[0]
    rows = [simulate_espdl(back, q[i : i + 1]).outputs[info.name] for i in range(len(q))]
    got = np.concatenate(rows).astype(np.float64) * 2.0**info.exponent
    ref = ref.astype(np.float64).reshape(got.shape)
    return float(10 * np.log10(np.sum(ref**2) / np.sum((got - ref) ** 2)))


@pytest.mark.parametrize(("build", "target"), [(_gru_net, "esp32s3"), (_lstm_net, "esp32p4")])
def test_search_scores_recurrent_nets(tmp_path, build, target):
    keras.utils.set_random_seed(0)
    model = build()
    data = np.random.default_rng(7).normal(0, 1, (SAMPLES, STEPS, FEATURES)).astype("float32")
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    rule, searched = tmp_path / "rule.espdl", tmp_path / "searched.espdl"
    export_espdl(model, record, rule, format="espdl", target=target)
    res = export_espdl(model, record, searched, format="espdl", target=target,
                       calibration_data=data)  # fmt: skip
    note = next(n for n in res.notes if "exponents" in n)
    assert note.startswith(f"exponents searched on {V3_RNN_SAMPLES} of {SAMPLES} calibration")
    assert "GRU / LSTM layers, run one at a time" in note
    assert main(["espdl-run", str(searched), "--check"]) == 0
    scored = data[:V3_RNN_SAMPLES]  # the samples the search scored on
    ref = model.predict(scored, verbose=0)
    base = _snr(read_espdl(rule), scored, ref)
    best = _snr(read_espdl(searched), scored, ref)
    assert best >= base - 1e-9, (base, best, note)
    assert base > 20  # a working export to begin with


def test_mixed_precision_scores_a_recurrent_net(tmp_path):
    """``feature_type="auto"`` judges its int8 / int16 choices on the chip one sample at a
    time too, then searches at the widths it picked."""
    keras.utils.set_random_seed(0)
    model = _gru_net()
    data = np.random.default_rng(7).normal(0, 1, (SAMPLES, STEPS, FEATURES)).astype("float32")
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    out = tmp_path / "auto.espdl"
    res = export_espdl(model, record, out, format="espdl", target="esp32s3",
                       feature_type="auto", max_drop=0.01, calibration_data=data)  # fmt: skip
    mixed = next(n for n in res.notes if n.startswith("mixed precision"))
    assert f"of {V3_RNN_SAMPLES} calibration samples" in mixed
    assert any(n.startswith(f"exponents searched on {V3_RNN_SAMPLES}") for n in res.notes)
    assert main(["espdl-run", str(out), "--check"]) == 0
