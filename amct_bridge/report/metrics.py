"""The numbers of the per-layer quantization report (numpy only).

* :func:`snr_db`: ``10 log10(sum(ref^2) / sum((ref - test)^2))`` over every element, in dB.
* :func:`clip_range`: the activation range ``[(qmin - offset) * scale, (qmax - offset) * scale]``
  that ``scale_d`` / ``offset_d`` encode (values outside it saturate).
* :func:`saturated_share`: the fraction of input values outside that range.
* :func:`scale_spread`: ``max(scale_w) / min(scale_w)`` across output channels.
* :func:`top1_accuracy`: argmax (``> 0.5`` for one output unit) against index or one-hot labels.
* :func:`classification_problem`: why an output is not a class vector for the labels (an
  autoencoder's reconstruction with 0/1 anomaly labels), so that no accuracy is made of it.
* :func:`mse`: the mean squared error, the regression figure printed instead.

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


def mse(reference: np.ndarray, test: np.ndarray) -> float:
    """Mean squared error of ``test`` against ``reference`` (float64, over every element).

    Example:
        >>> import numpy as np
        >>> mse(np.float32([1, 2]), np.float32([1, 3]))
        0.5
    """
    ref = np.asarray(reference, dtype=np.float64)
    diff = ref - np.asarray(test, dtype=np.float64).reshape(ref.shape)
    return float(np.mean(diff * diff)) if diff.size else 0.0


def class_indices(labels: np.ndarray) -> tuple[np.ndarray | None, int | None, str]:
    """``(indices, one-hot width or None, "")`` for class labels: indices ``(N,)`` / ``(N, 1)``
    (non-negative whole numbers, in any numeric dtype) or one-hot rows ``(N, classes)``;
    ``(None, None, why)`` for anything else (reconstruction targets, probabilities, floats).

    Example:
        >>> import numpy as np
        >>> class_indices(np.float32([[0, 1], [1, 0]]))[:2]
        (array([1, 0]), 2)
        >>> class_indices(np.float32([0.5, 1.0]))[2]
        'the labels are not class indices (0.5 at sample 0)'
    """
    y = np.asarray(labels)
    if y.ndim == 2 and y.shape[1] > 1:
        flat = y.astype(np.float64) if np.issubdtype(y.dtype, np.number) else None
        if flat is not None and np.isin(flat, (0.0, 1.0)).all() and (flat.sum(axis=1) == 1).all():
            return flat.argmax(axis=1), int(y.shape[1]), ""
        return (
            None,
            None,
            (
                f"the labels have {y.shape[1]} values per sample and are not one-hot rows (a "
                "target to reconstruct or regress?)"
            ),
        )
    if y.ndim > 2 or y.ndim == 0:
        return None, None, f"labels of shape {y.shape} are not class indices"
    y = y.reshape(-1)
    if y.dtype == bool:
        return y.astype(np.int64), None, ""
    if not np.issubdtype(y.dtype, np.number):
        return None, None, f"the labels ({y.dtype}) are not class indices"
    values = y.astype(np.float64)
    bad = ~np.isfinite(values) | (values < 0) | (values != np.floor(values))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return None, None, f"the labels are not class indices ({y[i]:g} at sample {i})"
    return values.astype(np.int64), None, ""


#: Share of samples whose float arg max lies outside the labels' classes above which a wider
#: output is not taken for a class vector of them (an autoencoder's, say).
OUTSIDE_SHARE = 0.5


def classification_problem(outputs: np.ndarray, labels: np.ndarray) -> str:
    """Why the float model's ``outputs`` (one row per sample) are not class scores for
    ``labels``, or ``""`` when they are: then an accuracy (arg max, ``> 0.5`` for one value)
    means something. Not a class vector: labels that are not class indices
    (:func:`class_indices`); an output that is a map, not a vector; one value per sample with
    labels other than 0/1; labels naming a class the output lacks; one-hot labels of another
    width; and an output wider than the classes the labels name whose arg max lands outside
    them on most samples (0/1 anomaly labels for a 64-value reconstruction). A classifier
    evaluated on a few of its classes is still one (its arg max stays inside them).

    Example:
        >>> import numpy as np
        >>> classification_problem(np.float32([[0.1, 0.9], [0.8, 0.2]]), np.array([1, 0]))
        ''
        >>> x = np.random.default_rng(0).uniform(0, 1, (20, 64))
        >>> classification_problem(x, np.arange(20) % 2)  # doctest: +ELLIPSIS
        'it has 64 values per sample, the labels name 2 classes (0..1), and its arg max is ...'
    """
    out = np.asarray(outputs)
    shape = tuple(out.shape[1:])
    if sum(d > 1 for d in shape) > 1:
        return f"it has shape {shape} per sample: a map, not a vector of class scores"
    width = int(np.prod(shape)) if shape else 1
    indices, one_hot, why = class_indices(labels)
    if indices is None:
        return why
    if one_hot is not None and one_hot != width and not (width == 1 and one_hot == 2):
        return f"it has {width} values per sample, the one-hot labels {one_hot} classes"
    if width == 1:
        odd = indices[indices > 1]
        if odd.size:
            return (
                f"it has one value per sample (a binary classifier's score), the labels "
                f"name other classes than 0 and 1 ({int(odd[0])})"
            )
        return ""
    top = int(indices.max()) if indices.size else 0
    if top >= width:
        return f"it has {width} values per sample, the labels name class {top}"
    if one_hot is None and width > top + 1 and len(out):
        outside = float(np.mean(out.reshape(len(out), -1).argmax(axis=1) > top))
        if outside > OUTSIDE_SHARE:
            return (
                f"it has {width} values per sample, the labels name {top + 1} classes "
                f"(0..{top}), and its arg max is outside them on {100 * outside:.0f}% of "
                "the samples"
            )
    return ""
