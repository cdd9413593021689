"""A model input of unknown length (``keras.Input((None, 10))``, usual for recurrent nets) is
refused by name at the v3 export: it was a bare ``TypeError`` inside the input's lowering."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from amct_bridge.errors import ExportError
from amct_bridge.keras import calibrate, export_espdl


def test_variable_length_input_is_refused_by_name(tmp_path):
    inp = keras.Input((None, 6), name="frames")
    out = keras.layers.Dense(3, name="fc")(keras.layers.Conv1D(4, 3, name="conv")(inp))
    model = keras.Model(inp, out)
    x = np.random.default_rng(0).normal(size=(8, 12, 6)).astype(np.float32)
    record = tmp_path / "r.txt"
    calibrate(model, x, record)
    with pytest.raises(ExportError) as err:
        export_espdl(model, record, tmp_path / "m.espdl", format="espdl", target="esp32s3")
    text = str(err.value)
    assert "model input 'frames'" in text and "(None, 6)" in text
    assert "fixed" in text


def test_layer_norm_reading_the_model_input_exports(tmp_path):
    """A block that starts with LayerNormalization (a Transformer's first step) read the model
    input without any observed range ("model input: no calibrated range"): calibration now
    observes the LayerNorm's input, and the s16 chip follows Keras."""
    from amct_bridge.espdl.v3.simulate import simulate_espdl

    inp = keras.Input((8, 16), name="tokens")
    h = keras.layers.LayerNormalization(name="ln")(inp)
    out = keras.layers.Dense(4, name="fc")(h)
    model = keras.Model(inp, out)
    x = np.random.default_rng(1).normal(size=(16, 8, 16)).astype(np.float32)
    record = tmp_path / "r.txt"
    calibrate(model, x, record)
    result = export_espdl(
        model,
        record,
        tmp_path / "m.espdl",
        format="espdl",
        target="esp32s3",
        feature_type="s16",
        test_input=x[:1],
    )
    assert [n.op_type for n in result.model.nodes][0] == "LayerNormalization"
    sim = simulate_espdl(result.model)
    (name,) = sim.outputs
    got = sim.outputs[name].astype(np.float64) * 2.0 ** sim.exponents[name]
    want = model.predict(x[:1], verbose=0).reshape(got.shape)
    assert np.abs(got - want).max() <= 0.01 * (want.max() - want.min())
