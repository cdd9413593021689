"""Export a calibrated model as one ESP-DL v3 ``.espdl`` file (framework-free core).

Input: the model as :class:`~amct_bridge.espdl.source.SourceLayer` list (an adapter's
``source_layers``), the AMCT record and the calibration sidecar. Output: an
:class:`~amct_bridge.espdl.v3.model.EspdlModel`, written atomically with
:func:`~amct_bridge.espdl.v3.writer.write_espdl`, with embedded test values computed by
:func:`~amct_bridge.espdl.v3.simulate.simulate_espdl`.

What happens to each layer (:class:`V3Layer`, nothing vanishes):

- Conv2D / DepthwiseConv2D / Dense start a chain as in v1 (:mod:`amct_bridge.espdl.plan`):
  a following BatchNormalization is folded in, then a ReLU is fused (``activation: Relu``,
  the only activation the v3 Conv/Gemm kernels apply); any other activation becomes its own
  node after it. A ZeroPadding2D read only by a "valid" conv becomes the conv's pads.
- 1-D layers (``attrs["rank"] = 1``: Conv1D & co. as 2-D layers of height 1, on ``(N, W, C)``
  tensors) become the runtime's native 1-D ops: ``Conv`` with ``kernel_shape [k]`` and a filter
  ``[k, C, N]``, 1-D pools, ``Pad`` of a rank-3 tensor (esp-ppq's form; the simulator runs it).
- Activations (sigmoid, tanh, swish/silu, hard_sigmoid, hard_swish/hard_silu, leaky_relu,
  softmax, ReLU6 as ``Clip``), pools, Add, Subtract, Multiply, Concatenate, Flatten, Reshape,
  Permute, ZeroPadding2D, UpSampling2D (nearest) become the v3 op of the same meaning; int8
  sigmoid-like activations carry a 256-entry lookup table computed by our simulator.
- Dropout-like layers compute nothing (``passthrough``); a Rescaling / Normalization right
  after the model input is applied on the host when quantizing the input (``host``).
- Anything else is refused with its name and why (ExportError unless ``skip_unsupported``).

SourceLayer attrs read beyond v1's (:mod:`amct_bridge.espdl.source`), set by the adapters:
``activation`` of a Keras ``Activation`` (op ``unsupported`` for v1), ``axis`` of a Softmax,
``size`` / ``interpolation`` of an UpSampling2D, ``keepdims`` of a global pool, and
``scalar_operands`` (``[(position, value)]``) of a raw ``x + 3.0`` / ``x * c``. Layers are
recognised by ``op`` and ``kind`` (Keras class names; MindSpore cells by
:data:`CELL_ACTIVATIONS`).

Exponents (docs/espdl-v3.md): a tensor's exponent is the smallest power of two whose
symmetric int8/int16 range covers its calibrated range (the v1 rules and code,
:class:`~amct_bridge.espdl.exponents.ExponentFinder`). Add, Sub and Concat need one exponent
on all inputs and the output (the kernels add integers as they are): an input at another
exponent goes through a ``RequantizeLinear`` node. Weights are per tensor (auto exponent),
biases INT32 (INT64 for s16) at ``e_in + e_w``, and ``mac_shift = e_out - e_w - e_in >= 0``
is kept by raising ``e_out`` where needed (:func:`~amct_bridge.espdl.v3.exponents.keep_mac_shift`).

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
    >>> layers = [SourceLayer("x", "input", attrs={"shape": (4,)}),
    ...           SourceLayer("fc", "dense", ["x"], "Dense",
    ...                       {"kernel": np.full((4, 2), 0.5, np.float32)},
    ...                       {"model_output": True})]
    >>> st = CalibrationStats(layers={"fc": LayerStats("Dense", TensorRange(0, 1),
    ...                                                TensorRange(-2, 2))})
    >>> res = export_layers_v3(layers, None, stats=st, target="c")
    >>> [(n.op_type, n.name) for n in res.model.nodes], res.exponents["fc"][0]
    ([('Gemm', 'fc')], -5)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from amct_bridge.errors import ExportError, QuantError
from amct_bridge.espdl.checks import (
    as_float32,
    channel_vector,
    check_record_keys,
    check_sidecar_model,
    sidecar_of_another_record,
)
from amct_bridge.espdl.exponents import ExponentFinder
from amct_bridge.espdl.plan import Chain, Problem, consumers_map
from amct_bridge.espdl.source import (
    AVERAGE_KINDS,
    PASS_THROUGH,
    WEIGHT_OPS,
    ZERO_PADDING_KINDS,
    SourceLayer,
    zero_padding,
)
from amct_bridge.espdl.v3.exponents import (
    FIXED_RANGES,
    bias_bits,
    interval_bound,
    keep_mac_shift,
    preactivation_range,
)
from amct_bridge.espdl.v3.model import EspdlModel, Node, Tensor, ValueInfo, filter_file_order
from amct_bridge.espdl.v3.simulate import TARGETS, simulate_espdl
from amct_bridge.espdl.v3.writer import write_espdl
from amct_bridge.espdl.writer import check_output_path
from amct_bridge.quant.espdl import auto_exponent, range_to_exponent
from amct_bridge.quant.fold import fold_batchnorm
from amct_bridge.records.calibration import CalibrationStats
from amct_bridge.records.model import Record

__all__ = ["FEATURE_TYPES", "V3Layer", "V3ExportResult", "export_layers_v3", "check_options_v3"]

#: feature_type -> element bits.
FEATURE_TYPES = {"s8": 8, "s16": 16}

#: Framework activation names -> v3 op type (sigmoid-like ones get a LUT in int8 models).
ACTIVATION_OPS = {
    "sigmoid": "Sigmoid",
    "tanh": "Tanh",
    "swish": "Swish",
    "silu": "Swish",
    "hard_sigmoid": "HardSigmoid",
    "hard_swish": "HardSwish",
    "hard_silu": "HardSwish",
    "leaky_relu": "LeakyRelu",
    "relu": "Relu",
    "relu6": "Clip",
    "softmax": "Softmax",
}
_LUT_OPS = ("Sigmoid", "Tanh", "Swish", "HardSigmoid", "HardSwish")
#: MindSpore cell classes -> the activation names above.
CELL_ACTIVATIONS = {
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "SiLU": "silu",
    "HSigmoid": "hard_sigmoid",
    "HSwish": "hard_swish",
    "Softmax": "softmax",
}
_HOST_KINDS = ("Rescaling", "Normalization")


def check_options_v3(target: str, feature_type: str) -> int:
    """Refuse a target or feature type the v3 export does not know; returns the bits.

    Example:
        >>> check_options_v3("esp32s4", "s8")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: target 'esp32s4': expected one of esp32s3, esp32p4, c ...
    """
    if target not in TARGETS:
        import difflib

        close = difflib.get_close_matches(str(target), TARGETS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ExportError(
            f"target {target!r}: expected one of {', '.join(TARGETS)}{hint} (c: the generic "
            "C kernels of esp32, esp32s2, c3, c6 and the other chips)"
        )
    if feature_type not in FEATURE_TYPES:
        raise ExportError(f"feature_type {feature_type!r}: expected one of s8, s16")
    return FEATURE_TYPES[feature_type]


def _same_values(layer: SourceLayer) -> bool:
    """A layer whose output holds its input's values (so its range): reshapes, pass-throughs."""
    return layer.op == "runtime" and layer.kind in ("Flatten", "Reshape", *PASS_THROUGH)


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


@dataclass
class V3ExportResult:
    """The exported model, every layer's fate, tensor exponents with their source, notes.

    Example:
        >>> r = V3ExportResult(None, "c", "s8", EspdlModel([], {}), [V3Layer("d", "Dropout",
        ...                    "passthrough")])
        >>> r.skipped, r.warnings
        ([], [])
    """

    path: Path | None
    target: str
    feature_type: str
    model: EspdlModel
    layers: list[V3Layer]
    exponents: dict[str, tuple[int, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def skipped(self) -> list[Problem]:
        """Refused layers (left out with ``skip_unsupported``)."""
        return [
            Problem(x.name, x.kind, x.reason or "") for x in self.layers if x.status == "refused"
        ]

    @property
    def fused(self) -> dict[str, str]:
        """Fused layer -> the layer whose node computes it."""
        return {x.name: x.into for x in self.layers if x.status == "fused" and x.into}

    @property
    def warnings(self) -> list[str]:
        """Notes on exponents, saturation and host-side steps."""
        return list(self.notes)


def _check_links(layers: list[SourceLayer]) -> None:
    index: dict[str, int] = {}
    for i, layer in enumerate(layers):
        if layer.name in index:
            raise ExportError(f"layer {layer.describe()}: the name {layer.name!r} is used twice")
        index[layer.name] = i
    for i, layer in enumerate(layers):
        late = [x for x in layer.inputs if index.get(x, -1) >= i]
        if late:
            raise ExportError(
                f"layer {layer.describe()} reads {late[0]!r}, which does not come before it: "
                "SourceLayers must be in topological order"
            )


def _sole_consumer(layer: SourceLayer, consumers: dict) -> SourceLayer | None:
    users = consumers.get(layer.name, [])
    if len(users) == 1 and users[0].inputs == [layer.name] and not layer.attrs.get("model_output"):
        return users[0]
    return None


def _plan(layers: list[SourceLayer], skip_fusion) -> tuple[dict[str, Chain], dict[str, str]]:
    """Chains by head name, and fused layer -> head (v3 fuses BN and ReLU only)."""
    consumers = consumers_map(layers)
    by_name = {x.name: x for x in layers}
    chains: dict[str, Chain] = {}
    fused: dict[str, str] = {}
    for head in layers:
        if head.op not in WEIGHT_OPS:
            continue
        chain = Chain(head, members=[head.name])
        src = by_name.get(head.inputs[0]) if len(head.inputs) == 1 else None
        valid = str(head.attrs.get("padding", "valid")).lower() == "valid"
        if (
            head.op != "dense"
            and valid
            and not head.attrs.get("pads")
            and src is not None
            and src.kind in ZERO_PADDING_KINDS
            and src.op == "runtime"
            and len(src.inputs) == 1
            and _sole_consumer(src, consumers) is head
        ):
            chain.pad, chain.pads = src, zero_padding(src)
            fused[src.name] = head.name
        elif head.attrs.get("pads") is not None:
            chain.pads = [int(p) for p in head.attrs["pads"]]
        own = head.attrs.get("activation")
        if own is None:
            nxt = _sole_consumer(head, consumers)
            if nxt is not None and nxt.op == "batch_norm" and not skip_fusion(head.name):
                chain.bn = nxt
                chain.members.append(nxt.name)
                nxt = _sole_consumer(nxt, consumers)
            if nxt is not None and nxt.op == "relu":
                chain.act_layer, chain.activation = nxt, "Relu"
                chain.members.append(nxt.name)
        elif own == "relu":
            chain.activation = "Relu"
        for member in chain.members[1:]:
            fused[member] = head.name
        chains[head.name] = chain
    return chains, fused


def _sidecar_strangers(layers: list[SourceLayer], stats: CalibrationStats) -> list[str]:
    """A note when sidecar entries name no layer (a sidecar of another model gives its ranges
    to nobody; the layers fall back to bounds)."""
    names = {x.name for x in layers} | {x.name.split("@")[0] for x in layers}
    strangers = [
        key
        for key, entry in stats.layers.items()
        if key not in names and key.split("/")[0] not in names
        and "BatchNorm" not in (entry.kind or "")  # a BN folded away by strip_qat
    ]  # fmt: skip
    if not strangers:
        return []
    more = f" and {len(strangers) - 5} more" if len(strangers) > 5 else ""
    listing = ", ".join(repr(k) for k in strangers[:5])
    return [
        f"sidecar entries name no layer of this model: {listing}{more}; their ranges are not "
        "used (is the sidecar of another model?)"
    ]


def _round(x: np.ndarray, half_even: bool) -> np.ndarray:
    if half_even:
        return np.rint(x)
    return np.floor(x + 0.5)


def _same_pads(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int, int]:
    """TF/Keras "same": (output size, pad before, pad after); the extra pad goes after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return out, total // 2, total - total // 2


def _pair(value, default: int) -> tuple[int, int]:
    if value is None:
        return default, default
    if isinstance(value, int):
        return value, value
    vals = [int(v) for v in value]
    return (vals[0], vals[0]) if len(vals) == 1 else (vals[-2], vals[-1])


class _Emitter:
    def __init__(self, layers, record, stats, bits, target, chains, fused) -> None:
        self.layers = layers
        self.by_name = {x.name: x for x in layers}
        self.consumers = consumers_map(layers)
        self.finder = ExponentFinder(layers, record, stats, bits=bits)
        self.bits, self.target = bits, target
        self.half_even = target == "esp32p4"
        self.dtype = np.dtype(np.int8 if bits == 8 else np.int16)
        self.elem = 3 if bits == 8 else 5
        self.quant = "S8" if bits == 8 else "S16"
        self.chains, self.fused = chains, fused
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

    # --- bookkeeping

    def _tensor(self, name, exp, source, shape, rng=None, elem=None) -> str:
        self.exps[name] = int(exp)
        self.sources[name] = (int(exp), source)
        self.shapes[name] = [int(s) for s in shape]
        if rng is not None:
            self.ranges[name] = (float(rng[0]), float(rng[1]))
        self.infos[name] = ValueInfo(name, list(self.shapes[name]), elem or self.elem, [int(exp)])
        return name

    def _node(self, name, op, inputs, outputs, attrs=None) -> None:
        attributes = dict(attrs or {})
        attributes["quant_type"] = self.quant
        self.nodes.append(Node(name, op, list(inputs), list(outputs), attributes))

    def _init(self, name, data, exp=0, doc="UNK") -> str:
        data = np.asarray(data)
        if data.ndim == 0:
            data = data.reshape(1)  # the loader crashes on empty dims
        self.inits[name] = Tensor(name, data, [int(exp)], f"layout ==> {doc}")
        return name

    def done(self, layer: SourceLayer, status: str, nodes=(), into=None, reason=None) -> None:
        self.report[layer.name] = V3Layer(
            layer.name, layer.kind or layer.op, status, list(nodes), into, reason
        )

    def refuse(self, layer: SourceLayer, reason: str) -> None:
        self.done(layer, "refused", reason=reason)

    def _range_of(self, tensor: str) -> tuple[float, float]:
        if tensor in self.ranges:
            return self.ranges[tensor]
        top = (2 ** (self.bits - 1) - 1) * 2.0 ** self.exps[tensor]
        return -top, top

    def _found(self, name: str, seen: frozenset[str] = frozenset()):
        """(exponent, source, range) of layer ``name``'s output from the sidecar / record;
        through a reader that only reshapes (Flatten, Reshape, a pass-through), whose values
        are its input's, or zero-pads: an MLP's input is read by a Flatten that has no entry
        of its own, EfficientNetB0's by a ZeroPadding2D."""
        found = self.finder.range_exponent(name, "output")
        if found is not None:
            return found
        for user in self.consumers.get(name, []):
            if user.inputs != [name]:
                continue
            found = self.finder.range_exponent(user.name, "input")
            if found is None and user.op in WEIGHT_OPS:
                found = self.finder.record_exponent(user.name)
            # a ZeroPadding2D adds zeros only: |max| and so the exponent are its input's
            # (EfficientNetB0: Rescaling -> Normalization -> ZeroPadding2D -> stem_conv)
            keeps = _same_values(user) or user.kind in ZERO_PADDING_KINDS
            if found is None and keeps and user.name not in seen:
                found = self._found(user.name, seen | {name})
            if found is not None:
                return found
        return None

    def _range_exp(self, lo: float, hi: float, what: str) -> int:
        try:
            return range_to_exponent(lo, hi, self.bits)
        except QuantError as err:
            raise ExportError(f"{what}: {err}") from None

    def _quantize(self, x: np.ndarray, exp: int, dtype) -> np.ndarray:
        info = np.iinfo(dtype)
        q = _round(np.asarray(x, np.float64) * 2.0**-exp, self.half_even)
        return np.clip(q, info.min, info.max).astype(dtype)

    def _requant(self, tensor: str, exp: int, reader: str, index: int) -> str:
        """``tensor`` at exponent ``exp`` (a RequantizeLinear node when it differs)."""
        if self.exps[tensor] == exp:
            return tensor
        name = f"{reader}/requantize_{index}"
        scale = self._init(f"{name}/scale", np.float32([2.0**exp]))
        zero = self._init(f"{name}/zero_point", np.zeros(1, self.dtype))
        self._tensor(
            name,
            exp,
            f"the exponent {reader!r} needs on all its inputs",
            self.shapes[tensor],
            self.ranges.get(tensor),
        )
        self._node(name, "RequantizeLinear", [tensor, scale, zero], [name])
        return name

    # --- dispatch

    def emit(self, layer: SourceLayer) -> None:
        if layer.name in self.fused:
            head = self.fused[layer.name]
            self.done(layer, "fused", into=head)
            if self.chains[head].pad is layer and layer.inputs[0] in self.tensor_of:
                self.tensor_of[layer.name] = self.tensor_of[layer.inputs[0]]  # pads of the conv
            return
        if layer.op == "input":
            self._input(layer)
            return
        missing = [x for x in layer.inputs if x not in self.tensor_of]
        if missing:
            why = self.report.get(missing[0])
            if why is not None and why.reason and not why.reason.startswith("reads "):
                detail = f" (refused: {why.reason})"
            else:
                detail = " (refused)"
            self.refuse(layer, f"reads {missing[0]!r}, which is not exported{detail}")
            return
        start = len(self.nodes)
        self._dispatch(layer, [self.tensor_of[x] for x in layer.inputs])
        entry = self.report.get(layer.name)
        if entry is not None and entry.status == "exported":
            entry.nodes = [n.name for n in self.nodes[start:]]

    def _dispatch(self, layer: SourceLayer, ins: list[str]) -> None:
        kind = layer.kind
        if layer.op in WEIGHT_OPS:
            self._chain(self.chains[layer.name], ins[0])
        elif layer.op == "relu":
            self._activation(layer, "relu", ins[0])
        elif layer.op == "leaky_relu":
            self._activation(layer, "leaky_relu", ins[0], alpha=layer.attrs.get("alpha"))
        elif layer.op == "relu6":
            self._activation(layer, "relu6", ins[0])
        elif layer.op == "batch_norm":
            self._batch_norm(layer, ins[0])
        elif layer.op == "prelu":
            self._prelu(layer, ins[0])
        elif kind in PASS_THROUGH and layer.op == "runtime":
            self.tensor_of[layer.name] = ins[0]
            self.done(layer, "passthrough")
        elif kind == "Activation" and layer.attrs.get("activation") in ACTIVATION_OPS:
            self._activation(layer, layer.attrs["activation"], ins[0])
        elif kind == "Activation" and layer.attrs.get("activation") in (None, "linear"):
            self.tensor_of[layer.name] = ins[0]
            self.done(layer, "passthrough")
        elif kind in ("Softmax", *CELL_ACTIVATIONS):
            act = CELL_ACTIVATIONS.get(kind, "softmax")
            axis = layer.attrs.get("axis", -1)
            if not isinstance(axis, int):
                self.refuse(layer, f"softmax axis {axis!r} has no channel-last equivalent")
                return
            self._activation(layer, act, ins[0], axis=axis)
        elif kind in _HOST_KINDS and len(layer.inputs) == 1 and layer.inputs[0] in self.host:
            self.host.append(layer.name)
            self.tensor_of[layer.name] = ins[0]
            self.done(layer, "host")
            self.notes.append(
                f"layer {layer.name!r} ({kind}) runs on the host: it is applied before the "
                "input is quantized (the .espdl input is its output)"
            )
        else:
            handler = _RUNTIME.get(kind)
            if handler is None:
                self.refuse(layer, _no_handler(layer))
                return
            handler(self, layer, ins)

    # --- layers

    def _input(self, layer: SourceLayer) -> None:
        shape = [1, *[int(s) for s in layer.attrs.get("shape") or ()]]
        probe, seen = layer.name, {layer.name}
        while True:  # host preprocessing: the chip input is its output
            users = self.consumers.get(probe, [])
            if len(users) == 1 and users[0].kind in _HOST_KINDS and users[0].name not in seen:
                probe = users[0].name
                seen.add(probe)
                continue
            break
        found = self._found(probe)
        if found is None:
            readers = ", ".join(
                f"{u.name!r} ({u.kind or u.op})" for u in self.consumers.get(probe, [])
            )
            raise ExportError(
                f"model input {layer.name!r}: no calibrated range for it (no sidecar input "
                "range of a layer reading it, no record scale_d): pass the calibration sidecar"
                + (
                    f"; the layers reading it ({readers}) have neither: were they calibrated "
                    "(a layer the calibration does not quantize gets no entry)?"
                    if readers
                    else ""
                )
            )
        self._tensor(layer.name, found[0], found[1], shape, found[2])
        self.tensor_of[layer.name] = layer.name
        self.inputs.append(layer.name)
        self.host.append(layer.name)
        self.done(layer, "exported")

    def _weights(self, chain: Chain) -> tuple[np.ndarray, np.ndarray | None]:
        """Folded float64 filter as [N, kh, kw, C] and bias [N] (or None)."""
        head = chain.head
        kernel = head.weights.get("kernel")
        if kernel is None:
            raise ExportError(f"layer {head.name!r}: no kernel weights")
        kernel = as_float32(kernel, head.name, "kernel").astype(np.float64)
        if head.op == "dense":
            kernel = kernel.reshape(1, 1, *kernel.shape)
        if kernel.ndim != 4:
            raise ExportError(f"layer {head.name!r}: kernel of shape {kernel.shape}, expected 4-D")
        depthwise = head.op == "depthwise_conv2d"
        bias = head.weights.get("bias")
        if bias is not None:
            bias = as_float32(bias, head.name, "bias").astype(np.float64)
        if chain.bn is not None:
            w = chain.bn.weights
            if "mean" not in w or "variance" not in w:
                raise ExportError(f"layer {chain.bn.name!r}: BatchNormalization without stats")
            params = {k: as_float32(v, chain.bn.name, f"BN {k}") for k, v in w.items()}
            try:
                kernel, bias = fold_batchnorm(
                    kernel,
                    bias,
                    params.get("gamma"),
                    params.get("beta"),
                    params["mean"],
                    params["variance"],
                    float(chain.bn.attrs.get("epsilon", 1e-3)),
                    "HWCM" if depthwise else "HWIO",
                    name=chain.bn.name,
                )
            except QuantError as err:
                raise ExportError(f"layer {chain.bn.name!r}: cannot fold: {err}") from None
            kernel = np.asarray(kernel, np.float64)
        if depthwise:
            return kernel.transpose(2, 0, 1, 3), bias  # (H, W, C, 1) -> (C, H, W, 1)
        return kernel.transpose(3, 0, 1, 2), bias  # HWIO -> (O, H, W, I)

    def _conv_geometry(self, chain: Chain, shape: list[int], kh: int, kw: int):
        head = chain.head
        sh, sw = _pair(head.attrs.get("strides"), 1)
        h, w = shape[1], shape[2]
        if chain.pads is not None:
            top, bottom, left, right = chain.pads
        elif str(head.attrs.get("padding", "valid")).lower() == "same":
            _, top, bottom = _same_pads(h, kh, sh)
            _, left, right = _same_pads(w, kw, sw)
        else:
            top = bottom = left = right = 0
        ho = (h + top + bottom - kh) // sh + 1
        wo = (w + left + right - kw) // sw + 1
        return [top, left, bottom, right], [sh, sw], ho, wo

    def _chain(self, chain: Chain, x: str) -> None:
        head = chain.head
        w, bias = self._weights(chain)
        n, kh, kw, c = w.shape
        in_shape = self.shapes[x]
        e_in = self.exps[x]
        # a 1-D conv (NWC input): the 2-D conv of height 1 it was given as, written as the
        # runtime's native 1-D Conv (esp-ppq's form: kernel_shape [k], filter [k, C, N])
        one_d = head.op != "dense" and len(in_shape) == 3
        if one_d and kh != 1:
            raise ExportError(
                f"layer {head.name!r}: kernel of height {kh} on a 1-D input {in_shape}"
            )
        depthwise = head.op == "depthwise_conv2d"
        if depthwise and int(head.attrs.get("depth_multiplier", 1)) != 1:
            self.refuse(head, "depth_multiplier > 1: the v3 runtime's depthwise conv has one")
            return
        if depthwise and n != in_shape[-1] or not depthwise and c != in_shape[-1]:
            raise ExportError(
                f"layer {head.name!r}: filter for {c if not depthwise else n} input channels, "
                f"input has {in_shape[-1]}"
            )
        own = head.attrs.get("activation")
        separate = own if own not in (None, "relu") else None
        if separate is not None and separate not in ACTIVATION_OPS:
            self.refuse(head, f"activation {separate!r}: no ESP-DL v3 op for it here")
            return
        try:
            e_w = auto_exponent(w, self.bits, name=f"{head.name} filter")
        except QuantError as err:
            raise ExportError(f"layer {head.name!r}: {err}") from None
        limit = 2 ** (bias_bits(self.target, self.bits) - 1) - 1
        if bias is not None:
            peak = float(np.abs(bias).max(initial=0.0))
            while peak * 2.0 ** -(e_in + e_w) > limit:  # keep the bias inside its lanes
                e_w += 1
                self.notes.append(
                    f"layer {head.name!r}: filter exponent raised to {e_w} so the bias fits "
                    f"{bias_bits(self.target, self.bits)} bits on {self.target}"
                )
        # output range: after the fused activation, else the separate activation's input
        try:
            found = self.finder.output_exponent(chain)
        except ExportError:
            if separate is None or separate not in FIXED_RANGES:
                raise
            lo, hi = FIXED_RANGES[separate]
            found = (self._range_exp(lo, hi, head.name), f"the range of {separate}", (lo, hi))
        self.notes += self.finder.warnings
        self.finder.warnings.clear()
        flat = w.reshape(n, -1)
        x_lo, x_hi = self._range_of(x)
        bound = interval_bound(flat, bias, x_lo, x_hi)  # depthwise: [N, kh*kw], one channel
        if separate is not None:
            shift = float(np.abs(bias).max(initial=0.0)) if bias is not None else 0.0
            pre = preactivation_range(separate, found[2], bound, shift)
            if separate == "softmax":
                self.notes.append(
                    f"layer {head.name!r}: the range of its logits (before softmax) is estimated "
                    f"from the calibrated probabilities ({pre[0]:.3g}..{pre[1]:.3g}; the "
                    "sidecar holds the softmax output only): for a measured range, end the "
                    "model with Dense(activation=None) and a Softmax layer"
                )
            e_out = self._range_exp(*pre, head.name)
            out_src = f"pre-activation range of {separate} (from {found[1]})"
            out_rng = pre
        else:
            e_out, out_src, out_rng = found
        e_out, raised = keep_mac_shift(e_in, e_w, e_out)
        if raised:
            out_src += f"; raised to {e_out} for mac_shift >= 0 (e_in {e_in} + e_w {e_w})"
        wq = self._quantize(w, e_w, self.dtype)
        stored, note = filter_file_order(
            wq[:, 0] if one_d else wq, n if depthwise else 1, self.target
        )
        name = head.name
        fname = self._init(f"{name}/filter", stored, e_w, note)
        inputs = [x, fname]
        if bias is not None:
            bdt = np.int32 if self.bits == 8 else np.int64
            bq = self._quantize(bias, e_in + e_w, bdt)
            bq = np.clip(bq, -limit - 1, limit).astype(bdt)
            inputs.append(self._init(f"{name}/bias", bq, e_in + e_w))
        out_name = f"{name}/linear" if separate is not None else chain.last
        act = "Relu" if chain.activation == "Relu" else "Linear"
        if head.op == "dense":
            shape = [*in_shape[:-1], n]
            attrs = {"activation": act, "alpha": 1.0, "beta": 1.0, "transB": 0}
            self._node(name, "Gemm", inputs, [out_name], attrs)
        elif one_d:
            b, width, _ = in_shape
            pads, strides, _, wo = self._conv_geometry(chain, [b, 1, width, in_shape[2]], kh, kw)
            shape = [b, wo, n]
            attrs = {
                "activation": act,
                "dilations": [1],
                "group": n if depthwise else 1,
                "kernel_shape": [kw],
                "pads": [pads[1], pads[3]],  # ONNX 1-D [begin, end]: left, right
                "strides": [strides[1]],
            }
            self._node(name, "Conv", inputs, [out_name], attrs)
        else:
            pads, strides, ho, wo = self._conv_geometry(chain, in_shape, kh, kw)
            shape = [in_shape[0], ho, wo, n]
            attrs = {
                "activation": act,
                "dilations": [1, 1],
                "group": n if depthwise else 1,
                "kernel_shape": [kh, kw],
                "pads": pads,
                "strides": strides,
            }
            self._node(name, "Conv", inputs, [out_name], attrs)
        self._tensor(out_name, e_out, out_src, shape, out_rng)
        if separate is not None:
            self._activation(
                head,
                separate,
                out_name,
                alpha=head.attrs.get("alpha"),
                found=found,
                node=f"{name}/{separate}",  # node names are unique: the Conv/Gemm is 'name'
            )
        else:
            self.tensor_of[chain.last] = out_name
            self.done(head, "exported", [name])

    def _out_exp(self, layer: SourceLayer, fallback: tuple[int, str], found=None):
        found = found or self._found(layer.name)
        if self.finder.is_zero_range(found):  # dead on the calibration data: the fallback
            out = self.finder.zero_runtime(layer.name, found, fallback[0], fallback[1])
            self.notes += self.finder.warnings
            self.finder.warnings.clear()
            return out
        if found is not None:
            return found
        return fallback[0], fallback[1], None

    def _activation(self, layer, act, x, *, alpha=None, axis=-1, found=None, node=None) -> None:
        op = ACTIVATION_OPS[act]
        e_in = self.exps[x]
        shape = self.shapes[x]
        name = layer.name
        node = node or name
        if op == "Softmax":
            self._softmax(layer, x, axis, node)
            return
        if op == "Relu":
            self._node(node, "Relu", [x], [name])
            lo, hi = self._range_of(x)
            self._tensor(name, e_in, f"the input's ({x!r}): Relu keeps it", shape, (0.0, hi))
        elif op == "Clip":
            top = min(6.0, self._range_of(x)[1])
            fb = (self._range_exp(0.0, top, name), "the ReLU6 range [0, min(6, input max)]")
            if top <= 0.0:  # an input never above 0: its exponent, not 0
                fb = (e_in, f"the input's ({x!r})")
            e_out, src, rng = self._out_exp(layer, fb, found)
            info = np.iinfo(self.dtype)
            high = int(min(info.max, _round(np.float64(6.0 * 2.0**-e_in), self.half_even)))
            lo_t = self._init(f"{name}/min", np.zeros(1, self.dtype), e_in)
            hi_t = self._init(f"{name}/max", np.array([high], self.dtype), e_in)
            self._node(node, "Clip", [x, lo_t, hi_t], [name])
            self._tensor(name, e_out, src, shape, rng)
        else:
            fixed = FIXED_RANGES.get(act)
            fb = (
                (self._range_exp(*fixed, name), f"the range of {act} {fixed}")
                if fixed
                else (
                    e_in,
                    f"the input's ({x!r})",
                )
            )
            e_out, src, rng = self._out_exp(layer, fb, found)
            attrs = {}
            if op == "LeakyRelu":
                attrs["alpha"] = float(0.2 if alpha is None else alpha)
            if op == "HardSigmoid":
                attrs.update(alpha=1.0 / 6.0, beta=0.5)  # Keras: relu6(x + 3) / 6
            self._tensor(name, e_out, src, shape, rng)
            if op in _LUT_OPS and self.bits == 8:
                attrs["lut"] = self._lut(op, attrs, e_in, e_out)
            self._node(node, op, [x], [name], attrs)
        self.tensor_of[layer.name] = name
        self.done(layer, "exported", [name])

    def _batch_norm(self, layer: SourceLayer, x: str) -> None:
        """A BatchNormalization that folds into no conv (pre-activation blocks, skip_fusion):
        ``Mul`` by the per-channel scale, then ``Add`` of the per-channel shift."""
        w = layer.weights
        if "mean" not in w or "variance" not in w:
            raise ExportError(f"layer {layer.describe()}: BatchNormalization without stats")
        channels = self.shapes[x][-1]
        mean = channel_vector(w["mean"], channels, layer.name, "BN mean").astype(np.float64)
        var = channel_vector(w["variance"], channels, layer.name, "BN variance")
        gamma = channel_vector(w.get("gamma", np.ones(1)), channels, layer.name, "BN gamma")
        beta = channel_vector(w.get("beta", np.zeros(1)), channels, layer.name, "BN beta")
        eps = float(layer.attrs.get("epsilon", 1e-3))
        if np.any(var.astype(np.float64) + eps <= 0):
            raise ExportError(f"layer {layer.describe()}: variance + epsilon <= 0")
        scale = gamma / np.sqrt(var.astype(np.float64) + eps)
        shift = beta - mean * scale
        x_reach = max(map(abs, self._range_of(x)))
        reach = float(np.abs(scale).max() * x_reach + np.abs(shift).max())
        fallback = (self._range_exp(-reach, reach, layer.name), "bound of the folded BN")
        e_out, src, rng = self._out_exp(layer, fallback)
        name = layer.name
        s_exp = auto_exponent(scale, self.bits, name=f"{name} scale")
        s_t = self._init(f"{name}/scale", self._quantize(scale, s_exp, self.dtype), s_exp)
        t_t = self._init(f"{name}/shift", self._quantize(shift, e_out, self.dtype), e_out)
        self._node(f"{name}/mul", "Mul", [x, s_t], [f"{name}/scaled"])
        self._tensor(f"{name}/scaled", e_out, src, self.shapes[x], rng)
        self._node(name, "Add", [f"{name}/scaled", t_t], [name])
        self._tensor(name, e_out, src, self.shapes[x], rng)
        self.tensor_of[name] = name
        self.done(layer, "exported")

    def _prelu(self, layer: SourceLayer, x: str) -> None:
        """``PRelu`` at the input's exponent: the c kernel copies x >= 0 as it is."""
        if self.target == "esp32p4":
            self.refuse(
                layer,
                "PReLU on esp32p4: the rounding of its esp.vprelu kernel is not known here, so "
                "the simulator (and this export) does not take it; use esp32s3 or c",
            )
            return
        if "alpha" not in layer.weights:
            raise ExportError(f"layer {layer.describe()}: PReLU without alpha weights")
        channels = self.shapes[x][-1]
        alpha = channel_vector(layer.weights["alpha"], channels, layer.name, "PReLU alpha")
        e_alpha = auto_exponent(alpha, self.bits, name=f"{layer.name} alpha")
        slope = self._init(
            f"{layer.name}/alpha", self._quantize(alpha, e_alpha, self.dtype), e_alpha
        )
        self._node(layer.name, "PRelu", [x, slope], [layer.name])
        e_in = self.exps[x]
        self._tensor(layer.name, e_in, f"the input's ({x!r})", self.shapes[x], self.ranges.get(x))
        self.tensor_of[layer.name] = layer.name
        self.done(layer, "exported")

    def _lut(self, op: str, attrs: dict, e_in: int, e_out: int) -> str:
        """The int8 table of ``op``: our simulation of the module's float path on -128..127."""
        probe = EspdlModel(
            [Node("lut", op, ["x"], ["y"], {**attrs, "quant_type": "S8"})],
            {},
            inputs=[ValueInfo("x", [256], 3, [e_in])],
            outputs=[ValueInfo("y", [256], 3, [e_out])],
        )
        table = simulate_espdl(probe, np.arange(-128, 128, dtype=np.int8), self.target)
        name = f"{op}_lut_{self.luts}"
        self.luts += 1
        return self._init(name, table.outputs["y"].astype(np.int8), e_out)

    def _softmax(self, layer, x, axis, node) -> None:
        name = layer.name
        shape = self.shapes[x]
        axis = int(axis) % len(shape)
        readers = self.consumers.get(name, [])
        out = name if not readers else f"{name}/float"
        self._node(node, "Softmax", [x], [out], {"axis": axis})
        self._tensor(out, 0, "float32 output (Softmax)", shape, (0.0, 1.0), elem=1)
        nodes = [name]
        if readers:  # later layers read integers: quantize the probabilities
            e_out, src, rng = self._out_exp(layer, (self._range_exp(0, 1, name), "[0, 1]"))
            self._node(f"{name}/quantize", "QuantizeLinear", [out], [name])
            self._tensor(name, e_out, src, shape, rng)
            nodes.append(f"{name}/quantize")
        self.tensor_of[name] = name
        self.done(layer, "exported", nodes)

    def keep(self, layer, op, ins, shape, attrs=None, extra=()) -> None:
        """A node whose output keeps its input's exponent."""
        name = layer.name
        self._node(name, op, [ins[0], *extra], [name], attrs)
        x = ins[0]
        self._tensor(name, self.exps[x], f"the input's ({x!r})", shape, self.ranges.get(x))
        self.tensor_of[name] = name
        self.done(layer, "exported", [name])


def _no_handler(layer: SourceLayer) -> str:
    """Why a layer has no v3 export, in v3 terms: the adapter's ``problems`` (a dilated or
    grouped conv) or its kind; an adapter's ESP-DL v1 reason only when it gives nothing else.

    Example:
        >>> _no_handler(SourceLayer("c", "unsupported", [], "Conv2D",
        ...                         attrs={"problems": ["dilation (2, 2)"]}))
        'Conv2D with dilation (2, 2): not supported by the ESP-DL v3 exporter'
    """
    kind = layer.kind or layer.op
    if layer.attrs.get("problems"):
        problems = ", ".join(layer.attrs["problems"])
        return f"{kind} with {problems}: not supported by the ESP-DL v3 exporter"
    reason = layer.attrs.get("reason")
    if reason and "ESP-DL v3" in reason:  # worded for v3 by the adapter (no_equivalent)
        return reason
    return f"no ESP-DL v3 export for {kind}: {reason or 'not exported'}"


def _pool_geometry(em: _Emitter, layer: SourceLayer, shape: list[int]):
    if len(shape) == 3:  # a 1-D pool (NWC): its height-1 twin's geometry, as a 1-D node
        attrs, out = _pool_geometry(em, layer, [shape[0], 1, shape[1], shape[2]])
        if out[1] != 1 or attrs["kernel_shape"][0] != 1:
            raise ExportError(f"layer {layer.describe()}: a 2-D pool on a 1-D input {shape}")
        top, left, bottom, right = attrs["pads"]
        attrs.update(
            kernel_shape=attrs["kernel_shape"][1:],
            pads=[left, right],
            strides=attrs["strides"][1:],
        )
        return attrs, [out[0], out[2], out[3]]
    kh, kw = _pair(layer.attrs.get("pool_size"), 2)
    sh, sw = _pair(layer.attrs.get("strides") or (kh, kw), 1)
    h, w = shape[1], shape[2]
    if str(layer.attrs.get("padding", "valid")).lower() == "same":
        ho, top, bottom = _same_pads(h, kh, sh)
        wo, left, right = _same_pads(w, kw, sw)
    else:
        top = bottom = left = right = 0
        ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
    attrs = {
        "ceil_mode": 0,
        "kernel_shape": [kh, kw],
        "pads": [top, left, bottom, right],
        "strides": [sh, sw],
    }
    return attrs, [shape[0], ho, wo, shape[3]]


def _layer_norm(em: _Emitter, layer: SourceLayer, ins: list[str]) -> None:
    """``LayerNormalization`` (dl_module_layer_normalization.hpp): the runtime computes it in
    float32 from the integers; gamma and beta are tensors of the feature type, each at its
    own exponent; the output at the calibrated exponent."""
    if "axis" not in layer.attrs:  # the adapter found no chip equivalent; it says why
        em.refuse(layer, f"no ESP-DL v3 export for {layer.kind}: {layer.attrs.get('reason')}")
        return
    x = ins[0]
    shape = em.shapes[x]
    rank = len(shape)
    axes = sorted(int(a) % rank for a in layer.attrs["axis"])
    if layer.attrs.get("rms_scaling"):
        em.refuse(layer, "LayerNormalization with rms_scaling: the runtime subtracts the mean")
        return
    if not axes or axes[0] == 0 or axes != list(range(axes[0], rank)):
        em.refuse(
            layer,
            f"LayerNormalization over axes {layer.attrs.get('axis')}: the runtime normalizes "
            "over the trailing axes from one axis to the last",
        )
        return
    inner = int(np.prod(shape[axes[0] :]))
    inputs, peak = [x], 0.0
    for key in ("gamma", "beta"):
        value = layer.weights.get(key)
        if value is None:
            if key == "gamma" and "beta" in layer.weights:
                value = np.ones(inner)  # the runtime takes beta as the third input only
            else:
                continue
        value = np.asarray(value, np.float64).reshape(-1)
        if value.size != inner:
            raise ExportError(
                f"layer {layer.describe()}: {key} has {value.size} values, expected {inner}"
            )
        e = auto_exponent(value, em.bits, name=f"{layer.name} {key}")
        inputs.append(em._init(f"{layer.name}/{key}", em._quantize(value, e, em.dtype), e))
        peak += float(np.max(np.abs(value))) * (np.sqrt(inner) if key == "gamma" else 1.0)
    if len(inputs) == 1:
        peak = float(np.sqrt(inner))
    # |(x - mean) / std| <= sqrt(n - 1): the bound when nothing was calibrated
    fallback = (em._range_exp(-peak, peak, layer.name), "the normalized bound")
    e, src, rng = em._out_exp(layer, fallback)
    attrs = {"axis": axes[0], "epsilon": float(layer.attrs.get("epsilon", 1e-3)), "stash_type": 1}
    em._node(layer.name, "LayerNormalization", inputs, [layer.name], attrs)
    em._tensor(layer.name, e, src, shape, rng)
    em.tensor_of[layer.name] = layer.name
    em.done(layer, "exported", [layer.name])


def _maxpool(em: _Emitter, layer: SourceLayer, ins: list[str]) -> None:
    attrs, shape = _pool_geometry(em, layer, em.shapes[ins[0]])
    attrs["dilations"] = [1] * len(attrs["kernel_shape"])
    em.keep(layer, "MaxPool", ins, shape, attrs)


def _avgpool(em: _Emitter, layer: SourceLayer, ins: list[str]) -> None:
    attrs, shape = _pool_geometry(em, layer, em.shapes[ins[0]])
    if any(attrs["pads"]):
        em.refuse(
            layer,
            "AveragePooling2D with 'same' padding that pads: the v3 runtime's AveragePool "
            "reads no count_include_pad and divides by the whole kernel at the borders "
            "(dl_module_average_pool.hpp, dl_base_pool2d.hpp avg_pool_area), Keras by the "
            "real cells only (use 'valid' padding)",
        )
        return
    attrs["count_include_pad"] = 1
    x = ins[0]
    e, src, rng = em._out_exp(layer, (em.exps[x], f"the input's ({x!r})"))
    em._node(layer.name, "AveragePool", [x], [layer.name], attrs)
    em._tensor(layer.name, e, src, shape, rng)
    em.tensor_of[layer.name] = layer.name
    em.done(layer, "exported", [layer.name])


def _global_pool(em: _Emitter, layer: SourceLayer, ins: list[str]) -> None:
    x = ins[0]
    shape = em.shapes[x]
    keep = bool(layer.attrs.get("keepdims", True))
    name = layer.name
    pooled = name if keep else f"{name}/pool"
    spatial = shape[1:-1]  # [H, W], or [W] of a 1-D (NWC) input
    if layer.kind in AVERAGE_KINDS:
        e, src, rng = em._out_exp(layer, (em.exps[x], f"the input's ({x!r})"))
        em._node(name, "GlobalAveragePool", [x], [pooled])
    else:  # the runtime has no GlobalMaxPool: a MaxPool over the whole map
        e, src, rng = em.exps[x], f"the input's ({x!r})", em.ranges.get(x)
        attrs = {
            "ceil_mode": 0,
            "dilations": [1] * len(spatial),
            "kernel_shape": list(spatial),
            "pads": [0] * (2 * len(spatial)),
            "strides": [1] * len(spatial),
        }
        em._node(name, "MaxPool", [x], [pooled], attrs)
    em._tensor(pooled, e, src, [shape[0], *[1] * len(spatial), shape[-1]], rng)
    nodes = [name]
    if not keep:
        em._node(f"{name}/flatten", "Flatten", [pooled], [name], {"axis": 1})
        em._tensor(name, e, src, [shape[0], shape[-1]], rng)
        nodes.append(f"{name}/flatten")
    em.tensor_of[name] = name
    em.done(layer, "exported", nodes)


def _broadcast(em: _Emitter, layer: SourceLayer, ins: list[str]) -> list[int] | None:
    try:
        return list(np.broadcast_shapes(*(tuple(em.shapes[t]) for t in ins)))
    except ValueError:
        em.refuse(layer, f"inputs of shapes {[em.shapes[t] for t in ins]} do not broadcast")
        return None


def _operands(layer: SourceLayer, ins: list[str]) -> list[tuple[str | None, float]]:
    """(tensor, None) or (None, scalar) per operand, in the call's order (``x + 3.0``)."""
    scalars = {int(i): float(v) for i, v in layer.attrs.get("scalar_operands") or []}
    tensors = iter(ins)
    return [
        (None, scalars[i]) if i in scalars else (next(tensors), 0.0)
        for i in range(len(ins) + len(scalars))
    ]


def _constant(em: _Emitter, name: str, value: float, exp: int | None = None) -> str:
    """A scalar operand as a one-element integer initializer (its own exponent if None)."""
    if exp is None:
        exp = auto_exponent([value], em.bits, name=name)
    return em._init(name, em._quantize(np.array([value]), exp, em.dtype), exp)


def _add_sub(em: _Emitter, layer: SourceLayer, ins: list[str]) -> None:
    operands = _operands(layer, ins)
    if len(operands) < 2:
        em.refuse(layer, f"{layer.kind} of {len(operands)} operand(s): not exported")
        return
    shape = _broadcast(em, layer, ins)
    if shape is None:
        return
    reach = sum(max(map(abs, em._range_of(t))) if t else abs(c) for t, c in operands)
    fallback = (
        em._range_exp(-reach, reach, layer.name),
        "bound of the operands' ranges (no calibrated range)",
    )
    if reach == 0.0:  # operands all 0 on the calibration data: keep their exponent, not 0
        fallback = (max(em.exps[t] for t, _ in operands if t), "the operands' largest exponent")
    e, src, rng = em._out_exp(layer, fallback)
    op = "Add" if layer.kind == "Add" else "Sub"
    parts = []
    for i, (tensor, value) in enumerate(operands):
        if tensor is None:  # in the output's exponent: the kernels add integers as they are
            parts.append(_constant(em, f"{layer.name}/operand_{i}", value, e))
        else:
            parts.append(em._requant(tensor, e, layer.name, i))
    total = parts[0]
    for i, other in enumerate(parts[1:], start=1):
        out = layer.name if i == len(parts) - 1 else f"{layer.name}/partial_{i}"
        em._node(out, op, [total, other], [out])
        em._tensor(out, e, src, shape, rng)
        total = out
    em.tensor_of[layer.name] = layer.name
    em.done(layer, "exported")


def _multiply(em: _Emitter, layer: SourceLayer, ins: list[str]) -> None:
    operands = _operands(layer, ins)
    if len(operands) != 2:
        em.refuse(layer, f"Multiply of {len(operands)} operand(s): the v3 Mul takes two")
        return
    shape = _broadcast(em, layer, ins)
    if shape is None:
        return
    parts = [
        t if t is not None else _constant(em, f"{layer.name}/operand_{i}", c)
        for i, (t, c) in enumerate(operands)
    ]
    exps = [em.exps[p] if p in em.exps else em.inits[p].exponent for p in parts]
    bound = exps[0] + exps[1] + em.bits - 1
    e, src, rng = em._out_exp(layer, (bound, "bound of the product (no calibrated range)"))
    em._node(layer.name, "Mul", parts, [layer.name])
    em._tensor(layer.name, e, src, shape, rng)
    em.tensor_of[layer.name] = layer.name
    em.done(layer, "exported")


def _concat(em: _Emitter, layer: SourceLayer, ins: list[str]) -> None:
    shapes = [em.shapes[t] for t in ins]
    rank = len(shapes[0])
    axis = int(layer.attrs.get("axis", -1)) % rank
    out_shape = list(shapes[0])
    out_shape[axis] = sum(s[axis] for s in shapes)
    top = max(em.exps[t] for t in ins)
    e, src, rng = em._out_exp(layer, (top, "the largest input exponent"))
    parts = [em._requant(t, e, layer.name, i) for i, t in enumerate(ins)]
    em._node(layer.name, "Concat", parts, [layer.name], {"axis": axis})
    em._tensor(layer.name, e, src, out_shape, rng)
    em.tensor_of[layer.name] = layer.name
    em.done(layer, "exported")


def _flatten(em: _Emitter, layer: SourceLayer, ins: list[str]) -> None:
    shape = em.shapes[ins[0]]
    em.keep(layer, "Flatten", ins, [shape[0], int(np.prod(shape[1:]))], {"axis": 1})


def _reshape(em: _Emitter, layer: SourceLayer, ins: list[str]) -> None:
    shape = em.shapes[ins[0]]
    target = [int(v) for v in layer.attrs.get("target_shape") or ()]
    if not target:
        em.refuse(layer, "Reshape without a target shape")
        return
    if -1 in target:
        known = int(np.prod([v for v in target if v != -1]))
        target[target.index(-1)] = int(np.prod(shape[1:])) // known
    out = [shape[0], *target]
    # 0 copies the batch dimension (ONNX, dl_module_reshape.hpp with allowzero 0)
    const = em._init(f"{layer.name}/shape", np.array([0, *target], np.int64))
    em.keep(layer, "Reshape", ins, out, extra=[const])


def _permute(em: _Emitter, layer: SourceLayer, ins: list[str]) -> None:
    dims = [int(d) for d in layer.attrs.get("dims") or ()]
    perm = [0, *dims]
    shape = em.shapes[ins[0]]
    em.keep(layer, "Transpose", ins, [shape[p] for p in perm], {"perm": perm})


def _pad(em: _Emitter, layer: SourceLayer, ins: list[str]) -> None:
    top, bottom, left, right = zero_padding(layer)
    shape = em.shapes[ins[0]]
    if len(shape) == 3:  # ZeroPadding1D (NWC): left / right of W
        pads = em._init(f"{layer.name}/pads", np.array([0, left, 0, 0, right, 0]))
        out = [shape[0], shape[1] + left + right, shape[2]]
        em.keep(layer, "Pad", ins, out, {"mode": "constant"}, extra=[pads])
        return
    pads = em._init(f"{layer.name}/pads", np.array([0, top, left, 0, 0, bottom, right, 0]))
    out = [shape[0], shape[1] + top + bottom, shape[2] + left + right, shape[3]]
    em.keep(layer, "Pad", ins, out, {"mode": "constant"}, extra=[pads])


def _upsample(em: _Emitter, layer: SourceLayer, ins: list[str]) -> None:
    mode = str(layer.attrs.get("interpolation", "nearest"))
    if mode != "nearest":
        em.refuse(layer, f"interpolation {mode!r}: the v3 Resize is exported for 'nearest' only")
        return
    sh, sw = _pair(layer.attrs.get("size"), 2)
    shape = em.shapes[ins[0]]
    if em.bits == 16:
        _upsample_by_concat(em, layer, ins[0], sh, sw)
        return
    scales = em._init(f"{layer.name}/scales", np.float32([1, 1, sh, sw]))
    attrs = {
        "coordinate_transformation_mode": "asymmetric",
        "mode": "nearest",
        "nearest_mode": "floor",
    }
    name = layer.name
    em._node(name, "Resize", [ins[0], "", scales], [name], attrs)
    x = ins[0]
    out = [shape[0], shape[1] * sh, shape[2] * sw, shape[3]]
    em._tensor(name, em.exps[x], f"the input's ({x!r})", out, em.ranges.get(x))
    em.tensor_of[name] = name
    em.done(layer, "exported", [name])


def _upsample_by_concat(em: _Emitter, layer: SourceLayer, x: str, sh: int, sw: int) -> None:
    """Nearest upsampling of an int16 tensor as Concat + Reshape (exact: integers copied).

    The runtime's int16 Resize computes nothing (``resize<int16_t>`` has an empty body in
    dl_base_resize.cpp; operator_support_state.md lists Resize for int8 only). Repeating
    each pixel ``sw`` times is a Concat of ``sw`` copies on the channel axis read back as
    ``[N, H, W*sw, C]``; the rows likewise on a ``[N, H, 1, W*sw*C]`` view.
    """
    n, h, w, c = em.shapes[x]
    name, exp, rng = layer.name, em.exps[x], em.ranges.get(x)
    src = f"the input's ({x!r})"
    nodes = []

    def reshape(tensor: str, out: str, dims: list[int]) -> str:
        const = em._init(f"{out}/shape", np.array([0, *dims[1:]], np.int64))
        em._node(out, "Reshape", [tensor, const], [out])
        nodes.append(out)
        return em._tensor(out, exp, src, dims, rng)

    def concat(tensor: str, out: str, copies: int, axis: int) -> str:
        em._node(out, "Concat", [tensor] * copies, [out], {"axis": axis})
        nodes.append(out)
        dims = list(em.shapes[tensor])
        dims[axis] *= copies
        return em._tensor(out, exp, src, dims, rng)

    y = x
    if sw != 1:
        y = concat(y, f"{name}/repeat_w", sw, 3)
        y = reshape(y, f"{name}/as_w", [n, h, w * sw, c])
    if sh != 1:
        y = reshape(y, f"{name}/rows", [n, h, 1, w * sw * c])
        y = concat(y, f"{name}/repeat_h", sh, 2)
    y = reshape(y, name, [n, h * sh, w * sw, c])
    em.tensor_of[name] = name
    em.done(layer, "exported", nodes)


_RUNTIME = {
    "MaxPooling2D": _maxpool,
    "AveragePooling2D": _avgpool,
    "GlobalAveragePooling2D": _global_pool,
    "GlobalMaxPooling2D": _global_pool,
    "Add": _add_sub,
    "Subtract": _add_sub,
    "Multiply": _multiply,
    "Concatenate": _concat,
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Permute": _permute,
    "ZeroPadding2D": _pad,
    "UpSampling2D": _upsample,
    # 1-D layers (NWC tensors): the native 1-D ops
    "MaxPooling1D": _maxpool,
    "AveragePooling1D": _avgpool,
    "GlobalAveragePooling1D": _global_pool,
    "GlobalMaxPooling1D": _global_pool,
    "ZeroPadding1D": _pad,
    "LayerNormalization": _layer_norm,
    "LayerNorm": _layer_norm,  # MindSpore's nn.LayerNorm
}


def _test_values(
    model: EspdlModel,
    em: _Emitter,
    test_input: np.ndarray | None,
    seed: int,
) -> None:
    """Fill ``test_inputs`` / ``test_outputs``: the first sample of ``test_input`` (or a seeded
    input inside the calibrated range), quantized, and what our simulator computes for it."""
    rng = np.random.default_rng(seed)
    ints = {}
    for info in model.inputs:
        shape = [int(s) for s in info.shape]
        if test_input is not None:
            sample = np.asarray(test_input, np.float64)
            if sample.size != int(np.prod(shape)):
                sample = sample[:1]
            if sample.size != int(np.prod(shape)):
                raise ExportError(
                    f"test input of shape {np.shape(test_input)} does not fit the model input "
                    f"{info.name!r} of shape {shape[1:]} (one sample, batch first)"
                )
            sample = sample.reshape(shape)
            bad = int(np.size(sample) - np.isfinite(sample).sum())
            if bad:  # numpy would cast NaN to 0 with a RuntimeWarning: a test of nothing
                raise ExportError(
                    f"test input: {bad} of {sample.size} values of the sample for "
                    f"{info.name!r} are NaN or infinite; the test input must be finite"
                )
        else:
            lo, hi = em._range_of(info.name)
            sample = rng.uniform(lo, hi, size=shape)
        ints[info.name] = em._quantize(sample, info.exponent, em.dtype)
    result = simulate_espdl(model, ints, em.target)
    model.test_inputs = [Tensor(n, v, [em.exps[n]]) for n, v in ints.items()]
    outs = []
    for info in model.outputs:
        value = result.outputs[info.name]
        outs.append(Tensor(info.name, np.ascontiguousarray(value), list(info.exponents)))
    model.test_outputs = outs
    em.notes += result.notes


def export_layers_v3(
    layers: list[SourceLayer],
    out: str | os.PathLike | None,
    *,
    record: Record | None = None,
    stats: CalibrationStats | None = None,
    target: str = "esp32s3",
    feature_type: str = "s8",
    test_input: np.ndarray | None = None,
    seed: int = 0,
    skip_unsupported: bool = False,
    overwrite: bool = False,
) -> V3ExportResult:
    """Export ``layers`` (execution order) as an ESP-DL v3 model; write it to ``out`` (a
    ``.espdl`` path; None: compute only).

    Args:
        layers: the model as SourceLayers (from an adapter).
        out: the file to write (atomically); must not exist unless ``overwrite``.
        record: AMCT record (skip_fusion, scale_d fallback for exponents; keys checked).
        stats: calibration sidecar (ranges per layer).
        target: ``esp32s3``, ``esp32p4`` or ``c`` (rounding, filter layout, bias width).
        feature_type: ``s8`` or ``s16``.
        test_input: float input whose first sample becomes the embedded test input (the
            chip's input: after any host-side Rescaling); default a seeded input inside the
            calibrated input range.
        seed: seed of the default test input.
        skip_unsupported: leave refused layers out (listed) instead of failing.
        overwrite: replace an existing ``out``.

    Example:
        >>> export_layers_v3([], None, target="esp32")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: target 'esp32': expected one of esp32s3, esp32p4, c ...
    """
    bits = check_options_v3(target, feature_type)
    if out is not None:
        check_output_path(out)
    if out is not None and Path(out).exists() and not overwrite:
        raise ExportError(f"{out} already exists: pass overwrite=True (--overwrite) to replace it")
    _check_links(layers)
    check_record_keys(record, layers)
    check_sidecar_model(stats, layers)  # a sidecar of another model, by layer name
    if not any(x.op == "input" for x in layers):
        raise ExportError("the model has no input layer")

    keys = {x.name: x.attrs.get("record_key", x.name) for x in layers}  # a shared layer's call

    def skip_fusion(name: str) -> bool:
        factors = record.layers.get(keys.get(name, name)) if record else None
        return bool(factors and factors.skip_fusion)

    chains, fused = _plan(layers, skip_fusion)
    em = _Emitter(layers, record, stats, bits, target, chains, fused)
    if stats is not None:
        em.notes += sidecar_of_another_record(record, stats)
        em.notes += _sidecar_strangers(layers, stats)
    for layer in layers:
        em.emit(layer)
    # a fused member whose head was refused is refused too
    for name, head in fused.items():
        if em.report.get(head) is not None and em.report[head].status == "refused":
            layer = em.by_name[name]
            em.refuse(layer, f"fused into {head!r}, which is refused")
    missing = [x.name for x in layers if x.name not in em.report]
    if missing:  # a bug guard: every layer must be exported, fused, passed, hosted or refused
        raise ExportError(f"layers neither exported, fused, skipped nor refused: {missing}")
    report = [em.report[x.name] for x in layers]
    refused = [x for x in report if x.status == "refused"]
    if refused and not skip_unsupported:
        roots = [x for x in refused if not x.reason.startswith(("reads ", "fused into "))]
        listing = "\n".join(f"  layer {x.name!r} ({x.kind}): {x.reason}" for x in roots)
        rest = [x.name for x in refused if x not in roots]
        if rest:
            more = f" and {len(rest) - 5} more" if len(rest) > 5 else ""
            listing += (
                f"\n  and {len(rest)} layer(s) that read or fuse into them: "
                f"{', '.join(repr(n) for n in rest[:5])}{more}"
            )
        raise ExportError(
            f"ESP-DL v3 export cannot take these layers (skip_unsupported leaves them out):\n"
            f"{listing}"
        )
    outputs = []
    for layer in layers:
        if layer.attrs.get("model_output"):
            tensor = em.tensor_of.get(layer.name)
            if tensor is None:
                em.notes.append(f"model output {layer.name!r} is not exported (refused)")
            elif tensor not in outputs:
                outputs.append(tensor)
    if not outputs:
        raise ExportError("no model output is exported (every output layer is refused)")
    model = EspdlModel(
        em.nodes,
        em.inits,
        inputs=[em.infos[n] for n in em.inputs],
        outputs=[em.infos[n] for n in outputs],
        value_info=list(em.infos.values()),
        metadata={"target": target},
        ir_version=8,
        graph_name="main_graph",
        producer_name="amct_bridge",
        source=str(out) if out is not None else "<export>",
    )
    _test_values(model, em, test_input, seed)
    result = V3ExportResult(
        Path(out) if out is not None else None,
        target,
        feature_type,
        model,
        report,
        em.sources,
        em.notes,
    )
    if out is not None:
        write_espdl(model, out)
    return result
