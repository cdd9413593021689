"""``shift_bit`` for joint quantization (``joint_quant``): our documented definition.

AMCT writes one ``shift_bit`` per ``scale_w`` (each in [1, 16], or all zero) but does not
publish its meaning. amct_bridge defines it as the arithmetic right shift that brings the
layer's int32 accumulator into int16 before requantization:

    acc_c = sum(q_x * q_w[c]),   real value = acc_c * scale_d * scale_w[c]
    shift_bit[c] = clamp(ceil(log2(A_c / (2**15 - 1))), 1, 16)

where ``A_c`` bounds ``|acc_c|``. Two bounds are offered:

- :func:`shift_bits_from_range` (data-driven): ``A_c = amax|y_c| / (scale_d * scale_w[c])``
  from the calibrated pre-activation output magnitude of channel ``c`` (bias excluded);
- :func:`shift_bits_from_weights` (worst case): ``A_c = sum_k |q_w[k, c]| * q_x_max`` with
  ``q_x_max = 2**b - 1`` for asymmetric activations (``q_x - offset_d`` spans 0..255 at INT8)
  or ``2**(b-1)`` for symmetric ones. Never overflows, may waste precision.

The lower clamp 1 keeps values inside AMCT's accepted range; 16 is its upper limit.

Example:
    >>> shift_bits_from_range(1 / 255, [0.01, 0.001], [100.0, 0.5]).tolist()
    [7, 2]
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from amct_bridge.errors import QuantError
from amct_bridge.quant.arq import quantize_weights
from amct_bridge.quant.layouts import out_major

INT16_MAX = 2**15 - 1
SHIFT_RANGE = (1, 16)


def shift_for_accumulator(acc_absmax: ArrayLike) -> np.ndarray:
    """``clamp(ceil(log2(acc_absmax / 32767)), 1, 16)`` per channel (int64).

    Example:
        >>> shift_for_accumulator([0.0, 32767.0, 32768.0, 2.0**40]).tolist()
        [1, 1, 1, 16]
    """
    a = np.asarray(acc_absmax, dtype=np.float64)
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise QuantError(f"accumulator bound must be finite and >= 0, got {a}")
    with np.errstate(divide="ignore"):
        raw = np.ceil(np.log2(np.maximum(a, 1.0) / INT16_MAX))
    # exact check at powers of two: the shifted bound must fit
    raw = np.where(np.ldexp(float(INT16_MAX), raw.astype(np.int64) - 1) >= a, raw - 1, raw)
    return np.clip(raw, *SHIFT_RANGE).astype(np.int64)


def shift_bits_from_range(scale_d: float, scale_w: ArrayLike, out_absmax: ArrayLike) -> np.ndarray:
    """Data-driven shift: accumulator bound from the calibrated output magnitude per channel.

    ``out_absmax`` is one value (whole tensor) or one per output channel.

    Example:
        >>> shift_bits_from_range(0.5, [0.25], [32767 * 4 * 0.125]).tolist()  # 4x int16 -> 2
        [2]
    """
    s_w = np.asarray(scale_w, dtype=np.float64).ravel()
    out = np.broadcast_to(np.asarray(out_absmax, dtype=np.float64).ravel(), s_w.shape)
    if float(scale_d) <= 0 or np.any(s_w <= 0):
        raise QuantError("scale_d and scale_w must be > 0 to compute shift_bit")
    return shift_for_accumulator(np.abs(out) / (float(scale_d) * s_w))


def shift_bits_from_weights(
    kernel: ArrayLike,
    layout: str,
    scale_w: ArrayLike,
    *,
    act_bits: int = 8,
    symmetric: bool = False,
    name: str = "kernel",
) -> np.ndarray:
    """Worst-case shift: ``sum_k |q_w[k, c]|`` times the largest activation integer.

    Example:
        >>> shift_bits_from_weights(np.ones((300, 2)), "IO", [1 / 127]).tolist()  # 300*127*255
        [9]
    """
    q = quantize_weights(kernel, layout, scale_w, name=name)
    l1 = np.abs(out_major(q, layout, name)).sum(axis=1).astype(np.float64)
    if np.asarray(scale_w).size == 1:  # one scale_w: one shift covering every output channel
        l1 = l1.max(keepdims=True)
    q_x_max = 2 ** (act_bits - 1) if symmetric else 2**act_bits - 1
    return shift_for_accumulator(l1 * q_x_max)
