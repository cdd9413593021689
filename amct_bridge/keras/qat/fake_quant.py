"""In-graph fake quantization for Keras: the quantize -> dequantize ops and the per-layer table.

Shared by :mod:`amct_bridge.keras.simulate` (fixed factors from a record) and
:mod:`amct_bridge.keras.qat` (factors learned while training). The math is AMCT's
(``docs/qat.md``)::

    q  = clip(round(x / scale) + offset, qmin, qmax)      qmin, qmax = -2^(b-1), 2^(b-1) - 1
    x' = (q - offset) * scale

``round`` is C's (halves away from zero, as AMCT) and passes its gradient straight through
(STE); ``clip`` does not, so inputs outside the clip range get a zero gradient while the
range bounds (when they are trainable) receive LSQ-style gradients through ``scale``.

:func:`layer_spec` says, per Keras layer, which kernels are quantized, in which layout and under
which record keys (from :mod:`amct_bridge.keras.layers`, shared with the calibration callback) and
how the layer's linear op is recomputed from (input, kernels) so kernels can be swapped for
fake-quantized ones (:data:`LAYER_OPS`).

Example:
    >>> import numpy as np
    >>> from amct_bridge.keras.qat.fake_quant import fake_quant
    >>> x = np.array([0.0, 0.26, 1.0], "float32")
    >>> np.asarray(fake_quant(x, 0.5, 0, 4)).tolist()
    [0.0, 0.5, 1.0]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import keras
from keras import ops

from amct_bridge.errors import QuantError
from amct_bridge.keras.layers import class_name, quant_parts
from amct_bridge.quant.factors import FLT_EPSILON, quant_limits
from amct_bridge.quant.layouts import LAYOUTS
from amct_bridge.quant.qat import LOG2_T_MAX, LOG2_T_MIN, log2_qmax


def divide_exact(a, b):
    """``a / b`` rounded to float32 as a true division would be (as AMCT and numpy compute it).

    TF graphs and XLA turn a division by a constant into a multiplication by its reciprocal,
    which is off by one float32 ulp in most cases and would move scales off the record's
    values; in float64 that error vanishes when the result is rounded to float32.
    """
    return ops.cast(ops.cast(a, "float64") / ops.cast(b, "float64"), "float32")


def round_half_away(x):
    """C's ``round`` (halves away from zero), as AMCT rounds; ``ops.round`` rounds half to even."""
    return ops.sign(x) * ops.floor(ops.abs(x) + 0.5)


def round_ste(x):
    """``round_half_away(x)`` in the forward pass, identity gradient in the backward pass."""
    return x + ops.stop_gradient(round_half_away(x) - x)


def fake_quant(x, scale, offset, bits: int):
    """Quantize then dequantize ``x`` with (scale, offset) on a signed ``bits`` grid (STE round).

    ``scale``/``offset`` broadcast against ``x`` (per-channel factors: shape of the last axes).
    Computed in float32 whatever ``x``'s dtype (mixed precision), returned in ``x``'s dtype.

    Example:
        >>> import numpy as np
        >>> np.asarray(fake_quant(np.float32([9.0, -9.0]), 1.0, 0, 4)).tolist()  # clip at 4 bits
        [7.0, -8.0]
    """
    qmin, qmax = quant_limits(bits)
    dtype = getattr(x, "dtype", "float32")
    x = ops.cast(x, "float32")
    q = ops.clip(round_ste(x / scale) + offset, qmin, qmax)
    return ops.cast((q - offset) * scale, dtype)


def fake_quant_range(x, lo, hi, bits: int, *, symmetric: bool = False):
    """Fake-quantize ``x`` with AMCT's activation factors for the clip range [lo, hi].

    Asymmetric (AMCT's ``activation_offset = true``): the range is widened to contain 0,
    ``scale = (hi - lo) / (2^b - 1)``, ``offset = qmin - round(lo / scale)``. Symmetric:
    ``offset = 0``, ``scale = hi / (2^(b-1) - 1)`` if ``|hi| > |lo|`` else ``|lo| / 2^(b-1)``
    (:func:`amct_bridge.quant.factors.activation_factors`). Differentiable in ``lo``/``hi``
    (the rounding of the offset uses the STE), so learned ranges train.

    Example:
        >>> import numpy as np
        >>> y = fake_quant_range(np.float32([0.25, 2.0]), 0.0, 1.0, 8)  # 2.0 clips to 1.0
        >>> np.asarray(y, dtype=float).round(4).tolist()
        [0.251, 1.0]
    """
    qmin, qmax = quant_limits(bits)
    lo = ops.minimum(lo, 0.0)
    hi = ops.maximum(hi, 0.0)
    if symmetric:
        scale = ops.where(hi > -lo, divide_exact(hi, qmax), divide_exact(-lo, -qmin))
        scale = ops.where(scale < FLT_EPSILON, 1.0, scale)
        return fake_quant(x, scale, 0.0, bits)
    scale = divide_exact(hi - lo, qmax - qmin)
    scale = ops.where(scale < FLT_EPSILON, 1.0, scale)
    offset = qmin - round_ste(lo / scale)
    return fake_quant(x, scale, offset, bits)


def channel_axes(layout: str, rank: int) -> tuple[int, ...]:
    """Axes of a kernel that index its output channels (:data:`amct_bridge.quant.layouts.LAYOUTS`).

    Example:
        >>> channel_axes("HWCM", 4)
        (2, 3)
    """
    spec = LAYOUTS.get(layout)
    if spec is None or spec.ndim != rank:
        raise QuantError(f"kernel of rank {rank} does not match layout {layout}")
    return spec.out_axis


def arq_scale(kernel, layout: str, bits: int, *, channel_wise: bool):
    """ARQ weight scale of ``kernel`` (symmetric, offset 0), shaped to broadcast against it.

    ``scale = max(|max|, |min|) / (2^(b-1) - 1)``, the divisor being 2^(b-1) when |min| >= |max|;
    a scale below FLT_EPSILON becomes 1.0. Per output channel when ``channel_wise``, else one
    scalar. Flattened (C-order), the per-channel scales are in AMCT's channel order (c*M + m for
    a depthwise kernel).

    Example:
        >>> import numpy as np
        >>> np.asarray(arq_scale(np.float32([[1.0, -2.0]]), "IO", 8, channel_wise=False)).tolist()
        [[0.015625]]
    """
    qmin, qmax = quant_limits(bits)
    rank = len(kernel.shape)
    axes = channel_axes(layout, rank) if channel_wise else ()
    reduce_axes = tuple(a for a in range(rank) if a not in axes)
    kmax = ops.max(kernel, axis=reduce_axes, keepdims=True)
    kmin = ops.min(kernel, axis=reduce_axes, keepdims=True)
    divisor = ops.where(-kmin >= kmax, float(-qmin), float(qmax))
    scale = divide_exact(ops.maximum(kmax, -kmin), divisor)
    return ops.where(scale < FLT_EPSILON, 1.0, scale)


def arq_fake_quant(kernel, layout: str, bits: int, *, channel_wise: bool):
    """Fake-quantize a kernel with the ARQ scales of :func:`arq_scale` (STE on the kernel).

    The scale is a constant for the gradient: only the kernel trains.

    Example:
        >>> import numpy as np
        >>> k = np.float32([[1.0, -0.3], [0.5, 0.2]])
        >>> y = arq_fake_quant(k, "IO", 4, channel_wise=False)  # scale 1/7 (f32: 0.5/s = 3.49999)
        >>> np.asarray(y, dtype=float).round(3).tolist()
        [[1.0, -0.286], [0.429, 0.143]]
    """
    scale = ops.stop_gradient(arq_scale(kernel, layout, bits, channel_wise=channel_wise))
    return fake_quant(kernel, scale, 0.0, bits)


# --- power-of-two fake quantization (power_of_two=True; amct_bridge.quant.qat's reference) ---


def _identity_grad(*args, upstream=None):
    return args[0] if upstream is None else upstream


@ops.custom_gradient
def _floor_half(x):
    return ops.floor(x + 0.5), _identity_grad


@ops.custom_gradient
def _ceil(x):
    return ops.ceil(x), _identity_grad


def round_half_up_ste(x):
    """``floor(x + 0.5)`` (esp32s3's and the C kernels' rounding) with the identity gradient.

    A custom gradient, not ``x + stop_gradient(floor(x + 0.5) - x)``: TF's graph optimizer
    rewrites that sum (``(x + f) - x``), which is then not ``f`` exactly: seen as 1.7 % of a
    layer's values one step off the chip's in ``predict`` while eager calls were exact.

    Example:
        >>> import numpy as np
        >>> np.asarray(round_half_up_ste(np.float32([0.5, -0.5, 2.49]))).tolist()
        [1.0, 0.0, 2.0]
    """
    return _floor_half(x)


def log2_of_absmax(lo, hi):
    """``log2(max(|lo|, |hi|))`` in float32 within ``[LOG2_T_MIN, LOG2_T_MAX]`` (a threshold's
    start; :func:`amct_bridge.quant.qat.log2_threshold`), a constant for the gradient.

    Example:
        >>> float(log2_of_absmax(-4.0, 2.0))
        2.0
    """
    top = ops.maximum(ops.abs(ops.cast(lo, "float32")), ops.abs(ops.cast(hi, "float32")))
    return ops.stop_gradient(ops.clip(ops.log2(top), LOG2_T_MIN, LOG2_T_MAX))


def threshold_exponent(log2_t, bits: int = 8):
    """The exponent of the threshold ``2^log2_t`` (float32 tensor): ``ceil(log2_t - log2_qmax)``
    forward (:func:`amct_bridge.quant.qat.threshold_exponent`), gradient 1 (TQT's straight-
    through ceil), so ``log2_t`` learns through the scale ``2^e``.

    Example:
        >>> import numpy as np
        >>> float(threshold_exponent(np.float32(np.log2(6.0))))
        -4.0
    """
    return _ceil(ops.cast(log2_t, "float32") - float(log2_qmax(bits)))


def fake_quant_pow2(x, exponent, bits: int = 8):
    """``clip(round_half_up(x / 2^e), qmin, qmax) * 2^e`` (:func:`amct_bridge.quant.qat.
    fake_quant_pow2`): STE round, true clip gradient, and through ``2^e`` the gradient TQT
    gives ``log2 t`` (``round(x/s) - x/s`` inside the range, ``qmin`` / ``qmax`` outside).
    Computed in float32, returned in ``x``'s dtype; dividing by a power of two is exact.

    Example:
        >>> import numpy as np
        >>> np.asarray(fake_quant_pow2(np.float32([0.3, -0.375, 100.0]), -3.0)).tolist()
        [0.25, -0.375, 15.875]
    """
    qmin, qmax = quant_limits(bits)
    dtype = getattr(x, "dtype", "float32")
    scale = ops.power(2.0, ops.cast(exponent, "float32"))
    q = ops.clip(round_half_up_ste(ops.cast(x, "float32") / scale), qmin, qmax)
    return ops.cast(q * scale, dtype)


def weight_exponent(kernel, bits: int = 8):
    """The export's automatic exponent of a whole kernel (``max |w|`` fits in ``2^(b-1) - 1``
    steps; 0 for zeros; :func:`amct_bridge.quant.qat.weight_exponent`), exact: float64, the
    ``log2`` corrected by comparisons. A float32 constant for the gradient.

    Example:
        >>> import numpy as np
        >>> [float(weight_exponent(np.float32(k))) for k in ([[0.5, -1.0]], [127.0], [0.0])]
        [-6.0, 0.0, 0.0]
    """
    qmax = float(quant_limits(bits)[1])
    top = ops.cast(ops.max(ops.abs(ops.stop_gradient(kernel))), "float64")
    safe = ops.maximum(top, 1e-300)
    e = ops.ceil(ops.log2(safe / qmax))
    e = ops.where(top > qmax * ops.power(2.0, e), e + 1.0, e)  # log2 an ulp low
    e = ops.where(top <= qmax * ops.power(2.0, e - 1.0), e - 1.0, e)  # an ulp high
    return ops.cast(ops.where(top > 0, e, 0.0), "float32")


def pow2_weight_fake_quant(kernel, bits: int = 8):
    """A kernel fake-quantized at its :func:`weight_exponent` (per tensor; STE on the kernel).

    Example:
        >>> import numpy as np
        >>> np.asarray(pow2_weight_fake_quant(np.float32([1.0, 0.3, -0.01]))).tolist()
        [1.0, 0.296875, -0.015625]
    """
    return fake_quant_pow2(kernel, weight_exponent(kernel, bits), bits)


# --- the per-layer table ------------------------------------------------------------------------


def _dense_op(layer, x, kernels, mid):
    return ops.matmul(x, kernels["kernel"])


def _conv_op(layer, x, kernels, mid):
    return layer.convolution_op(x, kernels["kernel"])


def _conv1d_op(layer, x, kernels, mid):
    # Conv1D(padding="causal") pads in call(), not in convolution_op (which cannot take it)
    if layer.padding == "causal":
        x = ops.pad(x, layer._compute_causal_padding())
        return ops.conv(
            x,
            kernels["kernel"],
            strides=list(layer.strides),
            padding="valid",
            dilation_rate=layer.dilation_rate,
            data_format=layer.data_format,
        )
    return layer.convolution_op(x, kernels["kernel"])


def _depthwise_op(layer, x, kernels, mid):
    return ops.depthwise_conv(
        x,
        kernels["kernel"],
        strides=layer.strides,
        padding=layer.padding,
        dilation_rate=layer.dilation_rate,
        data_format=layer.data_format,
    )


def _transpose_op(layer, x, kernels, mid):
    return ops.conv_transpose(
        x,
        kernels["kernel"],
        strides=list(layer.strides),
        padding=layer.padding,
        output_padding=layer.output_padding,
        dilation_rate=layer.dilation_rate,
        data_format=layer.data_format,
    )


def _separable_op(layer, x, kernels, mid):
    # Split into its two convolutions (as TF's separable_conv2d computes it) so the pointwise
    # part's input, a tensor of its own in the deployed graph, can be fake-quantized.
    y = ops.depthwise_conv(
        x,
        kernels["depthwise_kernel"],
        strides=layer.strides,
        padding=layer.padding,
        dilation_rate=layer.dilation_rate,
        data_format=layer.data_format,
    )
    return ops.conv(mid(y), kernels["pointwise_kernel"], 1, "valid", layer.data_format)


@dataclass(frozen=True)
class LayerSpec:
    """How one Keras layer is fake-quantized.

    Attributes:
        kernels: ``(attribute, layout)`` of each quantized kernel, in execution order.
        keys: record-key suffix of each part ("" = the layer name; SeparableConv2D:
            "depthwise", "pointwise"), in the same order (one entry for average pooling).
        channel_wise: whether ARQ may use per-channel scales (AMCT: not for MatMul/Dense).
        op: ``op(layer, x, kernels, mid) -> y`` recomputes the linear part (no bias/activation);
            ``mid`` fake-quantizes an inner activation (separable conv). None: call the layer.
    """

    kernels: tuple[tuple[str, str], ...]
    keys: tuple[str, ...]
    channel_wise: bool
    op: Callable | None

    def key(self, layer_key: str, part: int) -> str:
        """Record key of part ``part`` of the layer keyed ``layer_key``."""
        return f"{layer_key}/{self.keys[part]}" if self.keys[part] else layer_key


#: Keras class name -> how its linear op is recomputed from fake-quantized kernels. What is
#: quantized (parts, kernels, layouts, record keys) comes from :data:`amct_bridge.keras.layers.
#: QUANTIZABLE`, the table the calibration callback uses too.
LAYER_OPS: dict[str, Callable | None] = {
    "Dense": _dense_op,
    "Conv2D": _conv_op,
    "DepthwiseConv2D": _depthwise_op,
    "Conv2DTranspose": _transpose_op,
    "SeparableConv2D": _separable_op,
    "AveragePooling2D": None,
    # 1-D convs: the same ops on rank-3 inputs (keras.ops picks the 1-D form)
    "Conv1D": _conv1d_op,
    "DepthwiseConv1D": _depthwise_op,
    "SeparableConv1D": _separable_op,
}


def layer_spec(layer: keras.layers.Layer) -> LayerSpec | None:
    """The LayerSpec of ``layer`` (by class, subclasses included), or None if not quantizable.

    Example:
        >>> layer_spec(keras.layers.Dense(3)).kernels
        (('kernel', 'IO'),)
        >>> layer_spec(keras.layers.SeparableConv2D(3, 3)).key("sep", 1)
        'sep/pointwise'
    """
    parts = quant_parts(layer)
    name = class_name(layer)
    if not parts or name not in LAYER_OPS:
        return None
    weighted = [p for p in parts if p.has_weights]
    return LayerSpec(
        kernels=tuple((p.kernel_attr, p.layout) for p in weighted),
        keys=tuple(p.suffix for p in parts),
        channel_wise=all(p.channel_wise for p in weighted),
        op=LAYER_OPS[name],
    )


def finish(layer: keras.layers.Layer, y, bias_exponent=None, observe=None):
    """Add ``layer``'s bias and apply its activation to the output ``y`` of its linear op.

    ``bias_exponent`` (power-of-two QAT: ``e_in + e_w``): the bias as the chip stores it,
    rounded half up to that grid (not clipped: int32; STE). ``observe``: called with the
    output before the activation (QAT tracks a fused softmax's logits).
    """
    bias = getattr(layer, "bias", None)
    if bias is not None and bias_exponent is not None:
        scale = ops.power(2.0, ops.cast(bias_exponent, "float32"))
        grid = round_half_up_ste(ops.cast(bias, "float32") / scale) * scale
        bias = ops.cast(grid, bias.dtype)  # mixed precision: back to the compute dtype
    if bias is not None:
        if getattr(layer, "data_format", "channels_last") == "channels_first":
            bias = ops.reshape(bias, (1, -1) + (1,) * (len(y.shape) - 2))
        y = y + bias
    if observe is not None:
        observe(y)
    activation = getattr(layer, "activation", None)
    return activation(y) if activation is not None else y
