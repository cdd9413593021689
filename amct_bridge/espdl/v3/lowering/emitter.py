"""The state one ESP-DL v3 export builds up, and the steps every lowering shares.

An :class:`Emitter` holds the nodes, initializers and value infos written so far, each
tensor's exponent (and where it came from), shape and calibrated range, and what became of
every source layer (:class:`V3Layer`). A lowering (:mod:`amct_bridge.espdl.v3.lowering`)
turns one :class:`~amct_bridge.espdl.source.SourceLayer` into nodes through it:
``em.node(...)``, ``em.tensor(...)``, ``em.done(...)`` or ``em.refuse(...)``.

Example:
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> em = Emitter([SourceLayer("x", "input")], None, None, 8, "c", {}, {})
    >>> em.tensor("x", -4, "given", [1, 2], (-1.0, 1.0))
    'x'
    >>> em.requant("x", -4, "add", 0), em.requant("x", -3, "add", 0)
    ('x', 'add/requantize_0')
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from amct_bridge.errors import ExportError, QuantError
from amct_bridge.espdl.exponent_search import Tuning
from amct_bridge.espdl.exponents import ExponentFinder
from amct_bridge.espdl.plan import Chain, consumers_map
from amct_bridge.espdl.source import PASS_THROUGH, WEIGHT_OPS, ZERO_PADDING_KINDS, SourceLayer
from amct_bridge.espdl.v3.model import EspdlModel, Node, Tensor, ValueInfo
from amct_bridge.espdl.v3.simulate import simulate_espdl
from amct_bridge.quant.espdl import range_to_exponent

__all__ = ["Emitter", "V3Layer", "no_lowering", "pair", "round_half", "same_pads"]


@dataclass
class V3Layer:
    """What became of one source layer: ``status`` is ``exported`` (``nodes``), ``fused``
    (into ``into``), ``passthrough``, ``host`` (applied when quantizing the input) or
    ``refused`` (``reason``).

    Example:
        >>> V3Layer("bn", "BatchNormalization", "fused", into="conv").into
        'conv'
    """

    name: str
    kind: str
    status: str
    nodes: list[str] = field(default_factory=list)
    into: str | None = None
    reason: str | None = None


def round_half(x: np.ndarray, half_even: bool) -> np.ndarray:
    """The target's rounding of floats: half to even (esp32p4) or half up.

    Example:
        >>> round_half(np.array([0.5, 1.5, -0.5]), False).tolist()
        [1.0, 2.0, 0.0]
    """
    if half_even:
        return np.rint(x)
    return np.floor(x + 0.5)


def same_pads(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int, int]:
    """TF/Keras "same": (output size, pad before, pad after); the extra pad goes after.

    Example:
        >>> same_pads(8, 3, 2), same_pads(8, 3, 1, dilation=2)
        ((4, 0, 1), (8, 2, 2))
    """
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return out, total // 2, total - total // 2


def pair(value, default: int) -> tuple[int, int]:
    """A Keras size / stride (None, int, or a 1- or 2-sequence) as (height, width).

    Example:
        >>> pair(None, 1), pair(3, 1), pair((1, 2), 1)
        ((1, 1), (3, 3), (1, 2))
    """
    if value is None:
        return default, default
    if isinstance(value, int):
        return value, value
    vals = [int(v) for v in value]
    return (vals[0], vals[0]) if len(vals) == 1 else (vals[-2], vals[-1])


def same_values(layer: SourceLayer) -> bool:
    """A layer whose output holds its input's values (so its range): reshapes, pass-throughs.

    Example:
        >>> same_values(SourceLayer("f", "runtime", kind="Flatten"))
        True
    """
    return layer.op == "runtime" and layer.kind in ("Flatten", "Reshape", *PASS_THROUGH)


def no_lowering(layer: SourceLayer) -> str:
    """Why a layer has no v3 export, in v3 terms: the adapter's ``problems`` (a grouped
    conv) or its reason when worded for v3, else its kind.

    Example:
        >>> no_lowering(SourceLayer("c", "unsupported", [], "Conv2D",
        ...                         attrs={"problems": ["channels_first data format"]}))
        'Conv2D with channels_first data format: not supported by the ESP-DL v3 exporter'
    """
    kind = layer.kind or layer.op
    if layer.attrs.get("problems"):
        problems = ", ".join(layer.attrs["problems"])
        return f"{kind} with {problems}: not supported by the ESP-DL v3 exporter"
    reason = layer.attrs.get("reason")
    if reason and "ESP-DL v3" in reason:  # worded for v3 by the adapter (no_equivalent)
        return reason
    return f"no ESP-DL v3 export for {kind}: {reason or 'not exported'}"


class Emitter:
    """Nodes, initializers, value infos and the per-layer report of one export (module doc).

    Args:
        layers: the source layers, in execution order.
        record, stats: the AMCT record and calibration sidecar (either may be None).
        bits: 8 or 16 (the file's feature type); target: esp32s3, esp32p4 or c.
        chains, fused: the conv chains by head name and fused layer -> head
            (planned by :mod:`amct_bridge.espdl.v3.export`).
        layer_bits: layer name -> 8 or 16 where a layer runs at another width than ``bits``
            (mixed precision, :meth:`width`); a chain's head names the chain.
    """

    def __init__(self, layers, record, stats, bits, target, chains, fused, layer_bits=None):
        self.layers = layers
        self.by_name = {x.name: x for x in layers}
        self.consumers = consumers_map(layers)
        self.finder = ExponentFinder(layers, record, stats, bits=bits)
        self.target = target
        self.half_even = target == "esp32p4"
        self.default_bits = bits
        self.layer_bits: dict[str, int] = {k: int(v) for k, v in (layer_bits or {}).items()}
        self.converted: dict[tuple[str, int], str] = {}  # (tensor, bits) -> its copy
        self.use(bits)
        self.chains: dict[str, Chain] = chains
        self.fused: dict[str, str] = fused
        self.nodes: list[Node] = []
        self.inits: dict[str, Tensor] = {}
        self.infos: dict[str, ValueInfo] = {}
        self.tensor_of: dict[str, str] = {}  # layer -> tensor holding its output
        self.exps: dict[str, int] = {}
        self.sources: dict[str, tuple[int, str]] = {}
        self.shapes: dict[str, list[int]] = {}
        self.ranges: dict[str, tuple[float, float]] = {}
        self.report: dict[str, V3Layer] = {}
        self.notes: list[str] = []
        self.inputs: list[str] = []
        self.host: list[str] = []  # model inputs and the host-side layers right after them
        self.luts = 0
        self.tuning = Tuning()  # searched choices (tune); empty: the range rule

    # --- widths (mixed int8 / int16)

    def use(self, bits: int) -> None:
        """Write the next nodes at ``bits`` (8 or 16): tensor types, ``quant_type``, weights,
        bias width and the exponents of calibrated ranges."""
        self.bits = self.finder.bits = int(bits)
        self.dtype = np.dtype(np.int8 if bits == 8 else np.int16)
        self.elem = 3 if bits == 8 else 5
        self.quant = "S8" if bits == 8 else "S16"

    def width(self, layer: SourceLayer) -> int | None:
        """The bits ``layer``'s nodes run at: ``layer_bits`` (a fused layer: its head's), a
        model input its first reader's; None for a layer that writes no arithmetic of its own
        (a host step, a reshape, a pass-through): its input's width."""
        name = self.fused.get(layer.name, layer.name)
        if name in self.layer_bits:
            return self.layer_bits[name]
        if layer.op == "input":
            return self._reader_width(layer.name, {layer.name})
        if layer.kind in ("Rescaling", "Normalization") or same_values(layer):
            return None
        return self.default_bits

    def _reader_width(self, name: str, seen: set[str]) -> int:
        for user in self.consumers.get(name, []):
            bits = self.width(user)
            if bits is None and user.name not in seen:
                seen.add(user.name)
                bits = self._reader_width(user.name, seen)
            if bits is not None:
                return bits
        return self.default_bits

    def bits_of(self, tensor: str) -> int:
        """The width of a tensor written so far (8 or 16)."""
        return 16 if self.infos[tensor].elem_type == 5 else 8

    def convert(self, tensor: str) -> str:
        """``tensor`` at the current width: itself, or its copy by a ``RequantizeLinear`` node
        (``<tensor>/requantize_s16`` / ``_s8``; one per tensor and width). int8 -> int16 takes
        the exponent 8 lower (a left shift by 8: exact, never saturates); int16 -> int8 the
        exponent of the tensor's calibrated range (else 8 higher), rounded as the target
        rounds."""
        info = self.infos.get(tensor)
        if info is None or info.elem_type not in (3, 5) or self.bits_of(tensor) == self.bits:
            return tensor
        key = (tensor, self.bits)
        if key in self.converted:
            return self.converted[key]
        e_in, rng = self.exps[tensor], self.ranges.get(tensor)
        if self.bits == 16:
            exp, why = e_in - 8, f"int8 {tensor!r} as int16 (exact: exponent {e_in} - 8)"
        elif rng is not None:
            exp, why = self.range_exp(*rng, tensor), f"int16 {tensor!r} as int8 (its range)"
        else:
            exp, why = e_in + 8, f"int16 {tensor!r} as int8 (exponent {e_in} + 8)"
        name = f"{tensor}/requantize_s{self.bits}"
        scale = self.init(f"{name}/scale", np.float32([2.0**exp]))
        zero = self.init(f"{name}/zero_point", np.zeros(1, self.dtype))
        self.tensor(name, exp, why, self.shapes[tensor], rng)
        self.node(name, "RequantizeLinear", [tensor, scale, zero], [name])
        self.converted[key] = name
        return name

    # --- bookkeeping

    def tensor(self, name, exp, source, shape, rng=None, elem=None) -> str:
        """Declare tensor ``name``: exponent (and why), shape, calibrated range."""
        self.exps[name] = int(exp)
        self.sources[name] = (int(exp), source)
        self.shapes[name] = [int(s) for s in shape]
        if rng is not None:
            self.ranges[name] = (float(rng[0]), float(rng[1]))
        self.infos[name] = ValueInfo(name, list(self.shapes[name]), elem or self.elem, [int(exp)])
        return name

    def node(self, name, op, inputs, outputs, attrs=None) -> None:
        """Append a node (``quant_type`` of the feature type)."""
        attributes = dict(attrs or {})
        attributes["quant_type"] = self.quant
        self.nodes.append(Node(name, op, list(inputs), list(outputs), attributes))

    def init(self, name, data, exp=0, doc="UNK") -> str:
        """An initializer (a rank-0 value becomes ``[1]``: the loader crashes on empty dims);
        ``exp`` one exponent, or a sequence (one per output channel: esp32p4's filters)."""
        data = np.asarray(data)
        if data.ndim == 0:
            data = data.reshape(1)
        exps = [int(e) for e in np.ravel(exp)]
        self.inits[name] = Tensor(name, data, exps, f"layout ==> {doc}")
        return name

    def tune(self, tuning: Tuning) -> None:
        """Export with the searched ``tuning`` (amct_bridge.espdl.v3.search) instead of the
        range rule where it says: exponents by sidecar key, filter / pre-activation exponents,
        per-channel filters and bias corrections by conv/dense."""
        self.tuning = tuning
        self.finder.overrides = tuning.exponents  # read only

    def shape_init(self, name: str, dims) -> str:
        """An int64 shape / axes / index constant."""
        return self.init(name, np.asarray([int(d) for d in dims], np.int64))

    def done(self, layer: SourceLayer, status: str, nodes=(), into=None, reason=None) -> None:
        """Record what became of ``layer``."""
        self.report[layer.name] = V3Layer(
            layer.name, layer.kind or layer.op, status, list(nodes), into, reason
        )

    def refuse(self, layer: SourceLayer, reason: str) -> None:
        """Refuse ``layer`` with ``reason`` (in v3 terms: what the runtime lacks, what to do)."""
        self.done(layer, "refused", reason=reason)

    def output(self, layer: SourceLayer, tensor: str, nodes=None) -> None:
        """``tensor`` holds ``layer``'s output: the layer is exported."""
        self.tensor_of[layer.name] = tensor
        self.done(layer, "exported", [tensor] if nodes is None else nodes)

    def range_of(self, tensor: str) -> tuple[float, float]:
        """The calibrated range of ``tensor``, else its format's range."""
        if tensor in self.ranges:
            return self.ranges[tensor]
        bits = self.bits_of(tensor) if tensor in self.infos else self.bits
        top = (2 ** (bits - 1) - 1) * 2.0 ** self.exps[tensor]
        return -top, top

    def found(self, name: str, seen: frozenset[str] = frozenset()):
        """(exponent, source, range) of layer ``name``'s output from the sidecar / record;
        through a reader that only reshapes (Flatten, Reshape, a pass-through), whose values
        are its input's, or zero-pads: an MLP's input is read by a Flatten that has no entry
        of its own, EfficientNetB0's by a ZeroPadding2D."""
        found = self.finder.range_exponent(name, "output")
        if found is not None:
            return found
        for user in self.consumers.get(name, []):
            if set(user.inputs) != {name}:  # read once, or several times (mha(x, x))
                continue
            found = self.finder.range_exponent(user.name, "input")
            if found is None and user.op in WEIGHT_OPS:
                found = self.finder.record_exponent(user.name)
            # a ZeroPadding2D adds zeros only: |max| and so the exponent are its input's
            # (EfficientNetB0: Rescaling -> Normalization -> ZeroPadding2D -> stem_conv)
            keeps = same_values(user) or user.kind in ZERO_PADDING_KINDS
            if found is None and keeps and user.name not in seen:
                found = self.found(user.name, seen | {name})
            if found is not None:
                return found
        return None

    def range_exp(self, lo: float, hi: float, what: str) -> int:
        """The exponent whose format covers ``[lo, hi]``."""
        try:
            return range_to_exponent(lo, hi, self.bits)
        except QuantError as err:
            raise ExportError(f"{what}: {err}") from None

    def quantize(self, x: np.ndarray, exp: int, dtype=None) -> np.ndarray:
        """``x`` as integers at ``exp`` with the target's rounding, saturated to ``dtype``."""
        info = np.iinfo(dtype or self.dtype)
        q = round_half(np.asarray(x, np.float64) * 2.0**-exp, self.half_even)
        return np.clip(q, info.min, info.max).astype(dtype or self.dtype)

    def requant(self, tensor: str, exp: int, reader: str, index: int) -> str:
        """``tensor`` at exponent ``exp`` (a RequantizeLinear node when it differs)."""
        if self.exps[tensor] == exp:
            return tensor
        name = f"{reader}/requantize_{index}"
        scale = self.init(f"{name}/scale", np.float32([2.0**exp]))
        zero = self.init(f"{name}/zero_point", np.zeros(1, self.dtype))
        self.tensor(
            name,
            exp,
            f"the exponent {reader!r} needs on all its inputs",
            self.shapes[tensor],
            self.ranges.get(tensor),
        )
        self.node(name, "RequantizeLinear", [tensor, scale, zero], [name])
        return name

    def out_exp(self, layer: SourceLayer, fallback: tuple[int, str], found=None):
        """(exponent, source, range) of ``layer``'s output: calibrated, else ``fallback``."""
        found = found or self.found(layer.name)
        if self.finder.is_zero_range(found):  # dead on the calibration data: the fallback
            out = self.finder.zero_runtime(layer.name, found, fallback[0], fallback[1])
            self.notes += self.finder.warnings
            self.finder.warnings.clear()
            return out
        if found is not None:
            return found
        return fallback[0], fallback[1], None

    def keep(self, layer, op, ins, shape, attrs=None, extra=()) -> None:
        """A node whose output keeps its input's exponent."""
        name = layer.name
        self.node(name, op, [ins[0], *extra], [name], attrs)
        x = ins[0]
        self.tensor(name, self.exps[x], f"the input's ({x!r})", shape, self.ranges.get(x))
        self.output(layer, name)

    def reshape(self, tensor: str, out: str, dims: list[int]) -> str:
        """``tensor`` read as ``dims`` (batch first, kept as 0): a Reshape node ``out``."""
        const = self.shape_init(f"{out}/shape", [0, *dims[1:]])
        self.node(out, "Reshape", [tensor, const], [out])
        src = f"the input's ({tensor!r})"
        return self.tensor(out, self.exps[tensor], src, dims, self.ranges.get(tensor))

    def table(self, op: str, attrs: dict, e_in: int, e_out: int, fn=None) -> str:
        """The lookup table of ``op``: int8, 256 entries, our simulation of the module's float
        path on -128..127; with ``fn`` (a float64 function) ``round(fn(x·2^e_in)·2^-e_out)``
        over every input (int8: 256 entries; int16: 65537, the ``LUT`` module's step 1)."""
        name = f"{op}_lut_{self.luts}"
        self.luts += 1
        if fn is not None:
            info = np.iinfo(self.dtype)
            x = np.arange(info.min, info.max + 1, dtype=np.float64)
            if self.bits == 16:  # 65536 / (size - 1) = step 1: the last entry is never read
                x = np.append(x, x[-1])
            with np.errstate(over="ignore", invalid="ignore"):
                y = fn(x * 2.0**e_in)
            return self.init(name, self.quantize(y, e_out), e_out)
        probe = EspdlModel(
            [Node("lut", op, ["x"], ["y"], {**attrs, "quant_type": "S8"})],
            {},
            inputs=[ValueInfo("x", [256], 3, [e_in])],
            outputs=[ValueInfo("y", [256], 3, [e_out])],
        )
        table = simulate_espdl(probe, np.arange(-128, 128, dtype=np.int8), self.target)
        return self.init(name, table.outputs["y"].astype(np.int8), e_out)
