"""MindSpore cells and primitives -> graph IR kinds, TF op types and params (tables).

The core's rule tables use Keras class names as kinds, so each known MindSpore class is mapped
onto its twin: ``nn.Conv2d`` -> ``"Conv2D"`` (``groups``, ``kernel_layout="OIHW"``), ``nn.Dense``
-> ``"Dense"`` (``"OI"``), ``nn.Conv2dTranspose`` -> ``"Conv2DTranspose"`` (``"IOHW"``),
``nn.BatchNorm2d`` -> ``"BatchNormalization"``, functional ``Add`` -> ``"Add"``, ``Concat`` ->
``"Concatenate"``... Subclasses count as their base class. A cell call must consist of the
primitives its class is known to use (``CELL_PRIMS``); anything else, and every class or
primitive not in these tables, gets a kind no rule knows (``"mindspore:<Class>"``), so
propagation stops there with UNKNOWN_OP. MindSpore tensors are NCHW: channel axis 1.

Example:
    >>> from mindspore import nn
    >>> cell_kind(nn.Conv2d(3, 8, 3))
    'Conv2D'
    >>> cell_kind(nn.SequentialCell([nn.ReLU()])) is None
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mindspore import nn

from amct_bridge.graph.op_types import ACTIVATION_OP_TYPES, OP_TYPES

#: Known cell classes, most specific first: (class, IR kind).
_CELLS: list[tuple[type, str]] = [
    (nn.GRU, "GRU"),  # its CPU construct: unrolled steps (GRU) or an LSTM primitive
    (nn.LSTM, "LSTM"),
    (nn.Conv2dTranspose, "Conv2DTranspose"),
    (nn.Conv2d, "Conv2D"),
    (nn.Conv1d, "Conv1D"),  # MindSpore's own Conv2D of height 1 (ExpandDims, Conv2D, Squeeze)
    (nn.Dense, "Dense"),
    (nn.BatchNorm2d, "BatchNormalization"),
    (nn.BatchNorm1d, "BatchNormalization"),
    (nn.ReLU6, "ReLU6"),
    (nn.ReLU, "ReLU"),
    (nn.LeakyReLU, "LeakyReLU"),
    (nn.Sigmoid, "Activation"),
    (nn.Tanh, "Activation"),
    (nn.GELU, "Activation"),
    (nn.ELU, "Activation"),
    (nn.SiLU, "Activation"),
    (nn.HSwish, "Activation"),
    (nn.HSigmoid, "Activation"),
    (nn.Softmax, "Softmax"),
    (nn.MaxPool2d, "MaxPooling2D"),
    (nn.AvgPool2d, "AveragePooling2D"),
    (nn.AdaptiveAvgPool2d, "AveragePooling2D"),
    (nn.AdaptiveMaxPool2d, "MaxPooling2D"),
    # 1-D pools: the 2-D primitive on the input expanded to height 1 (their constructs)
    (nn.MaxPool1d, "MaxPooling1D"),
    (nn.AvgPool1d, "AveragePooling1D"),
    (nn.AdaptiveAvgPool1d, "AveragePooling1D"),
    (nn.AdaptiveMaxPool1d, "MaxPooling1D"),
    (nn.Flatten, "Flatten"),
    (nn.Dropout, "Dropout"),
    (nn.Identity, "Identity"),
    (nn.Upsample, "UpSampling2D"),  # ops.interpolate: one resize primitive per call
]
_ACTIVATION_NAMES = {
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "GELU": "gelu",
    "SiLU": "silu",
    "HSwish": "hard_silu",
    "HSigmoid": "hard_sigmoid",
    "ELU": "elu",
}
#: Element-wise activation primitives (functional, or inside an activation cell).
ACTIVATION_PRIMS = {
    "ReLU": "Relu",
    "ReLU6": "Relu6",
    "Sigmoid": "Sigmoid",
    "Tanh": "Tanh",
    "GeLU": "Gelu",
    "SiLU": "Silu",
    "HSwish": "HardSilu",
    "HSigmoid": "HardSigmoid",
    "LeakyReLU": "LeakyRelu",
    "Elu": "Elu",
    "Abs": "Abs",
    "Neg": "Negative",
    "Square": "Square",
    "Sqrt": "Sqrt",
    "Exp": "Exp",
    "Log": "Log",
    "Cast": "Cast",
    "Floor": "Floor",
    "Round": "Round",
}
#: Activation cells an ``nn.Dense(activation=...)`` holds -> the fused activation's name in
#: the graph params (Keras' names: the core's rules read ``softmax`` as channel mixing).
DENSE_ACTIVATIONS = {
    "ReLU": "relu",
    "ReLU6": "relu6",
    "LeakyReLU": "leaky_relu",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "Softmax": "softmax",
    "LogSoftmax": "log_softmax",
    "GELU": "gelu",
    "SiLU": "silu",
    "HSwish": "hard_silu",
    "HSigmoid": "hard_sigmoid",
    "ELU": "elu",
}


def dense_activation(cell: Any) -> str:
    """The name of the activation an ``nn.Dense`` applies itself (``"linear"``: none); an
    activation class outside :data:`DENSE_ACTIVATIONS` keeps its class name (``"Mish"``),
    which no rule or exporter takes for a known one.

    Example:
        >>> from mindspore import nn
        >>> dense_activation(nn.Dense(2, 2, activation="softmax")), dense_activation(nn.Dense(2, 2))
        ('softmax', 'linear')
    """
    if not getattr(cell, "activation_flag", False):
        return "linear"
    for cls in type(cell.activation).__mro__:
        if cls.__name__ in DENSE_ACTIVATIONS:
            return DENSE_ACTIVATIONS[cls.__name__]
    return type(cell.activation).__name__


#: Resize primitives of ``nn.Upsample`` / ``ops.interpolate`` / ``ops.ResizeNearestNeighbor``
#: on NCHW maps -> their interpolation (kind ``UpSampling2D``: channel c in -> channel c out).
RESIZE_PRIMS: tuple[str, ...] = (
    "ResizeNearestNeighbor",
    "ResizeNearestNeighborV2",
    "UpsampleNearest2D",
    "ResizeBilinearV2",
    "ResizeBilinear",
    "UpsampleBilinear2D",
)

_PLAIN = {"Cast", "Reshape", "Mul", "Muls", "Maximum", "Minimum", "Add", "Sub"}
#: Recurrent cells (nn.GRU, nn.LSTM): their calls are found by ``_Builder.claim_rnn``
#: (graph.py), not by scope alone (MindIR scopes the unrolled steps of an nn.GRU under no cell).
RNN_KINDS = ("GRU", "LSTM")
#: The primitives an nn.GRU / nn.LSTM call runs on CPU (batch_first, either direction).
_RNN_PRIMS = (
    *_PLAIN,
    "Transpose",
    "StridedSlice",
    "Squeeze",
    "ExpandDims",
    "MatMul",
    "BiasAdd",
    "Split",
    "Sigmoid",
    "Tanh",
    "make_list",
    "make_tuple",
    "Stack",
    "ReverseV2",
    "ReverseSequence",
    "Concat",
    "LSTM",
    "Zeros",
    "Fill",
    "FillV2",
    "Dropout",
)
#: Primitives a call of each kind must contain (one of them) and the others it may contain.
CELL_PRIMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "Conv2D": (("Conv2D",), ("BiasAdd", "Pad", "Cast")),
    **dict.fromkeys(RNN_KINDS, ((), _RNN_PRIMS)),
    "Conv1D": (("Conv2D",), ("BiasAdd", "Pad", "Cast", "ExpandDims", "Squeeze")),
    "Conv2DTranspose": (
        ("Conv2DTranspose", "Conv2DBackpropInput"),
        ("BiasAdd", "Pad", "Cast"),
    ),
    "Dense": (("MatMul",), ("BiasAdd", "Reshape", "Cast", *ACTIVATION_PRIMS)),
    "BatchNormalization": (("BatchNorm",), ("Cast", "Reshape")),
    "ReLU": (("ReLU",), ()),
    "ReLU6": (("ReLU6",), ()),
    "LeakyReLU": (
        ("LeakyReLU", "Maximum"),
        ("Mul", "Muls", "Select", "GreaterEqual", "Greater"),
    ),
    # nn.GELU(approximate=False): x * 0.5 * (1 + erf(x / sqrt(2))), no GeLU primitive
    "Activation": ((*ACTIVATION_PRIMS, "Erf"), (*_PLAIN, "Div", "RealDiv")),
    "Softmax": (("Softmax",), ()),
    "MaxPooling2D": (("MaxPool", "AdaptiveMaxPool2D", "MaxPoolWithArgmax"), ("Pad",)),
    "AveragePooling2D": (("AvgPool", "AdaptiveAvgPool2D", "ReduceMean"), ("Pad",)),
    "MaxPooling1D": (("MaxPool", "MaxPoolWithArgmax"), ("Pad", "ExpandDims", "Squeeze")),
    "AveragePooling1D": (
        ("AvgPool", "ReduceMean"),
        ("Pad", "ExpandDims", "Squeeze", "StridedSlice"),
    ),
    "Flatten": (("Flatten", "Reshape"), ()),
    "Dropout": ((), ("Dropout", "DropoutExt")),
    "Identity": ((), ("Identity",)),
    "UpSampling2D": (RESIZE_PRIMS, ()),
}
#: Functional primitives -> IR kind (channel behaviour comes from the core's rules).
PRIM_KINDS: dict[str, str] = {
    "Add": "Add",
    "AddExt": "Add",
    "AddN": "Add",  # ops.AddN()([a, b]); the v1 export takes two operands only
    "InplaceAddExt": "Add",  # out += y (alpha 1: see graph.prim_node)
    "Sub": "Subtract",
    "SubExt": "Subtract",
    "InplaceSubExt": "Subtract",  # out -= y
    "Mul": "Multiply",
    "Muls": "Multiply",
    "Div": "Divide",
    "RealDiv": "Divide",
    "Divs": "Divide",
    "Pow": "Power",
    "Maximum": "Maximum",
    "Minimum": "Minimum",
    "Concat": "Concatenate",
    "Split": "Split",
    "MaxPool": "MaxPooling2D",
    "AvgPool": "AveragePooling2D",
    "AdaptiveAvgPool2D": "AveragePooling2D",
    "AdaptiveMaxPool2D": "MaxPooling2D",
    "Flatten": "Flatten",
    "Reshape": "Reshape",
    "ExpandDims": "Reshape",
    "Squeeze": "Reshape",
    "Transpose": "Transpose",
    "Softmax": "Softmax",
    "MatMul": "Matmul",
    "MatMulExt": "Matmul",  # ops.matmul
    "BatchMatMul": "Matmul",
    "BatchMatMulExt": "Matmul",
    **dict.fromkeys(RESIZE_PRIMS, "UpSampling2D"),
    **{p: k for p, k in ACTIVATION_PRIMS.items()},
}
_REDUCE_PRIMS = {
    "ReduceMean": "Mean",
    "MeanExt": "Mean",
    "ReduceMax": "Max",
    "ReduceMin": "Min",
    "ReduceSum": "Sum",
    "SumExt": "Sum",  # ops.sum
}


def resize_params(op: str, consts: list[Any], in_shape: tuple, out_shape: tuple) -> dict[str, Any]:
    """Params of a resize primitive on an NCHW map: ``interpolation`` (``"nearest"`` /
    ``"bilinear"``), ``size`` (the integer scales ``(sh, sw)``, as Keras UpSampling2D's, or None
    when the output is no integer multiple of the input), ``output_size`` and the flags that
    move the sampling grid (``align_corners``, ``half_pixel_centers``).

    Example:
        >>> p = resize_params("ResizeNearestNeighborV2", [(8, 12), False, False], (1, 2, 4, 4),
        ...                   (1, 2, 8, 12))
        >>> p["interpolation"], p["size"], p["align_corners"]
        ('nearest', (2, 3), False)
    """
    flags = [bool(c) for c in consts if isinstance(c, bool | np.bool_)]
    if op.startswith("Upsample"):  # UpsampleNearest2D / UpsampleBilinear2D: align_corners only
        flags = [flags[0] if flags else False, False]
    flags += [False] * (2 - len(flags))
    size = None
    if len(in_shape) == 4 and len(out_shape) == 4 and all(in_shape[2:]):
        (h, w), (oh, ow) = in_shape[2:], out_shape[2:]
        if oh % h == 0 and ow % w == 0:
            size = (oh // h, ow // w)
    return {
        "interpolation": "bilinear" if "Bilinear" in op else "nearest",
        "size": size,
        "output_size": tuple(int(d) for d in out_shape[2:]),
        "align_corners": flags[0],
        "half_pixel_centers": flags[1],
    }


def unknown_kind(name: str) -> str:
    """A kind no rule table holds: propagation stops at it with UNKNOWN_OP."""
    return f"mindspore:{name}"


def cell_kind(cell: Any) -> str | None:
    """IR kind of a known cell class (subclasses included), None for any other cell.

    Example:
        >>> from mindspore import nn
        >>> cell_kind(nn.ReLU6()), cell_kind(nn.Dense(2, 3))
        ('ReLU6', 'Dense')
    """
    for cls, kind in _CELLS:
        if isinstance(cell, cls):
            return kind
    return None


def _conv_params(cell: Any, rank: int) -> dict[str, Any]:
    kernel = tuple(int(d) for d in cell.weight.shape)
    nchw = -3 if not isinstance(cell, nn.Conv1d) else 1 - rank  # Conv1d: NCW, axis -2
    params = {
        "channel_axis": nchw if cell.data_format == "NCHW" else -1,
        "data_format": cell.data_format,
        "in_channels": int(cell.in_channels),
        "filters": int(cell.out_channels),
        "groups": int(cell.group),
        "kernel_shape": kernel,
        "strides": tuple(cell.stride) if isinstance(cell.stride, tuple) else cell.stride,
        "padding": cell.pad_mode,
        "use_bias": bool(cell.has_bias),
        "activation": "linear",
    }
    if isinstance(cell, nn.Conv2dTranspose):
        params["kernel_layout"] = "IOHW"
    else:
        params["kernel_layout"] = "OIHW" if cell.data_format == "NCHW" else "OHWI"
    return params


def cell_params(cell: Any, kind: str, in_rank: int, prims: list[str]) -> dict[str, Any]:
    """Params (see :mod:`amct_bridge.graph.ir`) of a call of a known cell on a rank-``in_rank``
    input that ran the primitives ``prims``.

    Example:
        >>> from mindspore import nn
        >>> cell_params(nn.Dense(4, 2), "Dense", 2, ["MatMul", "BiasAdd"])["kernel_layout"]
        'OI'
    """
    params: dict[str, Any] = {"framework_class": type(cell).__name__}
    if kind in ("Conv2D", "Conv2DTranspose", "Conv1D"):
        params.update(_conv_params(cell, in_rank))
    elif kind == "Dense":
        params.update(
            channel_axis=-1,
            units=int(cell.out_channels),
            in_channels=int(cell.in_channels),
            kernel_shape=tuple(int(d) for d in cell.weight.shape),
            kernel_layout="OI",
            use_bias=bool(cell.has_bias),
            activation=dense_activation(cell),
        )
    elif kind == "BatchNormalization":
        axis = 1 - in_rank if in_rank >= 2 else -1  # MindSpore normalizes axis 1
        params.update(channel_axis=axis, axis=axis, scale=True, center=True)
        params["epsilon"] = float(cell.eps)
    elif kind == "Activation":
        params["activation"] = _ACTIVATION_NAMES.get(_base_name(cell), "unknown")
    elif kind == "Softmax":
        axis = cell.softmax.axis if hasattr(cell, "softmax") else -1
        axes = axis if isinstance(axis, tuple) else (axis,)
        params["axis"] = tuple(a - in_rank if a >= 0 else a for a in axes)
    elif kind in ("ReLU", "ReLU6"):
        params.update(activation="relu", max_value=6.0 if kind == "ReLU6" else None)
    elif kind in RNN_KINDS:
        params.update(channel_axis=-1, units=int(cell.hidden_size))
        params["bidirectional"] = bool(cell.bidirectional)
    return params


def _base_name(cell: Any) -> str:
    for cls in type(cell).__mro__:
        if cls.__name__ in _ACTIVATION_NAMES:
            return cls.__name__
    return type(cell).__name__


def cell_op_type(kind: str, params: dict[str, Any]) -> str:
    """TF op type AMCT-TF writes for this kind (depthwise Conv2d: DepthwiseConv2dNative)."""
    if kind in ("Conv2D", "Conv1D") and params.get("groups", 1) > 1:
        if params["groups"] == params.get("in_channels"):
            return "DepthwiseConv2dNative"
    if kind == "ReLU6":
        return "Relu6"
    if kind == "ReLU":
        return "Relu"
    if kind == "Activation":
        return ACTIVATION_OP_TYPES.get(params.get("activation", ""), "")
    if kind == "UpSampling2D" and params.get("interpolation") == "bilinear":
        return "ResizeBilinear"
    return OP_TYPES.get(kind, "")


def ir_cell_kind(kind: str) -> str:
    """The core's kind for a cell kind (ReLU6 is a ReLU with max_value 6, as in Keras)."""
    return "ReLU" if kind == "ReLU6" else kind


def prim_kind(op: str, axes: tuple[int, ...] | None, channel_axis: int) -> str:
    """IR kind of a functional primitive; reductions over the spatial axes only are pooling.

    Example:
        >>> prim_kind("Concat", None, -3), prim_kind("ReduceMean", (-2, -1), -3)
        ('Concatenate', 'GlobalAveragePooling2D')
    """
    if op in _REDUCE_PRIMS:
        if axes and channel_axis not in axes and op in ("ReduceMean", "MeanExt", "ReduceMax"):
            return "GlobalMaxPooling2D" if op == "ReduceMax" else "GlobalAveragePooling2D"
        return _REDUCE_PRIMS[op]
    return PRIM_KINDS.get(op, unknown_kind(op))


def prim_op_type(op: str, kind: str) -> str:
    """TF op type for a functional primitive (its IR kind's twin; activations by name)."""
    if op in ACTIVATION_PRIMS:
        return ACTIVATION_PRIMS[op]
    if op in _REDUCE_PRIMS:
        return _REDUCE_PRIMS[op]
    if op in RESIZE_PRIMS and "Bilinear" in op:
        return "ResizeBilinear"
    return OP_TYPES.get(kind, "")
