"""Why a channel group or a layer is refused for pruning: one code per cause.

Example:
    >>> from amct_bridge.graph.reasons import Reason
    >>> Reason.REACHES_OUTPUT.value, Reason.REACHES_OUTPUT.explain()
    ('REACHES_OUTPUT', 'its channels reach a model output')
"""

from __future__ import annotations

from enum import Enum


class Reason(str, Enum):
    """Refusal reason codes (the value is the code printed and written to JSON).

    Example:
        >>> Reason("UNKNOWN_OP") is Reason.UNKNOWN_OP
        True
    """

    MODEL_OUTPUT = "MODEL_OUTPUT"
    REACHES_OUTPUT = "REACHES_OUTPUT"
    MERGED_WITH_UNPRUNABLE = "MERGED_WITH_UNPRUNABLE"
    WIDTH_MISMATCH = "WIDTH_MISMATCH"
    BROADCAST = "BROADCAST"
    UNKNOWN_OP = "UNKNOWN_OP"
    CHANNEL_MIXING = "CHANNEL_MIXING"
    GROUPED_CONV = "GROUPED_CONV"
    DEPTHWISE_CONV = "DEPTHWISE_CONV"
    MAPPING_MISMATCH = "MAPPING_MISMATCH"
    CONSTANT_OPERAND = "CONSTANT_OPERAND"
    UNSUPPORTED_LAYOUT = "UNSUPPORTED_LAYOUT"
    UNKNOWN_SHAPE = "UNKNOWN_SHAPE"
    NO_CLOSING_CONSUMER = "NO_CLOSING_CONSUMER"
    INPUT_NOT_PRUNABLE = "INPUT_NOT_PRUNABLE"
    SHARED_LAYER = "SHARED_LAYER"
    NOT_ELIGIBLE = "NOT_ELIGIBLE"

    def explain(self) -> str:
        """One-line human explanation of the code."""
        return _EXPLAIN[self]


_EXPLAIN = {
    Reason.MODEL_OUTPUT: (
        "the layer computes a model output (its channels are the model's result, e.g. the "
        "classes; a softmax or activation after it changes nothing)"
    ),
    Reason.REACHES_OUTPUT: "its channels reach a model output",
    Reason.MERGED_WITH_UNPRUNABLE: (
        "an element-wise op couples it with channels that cannot be pruned (model input, "
        "refused branch)"
    ),
    Reason.WIDTH_MISMATCH: "element-wise inputs have different channel counts",
    Reason.BROADCAST: "a 1-channel tensor is broadcast over the channels of another",
    Reason.UNKNOWN_OP: "an op or custom layer whose channel behaviour is unknown (never guessed)",
    Reason.CHANNEL_MIXING: "a reshape/transpose/softmax/normalization/matmul mixes channels",
    Reason.GROUPED_CONV: "a grouped convolution (1 < groups < channels) would need equal pruning",
    Reason.DEPTHWISE_CONV: (
        "a depthwise convolution (DepthwiseConv2D, or groups == input channels): each output "
        "reads one input channel, there is no run of 4 input channels to keep 2 of"
    ),
    Reason.MAPPING_MISMATCH: "channel index mappings that cannot be aligned (multiplier/tiling)",
    Reason.CONSTANT_OPERAND: "a raw op with a per-channel constant operand",
    Reason.UNSUPPORTED_LAYOUT: (
        "the layer's channel axis is not the tensor's (channels_first in a channels-last "
        "model, or a Dense over the last axis of an NCHW map)"
    ),
    Reason.UNKNOWN_SHAPE: "the channel dimension is unknown",
    Reason.NO_CLOSING_CONSUMER: "no consumer with weights closes the group",
    Reason.INPUT_NOT_PRUNABLE: "its input channels come from a model input or a refused group",
    Reason.SHARED_LAYER: "the layer is called more than once",
    Reason.NOT_ELIGIBLE: "the layer type cannot take this kind of pruning",
}
