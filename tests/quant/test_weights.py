"""ARQ scales, BN folding (checked against real Keras layers), DMQ factors and shift_bit."""

import numpy as np
import pytest

from amct_bridge.errors import QuantError
from amct_bridge.quant.arq import arq_factors, fake_quantize_weights, quantize_weights
from amct_bridge.quant.dmq import balance_factors
from amct_bridge.quant.fold import fold_batchnorm
from amct_bridge.quant.shift_bit import (
    shift_bits_from_range,
    shift_bits_from_weights,
    shift_for_accumulator,
)


def ref_scale(values):
    """AMCT's rule written out in float64 for one channel."""
    mx, mn = float(np.max(values)), float(np.min(values))
    s = mx / 127 if abs(mx) > abs(mn) else abs(mn) / 128
    return 1.0 if s < 1.1920929e-07 else s


def channels(kernel, layout):
    """Per-output-channel value lists by explicit indexing (framework channel order)."""
    if layout == "HWIO":
        return [kernel[..., o] for o in range(kernel.shape[3])]
    if layout == "HWCM":
        c_, m_ = kernel.shape[2:]
        return [kernel[:, :, c, m] for c in range(c_) for m in range(m_)]
    if layout == "HWOI":
        return [kernel[:, :, o, :] for o in range(kernel.shape[2])]
    if layout == "OIHW":
        return [kernel[o] for o in range(kernel.shape[0])]
    if layout == "IOHW":
        return [kernel[:, o] for o in range(kernel.shape[1])]
    raise AssertionError(layout)


@pytest.mark.parametrize(
    "layout,shape",
    [
        ("HWIO", (3, 3, 4, 6)),
        ("HWCM", (3, 3, 4, 3)),
        ("HWOI", (2, 2, 5, 4)),
        ("OIHW", (6, 4, 3, 3)),
        ("IOHW", (4, 6, 3, 3)),
    ],
)
def test_arq_per_channel_matches_rule(layout, shape):
    rng = np.random.default_rng(0)
    k = rng.normal(size=shape).astype(np.float32)
    scales, offsets = arq_factors(k, layout)
    refs = [ref_scale(ch) for ch in channels(k, layout)]
    assert len(scales) == len(refs) == len(offsets) and offsets == [0] * len(refs)
    assert np.allclose(scales, refs, rtol=1e-6)
    per_tensor, _ = arq_factors(k, layout, channel_wise=False)
    assert per_tensor == pytest.approx([ref_scale(k)], rel=1e-6)


def test_arq_rules_and_edge_cases():
    k = np.zeros((1, 1, 2, 5), np.float32)
    k[0, 0, :, 0] = [1.27, -0.5]  # positive max dominates -> /127
    k[0, 0, :, 1] = [0.5, -1.28]  # negative min dominates -> /128
    k[0, 0, :, 2] = [1.0, -1.0]  # tie -> /128
    k[0, 0, :, 3] = 0.0  # all zero -> FLT_EPSILON rule -> 1.0
    k[0, 0, :, 4] = [1e-9, 0.0]  # scale below FLT_EPSILON -> 1.0
    scales, _ = arq_factors(k, "HWIO")
    assert scales == pytest.approx([1.27 / 127, 1.28 / 128, 1 / 128, 1.0, 1.0], rel=1e-6)
    assert arq_factors(np.ones((3, 4)), "IO") == ([pytest.approx(1 / 127)], [0])
    with pytest.raises(QuantError, match="fc1"):
        arq_factors(np.array([[np.nan, 1.0]]), "IO", name="fc1")
    with pytest.raises(QuantError, match="layout"):
        arq_factors(np.ones((3, 3)), "HWIO")


def test_weight_fake_quant_error_bounded():
    rng = np.random.default_rng(1)
    k = rng.normal(size=(3, 3, 2, 4)).astype(np.float32)
    scales, _ = arq_factors(k, "HWIO")
    q = quantize_weights(k, "HWIO", scales)
    assert q.min() >= -128 and q.max() <= 127
    err = np.abs(fake_quantize_weights(k, "HWIO", scales) - k)
    assert np.all(err <= np.asarray(scales) / 2 * (1 + 1e-5))


# -- BatchNorm folding against real Keras ----------------------------------------------------
@pytest.fixture(scope="module")
def keras():
    import keras

    return keras


def bn_params(rng, n, scale=True, center=True):
    params = []
    if scale:
        params.append(rng.uniform(0.5, 2.0, n))
    if center:
        params.append(rng.normal(size=n))
    params += [rng.normal(size=n), rng.uniform(0.1, 3.0, n)]
    return [p.astype(np.float32) for p in params]


@pytest.mark.parametrize(
    "kind,layout,scale,center",
    [
        ("conv", "HWIO", True, True),
        ("depthwise", "HWCM", True, True),
        ("transpose", "HWOI", False, True),
        ("dense", "IO", True, False),
    ],
)
def test_fold_matches_keras(keras, kind, layout, scale, center):
    rng = np.random.default_rng(2)
    layers = keras.layers
    make = {
        "conv": lambda: layers.Conv2D(5, 3, use_bias=False),
        "depthwise": lambda: layers.DepthwiseConv2D(3, depth_multiplier=2),
        "transpose": lambda: layers.Conv2DTranspose(4, 3, strides=2),
        "dense": lambda: layers.Dense(6),
    }
    shape = (4,) if kind == "dense" else (6, 6, 3)
    x = rng.normal(size=(2, *shape)).astype(np.float32)
    inp = keras.Input(shape)
    conv = make[kind]()
    bn = layers.BatchNormalization(scale=scale, center=center, epsilon=1e-3)
    model = keras.Model(inp, bn(conv(inp)))
    weights = conv.get_weights()
    n = bn.get_weights()[0].shape[0]
    bn.set_weights(bn_params(rng, n, scale, center))
    expected = model(x, training=False).numpy()
    gamma = bn.gamma.numpy() if scale else None
    beta = bn.beta.numpy() if center else None
    bias = weights[1] if len(weights) > 1 else None
    k, b = fold_batchnorm(
        weights[0],
        bias,
        gamma,
        beta,
        bn.moving_mean.numpy(),
        bn.moving_variance.numpy(),
        1e-3,
        layout,
    )
    folded = make[kind]()
    folded_model = keras.Model(inp, folded(inp))
    if len(weights) > 1:
        folded.set_weights([k, b])
        got = folded_model(x).numpy()
    else:
        folded.set_weights([k])
        got = folded_model(x).numpy() + b
    assert np.allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_fold_errors():
    with pytest.raises(QuantError, match="conv9.*3 values"):
        fold_batchnorm(
            np.ones((1, 1, 2, 4)),
            None,
            None,
            None,
            np.zeros(3),
            np.ones(3),
            1e-3,
            "HWIO",
            name="conv9",
        )


# -- DMQ ------------------------------------------------------------------------------------
def dmq_reference(act, wts, alpha):
    """Loop transcription of AMCT's DMQBalance + ProcessZeroChannel."""
    eps = 1.1920929e-07
    n = len(act)
    if max(act) < eps or max(wts) < eps:
        return [1.0] * n
    f, zero = [0.0] * n, False
    for c in range(n):
        if act[c] < eps or wts[c] < eps:
            zero = True
        else:
            f[c] = act[c] ** alpha / wts[c] ** (1 - alpha)
    if zero:
        ao = max([act[c] / f[c] for c in range(n) if f[c] >= eps] or [0.0])
        wo = max([wts[c] * f[c] for c in range(n) if f[c] >= eps] or [0.0])
        if ao < eps or wo < eps:
            return [1.0] * n
        for c in range(n):
            if act[c] < eps:
                f[c] = 1.0 if wts[c] < eps else wo / wts[c]
            elif wts[c] < eps:
                f[c] = act[c] / ao
    return [min(max(v, eps), 1 / eps) for v in f]


@pytest.mark.parametrize("alpha", [0.2, 0.5, 0.8])
def test_dmq_matches_amct_loops(alpha):
    rng = np.random.default_rng(3)
    w = rng.normal(size=(3, 3, 6, 8)).astype(np.float32)
    w[:, :, 1, :] = 0.0  # weight-zero input channel
    act = rng.uniform(0, 20, 6).astype(np.float32)
    act[4] = 0.0  # activation-zero input channel
    got = balance_factors(act, w, "HWIO", alpha)
    wts = np.abs(w).max(axis=(0, 1, 3))
    ref = dmq_reference(act.tolist(), wts.tolist(), alpha)
    assert got.shape == (6,) and np.allclose(got, ref, rtol=1e-5)


def test_dmq_edge_cases():
    w = np.ones((2, 3), np.float32)
    assert balance_factors([0.0, 0.0], w, "IO").tolist() == [1.0, 1.0]
    assert balance_factors([1.0, 2.0], np.zeros((2, 3)), "IO").tolist() == [1.0, 1.0]
    with pytest.raises(QuantError, match="migration_strength"):
        balance_factors([1.0, 1.0], w, "IO", alpha=0.9)
    with pytest.raises(QuantError, match="Cin"):
        balance_factors([1.0, 1.0, 1.0], w, "IO")
    big = balance_factors([1e30, 1.0], np.array([[1e-6], [1.0]]), "IO", 0.8)
    assert big.max() == 2.0**23  # clamped to 1 / FLT_EPSILON


# -- shift_bit ------------------------------------------------------------------------------
def test_shift_definition_is_minimal_and_in_range():
    acc = np.array([0.0, 1.0, 32767.0, 32768.0, 65534.0, 65535.0, 1e6, 2.0**50])
    s = shift_for_accumulator(acc)
    assert s.tolist() == [1, 1, 1, 1, 1, 2, 5, 16]
    for a, k in zip(acc, s, strict=True):
        assert k == 16 or a / 2.0**k <= 32767  # fits after the shift
        assert k == 1 or a / 2.0 ** (k - 1) > 32767  # and no smaller shift would


def test_shift_from_weights_never_overflows_int16():
    rng = np.random.default_rng(4)
    k = rng.normal(size=(3, 3, 16, 4)).astype(np.float32)
    scales, _ = arq_factors(k, "HWIO")
    shifts = shift_bits_from_weights(k, "HWIO", scales)
    q = quantize_weights(k, "HWIO", scales).reshape(-1, 4)
    worst = np.abs(q).sum(axis=0) * 255  # q_x - offset_d reaches 255 at INT8 asymmetric
    assert np.all(worst / 2.0**shifts <= 32767) and shifts.shape == (4,)
    assert np.all((shifts == 1) | (worst / 2.0 ** (shifts - 1) > 32767))


def test_shift_from_range_matches_accumulator_of_calibrated_output():
    scale_d, scale_w = 0.02, np.array([0.001, 0.01])
    out = np.array([50.0, 0.3])
    acc = out / (scale_d * scale_w)
    assert (
        shift_bits_from_range(scale_d, scale_w, out).tolist() == shift_for_accumulator(acc).tolist()
    )
