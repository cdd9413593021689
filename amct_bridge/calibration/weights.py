"""Weights -> weight factors: Conv+BN folding, ARQ scale_w, DMQ balance, shift_bit inputs.

Kernels stay in the layout the adapter states (:class:`~amct_bridge.calibration.protocol.
PartWeights`): the math in :mod:`amct_bridge.quant` reads output / input channel axes from
:mod:`amct_bridge.quant.layouts`, so one code path serves Keras ``HWIO`` and MindSpore ``OIHW``.

Example:
    >>> k = np.array([[1.0, -2.0], [0.5, 4.0]], np.float32)  # Dense (in, out): layout "IO"
    >>> input_channels(k, "IO"), weight_factors(k, "IO", part_channel_wise=False,
    ...                                          channel_wise=True)
    (2, ([0.031496062874794006], [0]))
"""

from __future__ import annotations

import numpy as np

from amct_bridge.calibration.protocol import BatchNormParams, PartWeights
from amct_bridge.errors import CalibrationError
from amct_bridge.quant.arq import arq_factors
from amct_bridge.quant.dmq import balance_factors
from amct_bridge.quant.fold import fold_batchnorm
from amct_bridge.quant.layouts import get_layout
from amct_bridge.quant.shift_bit import shift_bits_from_weights


def input_channels(kernel: np.ndarray, layout: str) -> int:
    """Number of input channels of a kernel (length of tensor_balance_factor).

    Example:
        >>> input_channels(np.zeros((8, 3, 3, 3)), "OIHW")
        3
    """
    return int(kernel.shape[get_layout(kernel, layout).in_axis])


def fold(weights: PartWeights, bn: BatchNormParams | None, name: str) -> PartWeights:
    """The part's weights with ``bn`` folded in (unchanged when ``bn`` is None).

    Example:
        >>> w = PartWeights(np.ones((1, 2), np.float32), "IO")
        >>> bn = BatchNormParams(np.float32([2, 1]), None, np.zeros(2), np.ones(2), 0.0)
        >>> f = fold(w, bn, "fc"); f.kernel.tolist(), f.bias.tolist()
        ([[2.0, 1.0]], [0.0, 0.0])
    """
    if bn is None:
        return weights
    kernel, bias = fold_batchnorm(
        weights.kernel,
        weights.bias,
        bn.gamma,
        bn.beta,
        bn.mean,
        bn.var,
        float(bn.eps),
        weights.layout,
        name=name,
    )
    return PartWeights(np.asarray(kernel, np.float32), weights.layout, np.asarray(bias, np.float32))


def weight_factors(
    kernel: np.ndarray,
    layout: str,
    *,
    part_channel_wise: bool,
    channel_wise: bool,
    name: str = "kernel",
) -> tuple[list[float], list[int]]:
    """ARQ ``(scale_w, offset_w)`` lists; per channel only where AMCT allows it (the part
    allows it and the config asks for it).

    Example:
        >>> weight_factors(np.array([[1.0, -2.0]], "float32"), "IO", part_channel_wise=False,
        ...                channel_wise=True)[1]
        [0]
    """
    wise = channel_wise and part_channel_wise
    scale_w, offset_w = arq_factors(kernel, layout, channel_wise=wise, name=name)
    return [float(s) for s in scale_w], [int(o) for o in offset_w]


def balance(
    channel_range: np.ndarray | None, kernel: np.ndarray, layout: str, strength: float, key: str
) -> tuple[list[float], np.ndarray, tuple[float, float]]:
    """DMQ ``(tensor_balance_factor, balanced kernel, balanced activation (lo, hi))``.

    ``channel_range`` is the per-input-channel [min, max] seen in-graph ([2, Cin]). AMCT divides
    activations by the factor and multiplies weights by it, so scale_w is computed on the
    returned kernel and scale_d on the returned activation range.

    Example:
        >>> f, k, r = balance(np.array([[0.0, 0.0], [4.0, 1.0]]), np.array([[1.0], [4.0]]),
        ...                   "IO", 0.5, "fc")
        >>> f, k.ravel().tolist(), r
        ([2.0, 0.5], [2.0, 2.0], (0.0, 2.0))
    """
    if channel_range is None:
        raise CalibrationError(f"layer {key!r}: DMQ needs per-channel activation ranges; none seen")
    lo, hi = np.asarray(channel_range, np.float64)
    factors = balance_factors(
        np.maximum(np.abs(lo), np.abs(hi)), kernel, layout, strength, name=key
    )
    factors = np.asarray(factors, np.float64)
    shape = [1] * kernel.ndim
    shape[get_layout(kernel, layout).in_axis] = -1
    balanced = (kernel * factors.reshape(shape)).astype(np.float32)
    act = (float(np.min(lo / factors)), float(np.max(hi / factors)))
    return [float(f) for f in factors], balanced, act


def shift_bits(
    kernel: np.ndarray, layout: str, scale_w: list[float], act_bits: int, symmetric: bool
) -> list[int]:
    """shift_bit per scale_w entry (joint_quant): the worst-case accumulator bound, see
    :mod:`amct_bridge.quant.shift_bit` (never overflows int16).

    Example:
        >>> shift_bits(np.ones((300, 2)), "IO", [1 / 127], 8, False)
        [9]
    """
    shifts = shift_bits_from_weights(
        kernel, layout, scale_w, act_bits=act_bits, symmetric=symmetric
    )
    return [int(s) for s in shifts]
