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
* :func:`record_range`: the clip range a PTQ record's activation factors encode;
* power-of-two QAT (``power_of_two=True``, ESP-DL's format ``value = int * 2^e``, TQT):
  :func:`threshold_exponent` (the exponent of a learned threshold ``t = 2^log2_t``, the
  export's rule), :func:`fake_quant_pow2` (symmetric, rounded half up as esp32s3 and the C
  kernels round), :func:`weight_exponent` (the export's automatic exponent of a kernel),
  :func:`pow2_range` (the sidecar range whose export exponent is the trained one) and
  :data:`VALUE_KEEPING` (layer kinds whose outputs stay on their input's grid).

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
from amct_bridge.quant.espdl import MAX_RANGE_EXPONENT, auto_exponent
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
#: Training batches over which a learned power-of-two threshold starts (TQT starts from a
#: calibration): ``log2 t`` is the running mean of the batches' ``log2 max|x|`` until then, and
#: trains afterwards. One batch's maximum is a noisy start (a rare outlier, or none); 32
#: batches measured 0.7-0.9 points better on the digits example than one, 100 less so.
THRESHOLD_WARMUP = 32
#: Bounds of a learned log2 threshold: its exponent then stays within the export's limit
#: (``MAX_RANGE_EXPONENT``); an all-zero tensor (log2 0 = -inf) gets the lower one.
LOG2_T_MIN, LOG2_T_MAX = -float(MAX_RANGE_EXPONENT - 8), float(MAX_RANGE_EXPONENT)

#: Layer kinds (the graph IR's: Keras class names, MindSpore cells mapped onto them) whose
#: output values are some of their input's values, or zeros: on the input's power-of-two grid,
#: so power-of-two QAT gives them no quantizer of their own (the chip keeps the input's
#: exponent, or a finer one that holds the same integers). A ReLU only without max_value /
#: slope / threshold, an Activation only "relu" / "linear" (:func:`keeps_values`).
VALUE_KEEPING: frozenset[str] = frozenset(
    {
        "ReLU",
        "Activation",
        "MaxPooling1D",
        "MaxPooling2D",
        "GlobalMaxPooling1D",
        "GlobalMaxPooling2D",
        "AdaptiveMaxPool1d",
        "AdaptiveMaxPool2d",
        "Flatten",
        "Reshape",
        "Permute",
        "Dropout",
        "SpatialDropout1D",
        "SpatialDropout2D",
        "GaussianDropout",
        "GaussianNoise",
        "AlphaDropout",
        "Identity",
        "ZeroPadding1D",
        "ZeroPadding2D",
        "Cropping1D",
        "Cropping2D",
    }
)

__all__ = [
    "DST_TYPES",
    "RANGE_MODES",
    "LOG2_T_MAX",
    "LOG2_T_MIN",
    "THRESHOLD_WARMUP",
    "VALUE_KEEPING",
    "arq_fake_quant",
    "check_options",
    "ema_update",
    "fake_quant_pow2",
    "fake_quant_range",
    "keeps_values",
    "log2_qmax",
    "log2_threshold",
    "pow2_range",
    "record_range",
    "round_half_up",
    "threshold_exponent",
    "weight_exponent",
]


def check_options(
    dst_type: str, activation_range: str, ema_decay: float, *, power_of_two: bool = False
) -> int:
    """Validate ``quantize_aware``'s options; return the bit width of ``dst_type``.

    Raises:
        QuantError: naming the option and the values accepted.

    Example:
        >>> check_options("INT4", "ema", 0.99)
        4
        >>> check_options("INT4", "learned", 0.99, power_of_two=True)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.QuantError: power_of_two trains ESP-DL's int8 ...
    """
    if power_of_two and dst_type != "INT8":
        raise QuantError(
            f"power_of_two trains ESP-DL's int8 power-of-two format: dst_type must be 'INT8', "
            f"got {dst_type!r}"
        )
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


# --- power-of-two QAT (ESP-DL: value = int * 2^e, symmetric) -----------------------------------


def log2_qmax(bits: int = 8) -> np.float32:
    """``log2(2^(b-1) - 1)`` in float32, the constant the graphs subtract from ``log2 t``.

    Example:
        >>> round(float(log2_qmax(8)), 6)
        6.988685
    """
    return np.float32(np.log2(np.float64(quant_limits(bits)[1])))


def threshold_exponent(log2_t: float, bits: int = 8) -> int:
    """The exponent of a learned threshold ``t = 2^log2_t``: the smallest ``e`` with
    ``t <= (2^(b-1) - 1) * 2^e`` (the ESP-DL export's rule for a range of absolute maximum
    ``t``), computed as the graphs compute it: ``ceil(log2_t - log2_qmax)`` in float32 (at
    an exact boundary float32 may pick its neighbour: the written range, :func:`pow2_range`
    of this exponent, is what the export reads, so it still gets this exponent).

    Example:
        >>> threshold_exponent(np.log2(6.0)), threshold_exponent(np.log2(127 / 64))
        (-4, -6)
    """
    return int(np.ceil(np.float32(log2_t) - log2_qmax(bits)))


def log2_threshold(lo: float, hi: float) -> float:
    """``log2(max(|lo|, |hi|))`` in float32, kept within ``[LOG2_T_MIN, LOG2_T_MAX]`` (the
    starting threshold of a tensor whose range is ``[lo, hi]``; 0 gives the lower bound).

    Example:
        >>> log2_threshold(-3.0, 2.0) == np.float32(np.log2(3.0)), log2_threshold(0.0, 0.0)
        (True, -56.0)
    """
    top = np.float32(max(abs(float(lo)), abs(float(hi))))
    with np.errstate(divide="ignore"):
        t = np.log2(top)
    return float(np.clip(t, np.float32(LOG2_T_MIN), np.float32(LOG2_T_MAX)))


def round_half_up(x: ArrayLike) -> np.ndarray:
    """``floor(x + 0.5)``: how esp32s3 and the C kernels round (esp32p4: half to even).

    Example:
        >>> round_half_up([0.5, -0.5, -1.5, 1.4]).tolist()
        [1.0, 0.0, -1.0, 1.0]
    """
    return np.floor(np.asarray(x) + 0.5)


def fake_quant_pow2(x: ArrayLike, exponent: int, bits: int = 8) -> np.ndarray:
    """``clip(round_half_up(x * 2^-e), qmin, qmax) * 2^e`` in float32: the value the chip
    holds for ``x`` at exponent ``e`` (symmetric, no offset; the reference of the graphs'
    power-of-two fake quantization).

    Example:
        >>> fake_quant_pow2(np.float32([0.3, -0.375, 9.0]), -3).tolist()
        [0.25, -0.375, 9.0]
        >>> fake_quant_pow2(np.float32([100.0, -100.0]), -1).tolist()  # int8 at 2^-1
        [63.5, -64.0]
    """
    qmin, qmax = quant_limits(bits)
    scaled = np.asarray(x, np.float32) * np.float32(2.0 ** -int(exponent))
    q = np.clip(round_half_up(scaled), qmin, qmax)
    return (q * np.float32(2.0 ** int(exponent))).astype(np.float32)


def weight_exponent(kernel: ArrayLike, bits: int = 8) -> int:
    """A kernel's power-of-two exponent in power-of-two QAT: the ESP-DL export's automatic
    exponent of the whole tensor (``max |w|`` fits; 0 for an all-zero kernel), so the
    exported filter has the trained exponent and integers.

    Example:
        >>> weight_exponent(np.float32([[0.5, -1.0]]))
        -6
    """
    return auto_exponent(np.asarray(kernel, np.float32), bits, name="kernel")


def pow2_range(exponent: int, bits: int = 8, *, negative: bool = True) -> tuple[float, float]:
    """The range written for a tensor trained at exponent ``e``: ``[-qmax * 2^e, qmax * 2^e]``
    (``[0, qmax * 2^e]`` when it is never negative): the ESP-DL export's rule (the smallest
    power of two whose symmetric range covers it) gives back exactly ``e``.

    Example:
        >>> pow2_range(-4)
        (-7.9375, 7.9375)
        >>> from amct_bridge.quant.espdl import range_to_exponent
        >>> range_to_exponent(*pow2_range(-4, negative=False))
        -4
    """
    top = float(quant_limits(bits)[1] * 2.0 ** int(exponent))
    return (-top if negative else 0.0), top


def keeps_values(kind: str, params: dict | None = None) -> bool:
    """True when a layer of this kind outputs some of its input's values (or zeros): the
    output stays on the input's power-of-two grid (:data:`VALUE_KEEPING`).

    Example:
        >>> keeps_values("ReLU", {"max_value": None, "negative_slope": 0.0})
        True
        >>> keeps_values("ReLU", {"max_value": 6.0}), keeps_values("Flatten")
        (False, True)
    """
    params = params or {}
    if kind not in VALUE_KEEPING:
        return False
    if kind == "ReLU":
        return (
            params.get("max_value") is None
            and not params.get("negative_slope")
            and not params.get("threshold")
        )
    if kind == "Activation":
        return params.get("activation") in ("relu", "linear")
    return True
