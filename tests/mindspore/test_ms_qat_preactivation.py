"""Issue 31: a MindSpore QAT network's sidecar holds the ``preactivation`` range of an
``nn.Dense(..., activation="softmax")`` head (the input of its activation cell, the logits), as
the calibration's does, and the ESP-DL exports quantize the logits at it.

The reference is tests/calibration/qat_logit_reference.py (how QAT's EMA ranges work, and the
numpy pass). Within 1.5 % of the logits' range: the numpy pass does not round to the 8-bit grids
(measured: 0.07 %); the first batch's range alone is 20 % away."""

from __future__ import annotations

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Callback, Model
from qat_logit_reference import ema_logit_range

import amct_bridge.mindspore as ams
from amct_bridge.mindspore.qat import quantize_aware, save_qat_record, strip_qat
from amct_bridge.records.calibration import load_stats

BATCH, DECAY, LR, EPOCHS = 32, 0.9, 1.0, 3
SAMPLE = (1, 8)


class Mlp(nn.Cell):
    """Dense(8, 16, relu), Dense(16, 4, softmax)."""

    def __init__(self) -> None:
        super().__init__()
        self.hid = nn.Dense(8, 16, activation="relu")
        self.fc = nn.Dense(16, 4, activation="softmax")

    def construct(self, x):
        return self.fc(self.hid(x))


class _Weights(Callback):
    """The (hidden, head) weights and biases at the start of every training step, float64."""

    def __init__(self, qat) -> None:
        super().__init__()
        self.qat, self.seen = qat, []

    def on_train_step_begin(self, run_context) -> None:
        cells = (self.qat.hid.cell, self.qat.fc.cell)
        self.seen.append([np.float64(p.asnumpy()) for c in cells for p in (c.weight, c.bias)])


@pytest.mark.parametrize("mode", ["graph"], indirect=True)
def test_ms_qat_sidecar_holds_the_head_logits_range(tmp_path, mode):
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (128, 8)).astype(np.float32)
    y = x[:, :4].argmax(1).astype(np.int32)
    ms.set_seed(0)
    net = Mlp()
    qat = quantize_aware(net, ema_decay=DECAY, sample_input=SAMPLE)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(qat, loss, nn.SGD(qat.trainable_params(), LR))
    weights = _Weights(qat)
    data = ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(BATCH)
    model.train(EPOCHS, data, callbacks=[weights], dataset_sink_mode=False)
    record = tmp_path / "qat.txt"
    save_qat_record(qat, record)
    stats = load_stats(tmp_path / "qat.txt.calib.json")

    assert len(weights.seen) == EPOCHS * len(x) // BATCH
    seen = [(w1.T, b1, w2.T, b2) for w1, b1, w2, b2 in weights.seen]  # (in, out)
    want = ema_logit_range(x, seen, BATCH, DECAY)
    pre = stats.layers["fc"].preactivation
    assert pre is not None
    np.testing.assert_allclose([pre.min, pre.max], want, rtol=0, atol=0.015 * (want[1] - want[0]))
    assert stats.layers["hid"].preactivation is None  # relu: its output range tells
    assert stats.layers["fc"].output.max <= 1.0  # the output is the probabilities'

    plain = strip_qat(qat)
    v1 = ams.export_espdl(plain, record, tmp_path / "v1", sample_input=SAMPLE, target="esp32s3")
    (head,) = [x for x in v1.layers if x.name == "fc"]
    assert head.sources["output_exponent"] == "sidecar logit range of 'fc' (before its softmax)"
    v3 = ams.export_espdl(plain, record, tmp_path / "m.espdl", sample_input=SAMPLE,
                          format="espdl", target="esp32s3")  # fmt: skip
    exp, source = v3.exponents["fc/linear"]
    assert source == "sidecar pre-activation range of 'fc' (before its softmax)"
    assert 2.0**exp * 127 >= max(abs(pre.min), abs(pre.max))  # the logits fit
