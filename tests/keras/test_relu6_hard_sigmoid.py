"""replace_relu6 keeps the ReLU6 of a hard sigmoid (relu6(x + 3) / 6, as MobileNetV3 computes
it): there the clip is the function (issue 23 §3's follow-up: the hint was fixed, the copy
still changed the function)."""

import logging

import keras
import numpy as np

from amct_bridge.keras import replace_relu6
from amct_bridge.keras.relu6 import relu6_layers


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    x = keras.Input((4, 4, 3), name="img")
    c = keras.layers.Conv2D(4, 1, name="c")(x)
    plain = keras.layers.ReLU(6.0, name="plain")(c)
    hs = keras.layers.ReLU(6.0, name="hs_relu6")(plain + 3.0) * (1.0 / 6.0)
    return keras.Model(x, keras.layers.Multiply(name="mul")([plain, hs]))


def test_hard_sigmoid_relu6_keeps_its_clip_and_the_plain_one_becomes_relu(caplog):
    model = _model()
    with caplog.at_level(logging.WARNING, logger="amct_bridge.keras.relu6"):
        copy = replace_relu6(model)
    assert relu6_layers(model) == ["plain", "hs_relu6"]
    assert relu6_layers(copy) == ["hs_relu6"]
    assert "hs_relu6" in caplog.text and "hard sigmoid" in caplog.text
    # numpy reference of the copy: relu(conv) * clip(relu(conv) + 3, 0, 6) / 6
    x = np.random.default_rng(1).normal(0, 20, (8, 4, 4, 3)).astype(np.float32)
    kernel, bias = copy.get_layer("c").get_weights()
    conv = np.maximum(x @ kernel[0, 0] + bias, 0)
    ref = conv * np.clip(conv + 3, 0, 6) / 6
    assert conv.max() > 6  # the plain ReLU6 did clip in the original
    got = keras.ops.convert_to_numpy(copy(x))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)
