"""The ESP-DL v1 C++ model class (``<model>_model.hpp``) of an export, written for the user.

ESP-DL v1 users write a ``dl::layer::Model<feature_t>`` subclass by hand and copy every layer's
output exponent into it (espdl-v1-runtime.md, section 2). This module writes it from the export:

- one member per chip layer, in execution order: the exported chains (their constructors from
  export.json, with the coefficient getters qualified ``NAME::get_...()``), the runtime layers
  (``Add2D``, ``AvgPool2D``, ``GlobalAveragePool2D``, ``MaxPool2D``, ``GlobalMaxPool2D``,
  ``Concat``), ``Flatten``, and standalone ``Relu`` / ``LeakyRelu`` (release/v1.1 class names);
- Dropout, Identity, a linear Activation... are not chip layers: their readers read their input;
- constructors fully qualified (``dl::layer::``, ``dl::PADDING_*``): no ``using namespace``,
  so ``ReLU`` cannot clash with ``dl::ReLU`` and nothing leaks into the user's code;
- ``build()`` and ``call()`` in execution order (a topological order), ``call()`` frees every
  tensor right after its last reader (the model input too, as the tutorial does), never a model
  output; the model outputs are public members;
- a comment and ``input_exponent`` give the input's exponent and how to quantize a float input.

A model the class cannot express (a layer ESP-DL v1 lacks, two inputs, a runtime layer without
an exponent) raises :class:`~amct_bridge.errors.ExportError` naming the layer.

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.export import export_layers
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
    >>> layers = [SourceLayer("in", "input"),
    ...           SourceLayer("fc", "dense", ["in"], "Dense",
    ...                       {"kernel": np.full((4, 2), 0.5, np.float32)},
    ...                       {"model_output": True})]
    >>> stats = CalibrationStats(layers={"fc": LayerStats("Dense", TensorRange(0, 1),
    ...                                                   TensorRange(-2, 2))})
    >>> model = model_class(layers, export_layers(layers, None, stats=stats), "m_coefficient")
    >>> model.header_name, model.class_name, model.input_exponent, model.outputs
    ('m_model.hpp', 'MModel', -6, ['fc'])
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from amct_bridge.errors import ExportError
from amct_bridge.espdl import spec
from amct_bridge.espdl.cpp_render import render_model
from amct_bridge.espdl.naming import c_identifier
from amct_bridge.espdl.source import SourceLayer
from amct_bridge.quant.espdl import auto_exponent, quantize_pow2

if TYPE_CHECKING:  # export.py imports this module lazily; no import cycle at run time
    from amct_bridge.espdl.export import ExportResult

#: ESP-DL class -> the header that declares it (include/layer/).
HEADERS: dict[str, str] = {
    "Conv2D": "dl_layer_conv2d.hpp",
    "DepthwiseConv2D": "dl_layer_depthwise_conv2d.hpp",
    "FullyConnected": "dl_layer_fullyconnected.hpp",
    "Add2D": "dl_layer_add2d.hpp",
    "AvgPool2D": "dl_layer_avg_pool2d.hpp",
    "GlobalAveragePool2D": "dl_layer_global_avg_pool2d.hpp",
    "MaxPool2D": "dl_layer_max_pool2d.hpp",
    "GlobalMaxPool2D": "dl_layer_global_max_pool2d.hpp",
    "Concat": "dl_layer_concat.hpp",
    "Flatten": "dl_layer_flatten.hpp",
    "Relu": "dl_layer_relu.hpp",
    "LeakyRelu": "dl_layer_leakyrelu.hpp",
}

#: Keras layers that compute nothing at inference: readers read their input.
PASS_THROUGH = ("Dropout", "SpatialDropout2D", "GaussianNoise", "GaussianDropout", "Identity")

#: Names a member cannot take (Model's methods and base member, the method parameter).
_RESERVED = frozenset({"build", "call", "forward", "input", "input_shape", "input_exponent"})
INPUT = "input"


@dataclass
class ChipLayer:
    """One member of the model class: C++ type, constructor arguments, producers it reads.

    ``inputs`` are member names, or ``"input"`` for the model input; ``fused`` the model layers
    whose output this member produces (a chain's conv, BN and activation).

    Example:
        >>> ChipLayer("mp", "MaxPool2D", "int8_t", '{2, 2}, dl::PADDING_VALID, {}, 2, 2, "mp"',
        ...           ["c1"], "mp").inputs
        ['c1']
    """

    member: str
    espdl_class: str
    ctype: str
    args: str
    inputs: list[str]
    source: str
    output_exponent: int | None = None
    fused: list[str] = field(default_factory=list)


@dataclass
class ModelClass:
    """A generated model class: header text and what an app needs to use it.

    ``outputs`` are the public members (model outputs, execution order); ``input_exponent``
    the exponent the input tensor must carry (None when no calibration gave it).

    Example:
        >>> ModelClass("NetModel", "net_model.hpp", "net", "s8", [], ["fc"], -7).outputs
        ['fc']
    """

    class_name: str
    header_name: str
    coefficient_name: str
    feature_type: str
    layers: list[ChipLayer]
    outputs: list[str]
    input_exponent: int | None
    text: str = ""


def model_names(coefficient_name: str) -> tuple[str, str]:
    """(header file, class name) for coefficients ``NAME``: ``mnist_coefficient`` ->
    ``mnist_model.hpp``, ``MnistModel``.

    Example:
        >>> model_names("mnist_coefficient"), model_names("net")
        (('mnist_model.hpp', 'MnistModel'), ('net_model.hpp', 'NetModel'))
    """
    base = coefficient_name
    if base.endswith("_coefficient") and len(base) > len("_coefficient"):
        base = base[: -len("_coefficient")]
    camel = "".join(part[:1].upper() + part[1:] for part in base.split("_") if part)
    return f"{base}_model.hpp", f"{camel or 'Espdl'}Model"


def _qualify(cpp: str, namespace: str) -> str:
    """Export constructor text -> fully qualified (getters in NAME, padding enums in dl)."""
    cpp = re.sub(r"\bget_(\w+)\(\)", rf"{namespace}::get_\1()", cpp)
    return re.sub(r"(?<!::)\bPADDING_", "dl::PADDING_", cpp)


def _split(cpp: str) -> tuple[str, str, str]:
    """``dl::layer::Conv2D<int8_t, int16_t>(args)`` -> (class, template args, args)."""
    m = re.fullmatch(r"dl::layer::(\w+)<([^>]*)>\((.*)\)", cpp, re.S)
    if m is None:
        raise ExportError(f"unexpected constructor text {cpp!r}")
    return m[1], m[2], m[3]


class _Builder:
    def __init__(self, layers: list[SourceLayer], result: ExportResult, namespace: str) -> None:
        self.result = result
        self.namespace = namespace
        self.ctype = spec.CTYPE[result.feature_type]
        self.chains = {layer.source: layer for layer in result.layers}
        self.runtime = {item.source: item for item in result.runtime}
        self.skipped = {p.layer: p for p in result.skipped}
        self.producer: dict[str, str] = {}
        self.taken = {layer.name for layer in result.layers} | {i.name for i in result.runtime}
        self.taken |= _RESERVED
        self.nodes: list[ChipLayer] = []
        self.outputs: list[str] = []
        self.layers = layers

    def member(self, name: str) -> str:
        if name not in _RESERVED:
            return name
        ident, k = f"{name}_layer", 1
        while ident in self.taken:
            k += 1
            ident = f"{name}_layer_{k}"
        self.taken.add(ident)
        return ident

    def new_member(self, source: str) -> str:
        base = c_identifier(source)
        ident, k = base, 1
        while ident in self.taken:
            k += 1
            ident = f"{base}_{k}"
        self.taken.add(ident)
        return ident

    def inputs_of(self, layer: SourceLayer) -> list[str]:
        try:
            return [self.producer[src] for src in layer.inputs]
        except KeyError as err:
            raise ExportError(
                f"layer {layer.describe()}: its input {err.args[0]!r} is not computed on the chip"
            ) from None

    def add(
        self,
        layer: SourceLayer,
        cpp: str | None,
        fused: list[str],
        exp: int | None,
        member: str | None = None,
    ) -> None:
        if cpp is None:
            raise ExportError(
                f"layer {layer.describe()}: no C++ constructor (padding ESP-DL v1 cannot "
                "express, or no output exponent: see export.json)"
            )
        cls, types, args = _split(_qualify(cpp, self.namespace))
        if member is None:
            known = self.chains.get(layer.name) or self.runtime.get(layer.name)
            member = self.member(known.name) if known else self.new_member(layer.name)
        node = ChipLayer(member, cls, types, args, self.inputs_of(layer), layer.name, exp, fused)
        self.nodes.append(node)
        for src in fused or [layer.name]:
            self.producer[src] = member

    def visit(self, layer: SourceLayer) -> None:
        if layer.name in self.producer:  # fused into a chain already emitted
            return
        if layer.name in self.skipped:
            raise ExportError(f"layer {layer.describe()} was skipped: {self.skipped[layer.name]}")
        if layer.op == "input":
            if INPUT in self.producer.values():
                raise ExportError(
                    f"layer {layer.describe()}: a second model input (dl::layer::Model takes one)"
                )
            self.producer[layer.name] = INPUT
        elif layer.name in self.chains:
            ex = self.chains[layer.name]
            self.add(layer, ex.cpp, ex.fused, ex.entry["output_exponent"])
        elif layer.name in self.runtime:
            item = self.runtime[layer.name]
            self.add(layer, item.cpp, [], item.output_exponent)
        elif layer.op == "relu" or (layer.op == "runtime" and layer.kind == "Flatten"):
            cls = "Relu" if layer.op == "relu" else "Flatten"
            name = self.new_member(layer.name)
            self.add(layer, f'dl::layer::{cls}<{self.ctype}>("{name}")', [], None, name)
        elif layer.op == "leaky_relu":
            name = self.new_member(layer.name)
            self.add(layer, self.leaky_relu(layer, name), [], None, name)
        elif _pass_through(layer):
            self.producer[layer.name] = self.inputs_of(layer)[0]
        else:
            raise ExportError(
                f"layer {layer.describe()}: no ESP-DL v1 layer for it in the model class yet"
                + (" (ZeroPadding2D: issue 13 section 4)" if layer.kind == "ZeroPadding2D" else "")
            )
        if layer.attrs.get("model_output"):
            out = self.producer[layer.name]
            if out == INPUT:
                raise ExportError(f"layer {layer.describe()}: the model output is its input")
            if out not in self.outputs:
                self.outputs.append(out)

    def leaky_relu(self, layer: SourceLayer, name: str) -> str:
        bits = spec.FEATURE_BITS[self.result.feature_type]
        alpha = float(layer.attrs.get("alpha", 0.2))
        exp = auto_exponent([alpha], bits)  # the rule convert.py applies to a fused alpha
        q = int(quantize_pow2([alpha], exp, bits)[0])
        return f'dl::layer::LeakyRelu<{self.ctype}>({q}, {exp}, "{name}")'


def _pass_through(layer: SourceLayer) -> bool:
    """Dropout & co., and a linear ``Activation`` (the adapter gives it op runtime)."""
    return layer.op == "runtime" and (layer.kind in PASS_THROUGH or layer.kind == "Activation")


def _input_exponent(result: ExportResult, builder: _Builder) -> int | None:
    """The exponent the chip expects on the model input: its first reader's input exponent."""
    for node in builder.nodes:
        if INPUT not in node.inputs:
            continue
        if node.source in builder.chains:
            found = builder.chains[node.source].entry.get("input_exponent")
        elif node.source in builder.runtime:
            ins = builder.runtime[node.source].input_exponents
            found = ins[node.inputs.index(INPUT)]
        else:
            continue
        if found is not None:
            return int(found)
    return None


def model_class(
    layers: list[SourceLayer], result: ExportResult, coefficient_name: str
) -> ModelClass:
    """Build the model class of ``result`` (the export of ``layers``) and render its header.

    Example:
        >>> model_names("m_coefficient")[1]
        'MModel'
    """
    builder = _Builder(layers, result, coefficient_name)
    for layer in layers:
        builder.visit(layer)
    if not builder.nodes:
        raise ExportError("the model has no layer ESP-DL v1 computes")
    outputs = builder.outputs or [builder.nodes[-1].member]
    header, cls = model_names(coefficient_name)
    model = ModelClass(
        cls,
        header,
        coefficient_name,
        result.feature_type,
        builder.nodes,
        outputs,
        _input_exponent(result, builder),
    )
    model.text = render_model(model, result)
    return model
