"""Per-batch summaries of a tensor: what adapters compute in-graph and observers consume.

Example:
    >>> import numpy as np
    >>> batch_stats(np.array([0.0, 1.0, 3.0]), bins=3).hist.tolist()
    [1, 1, 1]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from amct_bridge.errors import QuantError


@dataclass(frozen=True)
class BatchStats:
    """Summary of one batch of one tensor.

    Args:
        count: number of elements.
        min: smallest value.
        max: largest value.
        hist: ``bins`` integer counts (int64 from :func:`batch_stats`; in-graph summaries
            may hand over int32 buffer rows) over ``[min, max]`` exactly as tf.histogram_fixed_width
            computes them (``idx = min(floor((x - min) / ((max - min) / bins)), bins - 1)`` in
            float64), or None. When ``max == min`` only the total matters (TF refuses that
            range; any histogram whose counts sum to ``count`` is accepted).
        channel_absmax: ``max|x|`` per channel along the channel axis, or None.

    Example:
        >>> BatchStats(3, 0.0, 2.0, np.array([1, 2]), None).max
        2.0
    """

    count: int
    min: float
    max: float
    hist: np.ndarray | None = None
    channel_absmax: np.ndarray | None = None


def batch_stats(
    x: ArrayLike, bins: int = 0, channel_axis: int | None = None, *, name: str = "tensor"
) -> BatchStats:
    """The numpy reference of the in-graph batch summary.

    Args:
        x: one batch (any shape, float).
        bins: histogram bins (0 = no histogram).
        channel_axis: axis for per-channel absmax (None = not computed).
        name: tensor name for errors.

    Example:
        >>> s = batch_stats(np.array([0.0, 0.5, 1.0, 1.0]), bins=2)
        >>> s.count, s.min, s.max, s.hist.tolist()
        (4, 0.0, 1.0, [1, 3])
    """
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float32)
    if arr.size == 0:
        raise QuantError(f"{name}: empty batch; nothing to calibrate")
    vmin, vmax = arr.min(), arr.max()
    if not (np.isfinite(vmin) and np.isfinite(vmax)):
        bad = "NaN" if np.isnan(vmin) or np.isnan(vmax) else "Inf"
        raise QuantError(f"{name}: batch contains {bad}; calibration data must be finite")
    hist = None
    if bins:
        if vmax > vmin:
            # tf.histogram_fixed_width (TF 2.21 CPU) works in float64: same bins bit for bit.
            pos = arr.ravel().astype(np.float64)
            pos -= float(vmin)
            pos /= (float(vmax) - float(vmin)) / bins
            idx = pos.astype(np.intp)
            np.minimum(idx, bins - 1, out=idx)
            hist = np.bincount(idx, minlength=bins).astype(np.int64)
        else:
            hist = np.zeros(bins, dtype=np.int64)
            hist[0] = arr.size
    absmax = None
    if channel_axis is not None:
        axes = tuple(i for i in range(arr.ndim) if i != channel_axis % arr.ndim)
        absmax = np.maximum(np.abs(arr.max(axis=axes)), np.abs(arr.min(axis=axes)))
        absmax = absmax.astype(np.float32)
    return BatchStats(int(arr.size), float(vmin), float(vmax), hist, absmax)
