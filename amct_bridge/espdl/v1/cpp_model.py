"""The ESP-DL v1 C++ model class (``<model>_model.hpp``) of a chip graph, written for the user.

ESP-DL v1 users write a ``dl::layer::Model<feature_t>`` subclass by hand and copy every layer's
output exponent into it (espdl-v1-runtime.md, section 2). This module writes it from the chip
graph of :mod:`amct_bridge.espdl.v1.network` (the export's ``export.json["graph"]``, the same graph
the chip simulator runs):

- one member per chip layer, in the graph's execution order: Conv2D / DepthwiseConv2D /
  FullyConnected with their coefficient getters (``NAME::get_<L>_filter()``...), Add2D, Sub2D,
  Mul2D, AvgPool2D, GlobalAveragePool2D, MaxPool2D, GlobalMaxPool2D, Concat, Flatten, Reshape,
  Pad, Transpose, Max2D, Min2D and standalone ReLU / LeakyReLU (ESP-DL release/v1.1 class names
  ``Relu`` / ``LeakyRelu``);
- constructors fully qualified (``dl::layer::``, ``dl::PADDING_*``): no ``using namespace``,
  so ``ReLU`` cannot clash with ``dl::ReLU`` and nothing leaks into the includer's code;
- an Add2D with a fused ReLU / LeakyReLU points to a ``static const dl::Activation`` declared
  before the class (``<Class>_<member>_activation``; convert.py writes such constants for conv
  layers only);
- int8 per-channel layers with a bias are ``<int8_t, int16_t>`` (convert.py's ``Bias<int16_t>``);
- the text (:mod:`amct_bridge.espdl.v1.cpp_render`, of the types in
  :mod:`amct_bridge.espdl.v1.cpp_types`): ``build()`` / ``call()`` in execution order,
  ``free_element()`` after each tensor's last reader, outputs public, the input exponent.

A layer the class cannot construct (a standalone PReLU, Squeeze...) raises
:class:`~amct_bridge.errors.ExportError` naming it.

Example:
    >>> from amct_bridge.espdl.v1.network import NetLayer, Network
    >>> net = Network("s8", False, [NetLayer("mp", "MaxPool2D", ["input"], attrs={
    ...     "pool": [2, 2], "padding": "VALID", "strides": [2, 2]})], input_exponent=-7,
    ...     outputs=["mp"])
    >>> m = model_class(net, "m_coefficient")
    >>> m.class_name, m.layers[0].args
    ('MModel', '{2, 2}, dl::PADDING_VALID, {}, 2, 2, "mp"')
"""

from __future__ import annotations

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1 import spec
from amct_bridge.espdl.v1.cpp_render import render_model
from amct_bridge.espdl.v1.cpp_types import ChipLayer, ModelClass
from amct_bridge.espdl.v1.network import INPUT, WEIGHTED, NetLayer, Network

#: Chip-graph class -> C++ class where the names differ (release/v1.1 renamed the activations).
CPP_CLASS: dict[str, str] = {"ReLU": "Relu", "LeakyReLU": "LeakyRelu"}

#: Names a member cannot take (Model's methods and base member, the method parameter, ours).
_RESERVED = frozenset({"build", "call", "forward", INPUT, "input_shape", "input_exponent"})


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


def _ints(values: object) -> str:
    return "{" + ", ".join(str(int(v)) for v in values) + "}"  # type: ignore[union-attr]


def _padding(attrs: dict) -> list[str]:
    """``dl::PADDING_X, {t, b, l, r} or {}`` (the explicit vector only with NOT_SET)."""
    padding = str(attrs.get("padding", "VALID"))
    pads = _ints(attrs.get("pads", [])) if padding == "NOT_SET" else "{}"
    return [f"dl::PADDING_{padding}", pads]


def _strides(attrs: dict) -> list[str]:
    sy, sx = attrs.get("strides", [1, 1])
    return [str(int(sy)), str(int(sx))]


def _weighted(layer: NetLayer, net: Network, ns: str, ctype: str) -> tuple[str, list[str]]:
    c = layer.coefficients or layer.name
    bias = layer.bias is not None
    types = f"{ctype}, int16_t" if net.per_channel and bias else ctype
    args = [
        str(layer.output_exponent),
        f"{ns}::get_{c}_filter()",
        f"{ns}::get_{c}_bias()" if bias else "NULL",
        f"{ns}::get_{c}_activation()" if layer.activation else "NULL",
    ]
    if layer.kind == "FullyConnected":
        args.append("true" if layer.attrs.get("flatten", True) else "false")
    else:
        args += [*_padding(layer.attrs), *_strides(layer.attrs)]
    return types, args


def _arguments(layer: NetLayer, net: Network, ns: str, ctype: str) -> tuple[str, list[str]]:
    """(template arguments, constructor arguments before the name) of one chip layer."""
    kind, attrs, exp = layer.kind, layer.attrs, str(layer.output_exponent)
    if kind in WEIGHTED:
        return _weighted(layer, net, ns, ctype)
    if kind in ("Add2D", "Sub2D", "Mul2D"):
        return ctype, [exp, "NULL"]  # a fused activation: model_class swaps in its constant
    if kind in ("AvgPool2D", "MaxPool2D"):
        args = [_ints(attrs["pool"]), *_padding(attrs), *_strides(attrs)]
        return ctype, [exp, *args] if kind == "AvgPool2D" else args
    if kind == "GlobalAveragePool2D":
        return ctype, [exp]
    if kind == "Concat":
        return ctype, [str(int(attrs.get("axis", -1)))]
    if kind == "Reshape":
        return ctype, [_ints(attrs["shape"])]
    if kind == "Transpose":
        return ctype, [_ints(attrs.get("perm", []))]
    if kind == "Pad":  # one (before, after) pair per HWC axis; the channel axis is not padded
        t, b, left, right = (int(v) for v in attrs["paddings"])
        constant = int(attrs.get("constant", 0))
        return ctype, [_ints([t, b, left, right, 0, 0]), f"{{{constant}}}", "dl::PADDING_CONSTANT"]
    if kind == "LeakyReLU":
        return ctype, [str(int(attrs["alpha"])), str(int(attrs["alpha_exponent"]))]
    if kind in ("ReLU", "GlobalMaxPool2D", "Flatten", "Max2D", "Min2D"):
        return ctype, []
    raise ExportError(f"chip layer {layer.describe()}: no constructor for it in the model class")


def _activation_constant(layer: NetLayer, ctype: str, name: str) -> list[str]:
    """Declarations of the ``dl::Activation`` an Add2D / Sub2D / Mul2D with a fused activation
    points to (convert.py writes such constants for conv layers only), named ``name``."""
    if layer.activation == "ReLU":
        return [f"static const dl::Activation<{ctype}> {name}(dl::ReLU);"]
    if layer.alpha is None:
        raise ExportError(f"chip layer {layer.describe()}: {layer.activation} without alpha")
    values = [int(v) for v in np.asarray(layer.alpha.values).reshape(-1)]
    return [
        f"static const {ctype} {name}_element[] = {_ints(values)};",
        f"static const dl::Activation<{ctype}> {name}(dl::{layer.activation}, {name}_element, "
        f"{int(layer.alpha.exponent)}, {{{len(values)}}});",
    ]


def _member_names(net: Network) -> dict[str, str]:
    """Layer name -> member name (layer names are C identifiers; Model's names are avoided)."""
    taken = {layer.name for layer in net.layers}
    result = {INPUT: INPUT}
    for layer in net.layers:
        name = layer.name
        if name in _RESERVED:
            base, k = f"{name}_layer", 1
            name = base
            while name in taken:
                k += 1
                name = f"{base}_{k}"
            taken.add(name)
        result[layer.name] = name
    return result


def model_class(net: Network, coefficient_name: str) -> ModelClass:
    """The model class of chip graph ``net`` whose coefficients are namespace
    ``coefficient_name`` (convert.py's ``-n``), with its header text.

    Example:
        >>> from amct_bridge.espdl.v1.network import NetLayer, Network
        >>> net = Network("s16", False, [NetLayer("r", "ReLU", ["input"])], input_exponent=0)
        >>> print(model_class(net, "n").layers[0].args)
        "r"
    """
    if not net.layers:
        raise ExportError("the chip graph has no layer")
    ctype = spec.CTYPE[net.feature_type]
    members = _member_names(net)
    header, cls = model_names(coefficient_name)
    layers, constants = [], []
    for layer in net.layers:
        types, args = _arguments(layer, net, coefficient_name, ctype)
        if layer.activation and layer.kind not in WEIGHTED:
            const = f"{cls}_{members[layer.name]}_activation"
            constants += _activation_constant(layer, ctype, const)
            args[1] = f"&{const}"
        layers.append(
            ChipLayer(
                members[layer.name],
                CPP_CLASS.get(layer.kind, layer.kind),
                types,
                ", ".join([*args, f'"{layer.name}"']),
                [members[s] for s in layer.inputs],
                layer.source or layer.name,
                layer.output_exponent,
                list(layer.fused),
            )
        )
    outputs = [members[o] for o in (net.outputs or [net.layers[-1].name])]
    model = ModelClass(
        cls,
        header,
        coefficient_name,
        net.feature_type,
        layers,
        outputs,
        net.input_exponent,
        net.input_shape,
        net.per_channel,
        constants=constants,
    )
    model.text = render_model(model)
    return model
