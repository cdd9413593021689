"""An Add whose inputs were both 0 on every calibration batch (two dead branches; found on a
keras.applications MobileNetV2 after QAT, where block_11's branch collapsed to 0): its sidecar
range is [0, 0], and the export gave the Add2D exponent 0. Everything after it then sat on whole
numbers: the v1 chip's next Add2D (the sum takes the larger exponent) floored the live path to
integers (-122 dB in espdl-eval). The Add now takes its inputs' largest exponent, with a warning,
in v1 and v3."""

import keras
import numpy as np

from amct_bridge.espdl import simulate_chip
from amct_bridge.keras import calibrate, export_espdl
from amct_bridge.quant.espdl import exponent_for_absmax

L = keras.layers


def _model():
    keras.utils.set_random_seed(0)
    inp = keras.Input((12, 12, 3), name="img")
    x = L.Conv2D(8, 3, padding="same", activation="relu", name="stem")(inp)
    b1 = L.BatchNormalization(gamma_initializer="zeros", beta_initializer="zeros", name="bn1")(
        L.Conv2D(8, 1, use_bias=False, name="b1")(x)
    )
    b2 = L.BatchNormalization(gamma_initializer="zeros", beta_initializer="zeros", name="bn2")(
        L.Conv2D(8, 1, use_bias=False, name="b2")(x)
    )
    dead = L.Add(name="dead")([b1, b2])
    s = L.Add(name="res")([x, dead])
    out = L.Dense(4, name="fc")(L.GlobalAveragePooling2D(name="gap")(s))
    return keras.Model(inp, out)


def test_an_add_of_two_dead_branches_keeps_its_inputs_exponent(tmp_path):
    model = _model()
    xs = np.random.default_rng(0).random((24, 12, 12, 3), dtype=np.float32)
    calibrate(model, xs, tmp_path / "r.txt", algorithm="minmax")
    # independent: the stem's output exponent from its float output on the same data
    stem = keras.Model(model.input, model.get_layer("stem").output).predict(xs, verbose=0)
    e_stem = exponent_for_absmax(float(np.abs(stem).max()), 8)

    res = export_espdl(model, tmp_path / "r.txt", tmp_path / "e", target="esp32s3")
    runtime = {r.name: r.output_exponent for r in res.runtime}
    assert runtime["dead"] == e_stem  # was 0
    assert any("'dead' was 0 on every calibration batch" in w for w in res.warnings)
    got = simulate_chip(tmp_path / "e", xs, target="esp32s3").output.to_float()
    want = model.predict(xs, verbose=0)
    snr = 10 * np.log10((want**2).sum() / ((want - got) ** 2).sum())
    assert snr > 20

    v3 = export_espdl(
        model, tmp_path / "r.txt", tmp_path / "m.espdl", format="espdl", target="esp32s3"
    )
    assert v3.exponents["dead"][0] == e_stem  # was 0
    assert any("'dead' was 0 on every calibration batch" in w for w in v3.warnings)
