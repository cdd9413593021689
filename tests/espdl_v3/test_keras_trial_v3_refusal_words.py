"""v3 refusals spoke of ESP-DL v1: a shared (now exported) or dilated Conv2D was refused with
"no ESP-DL v3 export for Conv2D: dilation (2, 2): not supported by the ESP-DL v1 exporter"
(Conv2D is exported; the dilation is the problem), NASNetMobile's Cropping2D with "Keras
Cropping2D has no ESP-DL v1 equivalent". An unstripped QAT model keeps its strip_qat hint."""

import keras
import numpy as np
import pytest

from amct_bridge.errors import ExportError
from amct_bridge.keras import calibrate, export_espdl
from amct_bridge.keras.qat import quantize_aware

L = keras.layers


def _calibrated(model, tmp_path):
    xs = np.random.default_rng(0).uniform(0, 1, (8, *model.input_shape[1:])).astype("float32")
    calibrate(model, xs, tmp_path / "r.txt", algorithm="minmax")
    return xs


def _refusal(model, record, tmp_path) -> str:
    with pytest.raises(ExportError) as err:
        export_espdl(model, record, tmp_path / "m.espdl", format="espdl")
    assert not (tmp_path / "m.espdl").exists()
    return str(err.value)


def test_v3_refusals_name_v3_and_the_problem(tmp_path):
    inp = keras.Input((8, 8, 3))
    x = L.Conv2D(3, 3, dilation_rate=2, name="dil")(inp)
    x = L.Conv2D(6, 1, groups=3, name="grp")(x)
    model = keras.Model(inp, L.Dense(2, name="fc")(L.Flatten(name="flat")(x)))
    _calibrated(model, tmp_path)
    text = _refusal(model, tmp_path / "r.txt", tmp_path)
    assert "layer 'dil'" not in text  # exported
    assert (
        "layer 'grp' (Conv2D): Conv2D with groups 3 (not depthwise): the ESP-DL v3 runtime's "
        "Conv runs group 1 or depthwise (group = channels = filters) only; split the layer into "
        "3 convs on channel slices and concatenate their outputs" in text
    )
    assert "v1" not in text.split("skip_unsupported")[1]

    x = L.UnitNormalization(name="un")(L.Conv2D(3, 1, name="c0")(inp))
    model = keras.Model(inp, L.Dense(2, name="fc")(L.Flatten(name="flat")(x)))
    _calibrated(model, tmp_path)
    text = _refusal(model, tmp_path / "r.txt", tmp_path)
    assert (
        "layer 'un' (UnitNormalization): Keras UnitNormalization is not translated by the "
        "ESP-DL v3 exporter\n" in text
    )
    assert "v1" not in text.split("skip_unsupported")[1]


def test_an_unstripped_qat_model_is_told_to_strip(tmp_path):
    inp = keras.Input((8, 8, 3))
    model = keras.Model(inp, L.Dense(2, name="fc")(L.Flatten()(L.Conv2D(3, 3, name="c")(inp))))
    xs = _calibrated(model, tmp_path)
    qat = quantize_aware(model)
    qat.compile(optimizer="sgd", loss="mse")
    qat.fit(xs, np.zeros((8, 2)), epochs=1, verbose=0)
    text = _refusal(qat, tmp_path / "r.txt", tmp_path)
    assert (
        "QATQuant is not translated by the ESP-DL v3 exporter (export strip_qat(qat_model)" in text
    )
