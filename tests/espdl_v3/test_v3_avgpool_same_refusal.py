"""AveragePooling2D(padding="same") that pads stays refused in v3, with the runtime's reason:
its AveragePool reads no count_include_pad and divides by the whole kernel at the borders,
where Keras averages the real cells only. Checked here on numbers: the two averages differ at
a corner by the ratio of the areas (docs/espdl-v3.md, "AveragePool at padded borders")."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras import layers as L

from amct_bridge.errors import ExportError
from amct_bridge.keras import calibrate, export_espdl


def test_same_padding_average_pool_is_refused_with_the_runtime_reason(tmp_path):
    x = keras.Input((4, 4, 2), name="x")
    c = L.Conv2D(2, 1, name="c")(x)
    p = L.AveragePooling2D(3, strides=1, padding="same", name="ap")(c)
    model = keras.Model(x, p)
    data = np.random.default_rng(0).uniform(0.5, 1, (2, 4, 4, 2)).astype("float32")
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    out = tmp_path / "m.espdl"
    with pytest.raises(ExportError, match=r"layer 'ap'.*count_include_pad.*whole kernel"):
        export_espdl(model, record, out, format="espdl", target="c")
    assert not out.exists()
    # why: at a corner Keras averages the 2x2 real cells, the runtime divides their sum by 9
    conv = keras.Model(x, c).predict(data, verbose=0)
    keras_corner = model.predict(data, verbose=0)[:, 0, 0]
    runtime_corner = conv[:, :2, :2].sum(axis=(1, 2)) / 9
    np.testing.assert_allclose(keras_corner, conv[:, :2, :2].mean(axis=(1, 2)), rtol=1e-5)
    assert np.all(np.abs(runtime_corner - keras_corner) > 0.1 * np.abs(keras_corner))


def test_same_padding_that_does_not_pad_exports(tmp_path):
    x = keras.Input((4, 4, 2), name="x")
    p = L.AveragePooling2D(2, padding="same", name="ap")(L.Conv2D(2, 1, name="c")(x))
    model = keras.Model(x, p)
    record = tmp_path / "r.txt"
    calibrate(model, np.ones((2, 4, 4, 2), "float32"), record, algorithm="minmax")
    res = export_espdl(model, record, tmp_path / "m.espdl", format="espdl", target="c")
    assert {r.name: r.status for r in res.layers}["ap"] == "exported"
