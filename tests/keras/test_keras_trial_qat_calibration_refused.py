"""QuantCalibration in the fit of a quantize_aware model (or calibrate() on it) said "model
'functional' has no quantizable layer left (quantizable types: Conv2D, ...; skipped: none)":
the QAT wrappers hide the layers. It now says it is a QAT model and where its record comes
from; nothing is written."""

import keras
import numpy as np
import pytest

from amct_bridge.errors import CalibrationError
from amct_bridge.keras import QuantCalibration, calibrate
from amct_bridge.keras.qat import quantize_aware

L = keras.layers


def test_calibrating_a_qat_model_says_what_it_is(tmp_path):
    inp = keras.Input((6, 6, 3))
    x = L.ReLU(name="r")(L.BatchNormalization(name="bn")(L.Conv2D(3, 3, name="c")(inp)))
    model = keras.Model(inp, L.Dense(2, name="fc")(L.Flatten(name="f")(x)))
    xs = np.random.default_rng(0).uniform(0, 1, (8, 6, 6, 3)).astype("float32")
    qat = quantize_aware(model)
    qat.compile(optimizer="sgd", loss="mse")
    with pytest.raises(CalibrationError, match=r"is a QAT model \(quantize_aware; QATQuant"):
        qat.fit(xs, np.zeros((8, 2)), verbose=0, callbacks=[QuantCalibration(tmp_path / "a.txt")])
    with pytest.raises(CalibrationError, match="save_qat_record"):
        calibrate(qat, xs, tmp_path / "b.txt")
    assert list(tmp_path.iterdir()) == []
    calibrate(model, xs, tmp_path / "c.txt", algorithm="minmax")  # the float model: fine
    assert (tmp_path / "c.txt").is_file()
