"""Keras QAT of a layer called at several nodes of a functional model (one ReLU layer used
twice, one quantized Dense used twice): each node keeps its own range, keyed as the calibration
sidecar keys it (``relu``, ``relu@1``); the shared quantized layer clips both nodes at the union
of their ranges (the record holds one).

References are independent of amct_bridge: the original model's layers run eagerly (the node
outputs), the EMA is ``core.ema_update`` (numpy, float32), the fake-quantized Dense is
``core.fake_quant_range`` / ``core.arq_fake_quant`` in numpy.
"""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest

from amct_bridge.keras import calibrate, simulate
from amct_bridge.keras.qat import qat_record, qat_stats, quantize_aware, strip_qat
from amct_bridge.quant import qat as core
from amct_bridge.quant.factors import activation_factors
from amct_bridge.records.calibration import load_stats, sidecar_path

DECAY = 0.5


def relu_twice() -> keras.Model:
    keras.utils.set_random_seed(0)
    x = keras.Input((6, 6, 2))
    relu = keras.layers.ReLU(name="relu")
    y = relu(keras.layers.Conv2D(4, 3, name="c1")(x))
    y = relu(keras.layers.Conv2D(4, 3, name="c2")(y))
    y = keras.layers.Dense(3, name="fc")(keras.layers.Flatten(name="flat")(y))
    model = keras.Model(x, y)
    c2 = model.get_layer("c2")
    c2.kernel.assign(c2.kernel * 10.0)  # the nodes' ranges far apart
    return model


def ema(batches):
    lo = hi = 0.0
    for k, b in enumerate(batches):
        lo, hi = core.ema_update(lo, hi, b.min(), b.max(), DECAY, first=k == 0)
    return lo, hi


def test_a_layer_at_two_nodes_keeps_a_range_per_node(tmp_path):
    """Only fc quantized (lr 0): the ReLU's two nodes see the float model's tensors; each
    node's range is the EMA of its outputs; the sidecar keys are the calibration sidecar's."""
    model = relu_twice()
    x = np.random.default_rng(0).normal(0, 1, (12, 6, 6, 2)).astype(np.float32)
    qat = quantize_aware(model, ema_decay=DECAY, skip_layers=["c1", "c2"])
    qat.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    qat.fit(x, np.zeros((12, 3)), batch_size=4, shuffle=False, epochs=1, verbose=0)
    nodes = {"relu": [], "relu@1": []}
    relu, c1, c2 = (model.get_layer(n) for n in ("relu", "c1", "c2"))
    for k in range(0, 12, 4):
        a1 = relu(c1(x[k : k + 4]))
        nodes["relu"].append(np.asarray(a1))
        nodes["relu@1"].append(np.asarray(relu(c2(a1))))
    want = {site: ema(outs) for site, outs in nodes.items()}
    wrapper = qat.get_layer("relu")
    assert wrapper.sites == 2 and tuple(wrapper.output_range[1].shape) == (2,)
    assert int(np.asarray(wrapper.calls)) == 2 * 3
    lo, hi = (np.asarray(v) for v in wrapper.output_range[:2])
    for k, site in enumerate(nodes):
        np.testing.assert_allclose((lo[k], hi[k]), want[site], rtol=1e-5, atol=1e-6)
    stats = qat_stats(qat)
    for site, (w_lo, w_hi) in want.items():
        got = stats.layers[site].output
        np.testing.assert_allclose((got.min, got.max), (w_lo, w_hi), rtol=1e-5, atol=1e-6)
    assert want["relu@1"][1] > 3 * want["relu"][1]  # one range would have merged them
    calibrate(model, x, tmp_path / "ptq.txt", batch_size=4, algorithm="minmax")
    calib = load_stats(sidecar_path(tmp_path / "ptq.txt")).layers
    assert [k for k in calib if k.startswith("relu")] == ["relu", "relu@1"]
    assert [k for k in stats.layers if k.startswith("relu")] == ["relu", "relu@1"]


def shared_dense() -> keras.Model:
    keras.utils.set_random_seed(1)
    x = keras.Input((4,))
    fc = keras.layers.Dense(4, name="fc")
    y = fc(keras.layers.Dense(4, name="mid")(fc(x)))
    model = keras.Model(x, keras.layers.Dense(2, name="out")(y))
    mid = model.get_layer("mid")
    mid.kernel.assign(mid.kernel * 5.0)
    return model


@pytest.mark.parametrize("activation_range", ["ema", "learned"])
def test_a_quantized_layer_at_two_nodes_clips_both_at_the_union(activation_range, caplog):
    """EMA: each node keeps its own input EMA (numpy reference: fc fake-quantized node by
    node, clipping at the union so far; mid and out float); learned: one range, started at the
    union of the first step's nodes. The record is the union's; simulate(strip_qat) agrees."""
    model = shared_dense()
    rng = np.random.default_rng(2)
    n = 12 if activation_range == "ema" else 4
    x = rng.normal(0, 1, (n, 4)).astype(np.float32)
    with caplog.at_level(logging.WARNING, "amct_bridge.keras.qat.model"):
        qat = quantize_aware(
            model, ema_decay=DECAY, activation_range=activation_range, skip_layers=["mid", "out"]
        )
    assert "'fc' (sites fc, fc@1)" in caplog.text
    qat.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    qat.fit(x, np.zeros((n, 2)), batch_size=4, shuffle=False, epochs=1, verbose=0)
    fc, mid = model.get_layer("fc"), model.get_layer("mid")
    wq = core.arq_fake_quant(np.asarray(fc.kernel), "IO", 8)
    bias = np.asarray(fc.bias)
    state = [[0.0, 0.0, 0], [0.0, 0.0, 0]]
    learned = None
    for k in range(0, n, 4):
        inp = x[k : k + 4]
        for site in (0, 1):
            lo, hi, seen = state[site]
            lo, hi = core.ema_update(lo, hi, inp.min(), inp.max(), DECAY, first=seen == 0)
            state[site] = [lo, hi, seen + 1]
            if activation_range == "ema":
                clip = (min(state[0][0], state[1][0]), max(state[0][1], state[1][1]))
            else:
                learned = (inp.min(), inp.max()) if learned is None else learned
                learned = (min(learned[0], inp.min()), max(learned[1], inp.max()))
                clip = learned
            out = core.fake_quant_range(inp, *clip, 8) @ wq + bias
            inp = np.asarray(mid(out)) if site == 0 else out
    wrapper = qat.get_layer("fc")
    lo_v, hi_v, seen_v = (np.asarray(v) for v in wrapper.ranges["input"])
    if activation_range == "ema":
        for site in (0, 1):
            np.testing.assert_allclose((lo_v[site], hi_v[site]), state[site][:2], rtol=1e-5)
        union = (min(state[0][0], state[1][0]), max(state[0][1], state[1][1]))
    else:
        assert lo_v.shape == () and float(seen_v) == 1.0
        union = learned
        np.testing.assert_allclose((lo_v, hi_v), union, rtol=1e-5)
    record = qat_record(qat)
    scale_d, offset_d = activation_factors(*union, 8, False)
    assert record.layers["fc"].scale_d == pytest.approx(scale_d, rel=1e-5)
    assert record.layers["fc"].offset_d == offset_d
    stats = qat_stats(qat)
    assert stats.layers["fc"].input.max == stats.layers["fc@1"].input.max
    xt = rng.normal(0, 1, (5, 4)).astype(np.float32)
    want = np.asarray(qat(xt, training=False))
    got = np.asarray(simulate(strip_qat(qat), record)(xt, training=False))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
