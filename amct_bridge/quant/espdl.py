"""ESP-DL v1 power-of-two quantization: exponents and symmetric integer coefficients.

ESP-DL stores ``real = int * 2**exponent`` with no zero point, int8 or int16. This module
reproduces the convert tool's arithmetic (see docs/quantization.md, "ESP-DL exponents"):

- ``auto_exponent(x, bits)`` = ``ceil(log2(max|x| / (2**(bits-1) - 1)))``, 0 for an all-zero
  tensor, computed exactly (no float log2 rounding at powers of two);
- ``channel_exponents(x, axis, bits)``: one automatic exponent per channel, clamped to >= -15
  as the tool does in per-channel mode;
- ``quantize_pow2(x, exponent, bits)``: ``clip(round_half_even(x / 2**e), -2**(w-1), 2**(w-1)-1)``;
- ``range_to_exponent(lo, hi, bits)`` and ``scale_offset_to_exponent(scale_d, offset_d, ...)``:
  the smallest symmetric power-of-two format covering a calibrated (possibly asymmetric) range.

Example:
    >>> from amct_bridge.quant.espdl import auto_exponent, quantize_pow2
    >>> auto_exponent([1.0], 8), auto_exponent([127 / 128], 8)
    (-6, -7)
    >>> quantize_pow2([0.5, -3.0], -6, 8).tolist()
    [32, -128]
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from amct_bridge.errors import QuantError

#: The convert tool clamps per-channel automatic exponents to this minimum.
MIN_CHANNEL_EXPONENT = -15

_INT_DTYPES = {8: np.int8, 16: np.int16}


def _check_bits(bits: int) -> int:
    if bits not in _INT_DTYPES:
        raise QuantError(f"ESP-DL element width must be 8 or 16 bits, got {bits!r}")
    return int(bits)


def _finite_array(x: ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.size and not np.all(np.isfinite(arr)):
        bad = "NaN" if np.isnan(arr).any() else "Inf"
        raise QuantError(f"{name}: contains {bad}; cannot choose an ESP-DL exponent")
    return arr


def exponent_for_absmax(absmax: float, bits: int = 8) -> int:
    """Smallest ``e`` with ``absmax <= (2**(bits-1) - 1) * 2**e`` (0 when ``absmax`` is 0).

    Equal to ``ceil(log2(absmax / (2**(bits-1) - 1)))`` evaluated exactly.

    Example:
        >>> exponent_for_absmax(1.0, 8), exponent_for_absmax(6.0, 16)
        (-6, -12)
    """
    bits = _check_bits(bits)
    absmax = float(absmax)
    if not math.isfinite(absmax) or absmax < 0:
        raise QuantError(f"absmax must be finite and >= 0, got {absmax!r}")
    if absmax == 0.0:
        return 0
    qmax = float(2 ** (bits - 1) - 1)
    e = math.ceil(math.log2(absmax / qmax))
    # log2 may be off by one ulp at exact powers of two; settle it with exact ldexp products.
    while absmax > math.ldexp(qmax, e):
        e += 1
    while absmax <= math.ldexp(qmax, e - 1):
        e -= 1
    return e


def auto_exponent(x: ArrayLike, bits: int = 8, *, name: str = "tensor") -> int:
    """The convert tool's automatic exponent of a whole tensor.

    Args:
        x: the values (any shape).
        bits: element width, 8 (s8) or 16 (s16).
        name: tensor name used in error messages.

    Example:
        >>> auto_exponent([0.0, -1.0, 0.5], 8)
        -6
    """
    arr = _finite_array(x, name)
    return exponent_for_absmax(float(np.max(np.abs(arr))) if arr.size else 0.0, bits)


def channel_exponents(
    x: ArrayLike,
    axis: int,
    bits: int = 8,
    *,
    min_exponent: int = MIN_CHANNEL_EXPONENT,
    name: str = "tensor",
) -> np.ndarray:
    """Per-channel automatic exponents along ``axis``, clamped to ``>= min_exponent``.

    An all-zero channel gets 0, like an all-zero tensor.

    Example:
        >>> channel_exponents([[1.0, 1e-9], [0.5, 0.0]], axis=1).tolist()
        [-6, -15]
    """
    arr = _finite_array(x, name)
    if arr.ndim == 0:
        raise QuantError(f"{name}: per-channel exponents need at least one dimension")
    absmax = np.max(np.abs(np.moveaxis(arr, axis, -1)).reshape(-1, arr.shape[axis]), axis=0)
    exps = [max(exponent_for_absmax(a, bits), min_exponent) if a > 0 else 0 for a in absmax]
    return np.asarray(exps, dtype=np.int64)


def quantize_pow2(
    x: ArrayLike, exponent: int | ArrayLike, bits: int = 8, *, axis: int | None = None
) -> np.ndarray:
    """Quantize to ``clip(round_half_even(x / 2**exponent), -2**(bits-1), 2**(bits-1) - 1)``.

    Args:
        x: float values.
        exponent: one int, or one per channel along ``axis``.
        bits: 8 -> int8 result, 16 -> int16 result.
        axis: channel axis when ``exponent`` is a sequence.

    Example:
        >>> quantize_pow2([0.015625, 0.0234375], -6).tolist()  # 1.0 and 1.5 steps: half to even
        [1, 2]
    """
    bits = _check_bits(bits)
    arr = _finite_array(x, "tensor")
    exp = np.asarray(exponent, dtype=np.int64)
    if exp.ndim:
        if axis is None:
            raise QuantError("quantize_pow2: per-channel exponents need an axis")
        shape = [1] * arr.ndim
        shape[axis] = exp.size
        exp = exp.reshape(shape)
    # ldexp divides by the power of two exactly (no rounding before the half-to-even step).
    q = np.rint(np.ldexp(arr, -exp))
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return np.clip(q, lo, hi).astype(_INT_DTYPES[bits])


def dequantize_pow2(
    q: ArrayLike, exponent: int | ArrayLike, *, axis: int | None = None
) -> np.ndarray:
    """``q * 2**exponent`` as float32 (per-channel exponents along ``axis``).

    Example:
        >>> dequantize_pow2([32, -128], -6).tolist()
        [0.5, -2.0]
    """
    arr = np.asarray(q, dtype=np.float64)
    exp = np.asarray(exponent, dtype=np.int64)
    if exp.ndim:
        shape = [1] * arr.ndim
        shape[-1 if axis is None else axis] = exp.size
        exp = exp.reshape(shape)
    return np.ldexp(arr, exp).astype(np.float32)


#: Largest exponent magnitude an activation range may need: beyond it the range is above
#: 2^71 or (not zero) below 2^-70, which no calibrated network produces.
MAX_RANGE_EXPONENT = 64


def range_to_exponent(lo: float, hi: float, bits: int = 8) -> int:
    """Exponent of the symmetric power-of-two format covering ``[lo, hi]``.

    Example:
        >>> range_to_exponent(0.0, 6.0, 8), range_to_exponent(-1.0, 0.25, 8)
        (-4, -6)
        >>> range_to_exponent(-1e300, 1e300)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.QuantError: range [-1e+300, 1e+300] needs exponent 990; ...
    """
    lo_f, hi_f = float(lo), float(hi)
    if not (math.isfinite(lo_f) and math.isfinite(hi_f)):
        raise QuantError(f"range [{lo!r}, {hi!r}] is not finite; cannot choose an ESP-DL exponent")
    if lo_f > hi_f:
        raise QuantError(f"range [{lo!r}, {hi!r}] has min > max")
    exp = exponent_for_absmax(max(abs(lo_f), abs(hi_f)), bits)
    if abs(exp) > MAX_RANGE_EXPONENT:  # 1e300 gave exponent 990 and an export that ran
        raise QuantError(
            f"range [{lo!r}, {hi!r}] needs exponent {exp}; a calibrated activation range "
            f"needs one within -{MAX_RANGE_EXPONENT}..{MAX_RANGE_EXPONENT} (the runtime's "
            "shifts): a broken calibration or sidecar"
        )
    return exp


def scale_offset_to_exponent(
    scale_d: float, offset_d: int, act_bits: int = 8, bits: int = 8
) -> int:
    """ESP-DL exponent covering the range an AMCT ``(scale_d, offset_d)`` pair represents.

    The AMCT pair encodes ``[(qmin - offset_d) * scale_d, (qmax - offset_d) * scale_d]`` with
    ``qmin, qmax = -2**(act_bits-1), 2**(act_bits-1) - 1``; the result is the smallest symmetric
    power-of-two format (``bits`` wide) that holds that whole range.

    Example:
        >>> scale_offset_to_exponent(6 / 255, -128)  # ReLU6 -> [0, 6] -> 6 <= 127 * 2**-4
        -4
    """
    scale = float(scale_d)
    if not math.isfinite(scale) or scale <= 0:
        raise QuantError(f"scale_d must be finite and > 0, got {scale_d!r}")
    if act_bits not in (4, 8, 16):
        raise QuantError(f"act_bits must be 4, 8 or 16, got {act_bits!r}")
    qmin, qmax = -(2 ** (act_bits - 1)), 2 ** (act_bits - 1) - 1
    if not qmin <= int(offset_d) <= qmax:
        raise QuantError(f"offset_d {offset_d} outside [{qmin}, {qmax}] for INT{act_bits}")
    lo = (qmin - int(offset_d)) * scale
    hi = (qmax - int(offset_d)) * scale
    return range_to_exponent(lo, hi, bits)
