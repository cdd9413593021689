"""Quantization-aware training math both adapters share (numpy only; docs/qat.md).

The Keras and MindSpore QAT cells compute these formulas with their own graph ops (they need
gradients); this module is the reference they mirror:

* :func:`check_options`: the options ``quantize_aware`` accepts (``dst_type`` INT8 / INT4,
  ``activation_range`` "ema" / "learned", ``0 <= ema_decay < 1``), giving the bit width;
* :func:`ema_update`: ``range <- d * range + (1 - d) * batch``, the first batch sets it;
* :func:`fake_quant_range`: an activation fake-quantized with AMCT's factors of its clip range
  ``[lo, hi]`` (widened to contain 0; scale divided in float64 and rounded once to float32, the
  correctly rounded quotient, as the graph ops do);
* :func:`arq_fake_quant`: a kernel fake-quantized with its ARQ scales;
* :func:`record_range`: the clip range a PTQ record's activation factors encode.

The record entries of a QAT run (AMCT's record format) are built from these numbers in
:func:`amct_bridge.calibration.qat.layer_factors`, next to the sidecar: this module does not
know the record format.

Example:
    >>> import numpy as np
    >>> y = fake_quant_range(np.float32([0.25, 2.0]), 0.0, 1.0, 8)  # 2.0 clips to 1.0
    >>> y.astype(float).round(4).tolist()
    [0.251, 1.0]
    >>> record_range(0.5, -128, 8)
    (0.0, 127.5)
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from amct_bridge.errors import QuantError
from amct_bridge.quant.arq import arq_scales
from amct_bridge.quant.factors import (
    FLT_EPSILON,
    quant_limits,
    round_half_away,
)
from amct_bridge.quant.layouts import out_channel_shape

#: ``dst_type`` values of AMCT's QAT record and their bit widths.
DST_TYPES: dict[str, int] = {"INT8": 8, "INT4": 4}
#: How activation clip ranges evolve in training.
RANGE_MODES: tuple[str, ...] = ("ema", "learned")

__all__ = [
    "DST_TYPES",
    "RANGE_MODES",
    "arq_fake_quant",
    "check_options",
    "ema_update",
    "fake_quant_range",
    "record_range",
]


def check_options(dst_type: str, activation_range: str, ema_decay: float) -> int:
    """Validate ``quantize_aware``'s options; return the bit width of ``dst_type``.

    Raises:
        QuantError: naming the option and the values accepted.

    Example:
        >>> check_options("INT4", "ema", 0.99)
        4
    """
    if dst_type not in DST_TYPES:
        raise QuantError(f"dst_type must be 'INT8' or 'INT4', got {dst_type!r}")
    if activation_range not in RANGE_MODES:
        raise QuantError(f"activation_range must be one of {RANGE_MODES}, got {activation_range!r}")
    if not 0.0 <= float(ema_decay) < 1.0:
        raise QuantError(f"ema_decay must be in [0, 1), got {ema_decay}")
    return DST_TYPES[dst_type]


def ema_update(
    lo: float, hi: float, batch_lo: float, batch_hi: float, decay: float, first: bool
) -> tuple[float, float]:
    """The range after one training batch (float32, as the graph computes it).

    Example:
        >>> ema_update(0.0, 1.0, -1.0, 3.0, 0.5, first=False)
        (-0.5, 2.0)
        >>> ema_update(0.0, 1.0, -1.0, 3.0, 0.5, first=True)
        (-1.0, 3.0)
    """
    f = np.float32
    if first:
        return float(f(batch_lo)), float(f(batch_hi))
    d = f(decay)
    one = f(1.0 - decay)  # the graphs multiply by the constant (1 - decay), rounded once
    return float(d * f(lo) + one * f(batch_lo)), float(d * f(hi) + one * f(batch_hi))


def _divide(a, b) -> np.ndarray:
    return (np.asarray(a, np.float64) / np.asarray(b, np.float64)).astype(np.float32)


def _fake_quant(x: np.ndarray, scale, offset, bits: int) -> np.ndarray:
    qmin, qmax = quant_limits(bits)
    q = np.clip(round_half_away(_divide(x, scale)) + np.float32(offset), qmin, qmax)
    return ((q.astype(np.float32) - np.float32(offset)) * np.float32(scale)).astype(np.float32)


def fake_quant_range(
    x: ArrayLike, lo: float, hi: float, bits: int, *, symmetric: bool = False
) -> np.ndarray:
    """``x`` quantized and dequantized with AMCT's factors of the clip range ``[lo, hi]``.

    Asymmetric: ``scale = (hi - lo) / (2^b - 1)``, ``offset = qmin - round(lo / scale)``;
    symmetric: ``offset = 0``, ``scale = hi / (2^(b-1) - 1)`` if ``hi > -lo`` else
    ``-lo / 2^(b-1)``; a scale below FLT_EPSILON becomes 1.0 (the range is first widened to
    contain 0). The factors equal :func:`amct_bridge.quant.factors.activation_factors`'s.

    Example:
        >>> fake_quant_range(np.float32([-3.0, 0.1, 5.0]), -1.0, 1.0, 4, symmetric=True).tolist()
        [-1.0, 0.125, 0.875]
    """
    qmin, qmax = quant_limits(bits)
    x = np.asarray(x, np.float32)
    lo32, hi32 = np.float32(min(float(lo), 0.0)), np.float32(max(float(hi), 0.0))
    if symmetric:
        scale = _divide(hi32, qmax) if hi32 > -lo32 else _divide(-lo32, -qmin)
        scale = np.float32(1.0) if scale < FLT_EPSILON else scale
        return _fake_quant(x, scale, 0.0, bits)
    scale = _divide(np.float32(hi32 - lo32), qmax - qmin)
    scale = np.float32(1.0) if scale < FLT_EPSILON else scale
    offset = np.float32(qmin) - round_half_away(np.float32(lo32 / scale))
    return _fake_quant(x, scale, offset, bits)


def arq_fake_quant(
    kernel: ArrayLike, layout: str, bits: int, *, channel_wise: bool = True
) -> np.ndarray:
    """``kernel`` quantized and dequantized with its ARQ scales (symmetric, offset 0).

    Example:
        >>> y = arq_fake_quant(np.float32([[1.0, -0.3], [0.5, 0.2]]), "IO", 4)
        >>> y.astype(float).round(3).tolist()
        [[1.0, -0.286], [0.429, 0.143]]
    """
    k = np.asarray(kernel, np.float32)
    scales = arq_scales(k, layout, channel_wise, num_bits=bits)
    shape = out_channel_shape(k, layout, "kernel") if scales.size > 1 else ()
    return _fake_quant(k, scales.reshape(shape), 0.0, bits)


def record_range(scale_d: float, offset_d: int, bits: int) -> tuple[float, float]:
    """The clip range whose AMCT activation factors are ``(scale_d, offset_d)`` (``init_record``:
    QAT starts from a PTQ record's ranges): ``lo = (qmin - offset) * scale``,
    ``hi = (qmax - offset) * scale``, on the record's own bit width.

    Example:
        >>> record_range(0.5, -128, 8)
        (0.0, 127.5)
        >>> from amct_bridge.quant.factors import activation_factors
        >>> lo, hi = record_range(0.02, -3, 8)
        >>> activation_factors(lo, hi, 8)[1]
        -3
    """
    qmin, qmax = quant_limits(bits)
    s = float(np.float32(scale_d))
    return (qmin - int(offset_d)) * s, (qmax - int(offset_d)) * s
