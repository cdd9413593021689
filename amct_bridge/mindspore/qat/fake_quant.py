"""In-graph fake quantization for MindSpore QAT: AMCT's formulas (:mod:`amct_bridge.quant.qat`,
docs/qat.md) as graph ops with gradients, the counterpart of
:mod:`amct_bridge.keras.qat.fake_quant`::

    q  = clip(round(x / scale) + offset, qmin, qmax)      qmin, qmax = -2^(b-1), 2^(b-1) - 1
    x' = (q - offset) * scale

``round`` is C's (halves away from zero) with a straight-through gradient; ``clip`` keeps its
true gradient (zero outside the range). MindSpore's float32 division is the correctly rounded
quotient (measured on CPU in GRAPH and PyNative mode, also by a constant: unlike TF graphs it
does not turn ``x / c`` into ``x * (1 / c)``), which is what numpy computes in float64 and rounds
once to float32: scales are divided in float32. Only graph ops: GRAPH_MODE compiles them,
PyNative runs them.

Every op of a QAT step costs a fixed host time on CPU (tens of microseconds, far more than
the arithmetic of a small tensor), so these functions are written with as few ops as give the
same values: ``round`` as 4 ops with a custom gradient (no forward ops for the STE), the clip's
gradient in 2 ops, one
division per ARQ scale, no offset ops with offset 0, reductions over a flat view
(benchmarks/bench_mindspore_qat.py, docs/mindspore.md "Speed").

Example:
    >>> import numpy as np
    >>> from mindspore import Tensor
    >>> y = fake_quant_range(Tensor(np.float32([0.25, 2.0])), Tensor(np.float32(0.0)),
    ...                      Tensor(np.float32(1.0)), *limits(8))
    >>> y.asnumpy().astype(float).round(4).tolist()
    [0.251, 1.0]
"""

from __future__ import annotations

from mindspore import nn, ops

from amct_bridge.quant.factors import FLT_EPSILON, quant_limits
from amct_bridge.quant.qat import LOG2_T_MAX, LOG2_T_MIN, log2_qmax

__all__ = [
    "arq_fake_quant",
    "arq_scale",
    "clip",
    "fake_quant",
    "fake_quant_pow2",
    "fake_quant_range",
    "limits",
    "log2_of_absmax",
    "round_half_up_ste",
    "round_ste",
    "threshold_exponent",
    "weight_exponent",
]


def round_half_away(x):
    """C's ``round``: halves away from zero (``ops.round`` rounds half to even).

    ``trunc(x + sign(x) / 2)``: for ``x < 0``, ``x - 0.5`` is ``-(|x| + 0.5)`` rounded alike,
    so this is ``sign(x) * floor(|x| + 0.5)`` exactly, in 4 ops instead of 5.

    Example:
        >>> import numpy as np
        >>> from mindspore import Tensor
        >>> round_half_away(Tensor(np.float32([0.5, 1.5, -2.5, -0.4]))).asnumpy().tolist()
        [1.0, 2.0, -3.0, -0.0]
    """
    return ops.trunc(x + 0.5 * ops.sign(x))


class RoundSTE(nn.Cell):
    """``round_half_away`` with the straight-through gradient as a custom ``bprop``: the same
    values as ``x + stop_gradient(round_half_away(x) - x)`` (``round(x) - x`` is exact, so
    adding ``x`` back gives ``round(x)``) without its two extra forward ops."""

    def construct(self, x):
        """``round_half_away(x)``."""
        return round_half_away(x)

    def bprop(self, x, out, dout):
        """Identity: the incoming gradient passes unchanged."""
        return (dout,)


# Docstrings of functions that graph code calls must not hold the Python keyword for an
# anonymous function: MindSpore's parser then takes the whole source for one and fails.
_ROUND_STE = RoundSTE()


def round_ste(x):
    """``round_half_away(x)`` forward, identity gradient backward.

    Example:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import Tensor
        >>> x = Tensor(np.float32([0.4, 2.5]))
        >>> def total(v):
        ...     return (round_ste(v) * v).sum()
        >>> ms.grad(total)(x).asnumpy().tolist()  # round(x) + x
        [0.4000000059604645, 5.5]
    """
    return _ROUND_STE(x)


class Clip(nn.Cell):
    """``clamp(x, lo, hi)`` (constant bounds) with its true gradient as a custom ``bprop``:
    ``dout`` where ``x`` is inside ``[lo, hi]``, else 0, told by ``x == clamp(x)`` (2 ops
    instead of autodiff's 4: two comparisons, a logical and, a select)."""

    def construct(self, x, lo, hi):
        """``clamp(x, lo, hi)``."""
        return ops.clamp(x, lo, hi)

    def bprop(self, x, lo, hi, out, dout):
        """``dout`` where ``x`` was not clipped; the constant bounds get none."""
        return ops.select(x == out, dout, ops.zeros_like(dout)), lo, hi


_CLIP = Clip()


def clip(x, lo: float, hi: float):
    """``x`` clipped to ``[lo, hi]``; the gradient passes inside the range (bounds included).

    Example:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import Tensor
        >>> x = Tensor(np.float32([-2.0, -1.0, 0.5, 3.0]))
        >>> def total(v):
        ...     return clip(v, -1.0, 1.0).sum()
        >>> ms.grad(total)(x).asnumpy().tolist()
        [0.0, 1.0, 1.0, 0.0]
    """
    return _CLIP(x, lo, hi)


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
    if isinstance(offset, (int, float)) and offset == 0:  # weights, symmetric: no offset ops
        return clip(round_ste(x / scale), qmin, qmax) * scale
    q = clip(round_ste(x / scale) + offset, qmin, qmax)
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
        scale = ops.select(hi > -lo, hi / qmax, -lo / -qmin)
        return fake_quant(x, _floor_scale(scale), 0.0, qmin, qmax)
    scale = _floor_scale((hi - lo) / (qmax - qmin))
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
    shape = kernel.shape
    keep = tuple(n if a == out_axis else 1 for a, n in enumerate(shape))
    if out_axis is None or out_axis == 0:
        # over a flat view (per channel: rows): CPU reductions over all but one axis of an
        # N-d tensor are far slower than over one axis of the same data
        flat = ops.reshape(kernel, (-1,) if out_axis is None else (shape[0], -1))
        kmax = ops.reshape(ops.amax(flat, -1), keep)
        kmin = ops.reshape(ops.amin(flat, -1), keep)
    else:
        axes = tuple(a for a in range(len(shape)) if a != out_axis)
        kmax = ops.amax(kernel, axes, True)
        kmin = ops.amin(kernel, axes, True)
    neg = -kmin
    # one division by the chosen divisor: the same quotient as choosing between two divisions
    scale = ops.maximum(kmax, neg) / ops.select(neg >= kmax, -qmin, qmax)
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


# --- power-of-two fake quantization (power_of_two=True; amct_bridge.quant.qat's reference) ---


class _FloorHalfSTE(nn.Cell):
    """``floor(x + 0.5)`` (esp32s3's and the C kernels' rounding), identity gradient."""

    def construct(self, x):
        """``floor(x + 0.5)``."""
        return ops.floor(x + 0.5)

    def bprop(self, x, out, dout):
        """Identity: the incoming gradient passes unchanged."""
        return (dout,)


class _CeilSTE(nn.Cell):
    """``ceil(x)``, identity gradient (TQT's straight-through ceil of ``log2 t``)."""

    def construct(self, x):
        """``ceil(x)``."""
        return ops.ceil(x)

    def bprop(self, x, out, dout):
        """Identity: the incoming gradient passes unchanged."""
        return (dout,)


_FLOOR_HALF = _FloorHalfSTE()
_CEIL = _CeilSTE()
_LOG2_QMAX8 = float(log2_qmax(8))


def round_half_up_ste(x):
    """``floor(x + 0.5)`` forward, identity gradient backward.

    Example:
        >>> import numpy as np
        >>> from mindspore import Tensor
        >>> round_half_up_ste(Tensor(np.float32([0.5, -0.5, -1.5]))).asnumpy().tolist()
        [1.0, 0.0, -1.0]
    """
    return _FLOOR_HALF(x)


def log2_of_absmax(lo, hi):
    """``log2(max(|lo|, |hi|))`` within ``[LOG2_T_MIN, LOG2_T_MAX]``, a constant for the
    gradient (:func:`amct_bridge.quant.qat.log2_threshold`).

    Example:
        >>> import numpy as np
        >>> from mindspore import Tensor
        >>> float(log2_of_absmax(Tensor(np.float32(-4.0)), Tensor(np.float32(2.0))).asnumpy())
        2.0
    """
    top = ops.maximum(ops.abs(lo), ops.abs(hi))
    return ops.stop_gradient(ops.clamp(ops.log2(top), LOG2_T_MIN, LOG2_T_MAX))


def threshold_exponent(log2_t):
    """``ceil(log2_t - log2 127)`` forward, gradient 1 (the int8 exponent of the threshold
    ``2^log2_t``, :func:`amct_bridge.quant.qat.threshold_exponent`).

    Example:
        >>> import numpy as np
        >>> from mindspore import Tensor
        >>> float(threshold_exponent(Tensor(np.float32(np.log2(6.0)))).asnumpy())
        -4.0
    """
    return _CEIL(log2_t - _LOG2_QMAX8)


def fake_quant_pow2(x, exponent, qmin: float = -128.0, qmax: float = 127.0):
    """``clip(round_half_up(x / 2^e), qmin, qmax) * 2^e`` (:func:`amct_bridge.quant.qat.
    fake_quant_pow2`); through ``2^e`` the exponent gets TQT's gradient.

    Example:
        >>> import numpy as np
        >>> from mindspore import Tensor
        >>> x = Tensor(np.float32([0.3, -0.375, 100.0]))
        >>> fake_quant_pow2(x, Tensor(np.float32(-3.0))).asnumpy().tolist()
        [0.25, -0.375, 15.875]
    """
    scale = ops.pow(2.0, exponent)
    return clip(round_half_up_ste(x / scale), qmin, qmax) * scale


def weight_exponent(kernel, qmax: float = 127.0):
    """The ESP-DL export's automatic exponent of a whole kernel (``max |w|`` fits in ``qmax``
    steps, 0 for zeros; :func:`amct_bridge.quant.qat.weight_exponent`): float32 ``log2``,
    settled by exact comparisons (``qmax * 2^e`` is exact). A constant for the gradient.

    Example:
        >>> import numpy as np
        >>> from mindspore import Tensor
        >>> float(weight_exponent(Tensor(np.float32([[0.5, -1.0]]))).asnumpy())
        -6.0
    """
    top = ops.stop_gradient(ops.reduce_max(ops.abs(ops.reshape(kernel, (-1,)))))
    safe = ops.maximum(top, 1e-30)
    e = ops.ceil(ops.log2(safe / qmax))
    e = ops.select(top > qmax * ops.pow(2.0, e), e + 1.0, e)
    e = ops.select(top <= qmax * ops.pow(2.0, e - 1.0), e - 1.0, e)
    return ops.select(top > 0.0, e, ops.zeros_like(e))
