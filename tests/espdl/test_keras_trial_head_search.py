"""The exponent search (``calibration_data=``) on a model ending in ``Dense(activation=
"softmax")``: the chip computes the logits (the softmax is left to the host), but the search
compared them with the model's probabilities. It reported "-2.2 dB with the range rule" for
an export whose logits were at 41 dB, and "improved" that by moving the model input's exponent
from -6 to -4 (a [0, 1] input on 16 steps): the searched logits fell to 22 dB. The search now
compares logits with the float logits."""

import re

import keras
import numpy as np

from amct_bridge.espdl import simulate_chip
from amct_bridge.keras import calibrate, export_espdl

L = keras.layers


def _snr(ref, got):
    return 10 * np.log10((ref**2).sum() / ((ref - got) ** 2).sum())


def test_search_on_a_softmax_head_compares_logits(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((12, 12, 3))
    a = L.ReLU(name="r1")(L.BatchNormalization(name="bn1")(L.Conv2D(8, 3, name="c1")(inp)))
    b = L.SeparableConv2D(8, 3, padding="same", activation="relu", name="sep")(a)
    g = L.GlobalAveragePooling2D(name="gap")(L.Concatenate(name="cat")([a, b]))
    model = keras.Model(inp, L.Dense(4, activation="softmax", name="head")(g))
    x = np.random.default_rng(0).uniform(0, 1, (64, 12, 12, 3)).astype("float32")
    calibrate(model, x, tmp_path / "r.txt", algorithm="minmax")
    # independent reference: the logits from the float pooled features and the head's weights
    gap = keras.Model(model.input, model.get_layer("gap").output).predict(x, verbose=0)
    kernel, bias = model.get_layer("head").get_weights()
    logits = gap.astype(np.float64) @ kernel + bias

    export_espdl(model, tmp_path / "r.txt", tmp_path / "max", target="esp32s3")
    chip_max = simulate_chip(tmp_path / "max", x, target="esp32s3").output.to_float()
    res = export_espdl(
        model, tmp_path / "r.txt", tmp_path / "s", target="esp32s3", calibration_data=x
    )
    chip_search = simulate_chip(tmp_path / "s", x, target="esp32s3").output.to_float()
    note = next(w for w in res.warnings if w.startswith("exponents searched"))
    said = float(re.search(r"output SNR (-?[\d.]+) dB with the range rule", note).group(1))
    assert abs(said - _snr(logits, chip_max)) < 0.2, note  # said -2.2 for a 30+ dB export
    assert _snr(logits, chip_search) >= _snr(logits, chip_max) - 0.1, note
