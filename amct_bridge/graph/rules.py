"""What each node kind does to channels: one table, read by the discovery.

Roles:
    PRODUCER   weights whose output channels can be removed (Conv, Dense, Conv2DTranspose); it
               also closes the groups feeding its input.
    SEPARABLE  SeparableConv: depthwise part passes the input range (times the multiplier),
               pointwise part closes it and produces new channels.
    DEPTHWISE  consumer with weights that passes its input range on, times ``depth_multiplier``.
    PASS       channel-wise op: channel c in -> channel c out (BN, activations, pooling...).
    ELEMENTWISE  two or more tensors combined position by position (Add, Multiply...).
    CONCAT     concatenation (channel axis: offsets; other axis: like ELEMENTWISE).
    SPLIT      split on the channel axis: per-branch slices (other axis: PASS per output).
    RESHAPE    Flatten/Reshape: identity if the channel axis survives, tiled (NHWC) or blocked
               (NCHW) for a flatten, else stop.
    TRANSPOSE  identity if the channel axis lands on the output's channel axis, else stop.
    STOP       channels cannot be followed (the reason says why); nothing is guessed.

Example:
    >>> from amct_bridge.graph.ir import Node
    >>> from amct_bridge.graph.rules import classify
    >>> classify(Node("bn", "bn", "BatchNormalization", "", ["a"], ["b"], {"axis": -1}))
    ('PASS', None)
"""

from __future__ import annotations

from amct_bridge.graph.ir import Node
from amct_bridge.graph.reasons import Reason

PRODUCER_KINDS = frozenset(
    {"Conv1D", "Conv2D", "Conv3D", "Dense", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose"}
)
SEPARABLE_KINDS = frozenset({"SeparableConv1D", "SeparableConv2D"})
DEPTHWISE_KINDS = frozenset({"DepthwiseConv1D", "DepthwiseConv2D"})
#: Channel-wise ops with per-channel weights: calls of a shared one couple their inputs.
WEIGHTED_PASS_KINDS = frozenset({"BatchNormalization", "PReLU"})
PASS_KINDS = frozenset(
    {
        "BatchNormalization",
        "PReLU",
        "ReLU",
        "LeakyReLU",
        "ELU",
        "ThresholdedReLU",
        "Identity",
        "Dropout",
        "SpatialDropout1D",
        "SpatialDropout2D",
        "SpatialDropout3D",
        "GaussianNoise",
        "GaussianDropout",
        "AlphaDropout",
        "ActivityRegularization",
        "Rescaling",
        "MaxPooling1D",
        "MaxPooling2D",
        "MaxPooling3D",
        "AveragePooling1D",
        "AveragePooling2D",
        "AveragePooling3D",
        "GlobalAveragePooling1D",
        "GlobalAveragePooling2D",
        "GlobalAveragePooling3D",
        "GlobalMaxPooling1D",
        "GlobalMaxPooling2D",
        "GlobalMaxPooling3D",
        "ZeroPadding1D",
        "ZeroPadding2D",
        "ZeroPadding3D",
        "Cropping1D",
        "Cropping2D",
        "Cropping3D",
        "UpSampling1D",
        "UpSampling2D",
        "UpSampling3D",
        # raw ops (keras.ops.*) that act per element
        "Relu",
        "Relu6",
        "Sigmoid",
        "HardSigmoid",
        "Silu",
        "HardSilu",
        "Tanh",
        "Elu",
        "Selu",
        "Gelu",
        "LeakyRelu",
        "Softplus",
        "Softsign",
        "Abs",
        "Absolute",
        "Negative",
        "Square",
        "Sqrt",
        "Exp",
        "Log",
        "Clip",
        "Cast",
        "Round",
        "Floor",
        "Ceil",
        "Sign",
    }
)
ELEMENTWISE_KINDS = frozenset(
    {
        "Add",
        "Subtract",
        "Multiply",
        "Maximum",
        "Minimum",
        "Average",
        "Divide",
        "TrueDivide",
        "Power",
    }
)
MIXING_KINDS = frozenset(
    {
        "LayerNormalization",
        "GroupNormalization",
        "UnitNormalization",
        "Dot",
        "Matmul",
        "Einsum",
        "MultiHeadAttention",
        "GroupedQueryAttention",
        "Attention",
        "AdditiveAttention",
        "Tensordot",
        "Sum",
        "Mean",
        "Max",
        "Min",
        "Argmax",
        "Argmin",
    }
)
#: Activation functions that mix the channels they run over.
MIXING_ACTIVATIONS = frozenset({"softmax", "log_softmax"})
#: Op types of what a classifier head applies after its last producer and keeps the channel
#: count of (softmax, sigmoid, an activation, dropout): that producer computes the model output.
HEAD_OP_TYPES = frozenset(
    {"Softmax", "LogSoftmax", "Sigmoid", "Tanh", "Relu", "LeakyRelu", "Elu", "Selu", "Identity"}
)
_CHANNEL_AXIS_KINDS = frozenset({"Concatenate", "Split"})


def classify(node: Node, channel_axis: int = -1) -> tuple[str, Reason | None]:
    """Role of ``node`` (module docstring) and, for STOP, the reason.

    ``channel_axis`` is the channel axis of the tensor the node reads (negative): -1 for NHWC /
    NC, -3 for NCHW. A node whose own ``channel_axis`` param disagrees with it, or a Keras
    ``channels_first`` layer reading a channels-last tensor, stops with UNSUPPORTED_LAYOUT.

    Example:
        >>> classify(Node("m", "m", "MyCustomLayer", "", ["a"], ["b"]))
        ('STOP', <Reason.UNKNOWN_OP: 'UNKNOWN_OP'>)
        >>> classify(Node("bn", "bn", "BatchNormalization", "", ["a"], ["b"], {"channel_axis": -3}))
        ('STOP', <Reason.UNSUPPORTED_LAYOUT: 'UNSUPPORTED_LAYOUT'>)
        >>> classify(Node("bn", "bn", "BatchNormalization", "", ["a"], ["b"], {"channel_axis": -3}),
        ...          channel_axis=-3)
        ('PASS', None)
    """
    kind, params = node.kind, node.params
    if params.get("channel_axis", channel_axis) != channel_axis or (
        params.get("data_format") == "channels_first" and channel_axis == -1
    ):
        return "STOP", Reason.UNSUPPORTED_LAYOUT
    if params.get("const_operands") or params.get("per_channel_constant"):
        return "STOP", Reason.CONSTANT_OPERAND
    if kind in PRODUCER_KINDS:
        return _conv_role(node)
    if kind in SEPARABLE_KINDS:
        return "SEPARABLE", None
    if kind in DEPTHWISE_KINDS:
        return "DEPTHWISE", None
    if kind == "Activation" or kind == "Softmax":
        return _activation_role(node, channel_axis)
    if kind in PASS_KINDS:
        return "PASS", None
    if kind in ELEMENTWISE_KINDS:
        return "ELEMENTWISE", None
    if kind in _CHANNEL_AXIS_KINDS:
        return kind.upper(), None
    if kind in ("Flatten", "Reshape"):
        return "RESHAPE", None
    if kind in ("Transpose", "Permute"):
        return "TRANSPOSE", None
    if kind in MIXING_KINDS:
        return "STOP", Reason.CHANNEL_MIXING
    return "STOP", Reason.UNKNOWN_OP


def _conv_role(node: Node) -> tuple[str, Reason | None]:
    groups = node.params.get("groups", 1)
    if groups == 1:
        return "PRODUCER", None
    if groups == node.params.get("in_channels"):
        return "DEPTHWISE", None  # a conv with groups == Cin is a depthwise conv
    return "STOP", Reason.GROUPED_CONV


def _activation_role(node: Node, channel_axis: int) -> tuple[str, Reason | None]:
    if node.kind == "Softmax":
        axes = node.params.get("axis", -1)
        axes = axes if isinstance(axes, tuple) else (axes,)
        return ("STOP", Reason.CHANNEL_MIXING) if channel_axis in axes else ("PASS", None)
    if node.params.get("activation") in MIXING_ACTIVATIONS:
        return "STOP", Reason.CHANNEL_MIXING
    return "PASS", None


def depth_multiplier(node: Node) -> int:
    """Output channels per input channel of a depthwise node (groups == Cin convs included)."""
    if node.kind in PRODUCER_KINDS:
        return node.params["filters"] // node.params["groups"]
    return int(node.params.get("depth_multiplier", 1))


def is_weighted(node: Node, role: str) -> bool:
    """True when the node's per-channel weights tie the channels of all calls of its layer."""
    return role in ("PRODUCER", "SEPARABLE", "DEPTHWISE") or node.kind in WEIGHTED_PASS_KINDS
