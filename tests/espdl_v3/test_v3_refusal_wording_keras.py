"""Refusals of the Keras ESP-DL exports name the format being exported: the v3 export said
"no ESP-DL v3 export for Conv2DTranspose: Keras Conv2DTranspose has no ESP-DL v1 equivalent".
Every layer below reads the model input, so each has its own line in both refusals. Since
issue 30 the v3 export lowers the transposed, dilated and GELU layers (v3 text None: no
refusal line); v1 still refuses them."""

import keras
import numpy as np
import pytest

from amct_bridge.errors import ExportError
from amct_bridge.keras import calibrate, export_espdl

L = keras.layers

# layer: (v1 text, v3 text)
EXPECTED = {
    "tr": ("Keras Conv2DTranspose has no ESP-DL v1 equivalent", None),
    "dil": ("dilation (2, 2): not supported by the ESP-DL v1 exporter", None),
    "grp": (
        "groups 2: not supported by the ESP-DL v1 exporter",
        "Conv2D with groups 2 (not depthwise): the ESP-DL v3 runtime's Conv runs group 1 or "
        "depthwise",
    ),
    "r4": (
        "ReLU max_value 4.0: ESP-DL v1 cannot clip",
        "ReLU max_value 4.0: not translated for ESP-DL v3",
    ),
    "rt": (
        "ReLU threshold 0.5: ESP-DL v1 has none",
        "ReLU threshold 0.5: not translated for ESP-DL v3",
    ),
    "g": ("activation 'gelu': ESP-DL v1 has no such layer", None),
}


def test_keras_refusals_name_the_format(tmp_path):
    x = keras.Input((6, 6, 2), name="img")
    outs = [
        L.Conv2D(4, 3, groups=2, name="grp")(x),
        L.Conv2DTranspose(2, 3, strides=2, name="tr")(x),
        L.Conv2D(2, 3, dilation_rate=2, name="dil")(x),
        L.ReLU(max_value=4.0, name="r4")(x),
        L.ReLU(threshold=0.5, name="rt")(x),
        L.Activation("gelu", name="g")(x),
    ]
    model = keras.Model(x, outs)
    data = np.random.default_rng(0).normal(0, 1, (8, 6, 6, 2)).astype("float32")
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    for k, fmt in enumerate(("v1", "espdl")):
        out = tmp_path / ("v1" if fmt == "v1" else "m.espdl")
        with pytest.raises(ExportError) as err:
            export_espdl(model, record, out, format=fmt)
        text = str(err.value)
        for layer, texts in EXPECTED.items():
            lines = [ln for ln in text.splitlines() if f"layer {layer!r}" in ln]
            if texts[k] is None:  # exported
                assert lines == [], lines
                continue
            assert texts[k] in lines[0], lines
        if fmt == "espdl":
            assert "v1" not in text, text
        assert not out.exists()
