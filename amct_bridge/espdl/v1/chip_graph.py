"""The chip graph (``export.json["graph"]``, :mod:`amct_bridge.espdl.v1.network`) of an export.

Walks the model's :class:`~amct_bridge.espdl.source.SourceLayer` list in execution order and
emits one chip layer per ``dl::layer`` member the C++ model class needs:

- an exported chain -> Conv2D / DepthwiseConv2D / FullyConnected (its config.json entry; the
  layers fused into it produce its output; a folded ZeroPadding2D gives ``NOT_SET`` + ``pads``);
- a runtime layer of the export with its exponent from export.json: Add2D (maybe with a fused
  ReLU / LeakyReLU), pools, Concat, ``Flatten`` / ``Reshape`` / ``Pad`` (ZeroPadding2D) /
  ``Transpose`` (Permute) / ``Max2D`` / ``Min2D``, a standalone ReLU / LeakyReLU (alpha
  quantized like convert.py quantizes a fused one);
- Dropout & co. and a linear ``Activation`` compute nothing: their readers read their input.

Anything else (a skipped layer, a second model input, a layer without an exponent) makes the
graph unavailable: :func:`chip_graph` raises ExportError naming the layer (the export records
the reason in ``export.json["graph_error"]``).

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.v1.export import export_layers
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
    >>> layers = [SourceLayer("in", "input", attrs={"shape": (4,)}),
    ...           SourceLayer("fc", "dense", ["in"], "Dense",
    ...                       {"kernel": np.full((4, 2), 0.5, np.float32)}, {"input_rank": 2})]
    >>> stats = CalibrationStats(layers={"fc": LayerStats("Dense", TensorRange(0, 1),
    ...                                                   TensorRange(-2, 2))})
    >>> g = chip_graph(layers, export_layers(layers, None, stats=stats))
    >>> g["input"], [(x["name"], x["class"], x["inputs"]) for x in g["layers"]]
    ... # doctest: +NORMALIZE_WHITESPACE
    ({'name': 'input', 'source': 'in', 'exponent': -6, 'shape': [4]},
     [('fc', 'FullyConnected', ['input'])])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amct_bridge.errors import ExportError
from amct_bridge.espdl.naming import c_identifier
from amct_bridge.espdl.source import PASS_THROUGH, SourceLayer
from amct_bridge.espdl.v1 import spec
from amct_bridge.espdl.v1.network import GRAPH_FORMAT, INPUT, WEIGHTED
from amct_bridge.espdl.v1.runtime import keeping_attrs, leaky_ints

if TYPE_CHECKING:
    from amct_bridge.espdl.v1.result import ExportResult

_CLASS_OF_OP = {v: k for k, v in WEIGHTED.items()}
_PADDING = {"valid": "VALID", "same": "SAME_END"}
#: Runtime classes whose chip attrs the export computed (``RuntimeLayer.chip_attrs``).
_KEEPING = ("Flatten", "Reshape", "Pad", "Transpose", "Max2D", "Min2D", "ReLU", "LeakyReLU")


def _pair(value: object, default: tuple[int, int]) -> list[int]:
    if value is None:
        return list(default)
    if isinstance(value, int):
        return [value, value]
    return [int(v) for v in value]  # type: ignore[union-attr]


def _conv_attrs(head: SourceLayer, operation: str) -> dict:
    if operation == "fully_connected":
        return {"flatten": int(head.attrs.get("input_rank", 2)) <= 2}
    padding = _PADDING.get(str(head.attrs.get("padding", "valid")).lower())
    if padding is None:
        raise ExportError(f"layer {head.describe()}: padding {head.attrs.get('padding')!r}")
    return {"padding": padding, "strides": _pair(head.attrs.get("strides"), (1, 1))}


def _pool_attrs(layer: SourceLayer) -> dict:
    padding = _PADDING.get(str(layer.attrs.get("padding", "valid")).lower())
    if padding is None or "pool_size" not in layer.attrs:
        raise ExportError(f"layer {layer.describe()}: pool size / padding unknown")
    pool = _pair(layer.attrs["pool_size"], (1, 1))
    return {"pool": pool, "padding": padding, "strides": _pair(layer.attrs.get("strides"), pool)}


class _Walk:
    def __init__(self, result: ExportResult) -> None:
        self.result = result
        self.bits = spec.FEATURE_BITS[result.feature_type]
        self.chains = {layer.source: layer for layer in result.layers}
        self.runtime = {item.source: item for item in result.runtime}
        self.skipped = {p.layer: p for p in result.skipped}
        # a ZeroPadding2D folded into the conv reading it: that conv reads the padding's input
        # (a conv's own explicit pads fold nothing: its fused list starts with itself)
        self.folded = {
            x.fused[0]
            for x in result.layers
            if x.pads is not None and x.fused and x.fused[0] != x.source
        }
        self.taken = {x.name for x in result.layers} | {x.name for x in result.runtime} | {INPUT}
        self.producer: dict[str, str] = {}
        self.nodes: list[dict] = []
        self.outputs: list[str] = []
        self.notes: list[str] = []
        self.skipped_outputs: list[dict] = []  # model outputs the chip does not compute
        self.model_outputs: list[dict] = []  # model output layer -> the chip layer computing it
        self.input: dict = {}
        self.from_input = {INPUT}  # chip tensors carrying the input's exponent (ReLU, Pad...)

    def new_name(self, source: str) -> str:
        base = c_identifier(source)
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def inputs_of(self, layer: SourceLayer) -> list[str]:
        try:
            return [self.producer[s] for s in layer.inputs]
        except KeyError as err:
            name = err.args[0]
            if name in self.skipped:
                why = f"was skipped ({self.skipped[name].reason})"
            else:
                why = "is not computed on the chip"
            raise ExportError(f"layer {layer.describe()}: its input {name!r} {why}") from None

    def emit(self, layer: SourceLayer, name: str, cls: str, exp: int | None, **extra) -> None:
        node = {"name": name, "class": cls, "source": layer.name, "inputs": self.inputs_of(layer)}
        node["output_exponent"] = exp
        node.update(extra)
        self.nodes.append(node)
        for member in [layer.name, *(extra.get("fused") or [])]:
            self.producer[member] = name

    def visit(self, layer: SourceLayer) -> None:
        if layer.name in self.producer:  # fused into a chain already emitted
            if layer.attrs.get("model_output"):
                self.model_outputs.append({"layer": layer.name, "chip": self.producer[layer.name]})
            return
        if layer.name in self.folded:
            self.producer[layer.name] = self.inputs_of(layer)[0]
            return
        if layer.name in self.skipped:  # fine unless a chip layer reads it (then inputs_of says)
            if layer.attrs.get("model_output"):
                self.skipped_output(layer)
            elif layer.attrs.get("host_input"):
                self.skipped_input(layer)
            return
        if layer.op == "input":
            if self.input:
                raise ExportError(f"layer {layer.describe()}: a second model input")
            shape = layer.attrs.get("shape")
            self.input = {"name": INPUT, "source": layer.name, "exponent": None}
            self.input["shape"] = None if shape is None else [int(s) for s in shape]
            self.producer[layer.name] = INPUT
        elif layer.name in self.chains:
            self.chain(layer)
        elif layer.name in self.runtime:
            self.runtime_layer(layer)
        else:
            self.other(layer)
        if layer.attrs.get("model_output"):
            out = self.producer[layer.name]
            if out == INPUT:
                raise ExportError(f"layer {layer.describe()}: the model output is its input")
            if out not in self.outputs:
                self.outputs.append(out)
            self.model_outputs.append({"layer": layer.name, "chip": out})

    def skipped_input(self, layer: SourceLayer) -> None:
        """Skipped input preprocessing (Rescaling...) reading the model input: the host applies
        it, the chip's input is its output, with a note. Read from elsewhere, it stays a gap."""
        if [self.producer.get(s) for s in layer.inputs] != [INPUT]:
            return
        self.producer[layer.name] = INPUT
        self.notes.append(
            f"input preprocessing {layer.describe()} was skipped "
            f"({self.skipped[layer.name].reason}): the chip's input is its output; apply it on "
            "the host before quantizing the input"
        )

    def skipped_output(self, layer: SourceLayer) -> None:
        """A skipped last layer (Softmax...): the chip's output is its input, with a note."""
        ins = [self.producer.get(s) for s in layer.inputs]
        if len(ins) != 1 or ins[0] in (None, INPUT):
            raise ExportError(f"layer {layer.describe()} was skipped: {self.skipped[layer.name]}")
        if ins[0] not in self.outputs:
            self.outputs.append(ins[0])
        problem = self.skipped[layer.name]
        self.skipped_outputs.append(
            {"layer": layer.name, "kind": problem.kind, "reason": problem.reason, "chip": ins[0]}
        )
        self.notes.append(
            f"model output {layer.describe()} was skipped ({self.skipped[layer.name].reason}): "
            f"the chip's output is its input {ins[0]!r}; apply it on the host"
        )

    def chain(self, layer: SourceLayer) -> None:
        ex = self.chains[layer.name]
        attrs = _conv_attrs(layer, ex.operation)
        if ex.pads is not None:
            attrs.update(padding="NOT_SET", pads=list(ex.pads))
        cls = _CLASS_OF_OP[ex.operation]
        exp = ex.entry["output_exponent"]
        self.emit(layer, ex.name, cls, exp, attrs=attrs, coefficients=ex.name, fused=ex.fused)
        if self.input and self.input["exponent"] is None and self.reads_input():
            self.input["exponent"] = ex.entry.get("input_exponent")

    def reads_input(self) -> bool:
        """True when the last emitted layer reads the model input (maybe through ReLU/Pad...)."""
        return self.nodes[-1]["inputs"][0] in self.from_input

    def runtime_layer(self, layer: SourceLayer) -> None:
        item = self.runtime[layer.name]
        cls, attrs = item.espdl_class, {}
        if cls in ("AvgPool2D", "MaxPool2D"):
            attrs = _pool_attrs(layer)
        elif cls == "Concat":
            axis = int(layer.attrs.get("axis", -1))
            if axis == 0:
                raise ExportError(f"layer {layer.describe()}: Concat on the batch axis")
            # a framework axis counts the batch axis; the chip's tensors are HWC
            attrs = {"axis": axis - 1 if axis > 0 else axis}
        elif cls in _KEEPING:
            attrs = dict(getattr(item, "chip_attrs", None) or keeping_attrs(layer, self.bits))
            if cls == "Reshape" and "shape" not in attrs:
                raise ExportError(f"layer {layer.describe()}: target shape unknown")
        if item.output_exponent is None and cls not in ("MaxPool2D", "GlobalMaxPool2D", *_KEEPING):
            raise ExportError(f"layer {layer.describe()} ({cls}): no output exponent")
        extra: dict = {"attrs": attrs}
        act = getattr(item, "activation", None)  # an Add2D may carry a fused activation
        if act:
            extra["activation"] = act
            if act == "LeakyReLU":
                alpha = getattr(item, "alpha", None)
                attrs.update(leaky_ints(float(0.2 if alpha is None else alpha), self.bits))
        fused = getattr(item, "fused", None)  # e.g. [add, add_relu]: readers of either read it
        if fused:
            extra["fused"] = list(fused)
        self.emit(layer, item.name, cls, item.output_exponent, **extra)
        reading = [s in self.from_input for s in self.nodes[-1]["inputs"]]
        if cls in _KEEPING and all(reading):  # the input's exponent, copied or clamped
            self.from_input.add(item.name)
        if self.input and self.input["exponent"] is None and any(reading):
            self.input["exponent"] = item.input_exponents[reading.index(True)]

    def other(self, layer: SourceLayer) -> None:
        if layer.op == "runtime" and layer.kind in PASS_THROUGH:
            self.producer[layer.name] = self.inputs_of(layer)[0]
            return
        raise ExportError(f"layer {layer.describe()}: no ESP-DL v1 chip layer for it")


def chip_graph(layers: list[SourceLayer], result: ExportResult) -> dict:
    """The chip graph of ``result`` (the export of ``layers``), JSON-ready.

    Example:
        >>> chip_graph.__name__
        'chip_graph'
    """
    walk = _Walk(result)
    for layer in layers:
        walk.visit(layer)
    if not walk.nodes:
        raise ExportError("the model has no layer ESP-DL v1 computes")
    return {
        "format": GRAPH_FORMAT,
        "feature_type": result.feature_type,
        "granularity": result.granularity,
        "input": walk.input or {"name": INPUT, "source": INPUT, "exponent": None, "shape": None},
        "layers": walk.nodes,
        "outputs": walk.outputs or [walk.nodes[-1]["name"]],
        **({"notes": walk.notes} if walk.notes else {}),
        # what the host computes after the chip: a final softmax / sigmoid (it keeps the arg
        # max), a skipped model output (the chip's output is its input); espdl-eval reads them
        "host": [h.to_json(walk.producer.get(h.reads)) for h in getattr(result, "host", [])],
        "skipped_outputs": walk.skipped_outputs,
        "model_outputs": walk.model_outputs,
    }
