"""Issue 31, "measured logit ranges": a ``Dense(activation="softmax")`` head's sidecar entry
holds the range of its logits (``preactivation``), measured by the calibration, and the plain
ESP-DL exports (no ``calibration_data``) quantize the logits at that range.

The model: an MLP trained on scikit-learn's digits whose head kernel then gets +1.0 on every
entry, a shift common to all ten logits (``sum(hidden)`` per sample) that neither the softmax
nor the arg max sees, as trained heads may have: the logits lie in about [18, 53]. Before,
v3 estimated them from the probabilities as about ±16 (exponent -3) and clipped them all to
the top: 11 % of the held-out digits kept the Keras arg max; v1 bounded them through the
weights (exponent 1). With the measured range: v3 99.7 %, v1 99.2 % (exponent -1).
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from sklearn.datasets import load_digits

from amct_bridge.espdl import simulate_chip
from amct_bridge.espdl.v3 import simulate_espdl
from amct_bridge.espdl.v3.evaluation import quantize_input
from amct_bridge.keras import QuantCalibration, calibrate, export_espdl
from amct_bridge.records.calibration import CalibrationStats, load_stats

L = keras.layers

#: float32 Keras against a float64 numpy recomputation of the same logits
TOLERANCE = {"rtol": 1e-5, "atol": 1e-4}


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """The MLP (Flatten, Dense(32, relu), Dense(10, softmax)) trained on 1400 digits, its
    head shifted (see the module docstring), calibrated on 256 of them; 397 held out."""
    data = load_digits()
    x = (data.images / 16.0)[..., None].astype("float32")
    idx = np.random.default_rng(0).permutation(len(x))
    train, test = idx[:1400], idx[1400:]
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 1))
    hidden = L.Dense(32, activation="relu", name="hid")(L.Flatten(name="flat")(inp))
    model = keras.Model(inp, L.Dense(10, activation="softmax", name="head")(hidden))
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(x[train], data.target[train], epochs=30, batch_size=32, verbose=0)
    kernel, bias = model.get_layer("head").get_weights()
    model.get_layer("head").set_weights([kernel + 1.0, bias])
    tmp = tmp_path_factory.mktemp("logits")
    calibrate(model, x[train[:256]], tmp / "record.txt")
    return {
        "model": model,
        "record": tmp / "record.txt",
        "calib": x[train[:256]],
        "x": x[test],
        "float": model.predict(x[test], verbose=0).argmax(-1),
        "tmp": tmp,
    }


def _logits(model, x: np.ndarray) -> np.ndarray:
    """The head's logits in float64 numpy from the weights (not Keras' kernels)."""
    w1, b1 = (np.float64(a) for a in model.get_layer("hid").get_weights())
    w2, b2 = (np.float64(a) for a in model.get_layer("head").get_weights())
    hidden = np.maximum(x.reshape(len(x), -1).astype(np.float64) @ w1 + b1, 0.0)
    return hidden @ w2 + b2


def _old_sidecar(d, name: str):
    """The record with a sidecar as written before the field existed (no preactivation)."""
    doc = json.loads(d["record"].with_name("record.txt.calib.json").read_text())
    for entry in doc["layers"].values():
        entry.pop("preactivation", None)
    record = d["tmp"] / f"{name}.txt"
    record.write_bytes(d["record"].read_bytes())
    record.with_name(f"{name}.txt.calib.json").write_text(json.dumps(doc))
    return record


def test_the_sidecar_holds_the_measured_logit_range(digits):
    d = digits
    stats = load_stats(d["record"].with_name("record.txt.calib.json"))
    head = stats.layers["head"]
    logits = _logits(d["model"], d["calib"])
    got = [head.preactivation.min, head.preactivation.max]
    np.testing.assert_allclose(got, [logits.min(), logits.max()], **TOLERANCE)
    assert head.output.max <= 1.0  # the output range is the probabilities'
    assert stats.layers["hid"].preactivation is None  # relu: its output range tells
    # written and read back; a sidecar without the field still loads
    again = CalibrationStats.from_json(stats.to_json())
    assert again.layers["head"].preactivation == head.preactivation
    old = json.loads(stats.to_json())
    del old["layers"]["head"]["preactivation"]
    assert CalibrationStats.from_json(json.dumps(old)).layers["head"].preactivation is None


def test_the_callback_measures_the_logits_too(digits, tmp_path):
    d = digits
    x = d["calib"][:96]
    cb = QuantCalibration(tmp_path / "r.txt", algorithm="minmax")
    d["model"].evaluate(x, np.zeros(len(x)), batch_size=32, callbacks=[cb], verbose=0)
    pre = load_stats(tmp_path / "r.txt.calib.json").layers["head"].preactivation
    logits = _logits(d["model"], x)
    np.testing.assert_allclose([pre.min, pre.max], [logits.min(), logits.max()], **TOLERANCE)


def test_v1_plain_s8_export_quantizes_the_measured_logits(digits):
    d = digits
    res = export_espdl(d["model"], d["record"], d["tmp"] / "v1", target="esp32s3")
    (head,) = [x for x in res.layers if x.name == "head"]
    assert head.sources["output_exponent"] == "sidecar logit range of 'head' (before its softmax)"
    assert not any("bounds the logits" in w for w in res.warnings)
    logits = simulate_chip(res, d["x"]).output.to_float().reshape(len(d["x"]), -1)
    assert (logits.argmax(-1) == d["float"]).mean() >= 0.95


@pytest.mark.parametrize("target", ["esp32s3", "esp32p4"])
def test_v3_plain_s8_export_quantizes_the_measured_logits(digits, target):
    d = digits
    res = export_espdl(d["model"], d["record"], None, format="espdl", target=target)
    exp, source = res.exponents["head/linear"]  # the Gemm's logits, before its Softmax node
    assert source == "sidecar pre-activation range of 'head' (before its softmax)"
    want = _logits(d["model"], d["calib"])
    assert 2.0**exp * 127 >= np.abs(want).max()  # covers the logits: nothing clips
    chip = simulate_espdl(res.model, quantize_input(res.model, d["x"], target), target)
    pred = chip.outputs["head"].reshape(len(d["x"]), -1).argmax(-1)
    assert (pred == d["float"]).mean() >= 0.95


def test_an_old_sidecar_keeps_the_estimates_with_their_warnings(digits):
    d = digits
    record = _old_sidecar(d, "old")
    v1 = export_espdl(d["model"], record, d["tmp"] / "v1_old", target="esp32s3")
    (head,) = [x for x in v1.layers if x.name == "head"]
    assert head.sources["output_exponent"].startswith("bound of the logits from the sidecar")
    assert any("has no measured logit range" in w for w in v1.warnings)
    v3 = export_espdl(d["model"], record, None, format="espdl", target="esp32p4")
    assert v3.exponents["head/linear"][1].startswith("pre-activation range of softmax")
    assert any("estimated from the calibrated probabilities" in w for w in v3.warnings)
