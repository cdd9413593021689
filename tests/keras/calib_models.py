"""Small Keras models and independent numpy references for the calibration tests."""

import keras
import numpy as np
import pytest

from amct_bridge.records import load

FLT_EPS = float(np.finfo(np.float32).eps)


def round_half_away(x):
    return np.copysign(np.floor(np.abs(x) + 0.5), x)


def ref_act_factors(lo, hi, bits=8):
    """AMCT asymmetric activation factors, written out from the reference text."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = float(np.float32((hi - lo) / (2**bits - 1)))
    if scale < FLT_EPS:
        return 1.0, -(2 ** (bits - 1))
    return scale, int(-(2 ** (bits - 1)) - round_half_away(lo / scale))


def assert_c1_input_range(record_path, lo, hi):
    """The record's c1 input factors are AMCT's for the range ``[lo, hi]``."""
    scale, offset = ref_act_factors(lo, hi)
    factors = load(record_path).layers["c1"]
    assert factors.scale_d == pytest.approx(scale, rel=1e-6)
    assert factors.offset_d == offset


def ref_arq(kernel, out_axis=None):
    """ARQ scale_w: max(|max|,|min|)/127, /128 when |min| >= |max|; per channel on out_axis."""
    k = np.asarray(kernel, np.float64)
    if out_axis is None:
        hi, lo = np.array([k.max()]), np.array([k.min()])
    else:
        k = np.moveaxis(k, out_axis, -1).reshape(-1, k.shape[out_axis])
        hi, lo = k.max(axis=0), k.min(axis=0)
    scale = np.where(np.abs(lo) >= np.abs(hi), np.abs(lo) / 128, np.abs(hi) / 127)
    return np.where(scale < FLT_EPS, 1.0, scale)


def bn_fold(kernel, bn, out_shape=None):
    """Fold BN into a kernel whose LAST axis is the output channel (or reshape for depthwise)."""
    gamma, beta, mean, var = (np.asarray(w, np.float64) for w in bn.weights)
    s = gamma / np.sqrt(var + bn.epsilon)
    k = np.asarray(kernel, np.float64)
    if out_shape is not None:  # depthwise HWIM: channel c*M + m
        return k * s.reshape(out_shape)
    return k * s


def randomize_bn(model, seed=0):
    """Give every BN non-trivial statistics so folding changes the kernels."""
    rng = np.random.default_rng(seed)
    for layer in _all_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            n = layer.moving_mean.shape[0]
            layer.gamma.assign(rng.uniform(0.5, 2.0, n).astype("float32"))
            layer.beta.assign(rng.uniform(-0.5, 0.5, n).astype("float32"))
            layer.moving_mean.assign(rng.uniform(-0.3, 0.3, n).astype("float32"))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, n).astype("float32"))


def _all_layers(model):
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _all_layers(layer)
        else:
            yield layer


def sequential_model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((12, 12, 3)),
            keras.layers.Conv2D(4, 3, use_bias=False, name="c1"),
            keras.layers.BatchNormalization(name="bn1"),
            keras.layers.ReLU(name="r1"),
            keras.layers.AveragePooling2D(2, name="ap"),
            keras.layers.Flatten(name="flat"),
            keras.layers.Dense(5, name="fc"),
        ],
        name="seq",
    )
    randomize_bn(model)
    return model


def branchy_model():
    """Functional model with branches, every quantizable type and a shared Dense."""
    keras.utils.set_random_seed(2)
    inp = keras.Input((10, 10, 4), name="img")
    a = keras.layers.Conv2D(6, 3, padding="same", name="ca")(inp)
    a = keras.layers.ReLU(6.0, name="ra")(a)
    b = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False, name="dw")(inp)
    b = keras.layers.BatchNormalization(name="bn_dw")(b)
    b = keras.layers.Conv2D(6, 1, name="pw")(b)
    x = keras.layers.Add(name="add")([a, b])
    x = keras.layers.SeparableConv2D(8, 3, padding="same", name="sep")(x)
    x = keras.layers.BatchNormalization(name="bn_sep")(x)
    x = keras.layers.Activation("tanh", name="act")(x)
    x = keras.layers.Conv2DTranspose(4, 3, strides=2, padding="same", name="tr")(x)
    x = keras.layers.AveragePooling2D(4, name="ap")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    shared = keras.layers.Dense(4, name="shared")
    y = shared(shared(x))
    model = keras.Model(inp, y, name="branchy")
    randomize_bn(model)
    return model


def nested_model():
    keras.utils.set_random_seed(3)
    inner_in = keras.Input((8, 8, 4))
    y = keras.layers.Conv2D(4, 3, padding="same", use_bias=False, name="ic")(inner_in)
    y = keras.layers.BatchNormalization(name="ibn")(y)
    y = keras.layers.ReLU(name="ir")(y)
    inner = keras.Model(inner_in, y, name="block")
    inp = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 1, name="stem")(inp)
    x = inner(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(3, name="head")(x)
    model = keras.Model(inp, x, name="outer")
    randomize_bn(model)
    return model


def images(n=48, seed=7):
    """``n`` images of shape (12, 12, 3), values in [0, 1)."""
    return np.random.default_rng(seed).random((n, 12, 12, 3), dtype=np.float32)
