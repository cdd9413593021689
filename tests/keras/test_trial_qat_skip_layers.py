"""Keras twin of the MindSpore trial's QAT ``skip_layers`` regression (issue 21 trial)."""

from __future__ import annotations

import json

import keras
import numpy as np

from amct_bridge.keras import export_espdl
from amct_bridge.keras.qat import quantize_aware, save_qat_record, strip_qat


def test_a_skip_layers_classifier_keeps_its_output_range_for_the_export(tmp_path):
    """``quantize_aware(skip_layers=["fc"])``: the float classifier had no sidecar entry and
    the ESP-DL export stopped ('no calibrated output range for 'fc''). It is observed now; with
    SGD at learning rate 0 its range is the float model's logits on the one batch."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6, 6, 1)),
            keras.layers.Conv2D(4, 3, activation="relu", name="c"),
            keras.layers.Flatten(name="f"),
            keras.layers.Dense(3, name="fc"),
            keras.layers.Softmax(name="sm"),
        ]
    )
    qat = quantize_aware(model, skip_layers=["fc"])
    qat.compile(optimizer=keras.optimizers.SGD(0.0), loss="sparse_categorical_crossentropy")
    x = np.random.default_rng(0).normal(size=(8, 6, 6, 1)).astype("float32")
    qat.fit(x, np.zeros(8, "int32"), batch_size=8, verbose=0)
    save_qat_record(qat, tmp_path / "q.txt")
    side = json.loads((tmp_path / "q.txt.calib.json").read_text())["layers"]
    plain = strip_qat(qat)
    # the fake-quantized conv output feeds the float Dense: its logits, as the QAT model ran
    logits = keras.Model(qat.inputs, qat.get_layer("fc").output).predict(x, verbose=0)
    np.testing.assert_allclose(
        [side["fc"]["output"]["min"], side["fc"]["output"]["max"]],
        [logits.min(), logits.max()],
        rtol=1e-5,
    )
    res = export_espdl(plain, tmp_path / "q.txt", tmp_path / "out")
    head = next(layer for layer in res.layers if layer.source == "fc")
    assert head.sources["output_exponent"] == "sidecar output range of 'fc'", head.sources
