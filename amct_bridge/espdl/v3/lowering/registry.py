"""The one table of the ESP-DL v3 export: per layer kind, the lowering that writes it and the
v3 op types it may write (as tfmot's layer registry maps a Keras layer to its quantize
config). docs/espdl-v3.md's "What each layer becomes" table is tested against it
(tests/espdl_v3/test_v3_lower_registry.py).

A layer is looked up by its ``op`` when that is one of the coefficient / activation ops an
adapter resolves itself (:data:`LOWERINGS` entries with ``source_ops``: ``conv2d``,
``relu``...), else by its ``kind`` (the framework's class name: ``Cropping2D``, MindSpore's
``LayerNorm``); a layer found in neither is refused with :func:`no_lowering`'s reason.

Example:
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> lowering_for(SourceLayer("c", "runtime", kind="Cropping2D")).v3_ops
    ('Slice',)
    >>> lowering_for(SourceLayer("c", "conv2d", kind="Conv2D")).v3_ops
    ('Conv', 'Gemm')
    >>> lowering_for(SourceLayer("c", "unsupported", kind="Conv2D")) is None
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from amct_bridge.espdl.source import PASS_THROUGH, SourceLayer
from amct_bridge.espdl.v3.lowering import activation as act
from amct_bridge.espdl.v3.lowering import arith, attention, conv, norm, pool, rnn, shape
from amct_bridge.espdl.v3.lowering import math as math_ops
from amct_bridge.espdl.v3.lowering.emitter import Emitter, no_lowering

__all__ = ["LOWERINGS", "Lowering", "chain_head", "lowering_for", "no_lowering"]

LowerFunction = Callable[[Emitter, SourceLayer, list[str]], None]


@dataclass(frozen=True)
class Lowering:
    """How one family of layers becomes v3 nodes.

    Args:
        kinds: the framework layer kinds it lowers (``SourceLayer.kind``; for entries with
            ``source_ops`` the kinds adapters give those ops, for the docs).
        v3_ops: every v3 op type it may write.
        lower: ``lower(em, layer, input_tensors)``: writes the nodes, or refuses.
        source_ops: dispatch by ``SourceLayer.op`` instead of kind.

    Example:
        >>> Lowering(("Flatten",), ("Flatten",), shape.lower_flatten).source_ops
        ()
    """

    kinds: tuple[str, ...]
    v3_ops: tuple[str, ...]
    lower: LowerFunction
    source_ops: tuple[str, ...] = ()


_ACTIVATION_OPS = tuple(sorted(set(act.ACTIVATION_OPS.values()) | {"QuantizeLinear"}))
_CELL_OPS = tuple(
    sorted({act.ACTIVATION_OPS[a] for a in act.CELL_ACTIVATIONS.values()} | {"QuantizeLinear"})
)

#: Transposed convs: chain heads (BatchNormalization folds, ReLU fuses) like the WEIGHT_OPS.
TRANSPOSE_KINDS = ("Conv2DTranspose", "Conv1DTranspose")

#: Every lowering. Adding a layer kind: a lowering module function and a row here (and in
#: docs/espdl-v3.md's table, which the tests hold to this one).
LOWERINGS: tuple[Lowering, ...] = (
    Lowering(
        (
            "Conv2D",
            "DepthwiseConv2D",
            "Dense",
            "Conv1D",
            "DepthwiseConv1D",
            "SeparableConv2D",
            "SeparableConv1D",
        ),
        ("Conv", "Gemm"),
        conv.lower_chain,
        source_ops=("conv2d", "depthwise_conv2d", "dense"),
    ),  # fmt: skip
    Lowering(TRANSPOSE_KINDS, ("InsertZeros", "Conv"), conv.lower_conv_transpose),
    Lowering(("ReLU",), ("Relu",), act.lower_relu, source_ops=("relu",)),
    Lowering(("LeakyReLU",), ("LeakyRelu",), act.lower_leaky_relu, source_ops=("leaky_relu",)),
    Lowering(("ReLU",), ("Clip",), act.lower_relu6, source_ops=("relu6",)),
    Lowering(("PReLU",), ("PRelu",), act.lower_prelu, source_ops=("prelu",)),
    Lowering(
        ("BatchNormalization",), ("Mul", "Add"), act.lower_batch_norm, source_ops=("batch_norm",)
    ),
    Lowering(("Activation", "ELU"), _ACTIVATION_OPS, act.lower_activation),
    Lowering(
        ("Softmax", *(k for k in act.CELL_ACTIVATIONS if k != "Softmax")),
        _CELL_OPS,
        act.lower_cell_activation,
    ),
    Lowering(tuple(k for k in PASS_THROUGH if k != "Activation"), (), act.lower_passthrough),
    Lowering(conv.HOST_KINDS, (), conv.lower_host),
    Lowering(("MaxPooling2D", "MaxPooling1D"), ("MaxPool",), pool.lower_maxpool),
    Lowering(("AveragePooling2D", "AveragePooling1D"), ("AveragePool", "Mul"), pool.lower_avgpool),
    Lowering(
        ("GlobalAveragePooling2D", "GlobalAveragePooling1D"),
        ("GlobalAveragePool", "Flatten"),
        pool.lower_global_pool,
    ),
    Lowering(
        ("GlobalMaxPooling2D", "GlobalMaxPooling1D"), ("MaxPool", "Flatten"), pool.lower_global_pool
    ),
    Lowering(("Add", "Subtract"), ("Add", "Sub", "RequantizeLinear"), arith.lower_add_sub),
    Lowering(("Multiply",), ("Mul",), arith.lower_multiply),
    Lowering(("LayerScale",), ("Mul",), arith.lower_scale),
    Lowering(("Concatenate",), ("Concat", "RequantizeLinear"), arith.lower_concat),
    Lowering(
        ("Maximum", "Minimum"),
        ("Reshape", "Concat", "ReduceMax", "ReduceMin", "RequantizeLinear"),
        arith.lower_max_min,
    ),
    Lowering(("Flatten",), ("Flatten",), shape.lower_flatten),
    Lowering(("Reshape",), ("Reshape",), shape.lower_reshape),
    Lowering(("Permute",), ("Transpose",), shape.lower_permute),
    Lowering(("Transpose",), ("Transpose",), shape.lower_transpose),
    Lowering(("Matmul",), ("MatMul",), attention.lower_matmul),
    Lowering(
        ("MultiHeadAttention",),
        ("Gemm", "Reshape", "Transpose", "MatMul", "Softmax", "QuantizeLinear"),
        attention.lower_attention,
    ),
    Lowering(("ZeroPadding2D", "ZeroPadding1D"), ("Pad",), shape.lower_pad),
    Lowering(("Cropping2D", "Cropping1D"), ("Slice",), shape.lower_cropping),
    Lowering(
        ("UpSampling2D",), ("Resize", "Concat", "Reshape", "Pad", "Conv"), shape.lower_upsample
    ),
    Lowering(("LayerNormalization", "LayerNorm"), ("LayerNormalization",), norm.lower_layer_norm),
    Lowering(("RMSNormalization",), ("RMSNormalization",), norm.lower_rms_norm),
    # keras.ops math and reductions (raw ops, named by class) and Embedding: lowering/math.py
    Lowering(("Divide", "TrueDivide"), ("Div",), math_ops.lower_divide),
    Lowering(("Power",), ("Pow",), math_ops.lower_power),
    Lowering(("Sqrt", "Exp", "Log"), ("Sqrt", "Exp", "Log"), math_ops.lower_unary),
    Lowering(("Negative",), ("Neg",), math_ops.lower_negative),
    Lowering(
        tuple(math_ops.REDUCE_OPS), tuple(math_ops.REDUCE_OPS.values()), math_ops.lower_reduce
    ),
    Lowering(("Embedding",), ("Reshape", "LUT", "Concat"), math_ops.lower_embedding),
    Lowering(rnn.RNN_KINDS, ("GRU", "LSTM", "ReverseSequence", "Reshape"), rnn.lower_rnn),
)

_BY_OP = {op: entry for entry in LOWERINGS for op in entry.source_ops}
_BY_KIND = {kind: entry for entry in LOWERINGS if not entry.source_ops for kind in entry.kinds}


def lowering_for(layer: SourceLayer) -> Lowering | None:
    """The entry that lowers ``layer``, or None (refused: :func:`no_lowering`)."""
    if layer.op in _BY_OP:
        return _BY_OP[layer.op]
    if layer.op in ("runtime", "unsupported"):
        return _BY_KIND.get(layer.kind)
    return None


def chain_head(layer: SourceLayer) -> bool:
    """True for a layer with a filter that starts a conv chain (a transposed conv given its
    kernel included).

    Example:
        >>> chain_head(SourceLayer("t", "unsupported", kind="Conv2DTranspose"))
        False
    """
    entry = lowering_for(layer)
    if entry is None:
        return False
    if entry.lower is conv.lower_conv_transpose:
        return "kernel" in layer.weights
    return entry.lower is conv.lower_chain
