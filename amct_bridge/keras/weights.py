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

#: Axis of the INPUT channels in each kernel layout (DMQ factors are per input channel).
_IN_AXIS = {"HWIO": 2, "HWIM": 2, "HWOI": 3, "IO": 0}


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
    return int(kernel_of(layer, part).shape[_IN_AXIS[part.layout]])


def part_kernel(target) -> tuple[np.ndarray, np.ndarray | None]:
    """(kernel, bias) that the record describes: BN-folded when ``target.bn`` is set.

    Example:
        >>> # see tests/keras/test_weights.py
    """
    from amct_bridge.quant.fold import fold_batchnorm

    kernel, bias = kernel_of(target.layer, target.part), bias_of(target.layer, target.part)
    if target.bn is None:
        return kernel, bias
    bn = target.bn
    var = np.asarray(bn.moving_variance, dtype=np.float32)
    gamma = np.asarray(bn.gamma, dtype=np.float32) if bn.scale else np.ones_like(var)
    beta = np.asarray(bn.beta, dtype=np.float32) if bn.center else np.zeros_like(var)
    mean = np.asarray(bn.moving_mean, dtype=np.float32)
    folded, folded_bias = fold_batchnorm(
        kernel, bias, gamma, beta, mean, var, float(bn.epsilon), layout=target.part.layout
    )
    return np.asarray(folded, np.float32), np.asarray(folded_bias, np.float32)


def weight_factors(kernel: np.ndarray, part: QuantPart, channel_wise: bool):
    """ARQ ``(scale_w, offset_w)`` lists; per channel only where AMCT allows it.

    Example:
        >>> from amct_bridge.keras.layers import QUANTIZABLE
        >>> weight_factors(np.array([[1.0, -2.0]], "float32"), QUANTIZABLE["Dense"][0], True)[1]
        [0]
    """
    from amct_bridge.quant.arq import arq_factors

    scale_w, offset_w = arq_factors(
        kernel, part.layout, channel_wise=channel_wise and part.channel_wise
    )
    return [float(s) for s in scale_w], [int(o) for o in offset_w]


def freeze_fold(target, kernel: np.ndarray, bias: np.ndarray | None) -> Fold:
    """The :class:`~amct_bridge.keras.freeze.Fold` that bakes ``kernel``/``bias`` into a .pb."""
    own = bias_of(target.layer, target.part)
    delta = bias if own is None else bias - own
    return Fold(target.key, target.bn, kernel, np.asarray(delta, np.float32))


def balance(absmax, kernel: np.ndarray, part: QuantPart, strength: float, key: str) -> list[float]:
    """DMQ tensor_balance_factor (one per input channel) from activation and weight max|.|."""
    from amct_bridge.quant.dmq import balance_factors

    if absmax is None:
        raise CalibrationError(f"layer {key!r}: DMQ needs per-channel activation maxima; none seen")
    factors = balance_factors(np.asarray(absmax), kernel, part.layout, strength)
    return [float(f) for f in factors]


def shift_bits(kernel: np.ndarray, part: QuantPart, scale_w, scale_d: float, cfg) -> list[int]:
    """shift_bit per scale_w entry (joint_quant), as defined in amct_bridge.quant.shift_bit."""
    from amct_bridge.quant.shift_bit import shift_bits as compute

    return [int(s) for s in compute(kernel, part.layout, scale_w, scale_d)]
