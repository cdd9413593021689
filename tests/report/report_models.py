"""A small CNN with one deliberately bad layer, and numpy references for the report tests."""

import keras
import numpy as np

#: conv1's channel 0 is scaled up by this much (and conv2's matching input weights down), so the
#: float function is unchanged but conv2's per-tensor input range is dominated by one channel.
OUTLIER = 40.0


def outlier_cnn(seed: int = 0) -> keras.Model:
    """image(8x8x3) -> conv1 (relu) -> conv2 (relu) -> pool -> fc(4); conv2's input is bad."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3), name="image")
    x = keras.layers.Conv2D(6, 3, activation="relu", name="conv1")(inputs)
    x = keras.layers.Conv2D(8, 3, activation="relu", name="conv2")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(4, name="fc")(x)
    model = keras.Model(inputs, outputs, name="outlier_cnn")
    k1, b1 = model.get_layer("conv1").get_weights()
    k1[..., 0] = np.abs(k1[..., 0]) * OUTLIER  # positive: channel 0 is large after ReLU
    b1[0] = 1.0
    model.get_layer("conv1").set_weights([k1, b1])
    k2, b2 = model.get_layer("conv2").get_weights()
    k2[:, :, 0, :] /= OUTLIER
    model.get_layer("conv2").set_weights([k2, b2])
    return model


def images(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, (n, 8, 8, 3)).astype("float32")


def conv_valid(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """NHWC 'valid' stride-1 convolution in float64 (kernel HWIO), brute force."""
    kh, kw = kernel.shape[:2]
    n, h, w, _ = x.shape
    out = np.zeros((n, h - kh + 1, w - kw + 1, kernel.shape[3]))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, i : i + h - kh + 1, j : j + w - kw + 1, :].astype(np.float64)
            out += patch @ kernel[i, j].astype(np.float64)
    return out + bias


def round_half_away(x):
    return np.copysign(np.floor(np.abs(x) + 0.5), x)


def fq_act(x, scale, offset, bits=8):
    """Activation quantize -> dequantize (AMCT: clamp(round(x / s) + o), then (q - o) * s)."""
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    q = np.clip(round_half_away(x / scale) + offset, lo, hi)
    return (q - offset) * scale


def fq_kernel(kernel, scale_w):
    """HWIO kernel, symmetric INT8 per output channel (or one scale)."""
    s = np.asarray(scale_w, np.float64).reshape(-1)
    q = np.clip(round_half_away(kernel / s), -128, 127)
    return q * s


def snr(ref, test):
    ref, test = np.asarray(ref, np.float64), np.asarray(test, np.float64)
    return 10 * np.log10(np.sum(ref**2) / np.sum((ref - test) ** 2))
