"""Conv/Dense + BatchNorm folding, as AMCT fuses before computing ``scale_w``.

``y = gamma * (conv(x, W) + b - mean) / sqrt(var + eps) + beta`` becomes ``conv(x, W') + b'``
with ``f = gamma / sqrt(var + eps)`` per output channel, ``W' = W * f`` and
``b' = (b - mean) * f + beta``. ``gamma``/``beta`` may be None (Keras ``scale=False`` /
``center=False``), ``bias`` None (``use_bias=False``). Depthwise kernels ``(H, W, C, M)`` scale
channel ``c * M + m``; transposed convs scale axis 2 (Keras) — the layout table decides.

Example:
    >>> import numpy as np
    >>> k, b = fold_batchnorm(np.ones((1, 1, 1, 2)), None, np.array([2.0, 1.0]), None,
    ...                       np.array([1.0, 0.0]), np.array([3.0, 0.0]), 1.0, "HWIO")
    >>> k.ravel().tolist(), b.tolist()
    ([1.0, 1.0], [-1.0, 0.0])
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from amct_bridge.errors import QuantError
from amct_bridge.quant.layouts import out_channel_shape


def _vector(v: ArrayLike | None, n: int, default: float, label: str, name: str) -> np.ndarray:
    if v is None:
        return np.full(n, default)
    arr = np.asarray(v, dtype=np.float64).ravel()
    if arr.size != n:
        raise QuantError(f"{name}: BatchNorm {label} has {arr.size} values, layer has {n} channels")
    if not np.all(np.isfinite(arr)):
        raise QuantError(f"{name}: BatchNorm {label} contains NaN/Inf")
    return arr


def fold_batchnorm(
    kernel: ArrayLike,
    bias: ArrayLike | None,
    gamma: ArrayLike | None,
    beta: ArrayLike | None,
    mean: ArrayLike,
    var: ArrayLike,
    eps: float,
    layout: str,
    *,
    name: str = "layer",
) -> tuple[np.ndarray, np.ndarray]:
    """Fold a following BatchNorm into ``(kernel, bias)``; returns arrays of the kernel's dtype.

    Args:
        kernel: conv/dense weights in ``layout`` (see ``amct_bridge.quant.layouts``).
        bias: the layer bias or None.
        gamma, beta: BN scale/offset or None when the BN has none.
        mean, var: BN moving mean/variance (one per output channel).
        eps: BN epsilon.
        layout: kernel layout (HWIO, HWCM, HWOI, IO, OIHW, ...).
        name: layer name for errors.

    Example:
        >>> k, b = fold_batchnorm(np.ones((2, 1)), np.ones(1), None, None, [1.0], [0.0], 0.25, "IO")
        >>> k.ravel().tolist(), b.tolist()
        ([2.0, 2.0], [0.0])
    """
    k = np.asarray(kernel)
    shape = out_channel_shape(k, layout, name)
    n = int(np.prod(shape))
    mean_v = _vector(mean, n, 0.0, "moving_mean", name)
    var_v = _vector(var, n, 1.0, "moving_variance", name)
    if np.any(var_v + eps <= 0):
        raise QuantError(f"{name}: BatchNorm variance + epsilon must be > 0")
    factor = _vector(gamma, n, 1.0, "gamma", name) / np.sqrt(var_v + float(eps))
    folded_k = (k.astype(np.float64) * factor.reshape(shape)).astype(k.dtype)
    b = _vector(bias, n, 0.0, "bias", name)
    folded_b = (b - mean_v) * factor + _vector(beta, n, 0.0, "beta", name)
    dtype = k.dtype if np.issubdtype(k.dtype, np.floating) else np.float32
    return folded_k, folded_b.astype(dtype)
