"""keras.applications.EfficientNetB0 (Rescaling -> Normalization -> ZeroPadding2D -> stem_conv)
failed the v3 export with "model input 'input_layer': no calibrated range for it": the range of
the chip's input (the Normalization's output, run on the host) is only in the sidecar as the
input range of the conv behind the ZeroPadding2D, and the lookup did not pass a padding. The
padding adds zeros only, so |max| and the exponent are the same."""

import keras
import numpy as np

from amct_bridge.keras import calibrate, export_espdl
from amct_bridge.quant.espdl import exponent_for_absmax

L = keras.layers


def test_an_input_read_through_host_layers_and_a_padding_gets_its_range(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((10, 10, 3), name="img")
    x = L.Rescaling(1 / 255, name="scale")(inp)
    x = L.Normalization(mean=[0.4, 0.5, 0.6], variance=[0.05, 0.06, 0.07], name="norm")(x)
    x = L.ZeroPadding2D(1, name="pad")(x)
    x = L.Conv2D(4, 3, strides=2, activation="relu", name="stem")(x)
    model = keras.Model(inp, L.Dense(3, name="fc")(L.GlobalAveragePooling2D(name="gap")(x)))
    xs = np.random.default_rng(0).uniform(0, 255, (16, 10, 10, 3)).astype("float32")
    calibrate(model, xs, tmp_path / "r.txt", algorithm="minmax")
    res = export_espdl(model, tmp_path / "r.txt", tmp_path / "m.espdl", format="espdl")
    # independent: the normalised input the chip gets, from its definition
    chip_in = (xs / 255 - np.float32([0.4, 0.5, 0.6])) / np.sqrt(np.float32([0.05, 0.06, 0.07]))
    assert res.exponents["img"][0] == exponent_for_absmax(float(np.abs(chip_in).max()), 8)
    assert {x.name: x.status for x in res.layers}["norm"] == "host"
