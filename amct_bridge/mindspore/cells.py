"""What gets quantized, per MindSpore cell class: one table instead of isinstance chains.

The MindSpore half of the core's layer descriptors (:mod:`amct_bridge.calibration.layers`):
:func:`describe` turns one cell into a :class:`~amct_bridge.calibration.layers.LayerDesc` keyed
by its ``cells_and_names()`` name (``layer1.0.conv1``). Kinds use the Keras adapter's names
where the two frameworks have the same layer, so the core's rules (Conv/Dense + BatchNorm
folding, sidecar ranges of activations and runtime layers) and the ESP-DL export read one
vocabulary:

=====================================  =====================  ======  ===============  ======
MindSpore cell (and subclasses)        kind                   layout  op type          scale_w
=====================================  =====================  ======  ===============  ======
``nn.Conv2d`` ``group=1``              ``Conv2D``             OIHW    Conv2D           per ch.
``nn.Conv2d`` ``group=in_channels``    ``DepthwiseConv2D``    OIHW    Conv2D           per ch.
``nn.Conv1d`` ``group=1``              ``Conv1D``             OIHW    Conv2D           per ch.
``nn.Conv1d`` ``group=in_channels``    ``DepthwiseConv1D``    OIHW    Conv2D           per ch.
``nn.Conv2dTranspose`` ``group=1``     ``Conv2DTranspose``    IOHW    Conv2DTranspose  per ch.
``nn.Dense``                           ``Dense``              OI      MatMul           tensor
``nn.AvgPool2d``                       ``AveragePooling2D``   (none)  AvgPool          (data)
``nn.BatchNorm2d``, ``BatchNorm1d``    ``BatchNormalization``
``nn.MaxPool2d``                       ``MaxPooling2D``       runtime (output range to sidecar)
``nn.AdaptiveAvgPool2d``               ``AdaptiveAvgPool2d``  runtime
``nn.MaxPool1d``, ``nn.AvgPool1d``     ``MaxPooling1D``...    runtime
=====================================  =====================  ======  ===============  ======

A depthwise kernel is ``(C*m, 1, kH, kW)``: output channel ``c*m + k`` reads input channel ``c``
(MindSpore's order), so "OIHW" (out axis 0) is right for its per-channel scale_w. Other grouped
convolutions (``1 < group < in_channels``) are not quantized (AMCT has no such op either); they
get kind ``GroupedConv2D`` (``GroupedConv1D``) so messages can name them.

``nn.Conv1d`` is MindSpore's own Conv2D of height 1 (its weight is ``(out, in / group, 1, k)``,
its construct an ExpandDims, the Conv2D primitive and a Squeeze), so it is quantized by AMCT's
Conv2D rules with that weight as it is: per-channel scale_w on axis 0 as a Conv2d's. Its
tensors are NCW (channel axis 1).

Activations (``ReLU``, ``ReLU6``, ``LeakyReLU``, ``PReLU``, ``ELU``, ``Sigmoid``, ``Tanh``,
``Softmax``, ``HSwish``, ``HSigmoid``, ``GELU``, ``SiLU``) keep their MindSpore class name as
kind. ``nn.LayerNorm`` (kind ``LayerNorm``), ``nn.GRU`` / ``nn.LSTM`` (``GRU`` / ``LSTM``, one
leaf each) and ``nn.Embedding`` stay float, but their input and output ranges go to the sidecar
as a runtime layer's (:data:`OBSERVED_FLOAT`). **Functional ops are not cells**:
``x + y``, ``ops.add`` and ``ops.concat`` inside a ``construct`` have no cell to wrap; the graph
IR (MindIR) names them and their ranges come from the cells around them (an Add's output is the
next cell's input).

Every tensor is NCHW (``channel_axis`` 1, also for Dense's ``(N, in)`` input).

Example:
    >>> from mindspore import nn
    >>> d = describe("layer1.0.conv1", nn.Conv2d(4, 4, 3, group=4))
    >>> d.kind, d.parts[0].layout, d.channel_axis
    ('DepthwiseConv2D', 'OIHW', 1)
"""

from __future__ import annotations

from dataclasses import dataclass

from mindspore import nn

from amct_bridge.calibration.layers import LayerDesc
from amct_bridge.calibration.layers import QuantPart as CorePart


@dataclass(frozen=True)
class QuantPart(CorePart):
    """One quantized op of a MindSpore cell: the core's part plus its kernel layout.

    Args:
        suffix, op_type, weights, channel_wise, foldable: see
            :class:`amct_bridge.calibration.layers.QuantPart`.
        layout: kernel layout name of :mod:`amct_bridge.quant.layouts` (None: no weights).

    Example:
        >>> PARTS["Dense"][0].layout, PARTS["Dense"][0].channel_wise
        ('OI', False)
    """

    layout: str | None = None


_CONV = QuantPart("", "Conv2D", True, True, True, "OIHW")
_DENSE = QuantPart("", "MatMul", True, False, True, "OI")

#: kind -> quantized parts (one AMCT record entry each), keyed by the cell's own name.
PARTS: dict[str, tuple[QuantPart, ...]] = {
    "Conv2D": (_CONV,),
    "DepthwiseConv2D": (_CONV,),
    "Conv1D": (_CONV,),  # nn.Conv1d: a Conv2D of height 1 (module docstring)
    "DepthwiseConv1D": (_CONV,),
    "Conv2DTranspose": (QuantPart("", "Conv2DTranspose", True, True, True, "IOHW"),),
    "Dense": (_DENSE,),
    "AveragePooling2D": (QuantPart("", "AvgPool", False, False, False, None),),
}

#: MindSpore cell class -> kind (activations and others keep their class name, see below).
_KINDS: dict[type, str] = {
    nn.Conv2d: "Conv2D",
    nn.Conv2dTranspose: "Conv2DTranspose",
    nn.Dense: "Dense",
    nn.AvgPool2d: "AveragePooling2D",
    nn.BatchNorm2d: "BatchNormalization",
    nn.MaxPool2d: "MaxPooling2D",
    nn.AdaptiveAvgPool2d: "AdaptiveAvgPool2d",
    nn.AdaptiveMaxPool2d: "AdaptiveMaxPool2d",
    nn.Conv1d: "Conv1D",
    nn.BatchNorm1d: "BatchNormalization",  # normalizes axis 1 as BatchNorm2d
    nn.MaxPool1d: "MaxPooling1D",
    nn.AvgPool1d: "AveragePooling1D",
    nn.AdaptiveAvgPool1d: "AdaptiveAvgPool1d",
    nn.AdaptiveMaxPool1d: "AdaptiveMaxPool1d",
    nn.GRU: "GRU",  # float, observed (OBSERVED_FLOAT): one leaf, not its inner cells
    nn.LSTM: "LSTM",
    nn.Embedding: "Embedding",  # float, observed: the ESP-DL v3 export reads its input's range
}

#: Activation classes (their ranges go to the sidecar only).
ACTIVATIONS: frozenset[str] = frozenset(
    {
        "ReLU",
        "ReLU6",
        "LeakyReLU",
        "PReLU",
        "ELU",
        "Sigmoid",
        "Tanh",
        "Softmax",
        "HSwish",
        "HSigmoid",
        "GELU",
        "SiLU",
    }
)
_ACTIVATION_CLASSES = {getattr(nn, name): name for name in ACTIVATIONS if hasattr(nn, name)}

#: Coefficient-free kinds whose output range the sidecar keeps (ESP-DL runtimes need them).
#: ``Add`` / ``Concatenate`` / ``Matmul`` / the global pools (``ops.mean`` / ``ReduceMax`` over
#: H, W) are graph-IR operations (functional ops), never cells.
RUNTIME: frozenset[str] = frozenset(
    {
        "Add",
        "Concatenate",
        "GlobalAveragePooling2D",
        "GlobalMaxPooling2D",
        "AveragePooling2D",
        "MaxPooling2D",
        "AdaptiveAvgPool2d",
        "AdaptiveMaxPool2d",
        "MaxPooling1D",
        "AveragePooling1D",
        "AdaptiveAvgPool1d",
        "AdaptiveMaxPool1d",
        # a functional ops.matmul / x @ y of two activations (attention): the ESP-DL v3
        # MatMul's output exponent (seen through q @ kᵀ * scale too: session._through_scalar)
        "Matmul",
    }
)

#: Cells that stay float (no record entry, named in the warning) but whose input and output
#: ranges the sidecar keeps, as a runtime layer's: the ESP-DL v3 runtime computes
#: LayerNormalization from integers, so the export needs the exponents around it (a
#: Transformer block's first LayerNorm reads the model input, which nothing else observes).
#: nn.GRU / nn.LSTM likewise (the runtime's GRU / LSTM read the input's exponent; the output
#: seen is the sequence, the first of the cell's outputs), and nn.Embedding (its integer
#: input is the model input, which nothing else observes).
OBSERVED_FLOAT: frozenset[str] = frozenset({"LayerNorm", "GRU", "LSTM", "Embedding"})

#: Kinds a following BatchNorm may be folded into, and the BatchNorm kinds.
FOLDABLE_KINDS: tuple[str, ...] = (
    "Conv2D",
    "DepthwiseConv2D",
    "Conv2DTranspose",
    "Dense",
    "Conv1D",
    "DepthwiseConv1D",
)
BATCH_NORM_KINDS: tuple[str, ...] = ("BatchNormalization",)
QUANTIZABLE_KINDS: tuple[str, ...] = tuple(PARTS)


def kind_of(cell) -> str:
    """The registry kind of ``cell``: its own class or the nearest registered base class.

    A Conv2d's kind depends on ``group``: 1 -> ``Conv2D``, ``in_channels`` -> ``DepthwiseConv2D``
    (checked first: a 1-channel conv with group 1 is a plain conv), anything else
    ``GroupedConv2D`` (not quantized); a Conv1d's likewise (``Conv1D``, ``DepthwiseConv1D``,
    ``GroupedConv1D``). Conv2dTranspose with ``group != 1`` likewise.

    Example:
        >>> from mindspore import nn
        >>> class MyDense(nn.Dense): ...
        >>> kind_of(MyDense(2, 3)), kind_of(nn.Conv2d(8, 16, 3, group=4)), kind_of(nn.ReLU6())
        ('Dense', 'GroupedConv2D', 'ReLU6')
    """
    for klass in type(cell).__mro__:
        kind = _KINDS.get(klass) or _ACTIVATION_CLASSES.get(klass)
        if kind is None:
            continue
        group = int(getattr(cell, "group", 1))
        if kind in ("Conv2D", "Conv1D") and group != 1:
            rank = kind[-2:]  # "2D" / "1D"
            if group == int(cell.in_channels):
                return f"DepthwiseConv{rank}"
            return f"GroupedConv{rank}"
        if kind == "Conv2DTranspose" and group != 1:
            return "GroupedConv2DTranspose"
        return kind
    return type(cell).__name__


def quant_parts(cell) -> tuple[QuantPart, ...]:
    """Quantized parts of ``cell`` (empty tuple if it is not quantizable).

    Example:
        >>> from mindspore import nn
        >>> [p.op_type for p in quant_parts(nn.Dense(2, 3))], quant_parts(nn.ReLU())
        (['MatMul'], ())
    """
    return PARTS.get(kind_of(cell), ())


def clamp_bounds(cell) -> tuple[float, float] | None:
    """``(low, high)`` when ``cell`` computes ``min(max(x, low), high)``, else None.

    Example:
        >>> from mindspore import nn
        >>> clamp_bounds(nn.ReLU()), clamp_bounds(nn.ReLU6()), clamp_bounds(nn.LeakyReLU(0.1))
        ((0.0, inf), (0.0, 6.0), None)
    """
    kind = kind_of(cell)
    if kind == "ReLU":
        return 0.0, float("inf")
    if kind == "ReLU6":
        return 0.0, 6.0
    return None


def describe(key: str, cell) -> LayerDesc:
    """The core's descriptor of ``cell`` keyed ``key`` (its ``cells_and_names()`` name).

    ``params``: ``channel_axis`` 1 (NCHW); BatchNorm ``on_channels`` True (BatchNorm2d
    normalizes axis 1); Dense ``activation`` the name of a fused activation, if any.

    Example:
        >>> from mindspore import nn
        >>> d = describe("fc", nn.Dense(4, 2, activation="relu"))
        >>> d.kind, d.params["activation"], d.quantizable
        ('Dense', 'ReLU', True)
    """
    kind = kind_of(cell)
    params: dict = {"channel_axis": 1}
    if kind in BATCH_NORM_KINDS:
        params["on_channels"] = True
    if kind == "Dense" and getattr(cell, "activation_flag", False):
        params["activation"] = type(cell.activation).__name__
    return LayerDesc(
        key,
        kind,
        PARTS.get(kind, ()),
        cell,
        activation=kind in ACTIVATIONS,
        runtime=kind in RUNTIME or kind in OBSERVED_FLOAT,
        name=key,
        params=params,
        weighted=has_weights(cell),
    )


def has_weights(cell) -> bool:
    """True when ``cell`` holds Parameters of its own (a leaf: its children's are its own too).

    Example:
        >>> from mindspore import nn
        >>> has_weights(nn.Dense(2, 3)), has_weights(nn.ReLU())
        (True, False)
    """
    return any(True for _ in cell.get_parameters())


def leaf_cells(net) -> dict[str, object]:
    """Every leaf cell of ``net`` by ``cells_and_names()`` name, in that order.

    A leaf is a registered cell (its children, e.g. a Dense's fused activation, belong to it)
    or a cell without children. A cell reachable under two names (one cell used at two places)
    appears once, under the first name, as in ``cells_and_names()``.

    Example:
        >>> from mindspore import nn
        >>> relu = nn.ReLU()
        >>> list(leaf_cells(nn.SequentialCell([nn.Dense(2, 2, activation="relu"), relu, relu])))
        ['0', '1']
    """
    out: dict[str, object] = {}
    inside: list[str] = []  # names of registered cells: their children are not leaves
    for name, cell in net.cells_and_names():
        if not name or any(name.startswith(f"{p}.") for p in inside):
            continue
        registered = _registered(cell)
        if registered or not cell._cells:
            out[name] = cell
        if registered:
            inside.append(name)
    return out


def structure_key(net) -> tuple:
    """What a compiled graph of ``net`` was built from, as a hashable value: every child slot
    (path, cell identity, class) and every parameter (name, identity, shape, dtype).

    Equal keys mean the same cell tree and parameters (values may differ: a graph reads them
    live), so a graph or a graph export made for one can serve the other. MindSpore itself
    keeps a compiled graph across a swapped child; this key notices one.

    Example:
        >>> from mindspore import nn
        >>> net = nn.SequentialCell([nn.Dense(2, 2), nn.ReLU()])
        >>> before = structure_key(net); net.insert_child_to_cell("1", nn.ReLU6())
        >>> structure_key(net) == before
        False
    """
    slots: list[tuple] = []
    stack: list[tuple[str, object]] = [("", net)]
    seen: set[int] = set()
    while stack:
        path, cell = stack.pop()
        slots.append((path, id(cell), type(cell)))
        if id(cell) in seen:
            continue  # a cell at two places: its subtree is listed once
        seen.add(id(cell))
        for name, child in reversed(list(cell._cells.items())):
            if child is not None:
                stack.append((f"{path}.{name}" if path else name, child))
    params = tuple(
        (name, id(p), tuple(p.shape), str(p.dtype)) for name, p in net.parameters_and_names()
    )
    return tuple(slots), params


def _registered(cell) -> bool:
    return any(k in _KINDS or k in _ACTIVATION_CLASSES for k in type(cell).__mro__)
