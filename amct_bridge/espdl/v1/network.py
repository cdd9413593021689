"""The chip's view of an ESP-DL v1 model: an ordered list of chip layers with integer coefficients.

A :class:`Network` is what the C++ model class constructs and what :mod:`amct_bridge.espdl.v1.chip`
simulates: one :class:`NetLayer` per ``dl::layer`` member, in execution (topological) order, each
naming the layers it reads (``"input"`` = the model input, :data:`INPUT`), its ESP-DL class
(:data:`CLASSES`), its output exponent and, for Conv2D / DepthwiseConv2D / FullyConnected, the
integers convert.py writes (via :func:`amct_bridge.espdl.v1.preview.preview_layer`, so they are the
tool's integers exactly, put back from the chip element order into HWCN).

Serialised form (``export.json["graph"]``, also a stand-alone JSON file, see
:func:`graph_from_json`)::

    {"format": "amct_bridge.espdl_graph/1", "feature_type": "s16", "granularity": "per-tensor",
     "input": {"name": "input", "source": "input_layer", "exponent": 0, "shape": [28, 28, 3]},
     "layers": [{"name": "l1", "class": "Conv2D", "source": "conv", "inputs": ["input"],
                 "output_exponent": -2, "coefficients": "l1",
                 "attrs": {"padding": "VALID", "strides": [2, 2]}}, ...],
     "outputs": ["l5_compress"]}

``coefficients`` names the config.json entry (omitted: the layer's name); ``output_exponent`` may
be null for layers that keep their input's exponent (resolved on load). ``attrs`` by class:

=====================  ============================================================================
class                  attrs
=====================  ============================================================================
Conv2D, Depthwise...   ``padding`` VALID / SAME_END / SAME_BEGIN / NOT_SET, ``pads`` [t, b, l, r]
                       (NOT_SET only), ``strides`` [sy, sx]
FullyConnected         ``flatten`` (bool, default true)
AvgPool2D, MaxPool2D   ``pool`` [h, w], ``padding``, ``pads``, ``strides``
Concat                 ``axis`` (of the HWC tensor, negative allowed)
Reshape                ``shape`` (HWC-style, one -1 allowed)
Pad                    ``paddings`` [t, b, l, r], ``constant`` (int, default 0)
LeakyReLU              ``alpha`` (int), ``alpha_exponent``
PReLU                  ``alpha`` (ints, one per channel), ``alpha_exponent``
Transpose              ``perm`` (of the HWC axes)
=====================  ============================================================================

Loaders: :func:`load_network` (an export directory: config.json + npy + export.json, or any
convert.py input set plus a graph JSON), :func:`network_from_result` (an in-memory
:class:`~amct_bridge.espdl.v1.result.ExportResult`). Building the graph from a model's layers:
:func:`amct_bridge.espdl.v1.chip_graph.chip_graph`.

Example:
    >>> import numpy as np
    >>> graph = {"feature_type": "s8", "input": {"exponent": -7, "shape": [4]},
    ...          "layers": [{"name": "fc", "class": "FullyConnected", "inputs": ["input"],
    ...                      "output_exponent": -5}]}
    >>> config = {"fc": {"operation": "fully_connected", "feature_type": "s8"}}
    >>> net = network_from_parts(graph, config, {"fc_filter": np.full((4, 2), 0.5, np.float32)})
    >>> fc = net.layers[0]
    >>> fc.filter.values.shape, fc.filter.exponent, net.outputs
    ((1, 1, 4, 2), -7, ['fc'])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1 import layout, spec
from amct_bridge.espdl.v1.preview import (
    LayerPreview,
    QuantizedTensor,
    load_set,
    preview_layer,
    read_json_object,
)

if TYPE_CHECKING:
    from amct_bridge.espdl.v1.result import ExportResult

GRAPH_FORMAT = "amct_bridge.espdl_graph/1"
INPUT = "input"

#: ESP-DL class -> whether it carries convert.py coefficients (its config.json operation).
WEIGHTED: dict[str, str] = {
    "Conv2D": "conv2d",
    "DepthwiseConv2D": "depthwise_conv2d",
    "FullyConnected": "fully_connected",
}
#: Classes whose output exponent is chosen (given in the constructor).
REQUANTIZING = ("Add2D", "Sub2D", "Mul2D", "AvgPool2D", "GlobalAveragePool2D", *WEIGHTED)
#: Classes that keep their input's exponent (the runtime copies or compares elements).
KEEPING: tuple[str, ...] = tuple(
    "MaxPool2D GlobalMaxPool2D Concat Flatten Reshape Pad ReLU LeakyReLU PReLU Max2D Min2D "
    "Transpose Squeeze ExpandDims".split()
)
CLASSES = (*REQUANTIZING, *KEEPING)
#: Classes whose arithmetic no ESP-DL v1 source fixes (the simulator marks them approximate).
APPROXIMATE = ("Sub2D", "Mul2D", "AvgPool2D", "GlobalAveragePool2D")
PADDINGS = ("VALID", "SAME_END", "SAME_BEGIN", "NOT_SET")


@dataclass
class IntTensor:
    """Integers the chip reads and their exponent (int, or one per output channel)."""

    values: np.ndarray
    exponent: int | np.ndarray


@dataclass
class NetLayer:
    """One chip layer (a ``dl::layer`` member of the model class).

    ``filter`` is HWCN (depthwise HWC1, FullyConnected 1x1xINxOUT) int64; ``bias`` (N,) at
    ``output_exponent`` (per-tensor) or at ``e_in + e_w[c] + 4`` (int8 per-channel, int16 ints);
    ``activation`` is the fused "ReLU" / "LeakyReLU" / "PReLU" with ``alpha`` its constant.

    Example:
        >>> NetLayer("r", "ReLU", ["c1"]).keeps_exponent
        True
    """

    name: str
    kind: str
    inputs: list[str]
    output_exponent: int | None = None
    source: str = ""
    attrs: dict = field(default_factory=dict)
    filter: IntTensor | None = None
    bias: IntTensor | None = None
    activation: str | None = None
    alpha: IntTensor | None = None
    coefficients: str | None = None
    fused: list[str] = field(default_factory=list)

    @property
    def keeps_exponent(self) -> bool:
        """True when the runtime gives the output its input's exponent."""
        return self.kind in KEEPING

    @property
    def approximate(self) -> bool:
        """True when no ESP-DL v1 source fixes this layer's arithmetic (see APPROXIMATE)."""
        return self.kind in APPROXIMATE

    def describe(self) -> str:
        """``'name' (Class)`` for messages."""
        return f"{self.name!r} ({self.kind})"


@dataclass
class Network:
    """A chip graph: layers in execution order, the model input's exponent/shape, the outputs.

    Example:
        >>> net = Network("s8", False, [NetLayer("r", "ReLU", [INPUT])], input_exponent=-7)
        >>> net.layer("r").kind, net.bits
        ('ReLU', 8)
    """

    feature_type: str
    per_channel: bool
    layers: list[NetLayer]
    input_exponent: int | None = None
    input_shape: tuple[int, ...] | None = None
    outputs: list[str] = field(default_factory=list)
    input_source: str = INPUT
    target: str | None = None  # the chip the export was made for (export.json), if known
    #: graph["host"]: a final softmax / sigmoid left to the host, with the chip layer it reads
    host: list[dict] = field(default_factory=list)
    #: graph["skipped_outputs"]: model outputs skipped at export, with the chip layer they read
    skipped_outputs: list[dict] = field(default_factory=list)
    #: graph["model_outputs"]: each model output layer and the chip layer computing it (a
    #: Dropout or linear Activation at the end computes nothing: its input's chip layer)
    model_outputs: list[dict] = field(default_factory=list)

    @property
    def bits(self) -> int:
        """Element width (8 or 16)."""
        return spec.FEATURE_BITS[self.feature_type]

    def layer(self, name: str) -> NetLayer:
        """The layer called ``name`` (ExportError if none)."""
        for item in self.layers:
            if item.name == name:
                return item
        raise ExportError(f"chip graph: no layer {name!r}")


def _hwcn(tensor: QuantizedTensor, operation: str, target: str, ftype: str) -> np.ndarray:
    """Undo the chip element order: ``values`` (tool order) -> HWCN (depthwise HWC1) int64."""
    shape = tuple(int(s) for s in tensor.shape)
    index = np.arange(int(np.prod(shape))).reshape(shape)
    order = layout.element_order(index, operation, target, ftype)
    out = np.empty(index.size, dtype=np.int64)
    out[order] = np.asarray(tensor.values, dtype=np.int64)
    return out.reshape(shape)


def _exponent(exp: int | np.ndarray) -> int | np.ndarray:
    arr = np.asarray(exp)
    return arr.astype(np.int64) if arr.ndim else int(arr)


def attach_coefficients(layer: NetLayer, preview: LayerPreview, target: str) -> None:
    """Give ``layer`` the tool's integers from ``preview`` (any target's element order).

    Example:
        >>> w = np.array([[[[1.0, -0.5]]]], np.float32)
        >>> p = preview_layer("c", {"operation": "conv2d", "feature_type": "s8"}, {"c_filter": w})
        >>> layer = NetLayer("c", "Conv2D", [INPUT], -5)
        >>> attach_coefficients(layer, p, "esp32")
        >>> layer.filter.values.ravel().tolist(), layer.filter.exponent
        ([64, -32], -6)
    """
    if WEIGHTED.get(layer.kind) != preview.operation:
        raise ExportError(
            f"chip layer {layer.describe()}: config entry {preview.name!r} is a "
            f"{preview.operation}, expected {WEIGHTED.get(layer.kind)}"
        )
    ftype = preview.feature_type
    values = _hwcn(preview.filter, preview.operation, target, ftype)
    layer.filter = IntTensor(values, _exponent(preview.filter.exponent))
    if preview.bias is not None:
        b = preview.bias
        layer.bias = IntTensor(np.asarray(b.values, np.int64).reshape(-1), _exponent(b.exponent))
    layer.activation = preview.activation_type
    if preview.activation is not None:
        a = preview.activation
        layer.alpha = IntTensor(np.asarray(a.values, np.int64).reshape(-1), int(a.exponent))


def _layer_from_json(doc: dict, where: str) -> NetLayer:
    try:
        name, kind = str(doc["name"]), str(doc["class"])
    except KeyError as err:
        raise ExportError(f"{where}: layer entry without {err.args[0]!r}") from None
    if kind not in CLASSES:
        raise ExportError(f"{where}: layer {name!r}: class {kind!r} is not one of {CLASSES}")
    exp = doc.get("output_exponent")
    if exp is None and kind in REQUANTIZING:
        raise ExportError(f"{where}: layer {name!r} ({kind}) needs an output_exponent")
    attrs = dict(doc.get("attrs") or {})
    if "padding" in attrs and attrs["padding"] not in PADDINGS:
        raise ExportError(
            f"{where}: layer {name!r}: padding {attrs['padding']!r} not in {PADDINGS}"
        )
    layer = NetLayer(
        name,
        kind,
        [str(s) for s in doc.get("inputs", [])],
        None if exp is None else int(exp),
        str(doc.get("source", name)),
        attrs,
        coefficients=doc.get("coefficients", name) if kind in WEIGHTED else None,
        fused=list(doc.get("fused", [])),
    )
    act = doc.get("activation")  # Add2D & co.: an Activation constant (ints in attrs)
    if act and kind not in WEIGHTED:
        if act not in ("ReLU", "LeakyReLU", "PReLU"):
            raise ExportError(f"{where}: layer {name!r}: activation {act!r}")
        layer.activation = act
        if act != "ReLU":
            if "alpha" not in attrs or "alpha_exponent" not in attrs:
                raise ExportError(
                    f"{where}: layer {name!r}: {act} needs attrs alpha/alpha_exponent"
                )
            alpha = np.asarray(attrs["alpha"], np.int64).reshape(-1)
            layer.alpha = IntTensor(alpha, int(attrs["alpha_exponent"]))
    return layer


def _resolve(net: Network, where: str) -> None:
    """Check the inputs exist in order; give exponent-keeping layers their input's exponent."""
    exps: dict[str, int | None] = {INPUT: net.input_exponent}
    for layer in net.layers:
        if layer.name in exps:
            raise ExportError(f"{where}: two layers named {layer.name!r}")
        if not layer.inputs:
            raise ExportError(f"{where}: layer {layer.describe()} has no inputs")
        missing = [s for s in layer.inputs if s not in exps]
        if missing:
            raise ExportError(
                f"{where}: layer {layer.describe()} reads {missing[0]!r}, which is not an "
                "earlier layer (layers must be in execution order)"
            )
        if layer.keeps_exponent:
            ins = [exps[s] for s in layer.inputs]
            known = [e for e in ins if e is not None]
            if layer.output_exponent is None and known:
                layer.output_exponent = max(known)
        exps[layer.name] = layer.output_exponent
    if not net.outputs and net.layers:
        net.outputs = [net.layers[-1].name]
    for out in net.outputs:
        if out not in exps or out == INPUT:
            raise ExportError(f"{where}: output {out!r} is not a layer of the graph")


def network_from_parts(
    graph: dict,
    config: dict,
    arrays: dict[str, np.ndarray],
    *,
    per_channel: bool | None = None,
    where: str = "chip graph",
) -> Network:
    """Build a :class:`Network` from a graph dict, a config.json dict and its npy arrays.

    Coefficients are quantized by :func:`~amct_bridge.espdl.v1.preview.preview_layer` (the tool's
    rules); ``per_channel`` defaults to the graph's ``granularity``.

    Example:
        >>> g = {"feature_type": "s16", "input": {"exponent": 0},
        ...      "layers": [{"name": "r", "class": "ReLU", "inputs": ["input"]}]}
        >>> network_from_parts(g, {}, {}).layer("r").output_exponent
        0
    """
    if graph.get("format", GRAPH_FORMAT) != GRAPH_FORMAT:
        raise ExportError(f"{where}: format {graph.get('format')!r}, expected {GRAPH_FORMAT!r}")
    ftype = graph.get("feature_type")
    if ftype not in spec.FEATURE_BITS:
        raise ExportError(f"{where}: feature_type {ftype!r} is not s8 or s16")
    if per_channel is None:
        per_channel = graph.get("granularity", "per-tensor") == "per-channel"
    inp = graph.get("input") or {}
    shape = inp.get("shape")
    exp = inp.get("exponent")
    net = Network(
        ftype,
        bool(per_channel),
        [_layer_from_json(d, where) for d in graph.get("layers", [])],
        None if exp is None else int(exp),
        None if shape is None else tuple(int(s) for s in shape),
        [str(s) for s in graph.get("outputs", [])],
        str(inp.get("source", INPUT)),
    )
    net.host = [dict(h) for h in graph.get("host") or [] if isinstance(h, dict)]
    net.model_outputs = [dict(h) for h in graph.get("model_outputs") or [] if isinstance(h, dict)]
    net.skipped_outputs = [
        dict(h) for h in graph.get("skipped_outputs") or [] if isinstance(h, dict)
    ]
    for layer in net.layers:
        if layer.kind not in WEIGHTED:
            continue
        entry = config.get(layer.coefficients)
        if entry is None:
            raise ExportError(
                f"{where}: layer {layer.describe()}: no config.json entry {layer.coefficients!r}"
            )
        preview = preview_layer(
            layer.coefficients, entry, arrays, target="esp32", per_channel=net.per_channel
        )
        attach_coefficients(layer, preview, "esp32")
    _resolve(net, where)
    return net


def graph_from_json(path: str | Path) -> dict:
    """Read a stand-alone graph JSON file (the ``export.json["graph"]`` format).

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "g.json"
        >>> _ = p.write_text('{"feature_type": "s8", "layers": []}')
        >>> graph_from_json(p)["feature_type"]
        's8'
    """
    return read_json_object(path)


def load_network(directory: str | Path, graph: str | Path | dict | None = None) -> Network:
    """Load an export directory (config.json + npy + export.json with its ``graph``).

    ``graph`` (a dict or a graph JSON path) replaces export.json's, e.g. for a hand-written
    convert.py set such as ESP-DL's tutorial.

    Example:
        >>> load_network("/nonexistent")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: /nonexistent/config.json: cannot read: ...
    """
    directory = Path(directory)
    config, arrays = load_set(directory)
    where = str(directory / "export.json")
    target = None
    if graph is None:
        report = graph_from_json(directory / "export.json")
        graph = report.get("graph")
        if not graph:
            why = report.get("graph_error", "it was written before the chip graph existed")
            raise ExportError(
                f"{where}: no chip graph, so the chip cannot be simulated ({why}); an export "
                "that skipped layers the graph needs (skip_unsupported) has none: make every "
                "layer exportable and export again, or pass a graph (load_network(dir, graph))"
            )
        target = report.get("target") if report.get("target") in spec.TARGETS else None
    elif not isinstance(graph, dict):
        where = str(graph)
        graph = graph_from_json(graph)
    net = network_from_parts(graph, config, arrays, where=where)
    net.target = target
    return net


def network_from_result(result: ExportResult) -> Network:
    """The chip graph of an in-memory export (``result.graph``, coefficients from its previews).

    Example:
        >>> from amct_bridge.espdl.v1.export import export_layers
        >>> from amct_bridge.espdl.source import SourceLayer
        >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
        >>> layers = [SourceLayer("in", "input", attrs={"shape": (4,)}),
        ...           SourceLayer("r", "relu", ["in"], "ReLU"),
        ...           SourceLayer("fc", "dense", ["r"], "Dense",
        ...                       {"kernel": np.full((4, 2), 0.5, np.float32)})]
        >>> stats = CalibrationStats(layers={"fc": LayerStats("Dense", TensorRange(0, 1),
        ...                                                   TensorRange(-2, 2))})
        >>> net = network_from_result(export_layers(layers, None, stats=stats))
        >>> [(x.name, x.kind) for x in net.layers]
        [('r', 'ReLU'), ('fc', 'FullyConnected')]
    """
    graph = getattr(result, "graph", None)
    if not graph:
        why = getattr(result, "graph_error", None) or "no graph"
        raise ExportError(f"export: no chip graph ({why})")
    previews = {layer.name: layer.preview for layer in result.layers}
    net = network_from_parts({**graph, "layers": [], "outputs": []}, {}, {})
    net.per_channel = result.granularity == "per-channel"
    for doc in graph["layers"]:
        layer = _layer_from_json(doc, "export graph")
        if layer.kind in WEIGHTED:
            if layer.coefficients not in previews:
                raise ExportError(f"export graph: no exported layer {layer.coefficients!r}")
            attach_coefficients(layer, previews[layer.coefficients], result.target)
        net.layers.append(layer)
    net.outputs = [str(s) for s in graph.get("outputs", [])]
    net.target = result.target
    _resolve(net, "export graph")
    return net
