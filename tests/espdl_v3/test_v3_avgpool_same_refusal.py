"""AveragePooling2D(padding="same") that pads: the v3 runtime's AveragePool reads no
count_include_pad and divides by the whole kernel at the borders, where Keras averages the real
cells only; the export writes the AveragePool with its pads and then a Mul by the constant
border factor (kernel area / real cells per position), so the chip computes Keras' average
(docs/espdl-v3.md, "AveragePool at padded borders"). The refusal this file was named after is
gone; more shapes (2x2 "same" on an odd map, 1-D) in test_v3_lower_math.py."""

from __future__ import annotations

import keras
import numpy as np
from keras import layers as L

from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.keras import calibrate, export_espdl


def test_same_padding_average_pool_exports_with_the_border_factor(tmp_path):
    x = keras.Input((4, 4, 2), name="x")
    c = L.Conv2D(2, 1, name="c")(x)
    p = L.AveragePooling2D(3, strides=1, padding="same", name="ap")(c)
    model = keras.Model(x, p)
    data = np.random.default_rng(0).uniform(0.5, 1, (4, 4, 4, 2)).astype("float32")
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    out = tmp_path / "m.espdl"
    res = export_espdl(model, record, out, format="espdl", target="c", feature_type="s16")
    assert {r.name: r.status for r in res.layers}["ap"] == "exported"
    back = read_espdl(out)
    assert [n.op_type for n in back.nodes] == ["Conv", "AveragePool", "Mul"]
    sim = simulate_espdl(back, None)
    np.testing.assert_array_equal(sim.outputs["ap"], back.test_outputs[0].data)
    # why the Mul: at a corner Keras averages the 2x2 real cells, the runtime divides their
    # sum by 9; the chip's output (border factor included) follows Keras
    step = 2.0 ** back.inputs[0].exponent
    q = np.round(data / step)
    conv = keras.Model(x, c).predict(q * step, verbose=0)
    keras_out = model.predict(q * step, verbose=0)
    runtime_corner = conv[:, :2, :2].sum(axis=(1, 2)) / 9
    np.testing.assert_allclose(keras_out[:, 0, 0], conv[:, :2, :2].mean(axis=(1, 2)), rtol=1e-5)
    assert np.all(np.abs(runtime_corner - keras_out[:, 0, 0]) > 0.1 * np.abs(keras_out[:, 0, 0]))
    chip = simulate_espdl(back, q.astype(np.int16))
    got = chip.outputs["ap"] * 2.0 ** back.outputs[0].exponent
    assert np.abs(got - keras_out).max() <= 0.01 * np.ptp(keras_out)


def test_same_padding_that_does_not_pad_is_one_average_pool(tmp_path):
    x = keras.Input((4, 4, 2), name="x")
    p = L.AveragePooling2D(2, padding="same", name="ap")(L.Conv2D(2, 1, name="c")(x))
    model = keras.Model(x, p)
    record = tmp_path / "r.txt"
    calibrate(model, np.ones((2, 4, 4, 2), "float32"), record, algorithm="minmax")
    res = export_espdl(model, record, tmp_path / "m.espdl", format="espdl", target="c")
    assert {r.name: r.status for r in res.layers}["ap"] == "exported"
    assert [n.op_type for n in res.model.nodes] == ["Conv", "AveragePool"]
