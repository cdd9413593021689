"""Keras kernels -> weight factors: Conv+BN folding, ARQ scale_w, DMQ and shift_bit inputs.

This module only reads Keras weights and hands numpy arrays to :mod:`amct_bridge.quant` (ARQ,
BN folding, DMQ balance factors, shift_bit); the math lives there. Kernels stay in Keras layout
(see :mod:`amct_bridge.keras.layers`), which is also the TF op's filter layout, so the frozen graph
(:mod:`amct_bridge.keras.freeze`) carries exactly the array scale_w was computed from.

Example:
    >>> import keras
    >>> from amct_bridge.keras.layers import QUANTIZABLE
    >>> layer = keras.layers.Conv2D(8, 3); layer.build((None, 16, 16, 3))
    >>> input_channels(layer, QUANTIZABLE["Conv2D"][0])
    3
"""

from __future__ import annotations

import numpy as np

from amct_bridge.errors import CalibrationError
from amct_bridge.keras.freeze import Fold
from amct_bridge.keras.layers import QuantPart
from amct_bridge.quant.arq import arq_factors
from amct_bridge.quant.dmq import balance_factors
from amct_bridge.quant.fold import fold_batchnorm
from amct_bridge.quant.layouts import get_layout
from amct_bridge.quant.shift_bit import shift_bits_from_weights


def kernel_of(layer, part: QuantPart) -> np.ndarray:
    """The part's kernel as float32 numpy (Keras layout).

    Example:
        >>> import keras
        >>> from amct_bridge.keras.layers import QUANTIZABLE
        >>> d = keras.layers.Dense(2); d.build((None, 3))
        >>> kernel_of(d, QUANTIZABLE["Dense"][0]).shape
        (3, 2)
    """
    return np.asarray(getattr(layer, part.kernel_attr), dtype=np.float32)


def bias_of(layer, part: QuantPart) -> np.ndarray | None:
    """The part's bias as float32 numpy, or None (no bias / depthwise half of a separable conv)."""
    if part.bias_attr is None or not getattr(layer, "use_bias", False):
        return None
    bias = getattr(layer, part.bias_attr, None)
    return None if bias is None else np.asarray(bias, dtype=np.float32)


def input_channels(layer, part: QuantPart) -> int:
    """Number of input channels of the part's kernel (length of tensor_balance_factor)."""
    kernel = kernel_of(layer, part)
    return int(kernel.shape[get_layout(kernel, part.layout).in_axis])


def part_kernel(target) -> tuple[np.ndarray, np.ndarray | None]:
    """(kernel, bias) that the record describes: BN-folded when ``target.bn`` is set.

    Example:
        >>> # see tests/keras/test_weights.py
    """
    kernel, bias = kernel_of(target.layer, target.part), bias_of(target.layer, target.part)
    if target.bn is None:
        return kernel, bias
    bn = target.bn
    folded, folded_bias = fold_batchnorm(
        kernel,
        bias,
        np.asarray(bn.gamma) if bn.scale else None,
        np.asarray(bn.beta) if bn.center else None,
        np.asarray(bn.moving_mean),
        np.asarray(bn.moving_variance),
        float(bn.epsilon),
        target.part.layout,
        name=target.key,
    )
    return np.asarray(folded, np.float32), np.asarray(folded_bias, np.float32)


def weight_factors(kernel: np.ndarray, part: QuantPart, channel_wise: bool, name: str = "kernel"):
    """ARQ ``(scale_w, offset_w)`` lists; per channel only where AMCT allows it.

    Example:
        >>> from amct_bridge.keras.layers import QUANTIZABLE
        >>> weight_factors(np.array([[1.0, -2.0]], "float32"), QUANTIZABLE["Dense"][0], True)[1]
        [0]
    """
    wise = channel_wise and part.channel_wise
    scale_w, offset_w = arq_factors(kernel, part.layout, channel_wise=wise, name=name)
    return [float(s) for s in scale_w], [int(o) for o in offset_w]


def freeze_fold(target, kernel: np.ndarray, bias: np.ndarray | None) -> Fold:
    """The :class:`~amct_bridge.keras.freeze.Fold` that bakes ``kernel``/``bias`` into a .pb."""
    own = bias_of(target.layer, target.part)
    delta = bias if own is None else bias - own
    return Fold(target.key, target.bn, kernel, np.asarray(delta, np.float32))


def balance(channel_range, kernel: np.ndarray, part: QuantPart, strength: float, key: str):
    """DMQ ``(tensor_balance_factor, balanced kernel, balanced activation (lo, hi))``.

    ``channel_range`` is the per-input-channel [min, max] seen in-graph ([2, Cin]). AMCT divides
    activations by the factor and multiplies weights by it, so scale_w is computed on the
    returned kernel and scale_d on the returned activation range.

    Example:
        >>> from amct_bridge.keras.layers import QUANTIZABLE
        >>> f, k, r = balance(np.array([[0.0, 0.0], [4.0, 1.0]]), np.array([[1.0], [4.0]]),
        ...                   QUANTIZABLE["Dense"][0], 0.5, "fc")
        >>> f, k.ravel().tolist(), r
        ([2.0, 0.5], [2.0, 2.0], (0.0, 2.0))
    """
    if channel_range is None:
        raise CalibrationError(f"layer {key!r}: DMQ needs per-channel activation ranges; none seen")
    lo, hi = np.asarray(channel_range, np.float64)
    factors = balance_factors(
        np.maximum(np.abs(lo), np.abs(hi)), kernel, part.layout, strength, name=key
    )
    factors = np.asarray(factors, np.float64)
    shape = [1] * kernel.ndim
    shape[get_layout(kernel, part.layout).in_axis] = -1
    balanced = (kernel * factors.reshape(shape)).astype(np.float32)
    act = (float(np.min(lo / factors)), float(np.max(hi / factors)))
    return [float(f) for f in factors], balanced, act


def shift_bits(kernel: np.ndarray, part: QuantPart, scale_w, act_bits: int, symmetric: bool):
    """shift_bit per scale_w entry (joint_quant): the worst-case accumulator bound, see
    :mod:`amct_bridge.quant.shift_bit` (never overflows int16).

    Example:
        >>> from amct_bridge.keras.layers import QUANTIZABLE
        >>> shift_bits(np.ones((300, 2)), QUANTIZABLE["Dense"][0], [1 / 127], 8, False)
        [9]
    """
    shifts = shift_bits_from_weights(
        kernel, part.layout, scale_w, act_bits=act_bits, symmetric=symmetric
    )
    return [int(s) for s in shifts]
