"""Issue 31's done-when on a small CNN trained on scikit-learn's digits, with a
``Dense(activation="softmax")`` head: with calibration data (``calibration_data=`` /
``--data``) the s8 chip keeps the float arg max on >= 95 % of the held-out digits, v3 and v1,
and the v3 chip is within 1 point of float accuracy on esp32s3 and esp32p4 (PTQ). The chip's
outputs come from simulate_espdl / simulate_chip of the exported file, compared with Keras'
own predictions; the CLI's ``--data`` with ``--format espdl`` writes a searched file."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from digits_cnn import trained_digits_cnn

from amct_bridge.cli import main
from amct_bridge.espdl import simulate_chip
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.espdl.v3.evaluation import quantize_input
from amct_bridge.keras import export_espdl

L = keras.layers


@pytest.fixture(scope="module")
def digits(tmp_path_factory, once):
    """A CNN trained on 1400 digits (8x8, [0, 1]), calibrated on 256 of them; 397 held out."""
    return trained_digits_cnn(tmp_path_factory.mktemp("digits"), once)


@pytest.mark.parametrize("target", ["esp32s3", "esp32p4"])
def test_v3_s8_with_data_keeps_float_accuracy(digits, target):
    d = digits
    res = export_espdl(
        d["model"], d["record"], None, format="espdl", target=target, calibration_data=d["calib"]
    )
    assert any(w.startswith("exponents searched on 512 of 512") for w in res.warnings)
    chip = simulate_espdl(res.model, quantize_input(res.model, d["x"], target), target)
    pred = chip.outputs["head"].reshape(len(d["x"]), -1).argmax(-1)
    float_acc, chip_acc = (d["float"] == d["y"]).mean(), (pred == d["y"]).mean()
    assert chip_acc >= float_acc - 0.01, (chip_acc, float_acc)
    assert (pred == d["float"]).mean() >= 0.95


def test_v1_s8_dense_softmax_head_keeps_the_float_argmax(digits):
    """v1 leaves the softmax to the host; the range rule takes the logits' range the
    calibration measured (output_exponent -3 here; before the sidecar had it, a bound through
    the weights: 0, step 1.0, which the search moved), and the search keeps the arg max."""
    d = digits
    res = export_espdl(d["model"], d["record"], None, target="esp32s3", calibration_data=d["calib"])
    (head,) = [x for x in res.layers if x.name == "head"]
    assert head.entry["output_exponent"] <= -2  # not the bound's 0
    assert any(w.startswith("exponents searched") for w in res.warnings)
    logits = simulate_chip(res, d["x"]).output.to_float().reshape(len(d["x"]), -1)
    assert (logits.argmax(-1) == d["float"]).mean() >= 0.95


def test_cli_data_with_format_espdl_writes_a_searched_file(digits, tmp_path, capsys):
    d = digits
    model_path, data_path = tmp_path / "m.keras", tmp_path / "x.npy"
    d["model"].save(model_path)
    np.save(data_path, d["calib"][:64])
    out = tmp_path / "m.espdl"
    argv = ["export-espdl", "--format", "espdl", "--record", str(d["record"])]
    argv += ["--model", str(model_path), "--out", str(out), "--data", str(data_path)]
    assert main([*argv, "--target", "esp32p4"]) == 0
    err = capsys.readouterr().err
    assert "exponents searched on 64 of 64 calibration samples" in err
    model = read_espdl(out)
    chip = simulate_espdl(model, quantize_input(model, d["x"], "esp32p4"))
    pred = chip.outputs["head"].reshape(len(d["x"]), -1).argmax(-1)
    assert (pred == d["float"]).mean() >= 0.95
    assert main([*argv, "--overwrite", "--exponents", "max"]) == 0  # the range rule
    assert "exponents searched" not in capsys.readouterr().err
