"""In-graph fake quantization for MindSpore QAT: AMCT's formulas (:mod:`amct_bridge.quant.qat`,
docs/qat.md) as graph ops with gradients, the counterpart of
:mod:`amct_bridge.keras.qat.fake_quant`::

    q  = clip(round(x / scale) + offset, qmin, qmax)      qmin, qmax = -2^(b-1), 2^(b-1) - 1
    x' = (q - offset) * scale

``round`` is C's (halves away from zero) with a straight-through gradient; ``clip`` keeps its
true gradient (zero outside the range). Scales are divided in float64 and rounded once to
float32 (the correctly rounded quotient numpy computes). Only graph ops: GRAPH_MODE compiles
them, PyNative runs them.

Example:
    >>> import numpy as np
    >>> from mindspore import Tensor
    >>> y = fake_quant_range(Tensor(np.float32([0.25, 2.0])), Tensor(np.float32(0.0)),
    ...                      Tensor(np.float32(1.0)), *limits(8))
    >>> y.asnumpy().astype(float).round(4).tolist()
    [0.251, 1.0]
"""

from __future__ import annotations

import mindspore as ms
from mindspore import ops

from amct_bridge.quant.factors import FLT_EPSILON, quant_limits

__all__ = [
    "arq_fake_quant",
    "arq_scale",
    "fake_quant",
    "fake_quant_range",
    "limits",
    "round_ste",
]


def divide_exact(a, b):
    """``a / b`` in float64, rounded to float32 (see the module docstring)."""
    return ops.cast(ops.cast(a, ms.float64) / ops.cast(b, ms.float64), ms.float32)


def round_half_away(x):
    """C's ``round``: halves away from zero (``ops.round`` rounds half to even)."""
    return ops.sign(x) * ops.floor(ops.abs(x) + 0.5)


def round_ste(x):
    """``round_half_away(x)`` forward, identity gradient backward."""
    return x + ops.stop_gradient(round_half_away(x) - x)


def limits(bits: int) -> tuple[float, float]:
    """``(qmin, qmax)`` of a signed ``bits`` grid as floats (computed outside ``construct``:
    graph code cannot raise our errors).

    Example:
        >>> limits(4)
        (-8.0, 7.0)
    """
    qmin, qmax = quant_limits(bits)
    return float(qmin), float(qmax)


def fake_quant(x, scale, offset, qmin: float, qmax: float):
    """Quantize -> dequantize ``x`` (float32) with ``scale`` / ``offset`` on a signed grid.

    Example:
        >>> import numpy as np
        >>> from mindspore import Tensor
        >>> fake_quant(Tensor(np.float32([9.0, -9.0])), 1.0, 0.0, -8.0, 7.0).asnumpy().tolist()
        [7.0, -8.0]
    """
    q = ops.clamp(round_ste(x / scale) + offset, qmin, qmax)
    return (q - offset) * scale


def _floor_scale(scale):
    # AMCT's ProcessScale: a scale below FLT_EPSILON becomes 1.0
    return ops.select(scale < FLT_EPSILON, ops.ones_like(scale), scale)


def fake_quant_range(x, lo, hi, qmin: float, qmax: float, symmetric: bool = False):
    """``x`` fake-quantized with AMCT's factors of the clip range [lo, hi] (widened to 0).

    Differentiable in ``lo`` / ``hi`` (the offset's rounding uses the STE): learned ranges
    train through the scale and the offset.

    Example:
        >>> import numpy as np
        >>> from mindspore import Tensor
        >>> lo, hi = Tensor(np.float32(-1.0)), Tensor(np.float32(1.0))
        >>> x = Tensor(np.float32([-3.0, 0.1, 5.0]))
        >>> fake_quant_range(x, lo, hi, -8.0, 7.0, symmetric=True).asnumpy().tolist()
        [-1.0, 0.125, 0.875]
    """
    zero = ops.zeros_like(lo)
    lo = ops.minimum(lo, zero)
    hi = ops.maximum(hi, zero)
    if symmetric:
        scale = ops.select(hi > -lo, divide_exact(hi, qmax), divide_exact(-lo, -qmin))
        return fake_quant(x, _floor_scale(scale), 0.0, qmin, qmax)
    scale = _floor_scale(divide_exact(hi - lo, qmax - qmin))
    offset = qmin - round_ste(lo / scale)
    return fake_quant(x, scale, offset, qmin, qmax)


def arq_scale(kernel, out_axis: int | None, qmin: float, qmax: float):
    """ARQ scale of ``kernel``: per output channel along ``out_axis`` (None: one scale),
    shaped to broadcast against it.

    ``max(|max|, |min|) / (2^(b-1) - 1)``, the divisor 2^(b-1) when ``|min| >= |max|``; below
    FLT_EPSILON: 1.0.

    Example:
        >>> import numpy as np
        >>> from mindspore import Tensor
        >>> arq_scale(Tensor(np.float32([[1.0, -2.0]])), None, -128.0, 127.0).asnumpy().tolist()
        [[0.015625]]
    """
    rank = len(kernel.shape)
    axes = tuple(a for a in range(rank) if a != out_axis)
    kmax = ops.amax(kernel, axes, True)
    kmin = ops.amin(kernel, axes, True)
    big = ops.maximum(kmax, -kmin)
    scale = ops.select(-kmin >= kmax, divide_exact(big, -qmin), divide_exact(big, qmax))
    return _floor_scale(scale)


def arq_fake_quant(kernel, out_axis: int | None, qmin: float, qmax: float):
    """``kernel`` fake-quantized with its ARQ scales (constants for the gradient: STE on the
    kernel).

    Example:
        >>> import numpy as np
        >>> from mindspore import Tensor
        >>> k = Tensor(np.float32([[1.0, -0.3], [0.5, 0.2]]))
        >>> arq_fake_quant(k, None, -8.0, 7.0).asnumpy().astype(float).round(3).tolist()
        [[1.0, -0.286], [0.429, 0.143]]
    """
    scale = ops.stop_gradient(arq_scale(kernel, out_axis, qmin, qmax))
    return fake_quant(kernel, scale, 0.0, qmin, qmax)
