"""Activation scale/offset exactly as AMCT computes them, plus numpy fake-quant references.

AMCT arithmetic (hicann/amct ``ifmr.cpp``/``hfmg.cpp``/``util.cpp``), reproduced in float32:

- asymmetric (``activation_offset = true``): ``max = max(max, 0)``, ``min = min(min, 0)``,
  ``scale = (max - min) / (2**b - 1)``, ``offset = -2**(b-1) - round(min / scale)``;
- symmetric (``activation_offset = false``): ``offset = 0``; ``scale = max / (2**(b-1) - 1)`` when
  ``|max| > |min|``, else ``|min| / 2**(b-1)`` (the negative end may use -2**(b-1));
- a scale below FLT_EPSILON becomes 1.0 (so all-zero data gives scale 1.0, offset -2**(b-1));
- ``round`` is C's ``round``: half away from zero.

Example:
    >>> from amct_bridge.quant.factors import activation_factors
    >>> activation_factors(0.0, 1.0)
    (0.003921568859368563, -128)
    >>> activation_factors(-1.0, 3.0, symmetric=True)
    (0.023622047156095505, 0)
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from amct_bridge.errors import QuantError

#: float32 machine epsilon; AMCT replaces smaller scales with 1.0.
FLT_EPSILON = float(np.finfo(np.float32).eps)

#: record type names -> bit widths (act_type INT8/INT16, dst_type INT8/INT4).
TYPE_BITS = {"INT4": 4, "INT8": 8, "INT16": 16}


def bits_of(type_name: str | int) -> int:
    """Bit width of an AMCT type name ("INT4", "INT8", "INT16") or of an int width.

    Example:
        >>> bits_of("INT16"), bits_of(8)
        (16, 8)
    """
    if isinstance(type_name, (int, np.integer)) and int(type_name) in TYPE_BITS.values():
        return int(type_name)
    if isinstance(type_name, str) and type_name.upper() in TYPE_BITS:
        return TYPE_BITS[type_name.upper()]
    raise QuantError(
        f"unsupported quantization type {type_name!r}; expected one of INT4, INT8, INT16"
    )


def quant_limits(bits: int) -> tuple[int, int]:
    """Signed integer range ``(-2**(bits-1), 2**(bits-1) - 1)`` of a bit width.

    Example:
        >>> quant_limits(4)
        (-8, 7)
    """
    b = bits_of(bits)
    return -(2 ** (b - 1)), 2 ** (b - 1) - 1


def round_half_away(x: ArrayLike) -> np.ndarray:
    """C ``round``: halves go away from zero (numpy's ``round`` goes to even).

    Example:
        >>> round_half_away([0.5, 1.5, -2.5]).tolist()
        [1.0, 2.0, -3.0]
    """
    a = np.asarray(x)
    return np.copysign(np.floor(np.abs(a) + 0.5), a)


def process_scale(scale: float, name: str = "tensor") -> float:
    """AMCT's ``ProcessScale``: below FLT_EPSILON -> 1.0; NaN/Inf or > 1/FLT_EPSILON -> error.

    Example:
        >>> process_scale(1e-9)
        1.0
    """
    s = float(np.float32(scale))
    if math.isnan(s) or math.isinf(s):
        raise QuantError(f"{name}: scale is {s}; the calibrated range is not finite")
    if s < FLT_EPSILON:
        return 1.0
    if 1.0 / s < FLT_EPSILON:
        raise QuantError(f"{name}: scale {s} is larger than 1/FLT_EPSILON; range too wide")
    return s


def check_finite_range(lo: float, hi: float, name: str = "tensor") -> tuple[float, float]:
    """Return ``(lo, hi)`` as floats or raise QuantError naming the tensor on NaN/Inf/min > max.

    Example:
        >>> check_finite_range(-1, 2)
        (-1.0, 2.0)
    """
    lo_f, hi_f = float(lo), float(hi)
    if not (math.isfinite(lo_f) and math.isfinite(hi_f)):
        raise QuantError(
            f"{name}: calibration range [{lo_f}, {hi_f}] contains NaN/Inf; "
            "the data fed to this tensor is not finite"
        )
    if lo_f > hi_f:
        raise QuantError(f"{name}: calibration range has min {lo_f} > max {hi_f}")
    return lo_f, hi_f


def raw_activation_scale(
    lo: float, hi: float, bits: int | str = 8, symmetric: bool = False, *, name: str = "tensor"
) -> float:
    """The activation scale of ``[lo, hi]`` before AMCT's ``ProcessScale`` (which turns one
    below FLT_EPSILON into 1.0: :func:`process_scale`).

    Example:
        >>> raw_activation_scale(0.0, 2.55e-6) < FLT_EPSILON  # a range that collapses
        True
    """
    b = bits_of(bits)
    lo_f, hi_f = check_finite_range(lo, hi, name)
    f32 = np.float32
    mx, mn = f32(max(hi_f, 0.0)), f32(min(lo_f, 0.0))
    if symmetric:
        if abs(mx) > abs(mn):
            return float(mx) / (2 ** (b - 1) - 1)
        return float(-mn) / 2 ** (b - 1)
    # AMCT subtracts in float32, divides, casts to float; offset divides in float32 too.
    return float(f32(mx - mn)) / (2**b - 1)


def activation_factors(
    lo: float,
    hi: float,
    bits: int | str = 8,
    symmetric: bool = False,
    *,
    name: str = "tensor",
) -> tuple[float, int]:
    """AMCT ``(scale_d, offset_d)`` for an activation clip range ``[lo, hi]``.

    Args:
        lo: clip minimum (clamped to <= 0).
        hi: clip maximum (clamped to >= 0).
        bits: 4, 8, 16 or "INT4"/"INT8"/"INT16" (act_type / dst_type).
        symmetric: True for ``activation_offset = false`` (offset 0).
        name: tensor name for error messages.

    Returns:
        ``(scale_d, offset_d)``: scale_d is a float32 value (as written to a record), offset_d an
        int inside the type's range.

    Example:
        >>> activation_factors(0.0, 6.0)
        (0.0235294122248888, -128)
    """
    b = bits_of(bits)
    scale = process_scale(raw_activation_scale(lo, hi, b, symmetric, name=name), name)
    if symmetric:
        return scale, 0
    mn = np.float32(min(float(lo), 0.0))
    ratio = float(np.float32(mn) / np.float32(scale))
    offset = -(2 ** (b - 1)) - int(round_half_away(ratio))
    qmin, qmax = quant_limits(b)
    return scale, int(min(max(offset, qmin), qmax))


def quantize(
    x: ArrayLike,
    scale: float | ArrayLike,
    offset: int | ArrayLike = 0,
    bits: int | str = 8,
    *,
    axis: int | None = None,
) -> np.ndarray:
    """``q = clamp(round(x / scale) + offset, qmin, qmax)`` (C rounding), as int32.

    ``scale``/``offset`` may be per channel along ``axis``.

    Example:
        >>> quantize([0.0, 0.25, 1.0, 2.0], 1 / 255, -128).tolist()
        [-128, -64, 127, 127]
    """
    qmin, qmax = quant_limits(bits)
    arr = np.asarray(x, dtype=np.float32)
    s, o = _per_channel(scale, arr.ndim, axis), _per_channel(offset, arr.ndim, axis)
    q = round_half_away(arr / s.astype(np.float32)) + o
    return np.clip(q, qmin, qmax).astype(np.int32)


def dequantize(
    q: ArrayLike, scale: float | ArrayLike, offset: int | ArrayLike = 0, *, axis: int | None = None
) -> np.ndarray:
    """``x = (q - offset) * scale`` as float32.

    Example:
        >>> dequantize([-128, 127], 1 / 255, -128).tolist()
        [0.0, 1.0]
    """
    arr = np.asarray(q, dtype=np.float64)
    s, o = _per_channel(scale, arr.ndim, axis), _per_channel(offset, arr.ndim, axis)
    return ((arr - o) * s.astype(np.float32)).astype(np.float32)


def fake_quantize(
    x: ArrayLike,
    scale: float | ArrayLike,
    offset: int | ArrayLike = 0,
    bits: int | str = 8,
    *,
    axis: int | None = None,
) -> np.ndarray:
    """``dequantize(quantize(x))``: the value the quantized network sees (reference for QAT).

    Example:
        >>> fake_quantize([-1.0, 0.0, 9.0], 6 / 255, -128).tolist()
        [0.0, 0.0, 6.0]
    """
    q = quantize(x, scale, offset, bits, axis=axis)
    return dequantize(q, scale, offset, axis=axis)


def _per_channel(v: float | ArrayLike, ndim: int, axis: int | None) -> np.ndarray:
    arr = np.asarray(v, dtype=np.float64)
    if arr.ndim == 0 or arr.size == 1 and axis is None:
        return arr.reshape(())
    if axis is None:
        raise QuantError("per-channel scale/offset need an axis")
    shape = [1] * ndim
    shape[axis] = arr.size
    return arr.reshape(shape)
