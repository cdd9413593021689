"""Quantization-aware training: fake-quant forward, STE gradients, ranges, the QAT record."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from amct_bridge.errors import QuantError
from amct_bridge.keras.qat import (
    FoldedBatchNorm,
    QATObserve,
    qat_record,
    quantize_aware,
    save_qat_record,
    strip_qat,
)
from amct_bridge.keras.simulate import simulate
from amct_bridge.quant.arq import arq_scales
from amct_bridge.records import load, validate


def np_fq(x, scale, offset, bits):
    """Quantize -> dequantize in float32, C rounding."""
    v = np.asarray(x, np.float32) / np.float32(scale)
    q = np.clip(
        np.sign(v) * np.floor(np.abs(v) + 0.5) + offset, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    )
    return ((q - offset) * np.float32(scale)).astype(np.float32)


def np_range_factors(lo, hi, bits):
    """AMCT asymmetric factors of [lo, hi], by hand."""
    lo, hi = np.float32(min(lo, 0.0)), np.float32(max(hi, 0.0))
    scale = np.float32((hi - lo) / np.float32(2**bits - 1))
    v = lo / scale
    return float(scale), int(-(2 ** (bits - 1)) - np.sign(v) * np.floor(abs(v) + 0.5))


def np_arq_per_tensor(w, bits):
    mx, mn = w.max(), w.min()
    return np.float32(max(mx, -mn) / (2 ** (bits - 1) if -mn >= mx else 2 ** (bits - 1) - 1))


def dense_model(seed=0, units=3):
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(units, name="fc")], name="m")
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0, 1, (5, units)).astype("float32"), np.float32([0.1] * units)])
    return model


def test_ema_range_follows_batches_and_forward_matches_numpy():
    model = dense_model()
    qat = quantize_aware(model, "INT4", ema_decay=0.9)
    qat.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")  # lr 0: ranges move, weights not
    rng = np.random.default_rng(1)
    batches = [rng.normal(0, s, (16, 5)).astype("float32") for s in (1.0, 2.0, 0.5)]
    lo, hi = float(batches[0].min()), float(batches[0].max())
    for i, xb in enumerate(batches):
        qat.train_on_batch(xb, np.zeros((16, 3), "float32"))
        if i:
            lo, hi = 0.9 * lo + 0.1 * float(xb.min()), 0.9 * hi + 0.1 * float(xb.max())
    layer = qat.get_layer("fc")
    np.testing.assert_allclose(layer.ranges["input"][0].numpy(), lo, rtol=1e-5)
    np.testing.assert_allclose(layer.ranges["input"][1].numpy(), hi, rtol=1e-5)

    x = rng.normal(0, 1.5, (7, 5)).astype("float32")
    kernel, bias = model.get_weights()
    scale_d, offset_d = np_range_factors(
        layer.ranges["input"][0].numpy(), layer.ranges["input"][1].numpy(), 4
    )
    want = np_fq(x, scale_d, offset_d, 4) @ np_fq(kernel, np_arq_per_tensor(kernel, 4), 0, 4) + bias
    np.testing.assert_allclose(qat.predict(x, verbose=0), want, rtol=1e-5, atol=1e-5)

    rec = qat_record(qat)
    f = rec.layers["fc"]
    assert (f.dst_type, f.offset_d, f.offset_w) == ("INT4", offset_d, [0])
    np.testing.assert_allclose(
        [f.scale_d, *f.scale_w], [scale_d, np_arq_per_tensor(kernel, 4)], rtol=1e-6
    )
    assert validate(rec) == []


def test_straight_through_gradients():
    model = dense_model(units=1)
    qat = quantize_aware(model, "INT8")
    x_fit = np.float32([[-1, 0, 1, 0.5, 0.2]])
    qat.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    qat.train_on_batch(x_fit, np.zeros((1, 1), "float32"))  # range becomes [-1, 1]
    x = tf.constant([[-3.0, 0.25, 0.5, 2.0, 0.0]])  # -3 and 2 lie outside the clip range
    layer = qat.get_layer("fc")
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(qat(x, training=False))
    gx, gk = tape.gradient(y, [x, layer.layer.kernel])
    kernel = model.get_weights()[0]
    kq = np_fq(kernel, np_arq_per_tensor(kernel, 8), 0, 8)
    inside = np.float32([0, 1, 1, 0, 1])
    np.testing.assert_allclose(gx.numpy()[0], kq[:, 0] * inside, rtol=1e-6)  # STE, clipped -> 0
    xq = np_fq(x.numpy(), *np_range_factors(-1.0, 1.0, 8), 8)
    np.testing.assert_allclose(gk.numpy()[:, 0], xq[0], rtol=1e-6)  # d/dW = quantized input


def test_learned_ranges_are_trained():
    model = dense_model()
    qat = quantize_aware(model, "INT4", activation_range="learned")
    layer = qat.get_layer("fc")
    lo_var, hi_var, _ = layer.ranges["input"]
    assert any(v is lo_var for v in qat.trainable_weights)
    qat.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    rng = np.random.default_rng(2)
    x = rng.normal(0, 1, (64, 5)).astype("float32")
    qat.fit(x, x[:, :3] * 3, epochs=3, batch_size=16, verbose=0)
    # learned: initialised from the first batch, then moved by gradients (not by later batches)
    first = x[:16]
    assert abs(hi_var.numpy() - first.max()) > 1e-4 or abs(lo_var.numpy() - first.min()) > 1e-4
    assert np.isfinite(qat_record(qat).layers["fc"].scale_d)


@pytest.fixture(scope="module")
def conv_bn():
    x = keras.Input((6, 6, 2))
    y = keras.layers.Conv2D(4, 3, use_bias=False, name="conv")(x)
    y = keras.layers.BatchNormalization(name="bn")(y)
    y = keras.layers.ReLU(name="relu")(y)
    y = keras.layers.Dense(3, name="fc")(keras.layers.Flatten(name="flat")(y))
    model = keras.Model(x, y, name="convbn")
    rng = np.random.default_rng(3)
    model.set_weights(
        [
            rng.normal(0.5, 0.5, w.shape).astype("float32") + (1 if "var" in w.path else 0)
            for w in model.weights
        ]
    )
    return model


def test_batchnorm_folding_keeps_the_float_function(conv_bn):
    x = np.random.default_rng(4).uniform(-1, 1, (5, 6, 6, 2)).astype("float32")
    qat = quantize_aware(conv_bn, "INT8")
    assert isinstance(qat.get_layer("bn"), FoldedBatchNorm)
    np.testing.assert_allclose(
        strip_qat(qat).predict(x, verbose=0), conv_bn.predict(x, verbose=0), rtol=1e-4, atol=1e-5
    )


def test_record_simulates_to_the_qat_model_and_original_is_untouched(conv_bn, tmp_path):
    rng = np.random.default_rng(5)
    x, y = (
        rng.uniform(-1, 1, (32, 6, 6, 2)).astype("float32"),
        rng.normal(0, 1, (32, 3)).astype("float32"),
    )
    before = [w.numpy().copy() for w in conv_bn.weights]
    qat = quantize_aware(conv_bn, "INT4")
    qat.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    qat.fit(x, y, epochs=2, batch_size=8, verbose=0)
    rec = save_qat_record(qat, tmp_path / "qat.txt")
    loaded = load(tmp_path / "qat.txt")
    assert list(loaded.layers) == ["conv", "fc"]
    assert all(f.dst_type == "INT4" and -8 <= f.offset_d <= 7 for f in loaded.layers.values())
    assert len(loaded.layers["conv"].scale_w) == 4 and len(loaded.layers["fc"].scale_w) == 1
    stripped = strip_qat(qat)
    for key, layout in (("conv", "HWIO"), ("fc", "IO")):  # the numpy ARQ of the trained kernels
        kernel = stripped.get_layer(key).kernel.numpy()
        want_w = arq_scales(kernel, layout, num_bits=4)
        np.testing.assert_allclose(loaded.layers[key].scale_w, want_w, rtol=1e-7)
    sim = simulate(stripped, rec)
    np.testing.assert_allclose(
        sim.predict(x, verbose=0), qat.predict(x, verbose=0), rtol=1e-6, atol=1e-6
    )
    for w, b in zip(conv_bn.weights, before, strict=True):
        np.testing.assert_array_equal(w.numpy(), b)


def test_qat_model_saves_and_loads(conv_bn, tmp_path):
    x = np.random.default_rng(6).uniform(-1, 1, (16, 6, 6, 2)).astype("float32")
    qat = quantize_aware(conv_bn, "INT8")
    qat.compile(optimizer="adam", loss="mse")
    qat.fit(x, np.zeros((16, 3), "float32"), epochs=1, verbose=0)
    qat.save(tmp_path / "qat.keras")
    again = keras.models.load_model(tmp_path / "qat.keras")
    np.testing.assert_allclose(again.predict(x, verbose=0), qat.predict(x, verbose=0), rtol=1e-6)


def test_no_folding_marks_skip_fusion(conv_bn):
    x = np.random.default_rng(7).uniform(-1, 1, (8, 6, 6, 2)).astype("float32")
    qat = quantize_aware(conv_bn, "INT8", fold_batchnorm=False)
    bn = qat.get_layer("bn")  # kept, wrapped to observe its output range for the sidecar
    assert isinstance(bn, QATObserve) and isinstance(bn.layer, keras.layers.BatchNormalization)
    qat.compile(optimizer="sgd", loss="mse")
    qat.fit(x, np.zeros((8, 3), "float32"), verbose=0)
    rec = qat_record(qat)
    assert rec.layers["conv"].skip_fusion is True and rec.layers["fc"].skip_fusion is None


def test_nested_separable_pooling_transpose_keys():
    inner = keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            keras.layers.SeparableConv2D(4, 3, padding="same", name="sep"),
            keras.layers.AveragePooling2D(2, name="pool"),
            keras.layers.Conv2DTranspose(2, 2, strides=2, name="up"),
        ],
        name="block",
    )
    x_in = keras.Input((6, 6, 2))
    model = keras.Model(x_in, keras.layers.Dense(1, name="head")(inner(x_in)))
    qat = quantize_aware(model, "INT8", skip_layers=["head"])
    qat.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(8).uniform(-1, 1, (16, 6, 6, 2)).astype("float32")
    qat.fit(x, np.zeros((16, 6, 6, 1), "float32"), epochs=1, verbose=0)
    rec = qat_record(qat)
    assert list(rec.layers) == [
        "block/sep/depthwise",
        "block/sep/pointwise",
        "block/pool",
        "block/up",
    ]
    assert len(rec.layers["block/sep/depthwise"].scale_w) == 2  # C*M = 2*1
    assert rec.layers["block/pool"].scale_w == []
    sim = simulate(strip_qat(qat), rec)
    np.testing.assert_allclose(
        sim.predict(x, verbose=0), qat.predict(x, verbose=0), rtol=1e-6, atol=1e-6
    )


def test_bad_input_is_a_clear_error(conv_bn):
    with pytest.raises(QuantError, match=r"skip_layers names no quantizable layer.*\['nope'\]"):
        quantize_aware(conv_bn, skip_layers=["nope"])
    with pytest.raises(QuantError, match="dst_type must be 'INT8' or 'INT4'"):
        quantize_aware(conv_bn, "INT2")
    with pytest.raises(QuantError, match="no quantizable layer"):
        quantize_aware(conv_bn, skip_layers=["conv", "fc"])
    with pytest.raises(QuantError, match="'conv'.*never observed"):
        qat_record(quantize_aware(conv_bn))
    with pytest.raises(QuantError, match="no QAT layer"):
        qat_record(conv_bn)


# --- INT4 QAT against post-training INT4 and the control, on standardized digits ---------------
def _qat_digits():
    """examples/qat_digits.py as a module (float / PTQ / control / QAT pipeline)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "qat_digits.py"
    spec = importlib.util.spec_from_file_location("qat_digits_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [0])  # seeds 1 and 2: docs/qat.md (suite time)
def test_int4_qat_beats_the_control_where_post_training_int4_loses(seed):
    """Standardized pixels put 10-20 sigma outliers in the input: post-training INT4 (minmax,
    per-tensor activations; record built in numpy by the example) loses >= 5 points, more float
    epochs do not help, QAT wins them back (docs/qat.md, "Example: digits, INT4")."""
    result = _qat_digits().run(epochs=20, qat_epochs=6, seed=seed)
    print(result)
    assert result["float"] - result["ptq_int4"] >= 0.05
    assert result["float"] - result["ptq_int4_after_float_fine_tuning"] >= 0.05
    assert result["qat_int4"] >= result["ptq_int4_after_float_fine_tuning"] + 0.04
    assert result["qat_int4"] >= result["float"] - 0.025


DISTRIBUTED_SCRIPT = """
import json, os, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, numpy as np
from amct_bridge.keras.qat import quantize_aware, qat_record
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, name="fc")])
with strategy.scope():
    qat = quantize_aware(model, "INT4", ema_decay=0.9)
    qat.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
rng = np.random.default_rng(0)
batches = [rng.normal(0, s, (16, 5)).astype("float32") for s in (1.0, 3.0)]
for xb in batches:
    qat.fit(xb, np.zeros((16, 3), "float32"), batch_size=16, shuffle=False, verbose=0)
lo, hi, _ = qat.get_layer("fc").ranges["input"]
json.dump({"replicas": strategy.num_replicas_in_sync, "lo": float(lo.numpy()),
           "hi": float(hi.numpy()), "batches": [b.tolist() for b in batches],
           "dst_type": qat_record(qat).layers["fc"].dst_type}, sys.stdout)
"""


def test_mirrored_strategy_ranges_are_the_replica_mean():
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, "-c", DISTRIBUTED_SCRIPT], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["replicas"] == 2 and out["dst_type"] == "INT4"
    # each replica sees half of every batch; the kept EMA is the mean of the replicas' EMAs
    lo = hi = None
    for batch in map(np.float32, out["batches"]):
        halves = batch[:8], batch[8:]
        b_lo, b_hi = np.mean([h.min() for h in halves]), np.mean([h.max() for h in halves])
        lo = b_lo if lo is None else 0.9 * lo + 0.1 * b_lo
        hi = b_hi if hi is None else 0.9 * hi + 0.1 * b_hi
    np.testing.assert_allclose([out["lo"], out["hi"]], [lo, hi], rtol=1e-5)


def test_strip_folds_batchnorm_into_the_trained_conv(conv_bn):
    """strip_qat after training: no BN layer, and it computes the QAT model's float forward
    (numpy conv + bias + ReLU + dense on the QAT layers' own trained weights)."""
    rng = np.random.default_rng(9)
    x = rng.uniform(-1, 1, (16, 6, 6, 2)).astype("float32")
    qat = quantize_aware(conv_bn, "INT4")
    qat.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    qat.fit(x, rng.normal(0, 1, (16, 3)).astype("float32"), epochs=2, batch_size=8, verbose=0)
    stripped = strip_qat(qat)
    assert [type(layer).__name__ for layer in stripped.layers] == [
        "InputLayer", "Conv2D", "ReLU", "Flatten", "Dense",
    ]  # fmt: skip
    conv, fc = qat.get_layer("conv").layer, qat.get_layer("fc").layer
    k, b = conv.kernel.numpy(), conv.bias.numpy()
    patches = np.stack(  # valid 3x3 conv by brute force
        [x[:, i : i + 3, j : j + 3, :] for i in range(4) for j in range(4)], axis=1
    )
    y = np.einsum("npabc,abco->npo", patches, k) + b
    want = np.maximum(y, 0).reshape(16, -1) @ fc.kernel.numpy() + fc.bias.numpy()
    np.testing.assert_allclose(stripped.predict(x, verbose=0), want, rtol=1e-4, atol=1e-4)
    assert not np.allclose(k, conv_bn.get_layer("conv").kernel.numpy())  # it did train


def test_strip_sequential_and_nested_models_drop_folded_bn():
    """Sequential and nested functional models: each folded BN is gone from the stripped copy,
    which still computes the original float function (QAT not yet trained: same weights)."""
    inner = keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            keras.layers.DepthwiseConv2D(3, padding="same", name="dw"),
            keras.layers.BatchNormalization(name="bn_in"),
            keras.layers.ReLU(name="r_in"),
        ],
        name="block",
    )
    x_in = keras.Input((6, 6, 2))
    y = keras.layers.Conv2D(2, 1, name="c")(inner(x_in))
    y = keras.layers.BatchNormalization(name="bn_out")(y)
    model = keras.Model(x_in, keras.layers.Add(name="add")([y, x_in]), name="outer")
    rng = np.random.default_rng(10)
    for layer in (inner.get_layer("bn_in"), model.get_layer("bn_out")):
        layer.set_weights([rng.uniform(0.5, 2, w.shape).astype("float32") for w in layer.weights])
    stripped = strip_qat(quantize_aware(model, "INT8"))
    kinds = [type(x).__name__ for x in stripped.layers]
    assert kinds == ["InputLayer", "Sequential", "Conv2D", "Add"]
    assert isinstance(stripped.get_layer("block"), keras.Sequential)
    assert [x.name for x in stripped.get_layer("block").layers] == ["dw", "r_in"]
    x = rng.uniform(-1, 1, (4, 6, 6, 2)).astype("float32")
    np.testing.assert_allclose(
        stripped.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("bits,symmetric", [(8, False), (4, False), (4, True)])
def test_keras_fake_quant_is_the_core_formula(bits, symmetric):
    """The in-graph ops (keras.qat.fake_quant) compute amct_bridge.quant.qat's numpy reference,
    which the MindSpore QAT cells mirror too; the reference is checked by hand (np_fq)."""
    from amct_bridge.keras.qat import fake_quant as kfq
    from amct_bridge.quant import qat as core

    rng = np.random.default_rng(3)
    x = rng.normal(0, 2, 500).astype("float32")
    lo, hi = -1.7, 2.9
    want = core.fake_quant_range(x, lo, hi, bits, symmetric=symmetric)
    got = np.asarray(
        kfq.fake_quant_range(x, np.float32(lo), np.float32(hi), bits, symmetric=symmetric)
    )
    np.testing.assert_array_equal(got, want)
    if not symmetric:
        scale, offset = np_range_factors(lo, hi, bits)
        np.testing.assert_allclose(want, np_fq(x, scale, offset, bits), atol=1e-6)
    k = rng.normal(0, 1, (3, 3, 4, 5)).astype("float32")
    for cw in (True, False):
        want_k = core.arq_fake_quant(k, "HWIO", bits, channel_wise=cw)
        got_k = np.asarray(kfq.arq_fake_quant(k, "HWIO", bits, channel_wise=cw))
        np.testing.assert_array_equal(got_k, want_k)
    np.testing.assert_allclose(
        core.arq_fake_quant(k, "HWIO", bits, channel_wise=False),
        np_fq(k, np_arq_per_tensor(k, bits), 0, bits),
        atol=1e-7,
    )


@pytest.mark.parametrize("kind", ["functional", "sequential"])
def test_strip_qat_carries_no_optimizer_state(kind, tmp_path):
    """issue 23: the deployable model has the layers' weights only, not the QAT optimizer's."""
    import zipfile

    import h5py

    if kind == "functional":
        x = keras.Input((4, 4, 1))
        y = keras.layers.BatchNormalization(name="bn")(keras.layers.Conv2D(2, 1, name="c")(x))
        model = keras.Model(x, keras.layers.Dense(3, name="fc")(keras.layers.Flatten()(y)))
    else:
        model = keras.Sequential(
            [
                keras.Input((4, 4, 1)),
                keras.layers.Conv2D(2, 1, name="c"),
                keras.layers.Flatten(),
                keras.layers.Dense(3, name="fc"),
            ]
        )
    qat = quantize_aware(model)
    qat.compile(optimizer="adam", loss="mse")
    qat.fit(np.ones((8, 4, 4, 1), "float32"), np.zeros((8, 3), "float32"), verbose=0)
    assert qat.optimizer.variables  # the QAT model has optimizer state to leave behind
    stripped = strip_qat(qat)
    assert not stripped.compiled and getattr(stripped, "optimizer", None) is None
    assert sorted("/".join(v.path.split("/")[-2:]) for v in stripped.variables) == [
        "c/bias",
        "c/kernel",
        "fc/bias",
        "fc/kernel",
    ]
    stripped.save(tmp_path / "deploy.keras")
    with zipfile.ZipFile(tmp_path / "deploy.keras") as z, z.open("model.weights.h5") as f:
        groups = list(h5py.File(f).keys())
    assert "optimizer" not in groups, groups
    assert qat.compiled  # the QAT model keeps training


def test_init_record_first_step_quantizes_with_its_ranges(conv_bn, tmp_path):
    """QAT from a PTQ record (AMCT's UlqInitializer): the first training step's outputs equal
    simulate(float model, record) on the calibration batch (the EMA update then keeps the first
    layer's range; deeper layers see fake-quantized inputs, a step or so off the float range)."""
    from amct_bridge.errors import RecordError
    from amct_bridge.keras.calibrate import calibrate
    from amct_bridge.records import LayerFactors, Record

    x = np.random.default_rng(5).normal(0, 1, (8, 6, 6, 2)).astype("float32")
    rec = calibrate(conv_bn, x, tmp_path / "ptq.txt", algorithm="minmax", batch_size=8)
    want = simulate(conv_bn, rec).predict(x, verbose=0)
    qat = quantize_aware(conv_bn, "INT8", init_record=tmp_path / "ptq.txt")
    for key in rec.layers:
        lo, hi, seen = (float(np.asarray(v)) for v in qat.get_layer(key).ranges["input"])
        assert seen == 1 and lo < hi
    got = np.asarray(qat(x, training=True))
    err = np.abs(got - want).max()
    cold = np.abs(np.asarray(quantize_aware(conv_bn, "INT8")(x, training=True)) - want).max()
    assert err < 1e-2 * np.abs(want).max(), err
    assert err <= cold
    np.testing.assert_allclose(
        qat_record(qat).layers["conv"].scale_d, rec.layers["conv"].scale_d, rtol=1e-6
    )
    with pytest.raises(RecordError, match="'nope'"):
        quantize_aware(conv_bn, init_record=Record({"nope": LayerFactors(0.1, 0)}))
