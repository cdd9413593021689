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
from amct_bridge.espdl.source import WEIGHT_OPS, SourceLayer, keeps_exponent
from amct_bridge.quant.espdl import exponent_for_absmax

#: Keras kind -> ESP-DL v1 class of the runtime layers reported.
ESPDL_CLASS: dict[str, str] = {
    "Add": "Add2D",
    "AveragePooling2D": "AvgPool2D",
    "GlobalAveragePooling2D": "GlobalAveragePool2D",
    "MaxPooling2D": "MaxPool2D",
    "GlobalMaxPooling2D": "GlobalMaxPool2D",
    "Concatenate": "Concat",
}

_PADDING = {"valid": "PADDING_VALID", "same": "PADDING_SAME_END"}


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

    def to_json(self) -> dict:
        """export.json entry."""
        return {
            "name": self.name,
            "source": self.source,
            "kind": self.kind,
            "class": self.espdl_class,
            "output_exponent": self.output_exponent,
            "input_exponents": self.input_exponents,
            "exponent_source": self.exponent_source,
            "cpp": self.cpp,
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


def _model_input_exponent(finder: ExponentFinder, name: str) -> int | None:
    """A model input's exponent: the input exponent of the first conv/dense reading it (what
    the export tells the user to quantize the input with)."""
    for user in finder.consumers.get(name, []):
        if user.op in WEIGHT_OPS and user.inputs == [name]:
            found = finder.range_exponent(user.name, "input") or finder.record_exponent(user.name)
            if found is not None:
                return found[0]
    return None


def _add_exponent(
    finder: ExponentFinder, layer: SourceLayer, ins: list[int | None]
) -> tuple[int | None, str, tuple | None]:
    found = finder.range_exponent(layer.name, "output")
    known = [e for e in ins if e is not None]
    e_hi = max(known) if known and len(known) == len(ins) else None
    if found is None:
        if e_hi is None:
            return None, "no calibrated output range and unknown input exponents", None
        top = float(2 ** (finder.bits - 1) - 1)
        bound = sum(top * 2.0**e for e in known)
        exp = exponent_for_absmax(bound, finder.bits)
        return exp, "bound from the input exponents (no calibrated output range)", None
    exp, src, rng = found
    if e_hi is not None and e_hi > exp:
        src = f"{src}, raised from {exp} to the inputs' exponent {e_hi} (the sum has no finer bits)"
        exp = e_hi
    return exp, src, rng


def _exponent(
    finder: ExponentFinder, layer: SourceLayer, ins: list[int | None]
) -> tuple[int | None, str, tuple | None]:
    kind = layer.kind
    if kind == "Add":
        return _add_exponent(finder, layer, ins)
    known = [e for e in ins if e is not None]
    if kind in ("AveragePooling2D", "GlobalAveragePooling2D"):
        found = finder.range_exponent(layer.name, "output")
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
    """The C++ constructor call of a runtime layer (None without an exponent it needs).

    Example:
        >>> r = RuntimeLayer("gap", "gap", "GlobalAveragePooling2D", "GlobalAveragePool2D", -6,
        ...                  [-5], "")
        >>> constructor(r, "s8", {})
        'dl::layer::GlobalAveragePool2D<int8_t>(-6, "gap")'
    """
    ctype = {"s8": "int8_t", "s16": "int16_t"}[feature_type]
    cls, name, e = item.espdl_class, f'"{item.name}"', item.output_exponent
    if cls in ("Add2D", "AvgPool2D", "GlobalAveragePool2D") and e is None:
        return None
    if cls == "Add2D":
        args = [str(e), "NULL", name]
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
        args = [str(int(attrs.get("axis", -1))), name]
    else:
        args = [name]
    return f"dl::layer::{cls}<{ctype}>({', '.join(args)})"


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
    layers: list[SourceLayer], finder: ExponentFinder, names: dict[str, str], feature_type: str
) -> tuple[list[RuntimeLayer], dict[str, tuple[int, str]]]:
    """Report every runtime layer in :data:`ESPDL_CLASS`, in execution order.

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
        items = _one_pass(layers, finder, names, feature_type, floors)
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


def _one_pass(
    layers: list[SourceLayer],
    finder: ExponentFinder,
    names: dict[str, str],
    feature_type: str,
    floors: dict[str, tuple],
) -> list[RuntimeLayer]:
    result = []
    for layer in layers:
        cls = ESPDL_CLASS.get(layer.kind) if layer.op == "runtime" else None
        if cls is None:
            continue
        ins = [_tensor_exponent(finder, src) for src in layer.inputs]
        exp, src, rng = _exponent(finder, layer, ins)
        floor = floors.get(layer.name)
        if floor is not None and exp is not None and exp < floor[0]:
            src = f"{src}, raised from {exp} to {floor[0]} to match the inputs of {floor[1]!r}"
            exp = floor[0]
        if exp is not None and not keeps_exponent(layer):
            finder.chain_outputs[layer.name] = exp
        item = RuntimeLayer(names[layer.name], layer.name, layer.kind, cls, exp, ins, src, rng)
        item.cpp = constructor(item, feature_type, layer.attrs)
        if exp is None and cls in ("Add2D", "AvgPool2D", "GlobalAveragePool2D"):
            item.warnings.append(
                f"runtime layer {layer.name!r} ({cls}): no output exponent ({src}); calibrate "
                "with the current callback (its sidecar holds runtime layers) or choose one"
            )
        result.append(item)
    return result
