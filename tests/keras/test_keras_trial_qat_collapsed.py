"""QAT on a model whose activations vanish (keras.applications MobileNetV2 with
``weights=None``: block_11_depthwise's input range was ~1e-8) wrote ``scale_d: 1`` (AMCT turns a
scale below FLT_EPSILON into 1.0) without a word, while the calibration callback warns about
the same thing; the export then found every later layer at [0, 0]. save_qat_record now warns
too, and keeps the warning in the sidecar."""

import json
import logging

import keras
import numpy as np

from amct_bridge.keras.qat import quantize_aware, save_qat_record

L = keras.layers


def test_save_qat_record_warns_about_a_collapsed_input_range(tmp_path, caplog):
    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 3))
    tiny = L.Rescaling(1e-8, name="tiny")(inp)  # what the vanished activations look like
    x = L.Conv2D(4, 3, name="c_tiny")(tiny)
    x = L.Conv2D(4, 3, name="c_ok")(L.Rescaling(1e8, name="back")(x))
    model = keras.Model(inp, L.Dense(2, name="fc")(L.Flatten(name="f")(x)))
    xs = np.random.default_rng(0).uniform(0, 1, (16, 6, 6, 3)).astype("float32")
    qat = quantize_aware(model, ema_decay=0.0)  # the range is the last batch's min/max
    qat.compile(optimizer="sgd", loss="mse")
    qat.fit(xs, np.zeros((16, 2)), batch_size=16, epochs=1, verbose=0)
    with caplog.at_level(logging.WARNING, logger="amct_bridge"):
        record = save_qat_record(qat, tmp_path / "q.txt")
    # independent: AMCT's asymmetric INT8 scale of the range [0, max] the conv read
    raw = float(xs.max()) * 1e-8 / 255
    assert raw < np.finfo(np.float32).eps
    assert record.layers["c_tiny"].scale_d == 1.0
    text = caplog.text
    assert "'c_tiny'" in text and "below FLT_EPSILON, which AMCT replaces by 1.0" in text
    assert f"scale_d {raw:.3g}" in text
    assert "'c_ok'" not in text and "'fc'" not in text
    side = json.loads((tmp_path / "q.txt.calib.json").read_text())
    assert any("'c_tiny'" in w for w in side["warnings"])
