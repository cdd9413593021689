"""Exponent rules where ESP-DL v3 differs from v1 (the shared lookups stay in
:mod:`amct_bridge.espdl.exponents`): bias widths per target, the ``mac_shift >= 0`` rule,
pre-activation ranges of a Conv/Gemm whose activation runs as its own node, and the
bounds an op's output exponent falls back to when the calibration saw no range for it.

Example:
    >>> bias_bits("esp32s3", 8), bias_bits("esp32p4", 16), bias_bits("c", 16)
    (20, 40, 64)
    >>> keep_mac_shift(e_in=-5, e_w=-3, e_out=-9)  # -9 - (-3) - (-5) = -1 < 0: raise e_out
    (-8, True)
"""

from __future__ import annotations

import math

import numpy as np

#: Bits of a Conv/Gemm bias the target's kernels keep, by (target, feature bits). esp32s3's
#: int8 QACC lanes hold 20 bits (``reset_bias_layout``); the others keep the stored width
#: (esp-ppq's EspdlQuantizer uses the same numbers).
_BIAS_BITS = {
    ("esp32s3", 8): 20,
    ("esp32s3", 16): 40,
    ("esp32p4", 8): 32,
    ("esp32p4", 16): 40,
    ("c", 8): 32,
    ("c", 16): 64,
}


def bias_bits(target: str, bits: int) -> int:
    """Signed bits a Conv/Gemm bias may use on ``target`` with ``bits``-bit features.

    Example:
        >>> bias_bits("c", 8)
        32
    """
    return _BIAS_BITS[(target, bits)]


def keep_mac_shift(e_in: int, e_w: int, e_out: int) -> tuple[int, bool]:
    """``(e_out, raised)`` with ``mac_shift = e_out - e_w - e_in >= 0``.

    The sum of products is a multiple of ``2^(e_in + e_w)`` (the bias too), so an output finer
    than that holds no more information: raising ``e_out`` to ``e_in + e_w`` loses nothing,
    it only widens the range (esp-ppq refuses instead, esp-dl issue #249).

    Example:
        >>> keep_mac_shift(-6, -7, -5)
        (-5, False)
    """
    if e_out - e_w - e_in >= 0:
        return e_out, False
    return e_in + e_w, True


def interval_bound(
    kernel: np.ndarray, bias: np.ndarray | None, lo: float, hi: float
) -> tuple[float, float]:
    """Range of ``x @ kernel + bias`` per output channel for inputs in ``[lo, hi]`` (zero
    padding included), the union over channels. ``kernel`` is ``[N, K]``.

    Example:
        >>> interval_bound(np.array([[1.0, -2.0]]), np.array([0.5]), 0.0, 1.0)
        (-1.5, 1.5)
    """
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    pos = np.clip(kernel, 0, None).sum(axis=1)
    neg = np.clip(kernel, None, 0).sum(axis=1)
    b = np.zeros(kernel.shape[0]) if bias is None else np.asarray(bias, np.float64)
    top = pos * hi + neg * lo + b
    bottom = pos * lo + neg * hi + b
    return float(bottom.min()), float(top.max())


def _invert_increasing(fn, y: float, lo: float, hi: float) -> float:
    """x in [lo, hi] with fn(x) = y (fn increasing there), by bisection."""
    for _ in range(60):
        mid = (lo + hi) / 2
        if fn(mid) < y:
            lo = mid
        else:
            hi = mid
    return hi


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def preactivation_range(
    activation: str,
    post: tuple[float, float] | None,
    bound: tuple[float, float],
    spread_shift: float | None = None,
) -> tuple[float, float]:
    """Range of a Conv/Gemm output that an activation node reads, from the calibrated range
    ``post`` of the activation's output (the sidecar holds the layer's output only) and the
    ``bound`` of :func:`interval_bound`.

    For monotonic activations the calibrated output range inverts exactly; where an
    activation saturates (sigmoid near 0 or 1, swish for x < -6) the pre-activation is
    clipped where the output changes by less than ~0.015. Softmax (given ``spread_shift``,
    the largest |bias|): ``±(ln(p_max / p_min) + spread_shift)``, an estimate; unknown
    activations take the bound.

    Example:
        >>> lo, hi = preactivation_range("sigmoid", (0.5, 0.75), (-50.0, 50.0))
        >>> round(lo, 6), round(hi, 4)
        (0.0, 1.0986)
    """
    b_lo, b_hi = bound
    if post is None:
        return bound
    y_lo, y_hi = post
    low, high = b_lo, b_hi
    if activation in ("sigmoid", "tanh"):
        eps = 1e-4
        if activation == "tanh":
            y_lo, y_hi = (y_lo + 1) / 2, (y_hi + 1) / 2  # tanh(x) = 2 sigmoid(2x) - 1

        def logit(y: float) -> float:
            y = min(max(y, eps), 1 - eps)
            return math.log(y / (1 - y))

        scale = 0.5 if activation == "tanh" else 1.0
        low, high = scale * logit(y_lo), scale * logit(y_hi)
    elif activation == "hard_sigmoid":
        low, high = 6 * y_lo - 3, 6 * y_hi - 3
    elif activation in ("swish", "silu", "gelu", "gelu_tanh", "hard_swish", "hard_silu"):
        if activation in ("swish", "silu"):
            fn = lambda x: x * _sigmoid(x)  # noqa: E731
        elif activation == "gelu":
            fn = lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
        elif activation == "gelu_tanh":  # GELU's tanh approximation (MindSpore nn.GELU())
            c = math.sqrt(2 / math.pi)
            fn = lambda x: 0.5 * x * (1 + math.tanh(c * (x + 0.044715 * x**3)))  # noqa: E731
        else:
            fn = lambda x: x * min(max(x + 3, 0), 6) / 6  # noqa: E731
        high = _invert_increasing(fn, max(y_hi, 0.0), 0.0, max(b_hi, 1.0)) if y_hi > 0 else 0.0
        low = -3.0 if activation in ("hard_swish", "hard_silu") else -max(high, 6.0)
    elif activation == "relu6":
        low, high = min(y_lo, 0.0), 6.0 if y_hi >= 6.0 else y_hi
    elif activation == "relu":
        low, high = b_lo, y_hi
    elif activation == "softmax" and spread_shift is not None:
        # z_i - z_j = ln(p_i / p_j): the calibrated probabilities bound the logits' spread;
        # their common shift is taken as at most the bias's (an estimate, with a warning)
        p_lo, p_hi = max(y_lo, 1e-6), max(y_hi, 1e-6)
        reach = math.log(p_hi / p_lo) + spread_shift
        low, high = -reach, reach
    else:
        return bound
    low, high = max(b_lo, low), min(b_hi, high)
    return (low, high) if high > low else bound


#: Output range of activations whatever their input ([lo, hi]; None: the input's).
FIXED_RANGES: dict[str, tuple[float, float]] = {
    "sigmoid": (0.0, 1.0),
    "hard_sigmoid": (0.0, 1.0),
    "tanh": (-1.0, 1.0),
    "softmax": (0.0, 1.0),
}
