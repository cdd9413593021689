"""What gets quantized, per Keras layer type: one table instead of isinstance chains.

The Keras half of the core's layer descriptors (:mod:`amct_bridge.calibration.layers`):
:func:`describe` turns one Keras layer into a
:class:`~amct_bridge.calibration.layers.LayerDesc`.

Each quantizable Keras class maps to one or more :class:`QuantPart`. A part is one AMCT record
entry (one quantized TF op): its record-key suffix, the TF op type convert_model sees, which kernel
attribute holds its weights, the kernel layout, whether per-channel weight scales are allowed and
whether a following BatchNormalization may be folded into it.

``SeparableConv2D`` is two ops in TF (DepthwiseConv2dNative, then a 1x1 Conv2D); its parts are
keyed ``<layer>/depthwise`` and ``<layer>/pointwise``. The pointwise part's input is the depthwise
output (a tensor inside the layer), so the callback computes it alongside the layer.

The 1-D convolutions (``Conv1D``, ``DepthwiseConv1D``, ``SeparableConv1D``) are the same TF ops
(TF runs them as 2-D convolutions of height 1: an ExpandDims on the input and the kernel), so
they get the same op types and AMCT's Conv2D rules: their kernels keep their Keras layout
(``WIO``, ``WCM``), which is the 2-D one with the height axis dropped, so the per-channel
scales are those of the 2-D conv ``[1, k, cin, cout]``.

Layouts are the names of :mod:`amct_bridge.quant.layouts` (H, W kernel size; I input, O output
channels; C channels and M depth multiplier of a depthwise kernel, output channel ``c * M + m``).

Example:
    >>> spec = QUANTIZABLE["SeparableConv2D"]
    >>> [(p.key("sep"), p.op_type) for p in spec]
    [('sep/depthwise', 'DepthwiseConv2dNative'), ('sep/pointwise', 'Conv2D')]
"""

from __future__ import annotations

from dataclasses import dataclass

from amct_bridge.calibration.layers import LayerDesc
from amct_bridge.calibration.layers import QuantPart as CorePart


@dataclass(frozen=True)
class QuantPart(CorePart):
    """One quantized op of a Keras layer: the core's part plus where its numbers live.

    Args:
        suffix, op_type, weights, channel_wise, foldable: see
            :class:`amct_bridge.calibration.layers.QuantPart`.
        kernel_attr: layer attribute with the weights (None: no weights, e.g. AvgPool).
        layout: kernel layout ("HWIO", "HWCM", "HWOI", "IO", 1-D "WIO", "WCM"), None without
            weights.
        bias_attr: layer attribute with the bias (None: the part has none).

    Example:
        >>> QUANTIZABLE["Dense"][0].channel_wise, QUANTIZABLE["Dense"][0].layout
        (False, 'IO')
    """

    kernel_attr: str | None = None
    layout: str | None = None
    bias_attr: str | None = "bias"


def _part(suffix, op_type, kernel_attr, layout, channel_wise, foldable, bias_attr="bias"):
    weights = kernel_attr is not None
    return QuantPart(
        suffix, op_type, weights, channel_wise, foldable, kernel_attr, layout, bias_attr
    )


_CONV = _part("", "Conv2D", "kernel", "HWIO", True, True)
_DEPTHWISE = _part("", "DepthwiseConv2dNative", "kernel", "HWCM", True, True)
_TRANSPOSE = _part("", "Conv2DBackpropInput", "kernel", "HWOI", True, True)
_DENSE = _part("", "MatMul", "kernel", "IO", False, True)
_AVGPOOL = _part("", "AvgPool", None, None, False, False, bias_attr=None)
_CONV_1D = _part("", "Conv2D", "kernel", "WIO", True, True)
_DEPTHWISE_1D = _part("", "DepthwiseConv2dNative", "kernel", "WCM", True, True)


def _separable(depthwise_layout: str, pointwise_layout: str) -> tuple[QuantPart, QuantPart]:
    return (
        _part(
            "depthwise",
            "DepthwiseConv2dNative",
            "depthwise_kernel",
            depthwise_layout,
            True,
            False,
            bias_attr=None,
        ),
        _part("pointwise", "Conv2D", "pointwise_kernel", pointwise_layout, True, True),
    )


#: Keras class name -> quantized parts, in execution order.
QUANTIZABLE: dict[str, tuple[QuantPart, ...]] = {
    "Conv2D": (_CONV,),
    "DepthwiseConv2D": (_DEPTHWISE,),
    "Conv2DTranspose": (_TRANSPOSE,),
    "Dense": (_DENSE,),
    "SeparableConv2D": _separable("HWCM", "HWIO"),
    "AveragePooling2D": (_AVGPOOL,),
    # 1-D convs: TF's 2-D ops of height 1 (see the module docstring)
    "Conv1D": (_CONV_1D,),
    "DepthwiseConv1D": (_DEPTHWISE_1D,),
    "SeparableConv1D": _separable("WCM", "WIO"),
}

#: Keras classes whose input/output ranges go to the calibration sidecar (no record entry).
ACTIVATIONS: frozenset[str] = frozenset(
    {"ReLU", "Activation", "LeakyReLU", "PReLU", "ELU", "Softmax"}
)

#: Coefficient-free layers (and raw ops of the same kind, e.g. ``x + y`` is "Add") whose output
#: range goes to the sidecar for runtimes that need it (ESP-DL Add2D, AvgPool2D...). Only min/max
#: are needed: the calibration plan gives them a minmax observer unless their tensors are already
#: observed (then that point is shared).
RUNTIME: frozenset[str] = frozenset(
    {
        "Add",
        "Concatenate",
        "AveragePooling2D",
        "GlobalAveragePooling2D",
        "MaxPooling2D",
        "GlobalMaxPooling2D",
        "AveragePooling1D",
        "GlobalAveragePooling1D",
        "MaxPooling1D",
        "GlobalMaxPooling1D",
        # the ESP-DL v3 export lowers these (amct_bridge.espdl.v3.lowering) and needs the
        # range of their output: a transposed 1-D conv (no TF op AMCT quantizes), Maximum /
        # Minimum, RMSNormalization, a matrix product of two activations (keras.ops.matmul)
        "Conv1DTranspose",
        "Matmul",
        "Maximum",
        "Minimum",
        "RMSNormalization",
        # recurrent layers (GRU / LSTM modules): their input range and output range (h, whose
        # exponent Y and Y_h share; the gate exponent is the op's own)
        "GRU",
        "LSTM",
        "Bidirectional",
        "SimpleRNN",  # refused by name (no such module), not lost in "no input range"
        # a LayerNormalization first in a block reads the model input: its input range is
        # the model input's exponent (MindSpore's nn.LayerNorm is observed the same way)
        "LayerNormalization",
        # its query input and output (the tensors inside: export_espdl's calibration_data)
        "MultiHeadAttention",
        # keras.ops math and reductions (raw ops) and Embedding (lowering/math.py): the output
        # ranges give their exponents, the input range the model input's when they read it
        "Divide",
        "TrueDivide",
        "Power",
        "Sqrt",
        "Exp",
        "Log",
        "Negative",
        "Max",
        "Min",
        "Sum",
        "Mean",
        "Embedding",
    }
)

#: Keras class names of batch normalization (folded into a preceding foldable part).
BATCH_NORMS: frozenset[str] = frozenset({"BatchNormalization"})

#: Layers whose weights are input preprocessing constants (mean / variance of
#: ``Normalization``), which deployment applies on the host: not named as left float.
PREPROCESSING: frozenset[str] = frozenset({"Normalization"})


def class_name(layer) -> str:
    """The registry name of ``layer``: its own class, or the nearest registered base class.

    Subclasses of a registered Keras layer (``class MyConv(keras.layers.Conv2D)``) are
    quantized like their base.

    Example:
        >>> class Conv2D: ...
        >>> class MyConv(Conv2D): ...
        >>> class_name(MyConv())
        'Conv2D'
    """
    for klass in type(layer).__mro__:
        if klass.__name__ in QUANTIZABLE or klass.__name__ in ACTIVATIONS:
            return klass.__name__
        if klass.__name__ in BATCH_NORMS or klass.__name__ in RUNTIME:
            return klass.__name__
    return type(layer).__name__


def quant_parts(layer) -> tuple[QuantPart, ...]:
    """Quantized parts of ``layer`` (empty tuple if it is not quantizable).

    Example:
        >>> class Dense: ...
        >>> [p.op_type for p in quant_parts(Dense())]
        ['MatMul']
    """
    return QUANTIZABLE.get(class_name(layer), ())


def is_activation(layer) -> bool:
    """True for standalone activation layers (their ranges go to the sidecar only).

    Example:
        >>> class ReLU: ...
        >>> is_activation(ReLU())
        True
    """
    return class_name(layer) in ACTIVATIONS


def is_batch_norm(layer) -> bool:
    """True for BatchNormalization layers.

    Example:
        >>> class BatchNormalization: ...
        >>> is_batch_norm(BatchNormalization())
        True
    """
    return class_name(layer) in BATCH_NORMS


def is_runtime(layer) -> bool:
    """True for coefficient-free layers / raw ops whose output range the sidecar keeps.

    Example:
        >>> class GlobalAveragePooling2D: ...
        >>> is_runtime(GlobalAveragePooling2D())
        True
    """
    return class_name(layer) in RUNTIME and not quant_parts(layer)


def clamp_bounds(layer) -> tuple[float, float] | None:
    """``(low, high)`` when ``layer`` computes ``min(max(x, low), high)`` (ReLU, ReLU6), else None.

    For such a layer the output's min and max follow exactly from the input's (the function
    is monotone), so the callback derives them instead of reducing the output again.

    Example:
        >>> import keras
        >>> clamp_bounds(keras.layers.ReLU(6.0)), clamp_bounds(keras.layers.Activation("relu"))
        ((0.0, 6.0), (0.0, inf))
        >>> clamp_bounds(keras.layers.ReLU(negative_slope=0.1)) is None
        True
    """
    import keras

    name = class_name(layer)
    if name == "ReLU":
        if float(layer.negative_slope) != 0.0 or float(layer.threshold) != 0.0:
            return None
        top = layer.max_value
        return 0.0, float("inf") if top is None else float(top)
    if name == "Activation":
        if layer.activation is keras.activations.relu:
            return 0.0, float("inf")
        if layer.activation is keras.activations.relu6:
            return 0.0, 6.0
    return None


def describe(key: str, layer) -> LayerDesc:
    """The core's descriptor of the Keras layer (or raw op) ``layer`` keyed ``key``.

    Example:
        >>> import keras
        >>> d = describe("r", keras.layers.ReLU(name="r"))
        >>> d.kind, d.activation, d.runtime, d.parts
        ('ReLU', True, False, ())
    """
    kind = class_name(layer)
    params = {}
    if getattr(layer, "data_format", "channels_last") == "channels_first":
        params["channel_axis"] = 1
    if kind in BATCH_NORMS:
        params["on_channels"] = _bn_on_channels(layer)
    return LayerDesc(
        key,
        kind,
        QUANTIZABLE.get(kind, ()),
        layer,
        activation=kind in ACTIVATIONS,
        runtime=kind in RUNTIME,
        name=getattr(layer, "name", key),
        params=params,
        weighted=bool(getattr(layer, "weights", ())) and kind not in PREPROCESSING,
    )


def _bn_on_channels(bn) -> bool:
    try:
        axis = bn.axis if isinstance(bn.axis, int) else (bn.axis[0] if len(bn.axis) == 1 else None)
        return axis is not None and axis in (-1, len(bn.input.shape) - 1)
    except (AttributeError, ValueError, RuntimeError, TypeError):  # not called once: no chain
        return False
