"""Issue 31: a QAT model's sidecar holds the ``preactivation`` range of a
``Dense(activation="softmax")`` head (its logits), as the calibration's does, and the ESP-DL
exports quantize the logits at it.

The reference is tests/calibration/qat_logit_reference.py (how QAT's EMA ranges work, and the
numpy pass). Within 1.5 % of the logits' range: the numpy pass does not round to the 8-bit grids
(measured: 0.12 %; power-of-two QAT 0.77 %: it clips at its learned power-of-two thresholds and
rounds to coarser grids); the first batch's range alone is 20 % away."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from qat_logit_reference import ema_logit_range

from amct_bridge.keras import export_espdl
from amct_bridge.keras.qat import quantize_aware, save_qat_record, strip_qat
from amct_bridge.records.calibration import load_stats

L = keras.layers
BATCH, DECAY = 32, 0.9


class _Weights(keras.callbacks.Callback):
    """The (hidden, head) weights at the start of every training batch, in float64."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[np.ndarray]] = []

    def on_train_batch_begin(self, batch, logs=None) -> None:
        names = ("hid", "head")
        self.seen.append(
            [np.float64(w) for n in names for w in self.model.get_layer(n).layer.get_weights()]
        )


@pytest.mark.parametrize("power_of_two", [False, True])
def test_qat_sidecar_holds_the_head_logits_range(tmp_path, power_of_two):
    keras.utils.set_random_seed(0)
    inp = keras.Input((8,))
    hidden = L.Dense(16, activation="relu", name="hid")(inp)
    model = keras.Model(inp, L.Dense(4, activation="softmax", name="head")(hidden))
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (256, 8)).astype("float32")
    y = x[:, :4].argmax(1)
    qat = quantize_aware(model, ema_decay=DECAY, power_of_two=power_of_two)
    qat.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    weights = _Weights()
    qat.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[weights])
    record = tmp_path / "qat.txt"
    save_qat_record(qat, record)
    stats = load_stats(tmp_path / "qat.txt.calib.json")

    want = ema_logit_range(x, weights.seen, BATCH, DECAY)
    pre = stats.layers["head"].preactivation
    assert pre is not None
    span = want[1] - want[0]
    np.testing.assert_allclose([pre.min, pre.max], want, rtol=0, atol=0.015 * span)
    assert stats.layers["hid"].preactivation is None  # relu: its output range tells
    assert stats.layers["head"].output.max <= 1.0  # the output is the probabilities'

    plain = strip_qat(qat)
    v1 = export_espdl(plain, record, tmp_path / "v1", target="esp32s3")
    (head,) = [x for x in v1.layers if x.name == "head"]
    assert head.sources["output_exponent"] == "sidecar logit range of 'head' (before its softmax)"
    v3 = export_espdl(plain, record, None, format="espdl", target="esp32s3")
    exp, source = v3.exponents["head/linear"]
    assert source == "sidecar pre-activation range of 'head' (before its softmax)"
    assert 2.0**exp * 127 >= max(abs(pre.min), abs(pre.max))  # the logits fit
