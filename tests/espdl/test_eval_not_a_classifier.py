"""Issue 33 §1: ``espdl-eval`` (ESP-DL v1 and v3) and ``report`` printed "accuracy 0.0000" for
a dense autoencoder scored with 0/1 anomaly labels: the arg max of the reconstruction against
the labels, a number computed on another tensor. Now they say why there is no accuracy and give
the model output's SNR and MSE against the float model's, checked here against numpy on the
simulators' and the fake-quantized model's outputs."""

from __future__ import annotations

import math
import re

import keras
import numpy as np
import pytest

from amct_bridge.cli import main
from amct_bridge.espdl.v1.chip import simulate_chip
from amct_bridge.espdl.v3.evaluation import quantize_input
from amct_bridge.espdl.v3.reader import read_espdl
from amct_bridge.espdl.v3.simulate import simulate_espdl
from amct_bridge.keras import calibrate, simulate
from amct_bridge.records import load
from amct_bridge.report.metrics import classification_problem


def _snr(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64).reshape(ref.shape)
    return 10 * math.log10(np.sum(ref**2) / np.sum((ref - got) ** 2))


def _mse(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64).reshape(ref.shape)
    return float(np.mean((ref - got) ** 2))


@pytest.fixture(scope="module")
def autoencoder(tmp_path_factory):
    """64 -> 16 -> 64 dense autoencoder, calibrated, exported to v1 and v3; 0/1 labels."""
    d = tmp_path_factory.mktemp("ae")
    keras.utils.set_random_seed(0)
    x_in = keras.Input((64,), name="x")
    h = keras.layers.Dense(16, activation="relu", name="enc")(x_in)
    model = keras.Model(x_in, keras.layers.Dense(64, name="dec")(h))
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (64, 64)).astype("float32")
    y = (rng.uniform(0, 1, 64) > 0.8).astype("int64")  # anomaly flags
    model.save(d / "ae.keras")
    calibrate(model, x, d / "r.txt", algorithm="minmax")
    np.savez(d / "val.npz", x=x, y=y)
    np.save(d / "x.npy", x)
    np.save(d / "y.npy", y)
    base = ["export-espdl", "--record", str(d / "r.txt"), "--model", str(d / "ae.keras")]
    assert main([*base, "--out", str(d / "v1"), "--target", "esp32s3"]) == 0
    assert main([*base, "--out", str(d / "ae.espdl"), "--format", "espdl"]) == 0
    return d, model, x, y


def _figures(text: str, what: str) -> tuple[float, float]:
    found = re.search(rf"^{what} output: +SNR (-?[\d.]+|inf) dB, MSE ([\d.e+-]+)", text, re.M)
    assert found, text
    return float(found.group(1)), float(found.group(2))


@pytest.mark.parametrize("fmt", ["v1", "espdl"])
def test_espdl_eval_gives_no_accuracy_and_the_output_snr_and_mse(autoencoder, fmt, capsys):
    d, model, x, _ = autoencoder
    export = d / ("v1" if fmt == "v1" else "ae.espdl")
    argv = ["espdl-eval", "--export", str(export), "--model", str(d / "ae.keras")]
    assert main([*argv, "--record", str(d / "r.txt"), "--data", str(d / "val.npz")]) == 0
    out = capsys.readouterr().out
    assert "accuracy:      " not in out and "0.0000" not in out, out  # no accuracy at all
    assert (
        "accuracy: n/a (the model output 'dec' is not a class vector for these labels: it has "
        "64 values per sample, the labels name 2 classes (0..1), and its arg max is outside "
        "them on"
    ) in out, out
    ref = model.predict(x, verbose=0)
    # independent: the chip's output from the simulator itself, the fake-quant from simulate()
    if fmt == "v1":
        chip = simulate_chip(str(export), x).output.to_float()
    else:
        espdl = read_espdl(export)
        ints = quantize_input(espdl, x, "esp32s3")
        result = simulate_espdl(espdl, ints, "esp32s3")
        chip = np.ldexp(result.values["dec"].astype(np.float64), espdl.outputs[0].exponent)
    fq = simulate(model, load(d / "r.txt")).predict(x, verbose=0)
    for what, got in (("chip", chip), ("fake-quant", fq)):
        snr, mse = _figures(out, what)
        assert snr == pytest.approx(_snr(ref, got), abs=0.051), what
        assert mse == pytest.approx(_mse(ref, got), rel=1e-3), what
    # the per-layer table is still there, with the output's row
    assert re.search(r"^dec +\S+ +-?\d+ +[\d.]+ ", out, re.M), out


def test_report_gives_no_accuracy_and_the_output_mse(autoencoder, capsys, tmp_path):
    d, model, x, _ = autoencoder
    argv = ["report", "--record", str(d / "r.txt"), "--model", str(d / "ae.keras")]
    json_out = tmp_path / "rep.json"
    assert (
        main(
            [*argv, "--data", str(d / "x.npy"), "--labels", str(d / "y.npy")]
            + [
                "--json",
                str(json_out),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "accuracy: n/a (the model output is not a class vector for these labels: " in out
    assert "accuracy: float" not in out
    fq = simulate(model, load(d / "r.txt")).predict(x, verbose=0)
    ref = model.predict(x, verbose=0)
    found = re.search(r"^model output MSE: all quantized ([\d.e+-]+)", out, re.M)
    assert found and float(found.group(1)) == pytest.approx(_mse(ref, fq), rel=1e-3), out
    found = re.search(r"^model output SNR: all quantized ([\d.]+) dB", out, re.M)
    assert found and float(found.group(1)) == pytest.approx(_snr(ref, fq), abs=0.051)
    import json

    doc = json.loads(json_out.read_text())
    assert doc["no_accuracy"].startswith("the model output is not a class vector")
    assert doc["float_accuracy"] is None and doc["mse_model_quantized"] == pytest.approx(
        _mse(ref, fq), rel=1e-6
    )
    assert all(row["accuracy_drop"] is None for row in doc["rows"])


def test_what_counts_as_a_class_vector():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(200, 10))
    labels = logits.argmax(axis=1)
    assert classification_problem(logits, labels) == ""  # a classifier
    assert classification_problem(logits, np.eye(10)[labels]) == ""  # one-hot labels
    # a classifier scored on a few of its classes (its arg max stays inside them)
    few = labels < 3
    assert classification_problem(logits[few], labels[few]) == ""
    # a binary classifier's one probability per sample
    assert classification_problem(rng.uniform(size=(50, 1)), rng.integers(0, 2, 50)) == ""
    # not class vectors: an autoencoder's reconstruction with 0/1 labels, digit labels for a
    # 784-pixel reconstruction, labels that are not class indices, maps, other widths
    recon = rng.uniform(size=(100, 64))
    assert "the labels name 2 classes" in classification_problem(recon, rng.integers(0, 2, 100))
    assert "arg max is outside" in classification_problem(
        rng.uniform(size=(100, 784)), rng.integers(0, 10, 100)
    )
    assert "not class indices (0.5 at sample 0)" in classification_problem(
        logits[:2], np.array([0.5, 1.0])
    )
    assert "not one-hot" in classification_problem(recon, recon)  # targets as "labels"
    assert "a map" in classification_problem(rng.uniform(size=(4, 8, 8, 3)), np.arange(4))
    assert "the labels name class 12" in classification_problem(logits[:3], np.array([0, 12, 1]))
    assert "one-hot labels 3 classes" in classification_problem(logits[:3], np.eye(3))
