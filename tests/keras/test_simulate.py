"""simulate(model, record): outputs equal an independent numpy forward of the quantized model."""

import keras
import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from amct_bridge.errors import RecordError
from amct_bridge.keras.simulate import SimulatedQuant, simulate
from amct_bridge.records import LayerFactors, Record, save


# --- numpy reference ---------------------------------------------------------------------------
def np_fq(x, scale, offset, bits):
    """Quantize -> dequantize in float32 with C rounding (halves away from zero)."""
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    v = np.asarray(x, np.float32) / np.float32(scale)
    q = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5) + offset, qmin, qmax)
    return ((q - offset) * np.float32(scale)).astype(np.float32)


def act_factors(x, bits=8):
    """Asymmetric AMCT factors for the range of x, computed by hand."""
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = float(np.float32((hi - lo) / (2**bits - 1)))
    v = lo / scale
    return scale, int(-(2 ** (bits - 1)) - np.sign(v) * np.floor(abs(v) + 0.5))


def arq(w, axis, bits=8):
    """Per-channel symmetric scales along ``axis`` (None: one scale), AMCT's /127 vs /128 rule."""
    red = tuple(a for a in range(w.ndim) if a != axis) if axis is not None else None
    mx, mn = w.max(axis=red), w.min(axis=red)
    div = np.where(-mn >= mx, 2 ** (bits - 1), 2 ** (bits - 1) - 1)
    return np.atleast_1d(np.maximum(mx, -mn) / div).astype(np.float32)


def fq_weights(w, scales, axis, bits=8):
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    s = np.asarray(scales, np.float32).reshape(shape)
    v = np.asarray(w, np.float32) / s
    q = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return (q * s).astype(np.float32)


def conv2d(x, w, b):
    win = sliding_window_view(x, w.shape[:2], axis=(1, 2))
    return np.einsum("nhwcij,ijco->nhwo", win, w) + b


def depthwise(x, w, b):
    win = sliding_window_view(x, w.shape[:2], axis=(1, 2))
    y = np.einsum("nhwcij,ijcm->nhwcm", win, w)
    return y.reshape(y.shape[:3] + (-1,)) + b


def avgpool2(x):
    n, h, w, c = x.shape
    return x[:, : h // 2 * 2, : w // 2 * 2].reshape(n, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))


def relu(x):
    return np.maximum(x, 0)


# --- models --------------------------------------------------------------------------------------
def seeded_weights(model, seed):
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0, 0.5, w.shape).astype("float32") for w in model.get_weights()])


@pytest.fixture(scope="module")
def plain():
    """Conv(relu) -> DepthwiseConv -> AvgPool -> Flatten -> Dense, functional."""
    x = keras.Input((7, 7, 2))
    y = keras.layers.Conv2D(3, 3, activation="relu", name="conv")(x)
    y = keras.layers.DepthwiseConv2D(2, depth_multiplier=2, name="dw")(y)
    y = keras.layers.AveragePooling2D(2, name="pool")(y)
    y = keras.layers.Flatten(name="flat")(y)
    y = keras.layers.Dense(4, name="fc")(y)
    model = keras.Model(x, y, name="plain")
    seeded_weights(model, 0)
    return model


def plain_reference(model, x, rec, bits=8):
    """The quantized forward of ``plain`` in numpy; ``rec`` maps key -> (scale_d, offset_d, w)."""
    w = {layer.name: layer.get_weights() for layer in model.layers}
    y = conv2d(np_fq(x, *rec["conv"][:2], bits), rec["conv"][2], w["conv"][1])
    y = depthwise(np_fq(relu(y), *rec["dw"][:2], bits), rec["dw"][2], w["dw"][1])
    y = avgpool2(np_fq(y, *rec["pool"][:2], bits)).reshape(len(x), -1)
    return np_fq(y, *rec["fc"][:2], bits) @ rec["fc"][2] + w["fc"][1]


def plain_record(model, x, bits=8, dst_type=None):
    """A record with factors from the float activations; returns (Record, reference factors)."""
    w = {layer.name: layer.get_weights() for layer in model.layers}
    c = conv2d(x, w["conv"][0], w["conv"][1])
    d = depthwise(relu(c), w["dw"][0], w["dw"][1])
    p = avgpool2(d).reshape(len(x), -1)
    inputs = {"conv": x, "dw": relu(c), "pool": d, "fc": p}
    kernels = {
        "conv": (w["conv"][0], 3),
        "dw": (w["dw"][0].reshape(2, 2, -1), 2),
        "fc": (w["fc"][0], None),
    }
    rec, ref = Record(), {}
    for key, data in inputs.items():
        scale_d, offset_d = act_factors(data, bits)
        lf = LayerFactors(scale_d=scale_d, offset_d=offset_d, dst_type=dst_type)
        kq = None
        if key in kernels:
            k, axis = kernels[key]
            lf.scale_w = arq(k, axis, bits).tolist()
            lf.offset_w = [0] * len(lf.scale_w)
            kq = fq_weights(k, lf.scale_w, axis, bits).reshape(w[key][0].shape)
        rec.layers[key] = lf
        ref[key] = (scale_d, offset_d, kq)
    return rec, ref


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(1).uniform(-1, 1, (8, 7, 7, 2)).astype("float32")


# --- tests ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits,dst_type", [(8, None), (4, "INT4")])
def test_outputs_match_numpy_quantized_forward(plain, data, bits, dst_type):
    rec, ref = plain_record(plain, data, bits, dst_type)
    got = simulate(plain, rec).predict(data, verbose=0)
    want = plain_reference(plain, data, ref, bits)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # and quantization is visible: the float model gives something else
    assert np.abs(plain.predict(data, verbose=0) - want).max() > 1e-3


def test_original_model_unchanged_and_saveable(plain, data, tmp_path):
    before = plain.predict(data, verbose=0)
    weights = [w.copy() for w in plain.get_weights()]
    rec, _ = plain_record(plain, data)
    sim = simulate(plain, rec)
    sim.predict(data, verbose=0)
    np.testing.assert_array_equal(plain.predict(data, verbose=0), before)
    for a, b in zip(plain.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not any(isinstance(layer, SimulatedQuant) for layer in plain.layers)
    plain.save(tmp_path / "plain.keras")
    np.testing.assert_array_equal(
        keras.models.load_model(tmp_path / "plain.keras").predict(data, verbose=0), before
    )


def test_simulated_model_saves_loads_and_compiles(plain, data, tmp_path):
    rec, _ = plain_record(plain, data)
    sim = simulate(plain, rec)
    want = sim.predict(data, verbose=0)
    sim.save(tmp_path / "sim.keras")
    loaded = keras.models.load_model(tmp_path / "sim.keras")
    np.testing.assert_allclose(loaded.predict(data, verbose=0), want, rtol=1e-6)
    loaded.compile(loss="mse", jit_compile=True)  # XLA: the fake quant is graph ops only
    assert np.isfinite(loaded.evaluate(data, want, verbose=0))


def test_record_file_path_is_accepted(plain, data, tmp_path):
    rec, ref = plain_record(plain, data)
    save(rec, tmp_path / "record.txt")
    got = simulate(plain, tmp_path / "record.txt").predict(data, verbose=0)
    np.testing.assert_allclose(got, plain_reference(plain, data, ref), rtol=1e-4, atol=1e-5)


def test_layers_missing_from_record_stay_float(plain, data):
    rec, ref = plain_record(plain, data)
    only_fc = Record({"fc": rec.layers["fc"]})
    got = simulate(plain, only_fc).predict(data, verbose=0)
    features = keras.Model(plain.input, plain.get_layer("flat").output).predict(data, verbose=0)
    want = np_fq(features, *ref["fc"][:2], 8) @ ref["fc"][2] + plain.get_layer("fc").bias.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_unknown_and_unquantizable_keys_are_errors(plain, data):
    with pytest.raises(RecordError, match="find conv2 failure in model.*did you mean 'conv'"):
        simulate(plain, Record({"conv2": LayerFactors(scale_d=0.1, offset_d=0)}))
    with pytest.raises(RecordError, match="find flat failure"):
        simulate(plain, Record({"flat": LayerFactors(scale_d=0.1, offset_d=0)}))


@pytest.mark.parametrize(
    "factors,message",
    [
        (LayerFactors(scale_d=0.1, offset_d=0, scale_w=[0.1, 0.1]), "scale_w has 2 values"),
        (LayerFactors(scale_d=0.1, offset_d=200), r"offset_d's value should be in \[-128, 127\]"),
        (LayerFactors(scale_d=0.1, offset_d=8, dst_type="INT4"), r"should be in \[-8, 7\]"),
        (LayerFactors(scale_d=float("nan"), offset_d=0), "finite and > 0"),
        (LayerFactors(scale_w=[0.1] * 3, offset_w=[0, 1, 0]), "offset_w's value should be 0"),
    ],
)
def test_bad_factors_name_the_layer(plain, factors, message):
    with pytest.raises(RecordError, match=f"'conv'.*{message}"):
        simulate(plain, Record({"conv": factors}))


def test_pooling_with_weight_scales_is_an_error(plain):
    bad = LayerFactors(scale_d=0.1, offset_d=0, scale_w=[0.1], offset_w=[0])
    with pytest.raises(RecordError, match="'pool'.*no weights"):
        simulate(plain, Record({"pool": bad}))


@pytest.mark.parametrize("skip_fusion", [None, True])
def test_conv_bn_quantizes_the_fused_kernel_unless_skip_fusion(data, skip_fusion):
    x = keras.Input((7, 7, 2))
    y = keras.layers.Conv2D(3, 3, name="conv")(x)
    y = keras.layers.BatchNormalization(name="bn", epsilon=1e-3)(y)
    model = keras.Model(x, keras.layers.ReLU(name="relu")(y))
    seeded_weights(model, 2)
    bn = model.get_layer("bn")
    gamma = np.float32([1.5, -0.7, 0.3])
    bn.set_weights(
        [
            gamma,
            np.float32([0.1, -0.2, 0.3]),
            np.float32([0.2, 0, -0.1]),
            np.float32([0.5, 2.0, 0.1]),
        ]
    )
    kernel, bias = model.get_layer("conv").get_weights()
    k = gamma / np.sqrt(np.float32([0.5, 2.0, 0.1]) + 1e-3)
    target = kernel if skip_fusion else kernel * k  # what scale_w describes
    scales = arq(target, 3)
    rec = Record(
        {
            "conv": LayerFactors(
                scale_d=1 / 127,
                offset_d=0,
                scale_w=scales.tolist(),
                offset_w=[0, 0, 0],
                skip_fusion=skip_fusion,
            )
        }
    )
    got = simulate(model, rec).predict(data, verbose=0)
    xq = np_fq(data, 1 / 127, 0, 8)
    if skip_fusion:
        y = conv2d(xq, fq_weights(kernel, scales, 3), bias)
        y = (y - [0.2, 0, -0.1]) * k + [0.1, -0.2, 0.3]
    else:
        y = conv2d(
            xq, fq_weights(target, scales, 3), (bias - [0.2, 0, -0.1]) * k + [0.1, -0.2, 0.3]
        )
    np.testing.assert_allclose(got, relu(y), rtol=1e-4, atol=1e-5)


def test_nested_separable_and_transpose(data):
    inner = keras.Sequential(
        [
            keras.Input((7, 7, 2)),
            keras.layers.SeparableConv2D(3, 3, depth_multiplier=2, name="sep"),
            keras.layers.Conv2DTranspose(2, 2, strides=2, name="up"),
        ],
        name="block",
    )
    x = keras.Input((7, 7, 2))
    model = keras.Model(x, inner(keras.layers.ReLU(name="relu")(x)), name="outer")
    seeded_weights(model, 3)
    dk, pk, pb = inner.get_layer("sep").get_weights()
    tk, tb = inner.get_layer("up").get_weights()
    xr = relu(data)
    mid = depthwise(xr, dk, 0)
    sep_out = conv2d(mid, pk, pb)
    dks, pks, tks = arq(dk.reshape(3, 3, -1), 2), arq(pk, 3), arq(tk, 2)
    rec = Record(
        {
            "block/sep/depthwise": LayerFactors(
                *act_factors(xr), scale_w=dks.tolist(), offset_w=[0] * 4
            ),
            "block/sep/pointwise": LayerFactors(
                *act_factors(mid), scale_w=pks.tolist(), offset_w=[0] * 3
            ),
            "block/up": LayerFactors(*act_factors(sep_out), scale_w=tks.tolist(), offset_w=[0] * 2),
        }
    )
    got = simulate(model, rec).predict(data, verbose=0)
    f = rec.layers
    mid_q = depthwise(
        np_fq(xr, f["block/sep/depthwise"].scale_d, f["block/sep/depthwise"].offset_d, 8),
        fq_weights(dk.reshape(3, 3, -1), dks, 2).reshape(dk.shape),
        0,
    )
    sep_q = conv2d(
        np_fq(mid_q, f["block/sep/pointwise"].scale_d, f["block/sep/pointwise"].offset_d, 8),
        fq_weights(pk, pks, 3),
        pb,
    )
    # Conv2DTranspose reference: the original Keras layer on dequantized input and kernel
    up = keras.layers.Conv2DTranspose.from_config(inner.get_layer("up").get_config())
    up.build((None, 5, 5, 3))
    up.set_weights([fq_weights(tk, tks, 2), tb])
    want = up(np_fq(sep_q.astype("float32"), f["block/up"].scale_d, f["block/up"].offset_d, 8))
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-4, atol=1e-5)


def test_rounding_at_exact_half_steps_is_amct_rounding():
    """x / scale landing exactly on k + 0.5 rounds away from zero, with a true division."""
    scale = np.float32(0.1)
    ks = np.arange(-40, 40, dtype=np.float32) + np.float32(0.5)
    x = ks * scale
    x = x[(x / scale) == ks][:16]  # keep values whose float32 quotient is exactly k + 0.5
    assert len(x) == 16
    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(16, use_bias=False, name="fc")]
    )
    model.set_weights([np.eye(16, dtype="float32")])
    rec = Record({"fc": LayerFactors(scale_d=0.1, offset_d=0, scale_w=[1 / 64], offset_w=[0])})
    got = simulate(model, rec).predict(x[None], verbose=0)[0]
    np.testing.assert_array_equal(got, np_fq(x, 0.1, 0, 8))
    assert np.all(np.abs(got) > np.abs(x))  # away from zero, never to even


def test_calibrated_record_simulates_close_to_float(tmp_path):
    """A record from calibrate() (keys, BN fusion, separable parts, nested) simulates at INT8."""
    from amct_bridge.keras.calibrate import calibrate

    inner = keras.Sequential(
        [
            keras.Input((8, 8, 4)),
            keras.layers.SeparableConv2D(6, 3, padding="same", name="sep"),
            keras.layers.BatchNormalization(name="bn2"),
            keras.layers.ReLU(name="relu2"),
        ],
        name="block",
    )
    x = keras.Input((8, 8, 3))
    y = keras.layers.Conv2D(4, 3, padding="same", name="conv")(x)
    y = keras.layers.ReLU(name="relu1")(keras.layers.BatchNormalization(name="bn1")(y))
    y = keras.layers.AveragePooling2D(2, name="pool")(inner(y))
    model = keras.Model(x, keras.layers.Dense(3, name="fc")(keras.layers.Flatten()(y)))
    seeded_weights(model, 9)
    for bn in ("bn1",):
        layer = model.get_layer(bn)
        layer.moving_variance.assign(np.abs(layer.moving_variance.numpy()) + 0.5)
    inner.get_layer("bn2").moving_variance.assign(np.full(6, 1.5, "float32"))
    data = np.random.default_rng(10).uniform(0, 1, (32, 8, 8, 3)).astype("float32")
    rec = calibrate(model, data, tmp_path / "r.txt", algorithm="minmax", batch_num=2, batch_size=16)
    assert {"conv", "block/sep/depthwise", "block/sep/pointwise", "pool", "fc"} <= set(rec.layers)
    want = model.predict(data, verbose=0)
    got = simulate(model, rec).predict(data, verbose=0)
    err = np.abs(got - want).max() / np.abs(want).max()
    print(f"INT8 simulated vs float: {err:.4f}")
    assert 0 < err < 0.05, err


def test_tf_op_keyed_record_simulates_like_the_keras_keyed_one(tmp_path):
    """keys="tf_op" (convert_model's op names; the shared Dense is two MatMul keys, the
    separable conv two ops) maps back to the layers: the same simulated outputs."""
    from calib_models import branchy_model

    from amct_bridge.keras.calibrate import calibrate

    model = branchy_model()
    data = np.random.default_rng(4).normal(size=(16, 10, 10, 4)).astype("float32")
    sims = []
    for keys in ("keras", "tf_op"):
        rec = calibrate(model, data, tmp_path / f"{keys}.txt", algorithm="minmax", keys=keys)
        sims.append(simulate(model, rec).predict(data, verbose=0))
    assert any("MatMul" in key for key in rec.layers)
    np.testing.assert_array_equal(sims[0], sims[1])
    rec.layers[next(k for k in rec.layers if "MatMul" in k)] = LayerFactors(
        scale_d=0.5, offset_d=0, scale_w=[0.01], offset_w=[0]
    )
    with pytest.raises(RecordError, match="are ops of the same layer 'shared'"):
        simulate(model, rec)


@pytest.mark.parametrize(
    "name",
    [
        "amct_bridge.keras.qat.fake_quant",
        "amct_bridge.keras.rewrite",
        "amct_bridge.keras.simulate",
        "amct_bridge.keras.qat",
    ],
)
def test_docstring_examples_run(name):
    import doctest
    import importlib

    failures, _ = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert failures == 0
