"""Output exponents of the coefficient-free layers the user's C++ model class constructs.

convert.py only writes conv / depthwise / fully-connected layers, but the ESP-DL v1 runtime also
needs an ``output_exponent`` for ``Add2D``, ``AvgPool2D`` and ``GlobalAveragePool2D`` (they
requantize), and ``Concat`` asserts equal input exponents. For each such layer (Keras class or raw
``x + y`` op) this module reports the exponent its output tensor has on the chip and the
constructor call to paste, in execution order, after the chains' output exponents are known:

- ``MaxPool2D``, ``GlobalMaxPool2D``, ``Concat``: the input's exponent (the runtime keeps it;
  Concat: all inputs share one, the largest is reported when they do not);
- ``AvgPool2D``, ``GlobalAveragePool2D``: the auto exponent of the layer's calibrated output range
  (sidecar); without one, the input exponent (an average never leaves its input's range);
- ``Add2D``: the auto exponent of its calibrated output range, raised to ``e_hi`` = the largest
  input exponent when that is larger: the runtime aligns both inputs to ``e_hi`` before adding,
  so the sum has no finer bits and ``e_out < e_hi`` only shifts in zeros while shrinking the
  range (``e_out = e_hi`` loses nothing and saturates less). Without an output range:
  the bound ``sum_i (2^(w-1) - 1) * 2^e_i`` of the input exponents.

- ``Flatten``, ``Reshape``, ``Pad`` (a ZeroPadding2D not folded into a conv), ``Transpose``
  (Permute), ``Max2D`` / ``Min2D`` and a standalone ``ReLU`` / ``LeakyReLU`` (one no chain
  fuses): the input's exponent (the runtime copies, compares or clamps elements);
- a ReLU / LeakyReLU that is the only reader of an ``Add2D`` is fused into it (Add2D takes an
  ``Activation*``, applied after saturation: the same integers as a separate layer). The item
  lists both layers in ``fused``; its exponent comes from the ReLU's range (negative sums become
  0 either way), a LeakyReLU's from the sum's. The model class declares the ``Activation``
  constant (:mod:`amct_bridge.espdl.v1.cpp_model`); ``cpp_constant`` gives it for hand-written code.

A model input's exponent is the input exponent of the first conv/dense reading it (the export
tells the user to quantize the input with it).

Example:
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> ESPDL_CLASS["GlobalAveragePooling2D"], ESPDL_CLASS["Add"]
    ('GlobalAveragePool2D', 'Add2D')
"""

from __future__ import annotations

from dataclasses import dataclass, field

from amct_bridge.espdl.exponents import ExponentFinder
from amct_bridge.espdl.source import (
    AVERAGE_KINDS,
    ESPDL_CLASS,
    PASS_THROUGH,
    WEIGHT_OPS,
    SourceLayer,
    keeps_exponent,
    zero_padding,
)
from amct_bridge.quant.espdl import auto_exponent, exponent_for_absmax, quantize_pow2

#: Standalone activations (ops) the runtime has as layers of their own.
_ACTIVATION_CLASS = {"relu": "ReLU", "leaky_relu": "LeakyReLU"}


def runtime_class(layer: SourceLayer) -> str | None:
    """The ESP-DL v1 class a coefficient-free layer runs as (None: not a runtime layer).

    Example:
        >>> runtime_class(SourceLayer("r", "relu", ["a"], "ReLU")), runtime_class(
        ...     SourceLayer("f", "runtime", ["a"], "Flatten"))
        ('ReLU', 'Flatten')
    """
    if layer.op in _ACTIVATION_CLASS:
        return _ACTIVATION_CLASS[layer.op]
    return ESPDL_CLASS.get(layer.kind) if layer.op == "runtime" else None


def leaky_ints(alpha: float, bits: int) -> dict:
    """A LeakyReLU slope as the runtime takes it: ``alpha`` int and ``alpha_exponent``, by the
    rule convert.py applies to a fused alpha.

    Example:
        >>> leaky_ints(0.1, 8)
        {'alpha': 102, 'alpha_exponent': -10}
    """
    exp = auto_exponent([alpha], bits)
    return {"alpha": int(quantize_pow2([alpha], exp, bits)[0]), "alpha_exponent": int(exp)}


def keeping_attrs(layer: SourceLayer, bits: int) -> dict:
    """Chip-graph attrs (:mod:`amct_bridge.espdl.v1.network`) of an exponent-keeping runtime layer.

    Example:
        >>> keeping_attrs(SourceLayer("p", "runtime", ["a"], "ZeroPadding2D",
        ...                           attrs={"padding": "((0, 1), (0, 1))"}), 8)
        {'paddings': [0, 1, 0, 1], 'constant': 0}
    """
    cls = runtime_class(layer)
    if cls == "LeakyReLU":
        return leaky_ints(float(layer.attrs["alpha"]), bits)
    if cls == "Reshape":
        shape = layer.attrs.get("target_shape", layer.attrs.get("shape"))
        if shape is None:
            return {}
        return {"shape": [int(s) for s in shape]}
    if cls == "Pad":
        return {"paddings": zero_padding(layer), "constant": 0}
    if cls == "Transpose":
        dims = layer.attrs.get("dims")
        return {} if dims is None else {"perm": [int(d) - 1 for d in dims]}
    return {}


def chip_axis(axis: object) -> int | None:
    """A framework axis of an (N, H, W, C) tensor as the chip's (HWC, no batch axis) takes it:
    positive axes lose one (Keras ``axis=3`` is ESP-DL's channel axis 2), negative ones stay;
    None for the batch axis (the chip has none).

    Example:
        >>> chip_axis(3), chip_axis(-1), chip_axis(0)
        (2, -1, None)
    """
    value = int(axis)  # type: ignore[call-overload]
    if value == 0:
        return None
    return value - 1 if value > 0 else value


__all__ = [
    "ESPDL_CLASS",
    "PASS_THROUGH",
    "RuntimeLayer",
    "chip_axis",
    "runtime_class",
    "runtime_layers",
]

_PADDING = {"valid": "dl::PADDING_VALID", "same": "dl::PADDING_SAME_END"}  # as the model class


@dataclass
class RuntimeLayer:
    """One runtime layer of the C++ model: its exponents, where they came from, constructor."""

    name: str
    source: str
    kind: str
    espdl_class: str
    output_exponent: int | None
    input_exponents: list[int | None]
    exponent_source: str
    output_range: tuple[float, float] | None = None
    cpp: str | None = None
    warnings: list[str] = field(default_factory=list)
    activation: str | None = None  # Add2D: a fused "ReLU" / "LeakyReLU"
    alpha: float | None = None  # its LeakyReLU slope
    fused: list[str] = field(default_factory=list)  # [add, add_relu]: readers of either read it
    cpp_constant: str | None = None  # the Activation constant ``cpp`` points to
    chip_attrs: dict = field(default_factory=dict)  # keeping layers: shape / paddings / perm...

    def to_json(self) -> dict:
        """export.json entry."""
        extra: dict = {}
        if self.fused:
            extra["fused"] = self.fused
        if self.activation:
            extra["activation"] = self.activation
            extra["cpp_constant"] = self.cpp_constant
        return {
            "name": self.name,
            "source": self.source,
            "kind": self.kind,
            "class": self.espdl_class,
            "output_exponent": self.output_exponent,
            "input_exponents": self.input_exponents,
            "exponent_source": self.exponent_source,
            "cpp": self.cpp,
            **extra,
        }


def _tensor_exponent(finder: ExponentFinder, name: str) -> int | None:
    """Exponent of ``name``'s output on the chip, through exponent-keeping layers."""
    seen = set()
    while name not in seen:
        seen.add(name)
        if name in finder.chain_outputs:
            return finder.chain_outputs[name]
        layer = finder.layers.get(name)
        if layer is not None and layer.op == "input":
            return _model_input_exponent(finder, name)
        if layer is None or not keeps_exponent(layer) or not layer.inputs:
            return None
        name = layer.inputs[0]
    return None


def _model_input_exponent(
    finder: ExponentFinder, name: str, seen: frozenset = frozenset()
) -> int | None:
    """A model input's exponent: the input exponent of the first conv/dense reading it (what
    the export tells the user to quantize the input with), also through a layer that only
    reshapes it (a 1-D model's Reshape to height 1, :mod:`amct_bridge.espdl.v1.height1`)."""
    for user in finder.consumers.get(name, []):
        if user.op in WEIGHT_OPS and user.inputs == [name]:
            found = finder.range_exponent(user.name, "input") or finder.record_exponent(user.name)
            if found is not None:
                return found[0]
    for user in finder.consumers.get(name, []):
        if user.attrs.get("lifts") == name and user.name not in seen:
            return _model_input_exponent(finder, user.name, seen | {name})
    return None


def _add_exponent(
    finder: ExponentFinder, layer: SourceLayer, ins: list[int | None], act: SourceLayer | None
) -> tuple[int | None, str, tuple | None]:
    found = None
    if act is not None and act.op == "relu":  # a fused ReLU: only its range reaches a reader
        found = finder.range_exponent(act.name, "output")
    found = found or finder.range_exponent(layer.name, "output")
    known = [e for e in ins if e is not None]
    e_hi = max(known) if known and len(known) == len(ins) else None
    if found is None:
        if e_hi is None:
            return None, "no calibrated output range and unknown input exponents", None
        top = float(2 ** (finder.bits - 1) - 1)
        bound = sum(top * 2.0**e for e in known)
        exp = exponent_for_absmax(bound, finder.bits)
        return exp, "bound from the input exponents (no calibrated output range)", None
    if finder.is_zero_range(found) and e_hi is not None:
        return finder.zero_runtime(layer.name, found, e_hi, "its inputs' largest exponent")
    exp, src, rng = found
    if e_hi is not None and e_hi > exp:
        src = f"{src}, raised from {exp} to the inputs' exponent {e_hi} (the sum has no finer bits)"
        exp = e_hi
    return exp, src, rng


def _exponent(
    finder: ExponentFinder, layer: SourceLayer, ins: list[int | None], act: SourceLayer | None
) -> tuple[int | None, str, tuple | None]:
    kind = layer.kind
    if kind == "Add":
        return _add_exponent(finder, layer, ins, act)
    known = [e for e in ins if e is not None]
    if kind in AVERAGE_KINDS:
        found = finder.range_exponent(layer.name, "output")
        if finder.is_zero_range(found) and known:
            return finder.zero_runtime(layer.name, found, known[0], "its input's exponent")
        if found is not None:
            return found
        if known:
            return known[0], "input exponent (no calibrated output range; averages keep it)", None
        return None, "no calibrated output range and unknown input exponent", None
    rng = finder.range_exponent(layer.name, "output")
    rng = rng[2] if rng else None
    if not known:
        return None, "input exponent unknown (not an exported layer's output)", rng
    src = f"kept from input {layer.inputs[0]!r}"
    if len(set(known)) > 1 or len(known) != len(ins):
        src = "the largest input exponent (ESP-DL Concat asserts equal input exponents)"
    return max(known), src, rng


def constructor(item: RuntimeLayer, feature_type: str, attrs: dict) -> str | None:
    """The C++ constructor call of a runtime layer (None without an exponent or attr it needs).

    Example:
        >>> r = RuntimeLayer("gap", "gap", "GlobalAveragePooling2D", "GlobalAveragePool2D", -6,
        ...                  [-5], "")
        >>> constructor(r, "s8", {})
        'dl::layer::GlobalAveragePool2D<int8_t>(-6, "gap")'
    """
    ctype = {"s8": "int8_t", "s16": "int16_t"}[feature_type]
    cls, name, e = item.espdl_class, f'"{item.name}"', item.output_exponent
    if cls in _REQUANTIZING and e is None:
        return None
    ints = lambda values: "{" + ", ".join(str(int(v)) for v in values) + "}"  # noqa: E731
    if cls == "Add2D":
        act = f"&{item.name}_activation" if item.activation else "NULL"
        args = [str(e), act, name]
    elif cls == "GlobalAveragePool2D":
        args = [str(e), name]
    elif cls in ("AvgPool2D", "MaxPool2D"):
        padding = _PADDING.get(str(attrs.get("padding", "valid")).lower())
        if padding is None or "pool_size" not in attrs:
            return None
        ph, pw = (int(v) for v in attrs["pool_size"])
        sy, sx = (int(v) for v in attrs.get("strides", attrs["pool_size"]))
        args = [f"{{{ph}, {pw}}}", padding, "{}", str(sy), str(sx), name]
        if cls == "AvgPool2D":
            args.insert(0, str(e))
    elif cls == "Concat":
        axis = chip_axis(attrs.get("axis", -1))
        if axis is None:
            return None
        args = [str(axis), name]
    elif cls in ("Reshape", "Transpose", "Pad", "LeakyReLU"):
        chip = item.chip_attrs
        if cls == "Reshape" and "shape" not in chip:
            return None
        if cls == "Reshape":
            args = [ints(chip["shape"]), name]
        elif cls == "Transpose":
            args = [ints(chip.get("perm", [])), name]
        elif cls == "Pad":  # (before, after) per HWC axis; the channel axis is not padded
            args = [ints([*chip["paddings"], 0, 0]), "{0}", "dl::PADDING_CONSTANT", name]
        else:
            args = [str(chip["alpha"]), str(chip["alpha_exponent"]), name]
    else:
        args = [name]
    cpp_class = {"ReLU": "Relu", "LeakyReLU": "LeakyRelu"}.get(cls, cls)  # release/v1.1 names
    return f"dl::layer::{cpp_class}<{ctype}>({', '.join(args)})"


def activation_constant(item: RuntimeLayer, feature_type: str, bits: int) -> str:
    """The ``dl::Activation`` constant a fused Add2D activation points to (C++ declaration).

    Example:
        >>> r = RuntimeLayer("add", "add", "Add", "Add2D", -5, [-5, -6], "", activation="ReLU")
        >>> activation_constant(r, "s8", 8)
        'static const dl::Activation<int8_t> add_activation(dl::ReLU);'
    """
    ctype = {"s8": "int8_t", "s16": "int16_t"}[feature_type]
    if item.activation == "ReLU":
        return f"static const dl::Activation<{ctype}> {item.name}_activation(dl::ReLU);"
    a = leaky_ints(float(item.alpha if item.alpha is not None else 0.2), bits)
    return (
        f"static const {ctype} {item.name}_alpha[] = {{{a['alpha']}}}; "
        f"static const dl::Activation<{ctype}> {item.name}_activation(dl::LeakyReLU, "
        f"{item.name}_alpha, {a['alpha_exponent']}, {{1}});"
    )


_REQUANTIZING = ("Add2D", "AvgPool2D", "GlobalAveragePool2D")


def _adjustable_source(finder: ExponentFinder, name: str, chain_ends: set[str]) -> str | None:
    """The exported chain end or requantizing runtime layer whose exponent ``name``'s output
    carries (through exponent-keeping layers), if any: those exponents are ours to choose."""
    seen = set()
    while name not in seen:
        seen.add(name)
        if name in chain_ends:
            return name
        layer = finder.layers.get(name)
        if layer is None:
            return None
        if layer.op == "runtime" and ESPDL_CLASS.get(layer.kind) in _REQUANTIZING:
            return name
        if not keeps_exponent(layer) or not layer.inputs:
            return None
        name = layer.inputs[0]
    return None


def _concat_floors(
    finder: ExponentFinder, items: list[RuntimeLayer], chain_ends: set[str]
) -> dict[str, tuple]:
    """Producers feeding a Concat below its largest input exponent -> (floor, concat name)."""
    floors: dict[str, tuple] = {}
    for item in items:
        known = [e for e in item.input_exponents if e is not None]
        if item.espdl_class != "Concat" or not known:
            continue
        top = max(known)
        for src, e in zip(finder.layers[item.source].inputs, item.input_exponents, strict=False):
            producer = _adjustable_source(finder, src, chain_ends)
            if producer is not None and e is not None and e < top:
                floors[producer] = (max(top, floors.get(producer, (top,))[0]), item.source)
    return floors


def concat_resolved(item: RuntimeLayer) -> bool:
    """True if a Concat's input exponents are all known and equal (what the runtime asserts).

    Example:
        >>> concat_resolved(RuntimeLayer("c", "c", "Concatenate", "Concat", -5, [-5, -5], ""))
        True
    """
    ins = item.input_exponents
    return None not in ins and len(set(ins)) == 1


def runtime_layers(
    layers: list[SourceLayer],
    finder: ExponentFinder,
    names: dict[str, str],
    feature_type: str,
    skip: frozenset[str] | set[str] = frozenset(),
) -> tuple[list[RuntimeLayer], dict[str, tuple[int, str]]]:
    """Report every runtime layer (:func:`runtime_class`) in execution order, except those in
    ``skip`` (fused into or folded into an exported chain).

    ``finder.chain_outputs`` must hold the chains' output exponents; each requantizing layer's
    exponent is added to it, so later chains take it as their input exponent (the tensor the
    chip has). A chain or requantizing layer feeding a Concat whose other inputs have a larger
    exponent is raised to it (Concat asserts equal exponents; those exponents are ours to
    choose). Returns the runtime layers and the raised chain ends (``Chain.last`` ->
    (exponent, Concat name)), which the caller must write into their entries.
    ``names`` maps layer names to C identifiers.

    Example:
        >>> finder = ExponentFinder([], None, None, bits=8)
        >>> runtime_layers([], finder, {}, "s8")
        ([], {})
    """
    base = dict(finder.chain_outputs)
    chain_ends = set(base)
    floors: dict[str, tuple] = {}
    for _ in range(4):  # raising one layer can raise another Concat's inputs: a few rounds
        finder.chain_outputs = dict(base)
        for end in chain_ends & set(floors):
            finder.chain_outputs[end] = max(base[end], floors[end][0])
        items = _one_pass(layers, finder, names, feature_type, floors, skip)
        new = _concat_floors(finder, items, chain_ends)
        if all(floors.get(k, (None,))[0] == v[0] for k, v in new.items()):
            break
        for k, v in new.items():
            if k not in floors or floors[k][0] < v[0]:
                floors[k] = v
    raised = {
        end: (floors[end][0], floors[end][1])
        for end in chain_ends & set(floors)
        if floors[end][0] > base[end]
    }
    return items, raised


def _fusable_activation(finder: ExponentFinder, layer: SourceLayer) -> SourceLayer | None:
    """The ReLU / LeakyReLU that alone reads an Add2D's output (fused into it), if any."""
    if layer.attrs.get("model_output"):
        return None
    users = finder.consumers.get(layer.name, [])
    if len(users) == 1 and users[0].inputs == [layer.name] and users[0].op in _ACTIVATION_CLASS:
        return users[0]
    return None


def _one_pass(
    layers: list[SourceLayer],
    finder: ExponentFinder,
    names: dict[str, str],
    feature_type: str,
    floors: dict[str, tuple],
    skip: frozenset[str] | set[str] = frozenset(),
) -> list[RuntimeLayer]:
    result = []
    absorbed: set[str] = set()
    for layer in layers:
        cls = runtime_class(layer)
        if cls is None or layer.name in skip or layer.name in absorbed:
            continue
        act = _fusable_activation(finder, layer) if cls == "Add2D" else None
        ins = [_tensor_exponent(finder, src) for src in layer.inputs]
        known = len(finder.warnings)
        exp, src, rng = _exponent(finder, layer, ins, act)
        notes = finder.warnings[known:]  # this layer's (one pass of several: not kept there)
        del finder.warnings[known:]
        floor = floors.get(layer.name)
        if floor is not None and exp is not None and exp < floor[0]:
            src = f"{src}, raised from {exp} to {floor[0]} to match the inputs of {floor[1]!r}"
            exp = floor[0]
        if exp is not None and not keeps_exponent(layer):
            finder.chain_outputs[layer.name] = exp
        item = RuntimeLayer(names[layer.name], layer.name, layer.kind, cls, exp, ins, src, rng)
        if act is not None:
            absorbed.add(act.name)
            item.activation, item.fused = _ACTIVATION_CLASS[act.op], [layer.name, act.name]
            item.alpha = act.attrs.get("alpha")
            item.cpp_constant = activation_constant(item, feature_type, finder.bits)
        if keeps_exponent(layer):
            item.chip_attrs = keeping_attrs(layer, finder.bits)
        item.cpp = constructor(item, feature_type, layer.attrs)
        item.warnings += notes
        if exp is None and cls in _REQUANTIZING:
            item.warnings.append(
                f"runtime layer {layer.name!r} ({cls}): no output exponent ({src}); calibrate "
                "with the current callback (its sidecar holds runtime layers) or choose one"
            )
        result.append(item)
    return result
