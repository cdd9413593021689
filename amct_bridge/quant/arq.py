"""ARQ weight quantization factors (AMCT ``arq_quantize { channel_wise }``), numpy only.

Per output channel (or per tensor): ``m = max(w)``, ``n = min(w)``; the dominant value ``d`` is
``m`` when ``|m| > |n|``, otherwise ``n`` (ties included); ``scale_w = d / 127`` when ``d > 0``,
else ``|d| / 128`` (so ``[1, -1]`` gives 1/128, a channel of one positive weight ``w`` gives
``w / 127``, as AMCT's ``arq.cpp``); a scale below FLT_EPSILON becomes 1.0;
``offset_w`` is all zeros. Arithmetic in float32 as AMCT's ``arq.cpp``. Dense/MatMul (layouts
``IO``/``OI``) always get one scalar.

Example:
    >>> import numpy as np
    >>> k = np.zeros((1, 1, 2, 3), np.float32)
    >>> k[..., 0] = [1.27, -0.5]; k[..., 1] = [0.5, -1.28]; k[..., 2] = [1.0, -1.0]
    >>> scales, offsets = arq_factors(k, "HWIO")
    >>> [round(s, 7) for s in scales], offsets
    ([0.01, 0.01, 0.0078125], [0, 0, 0])
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from amct_bridge.errors import QuantError
from amct_bridge.quant.factors import FLT_EPSILON, quantize
from amct_bridge.quant.layouts import get_layout, out_channel_shape, out_major


def _check_finite(k: np.ndarray, name: str) -> None:
    if not np.all(np.isfinite(k)):
        bad = "NaN" if np.isnan(k).any() else "Inf"
        raise QuantError(f"{name}: weights contain {bad}; cannot compute scale_w")


def row_scales(rows: ArrayLike, num_bits: int = 8) -> np.ndarray:
    """ARQ scale of each row of ``rows`` (one row per channel), before AMCT's ``ProcessScale``.

    The dominant value (max, or min when ``|min| >= |max|``) over ``2**(b-1) - 1`` if positive,
    else over ``-2**(b-1)``; float32 as ``arq.cpp``. Zero rows give 0.

    Example:
        >>> row_scales([[1.0, -1.0], [0.5, 0.5], [-0.5, -0.5]]).tolist()
        [0.0078125, 0.003937007859349251, 0.00390625]
    """
    r = np.asarray(rows, dtype=np.float32)
    mx, mn = r.max(axis=1), r.min(axis=1)
    dominant = np.where(np.abs(mx) > np.abs(mn), mx, mn)
    pos, neg = np.float32(2 ** (num_bits - 1) - 1), np.float32(-(2 ** (num_bits - 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(dominant > 0, dominant / pos, dominant / neg).astype(np.float32)


def arq_scales(
    kernel: ArrayLike,
    layout: str,
    channel_wise: bool = True,
    *,
    num_bits: int = 8,
    name: str = "kernel",
) -> np.ndarray:
    """ARQ ``scale_w`` as a float32 array (one per output channel, or one).

    Example:
        >>> arq_scales(np.array([[0.0, 2.54]]), "IO").tolist()
        [0.019999999552965164]
    """
    spec = get_layout(kernel, layout, name)
    k = np.asarray(kernel, dtype=np.float32)
    _check_finite(k, name)
    if k.size == 0:
        raise QuantError(f"{name}: empty kernel")
    rows = (
        out_major(k, layout, name)
        if channel_wise and not spec.per_tensor_only
        else k.reshape(1, -1)
    )
    scale = row_scales(rows, num_bits)
    scale = np.where(scale < FLT_EPSILON, np.float32(1.0), scale)
    if np.any(1.0 / scale < FLT_EPSILON):
        raise QuantError(f"{name}: a weight scale exceeds 1/FLT_EPSILON; weights are too large")
    return scale


def arq_factors(
    kernel: ArrayLike,
    layout: str,
    channel_wise: bool = True,
    *,
    num_bits: int = 8,
    name: str = "kernel",
) -> tuple[list[float], list[int]]:
    """AMCT record ``(scale_w, offset_w)`` lists for a (BN-folded) kernel.

    Args:
        kernel: the weights in the framework's layout.
        layout: one of ``amct_bridge.quant.layouts.LAYOUTS`` (HWIO, HWCM, HWOI, IO, OIHW...).
        channel_wise: per output channel (AMCT default for conv layers); ignored (per tensor)
            for Dense/MatMul layouts.
        num_bits: weight bits (wts_type INT8).
        name: layer name for error messages.

    Example:
        >>> arq_factors(np.ones((2, 3)), "IO")
        ([0.007874015718698502], [0])
    """
    scale = arq_scales(kernel, layout, channel_wise, num_bits=num_bits, name=name)
    return [float(s) for s in scale], [0] * int(scale.size)


def quantize_weights(
    kernel: ArrayLike, layout: str, scale_w: ArrayLike, *, num_bits: int = 8, name: str = "kernel"
) -> np.ndarray:
    """Integer weights ``clamp(round(w / scale_w), -2**(b-1), 2**(b-1) - 1)`` (int32).

    ``scale_w`` has one entry (per tensor) or one per output channel.

    Example:
        >>> quantize_weights(np.array([[1.0, -1.0]]), "IO", [1 / 127]).tolist()
        [[127, -127]]
    """
    k = np.asarray(kernel, dtype=np.float32)
    s = np.asarray(scale_w, dtype=np.float32).ravel()
    if s.size == 1:
        return quantize(k, float(s[0]), 0, num_bits)
    shape = out_channel_shape(k, layout, name)
    if int(np.prod(shape)) != s.size:
        raise QuantError(f"{name}: {s.size} scale_w values for {int(np.prod(shape))} channels")
    return quantize(k / s.reshape(shape), 1.0, 0, num_bits)


def fake_quantize_weights(
    kernel: ArrayLike, layout: str, scale_w: ArrayLike, *, num_bits: int = 8, name: str = "kernel"
) -> np.ndarray:
    """``quantize_weights(...) * scale_w`` as float32: the weights the quantized model uses.

    Example:
        >>> fake_quantize_weights(np.array([[0.3, -1.0]]), "IO", [0.25]).tolist()
        [[0.25, -1.0]]
    """
    q = quantize_weights(kernel, layout, scale_w, num_bits=num_bits, name=name).astype(np.float32)
    s = np.asarray(scale_w, dtype=np.float32).ravel()
    if s.size == 1:
        return q * s[0]
    return q * s.reshape(out_channel_shape(q, layout, name))
