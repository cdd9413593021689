"""The numbers of the per-layer quantization report (numpy only).

* :func:`snr_db`: ``10 log10(sum(ref^2) / sum((ref - test)^2))`` over every element, in dB.
* :func:`clip_range`: the activation range ``[(qmin - offset) * scale, (qmax - offset) * scale]``
  that ``scale_d`` / ``offset_d`` encode (values outside it saturate).
* :func:`saturated_share`: the fraction of input values outside that range.
* :func:`scale_spread`: ``max(scale_w) / min(scale_w)`` across output channels.
* :func:`top1_accuracy`: argmax (``> 0.5`` for one output unit) against index or one-hot labels.

Example:
    >>> import numpy as np
    >>> round(snr_db(np.float32([3.0, 4.0]), np.float32([3.0, 4.5])), 2)  # 25 / 0.25
    20.0
    >>> clip_range(0.5, -128, 8)
    (0.0, 127.5)
"""

from __future__ import annotations

import math

import numpy as np

from amct_bridge.errors import CalibrationError
from amct_bridge.quant.factors import quant_limits


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """Signal-to-noise ratio of ``test`` against ``reference`` in dB (float64 sums).

    ``inf`` when they are equal; ``-inf`` when the reference is all zeros and the test is not.

    Example:
        >>> import numpy as np
        >>> snr_db(np.ones(4), np.ones(4))
        inf
        >>> round(snr_db(np.float32([1, -1]), np.float32([1.1, -0.9])), 1)  # 2 / 0.02
        20.0
    """
    ref = np.asarray(reference, dtype=np.float64)
    diff = ref - np.asarray(test, dtype=np.float64)
    signal, noise = float(np.sum(ref * ref)), float(np.sum(diff * diff))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def clip_range(scale: float, offset: int, bits: int = 8) -> tuple[float, float]:
    """The float range ``(lo, hi)`` an activation ``scale`` / ``offset`` represents.

    A value quantizes to ``clamp(round(x / scale) + offset, qmin, qmax)``; the ends of that
    grid dequantize to ``lo = (qmin - offset) * scale`` and ``hi = (qmax - offset) * scale``.

    Example:
        >>> clip_range(0.1, 0, 8)  # symmetric INT8
        (-12.8, 12.700000000000001)
    """
    qmin, qmax = quant_limits(bits)
    return (qmin - offset) * float(scale), (qmax - offset) * float(scale)


def saturated_share(values: np.ndarray, lo: float, hi: float) -> float:
    """Fraction of ``values`` strictly outside ``[lo, hi]`` (0.0 for an empty array).

    Example:
        >>> import numpy as np
        >>> saturated_share(np.float32([-2, 0, 1, 5]), -1.0, 1.0)
        0.5
    """
    arr = np.asarray(values)
    if arr.size == 0:
        return 0.0
    return float(np.count_nonzero((arr < lo) | (arr > hi))) / arr.size


def balanced(values: np.ndarray, factors: list[float], axis: int) -> np.ndarray:
    """``values`` divided per channel (``axis``) by DMQ ``tensor_balance_factor`` (as AMCT
    divides a layer input before quantizing it); unchanged when ``factors`` is empty.

    Example:
        >>> import numpy as np
        >>> balanced(np.float32([[2.0, 9.0]]), [2.0, 3.0], -1).tolist()
        [[1.0, 3.0]]
    """
    if not factors:
        return values
    shape = [1] * values.ndim
    shape[axis] = -1
    return values / np.float32(factors).reshape(shape)


def scale_spread(scale_w: list[float]) -> float | None:
    """``max / min`` of the weight scales across channels (1.0 per tensor; None: no weights).

    Example:
        >>> scale_spread([0.01, 0.04, 0.02])
        4.0
    """
    if not scale_w:
        return None
    return float(max(scale_w)) / float(min(scale_w))


def top1_accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy of model ``outputs`` (N, classes) against ``labels``.

    Labels are class indices (N,) or (N, 1), or one-hot (N, classes). An output with one unit
    per sample is a binary classifier: predicted class ``output > 0.5``.

    Example:
        >>> import numpy as np
        >>> top1_accuracy(np.float32([[0.1, 0.9], [0.8, 0.2]]), np.int32([1, 1]))
        0.5
    """
    out = np.asarray(outputs)
    y = np.asarray(labels)
    if out.ndim < 1 or len(out) != len(y):
        raise CalibrationError(
            f"labels: {len(y)} labels for {len(out) if out.ndim else 0} samples; "
            "expected one label per sample"
        )
    out = out.reshape(len(out), -1)
    if y.ndim == 2 and y.shape[1] == out.shape[1] and out.shape[1] > 1:
        y = np.argmax(y, axis=1)  # one-hot
    elif y.ndim == 2 and y.shape[1] == 1 or y.ndim == 1:
        y = y.reshape(-1)
    else:
        raise CalibrationError(
            f"labels of shape {y.shape} do not fit outputs of shape {out.shape}: expected "
            "class indices (N,) or one-hot (N, classes)"
        )
    if out.shape[1] == 1:
        predicted = (out[:, 0] > 0.5).astype(np.int64)
    else:
        predicted = np.argmax(out, axis=1)
    return float(np.mean(predicted == y.astype(np.int64)))
