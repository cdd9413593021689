"""QAT record + sidecar from trained ranges, written as one set (framework-free; docs/qat.md).

Both adapters' ``save_qat_record`` collect, per quantized part, its input clip range and kernel
(record entries via :func:`layer_factors`, from the numpy math of :mod:`amct_bridge.quant.qat`
and :mod:`amct_bridge.quant.arq`) and, per observed cell, an output range; this module turns
them into the record and the calibration sidecar (``<record>.calib.json``) the ESP-DL exporter
reads, validates both in memory and writes them together (temp files, then renamed), so a
failure leaves the previous files.

Sidecar rules (the calibration callback's format, ``algorithm: "qat-ema"`` / ``"qat-learned"``):

* a quantized part: ``input`` = its clip range (what scale_d / offset_d encode), ``output`` =
  the EMA of its output;
* a tensor a quantized layer reads gets that reader's clip range as ``min`` / ``max`` and keeps
  the EMA as ``observed_min`` / ``observed_max`` (:func:`clipped`): the network was trained to
  see it clipped there;
* a layer called at several sites per step (one ReLU cell used four times) keeps a range per
  site (:func:`call_sites` names them as the graph does: ``relu``, ``relu@1``...), and each
  site gets its own entry, as in the calibration sidecar. A quantized layer called at several
  sites clips every site's input at one range, the :func:`union_range` of its sites' ranges:
  the record holds one ``scale_d`` / ``offset_d`` per layer, applied at every site.

Power-of-two QAT (``power_of_two=True``, docs/qat.md): every tensor the ESP-DL chip holds gets
one power-of-two quantizer, at its producer (:func:`pow2_plan` says which node quantizes
what, from the graph); a quantized layer's entry is ``scale_d = 2^e_in``, ``offset_d = 0``,
``scale_w = [2^e_w]`` (:func:`pow2_factors`) and each tensor's sidecar range is the range
whose export exponent is the trained one (:func:`pow2_tensor_range`).

Example:
    >>> clipped(TensorRange(-1.0, 9.0), TensorRange(0.0, 6.0)).to_dict()
    {'min': 0.0, 'max': 6.0, 'observed_min': -1.0, 'observed_max': 9.0}
    >>> tensor_range(0.0, 1.0, seen=0) is None
    True
    >>> union_range([(-1.0, 2.0, 3), (0.0, 5.0, 3), (-9.0, 9.0, 0)])
    (-1.0, 5.0, 3.0)
    >>> import numpy as np
    >>> f = layer_factors("fc", -1.0, 1.0, 3, 4, np.float32([[1.0, -0.5]]), "OI")
    >>> f.dst_type, f.offset_d, f.scale_w
    ('INT4', -1, [0.1428571492433548])
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from numpy.typing import ArrayLike

from amct_bridge.calibration.records import Built, _warn_collapsed, write_outputs
from amct_bridge.errors import QuantError, ValidationError
from amct_bridge.graph.ir import Graph
from amct_bridge.quant.arq import arq_scales
from amct_bridge.quant.factors import FLT_EPSILON, activation_factors, raw_activation_scale
from amct_bridge.quant.qat import DST_TYPES, keeps_values, pow2_range, weight_exponent
from amct_bridge.records import dumps, validate
from amct_bridge.records.calibration import CalibrationStats, TensorRange
from amct_bridge.records.model import LayerFactors, Record

__all__ = [
    "Pow2Plan",
    "algorithm_name",
    "call_sites",
    "clipped",
    "layer_factors",
    "pow2_factors",
    "pow2_plan",
    "refuse_shared_sites",
    "pow2_tensor_range",
    "shared_layers",
    "site_names",
    "tensor_range",
    "union_range",
    "write_qat_outputs",
]


def site_names(key: str, n: int) -> list[str]:
    """The names of a layer's ``n`` call sites, as the graph IR names its nodes: the first site
    is the layer's own key, the k-th ``"<key>@k"``.

    Example:
        >>> site_names("relu", 3)
        ['relu', 'relu@1', 'relu@2']
    """
    return [key] + [f"{key}@{k}" for k in range(1, int(n))]


def call_sites(graph: Graph | None) -> dict[str, list[str]]:
    """Layer key -> its node names in execution (topological) order, for every layer the graph
    calls more than once. The k-th call of a step is site k: QAT cells count their calls and
    keep the state of site ``calls mod n``, as the calibration probes number their rows.

    Example:
        >>> from amct_bridge.graph.ir import Graph, Node
        >>> g = Graph()
        >>> for name in ("relu", "fc", "relu@1"):
        ...     g.add_node(Node(name, name.split("@")[0], "ReLU", "Relu", [], [], {}))
        >>> call_sites(g)
        {'relu': ['relu', 'relu@1']}
    """
    if graph is None:
        return {}
    found: dict[str, list[str]] = {}
    for node in graph.nodes:
        found.setdefault(node.layer, []).append(node.name)
    return {layer: names for layer, names in found.items() if len(names) > 1}


def shared_layers(sites: dict[str, list[str]], keys: Iterable[str]) -> list[str]:
    """The ``keys`` called at several sites, named with their sites (for messages).

    Example:
        >>> shared_layers({"fc": ["fc", "fc@1"]}, ["fc", "out"])
        ["'fc' (sites fc, fc@1)"]
    """
    return [f"{k!r} (sites {', '.join(sites[k])})" for k in keys if k in sites]


def union_range(rows: Iterable[tuple[float, float, float]]) -> tuple[float, float, float]:
    """One ``(min, max, seen)`` covering every site's ``(min, max, seen)`` that saw a batch: the
    clip range of a quantized layer called at several sites (``seen``: the most any site saw).
    None seen: ``(0.0, 0.0, 0.0)``.

    Example:
        >>> union_range([(0.0, 1.0, 0)])
        (0.0, 0.0, 0.0)
    """
    seen = [(float(lo), float(hi), float(n)) for lo, hi, n in rows if n > 0]
    if not seen:
        return 0.0, 0.0, 0.0
    return min(r[0] for r in seen), max(r[1] for r in seen), max(r[2] for r in seen)


def tensor_range(lo: float, hi: float, seen: float) -> TensorRange | None:
    """The tracked range, or None when no training batch reached it.

    Example:
        >>> tensor_range(-1.0, 2.0, 5)
        TensorRange(min=-1.0, max=2.0, observed_min=None, observed_max=None)
    """
    return TensorRange(float(lo), float(hi)) if seen > 0 else None


def clipped(observed: TensorRange | None, clip: TensorRange | None) -> TensorRange | None:
    """The range of a tensor a quantized reader clips at ``clip`` (the EMA as observed).

    Example:
        >>> clipped(None, TensorRange(0.0, 1.0)).max
        1.0
    """
    if clip is None:
        return observed
    if observed is None:
        return clip
    return TensorRange(clip.min, clip.max, observed.min, observed.max)


def layer_factors(
    key: str,
    lo: float,
    hi: float,
    seen: float,
    bits: int,
    kernel: ArrayLike | None = None,
    layout: str | None = None,
    *,
    channel_wise: bool = True,
    symmetric: bool = False,
    skip_fusion: bool | None = None,
    part: str = "input",
) -> LayerFactors:
    """The QAT record entry of one quantized part (AMCT's inner flavor with ``dst_type``).

    Args:
        key: record key (for messages).
        lo, hi: the part's trained input clip range; ``seen``: training batches it saw.
        bits: 8 or 4 (``dst_type`` INT8 / INT4).
        kernel, layout: the (trained, BN-folded) kernel and its layout; None for pooling.
        channel_wise: per-output-channel scale_w (ignored for Dense / MatMul layouts).
        symmetric: ``activation_offset = false``.
        skip_fusion: written as is (True when a BatchNorm follows that was not folded).
        part: name of the tracked tensor (messages).

    Raises:
        QuantError: the range was never observed (``seen <= 0``) or is not finite.

    Example:
        >>> layer_factors("pool", 0.0, 2.0, 1, 8).offset_d
        -128
    """
    if seen <= 0:
        raise QuantError(
            f"layer {key!r}: its {part} range was never observed; train at least one step first"
        )
    dst = next(name for name, b in DST_TYPES.items() if b == bits)
    scale_d, offset_d = activation_factors(lo, hi, bits, symmetric, name=f"{key} {part}")
    f = LayerFactors(scale_d=scale_d, offset_d=offset_d, dst_type=dst)
    if kernel is not None:
        scale = arq_scales(kernel, layout, channel_wise, num_bits=bits, name=key)
        f.scale_w = [float(s) for s in scale]
        f.offset_w = [0] * len(f.scale_w)
        if skip_fusion:
            f.skip_fusion = True
    return f


def algorithm_name(modes: set[str] | list[str], *, power_of_two: bool = False) -> str:
    """The sidecar's ``algorithm`` for the activation range modes used.

    Example:
        >>> algorithm_name({"ema"}), algorithm_name({"learned"}, power_of_two=True)
        ('qat-ema', 'qat-pow2-learned')
    """
    return ("qat-pow2-" if power_of_two else "qat-") + ",".join(sorted(set(modes)))


# --- power-of-two QAT ---------------------------------------------------------------------------

#: Layer kinds that join tensors at one exponent: the ESP-DL v3 export requantizes each input to
#: the output's exponent (``RequantizeLinear``) before the integer Add / Sub / Concat.
REQUANTIZING: frozenset[str] = frozenset({"Add", "Subtract", "Concatenate"})
#: Activations a quantized layer computes inside that the chip fuses (one tensor, no
#: pre-activation tensor of its own).
FUSED_ACTIVATIONS: frozenset[str] = frozenset({"linear", "relu", ""})


def _is_softmax(kind: str, params: Mapping) -> bool:
    return kind == "Softmax" or params.get("activation") == "softmax"


@dataclass
class Pow2Plan:
    """Where power-of-two QAT quantizes (node names of the graph IR: a layer's key, ``key@k``
    for its k-th call).

    Attributes:
        source: node -> the node whose quantizer holds its output's values: itself (its own
            quantizer), the quantizer upstream of a value-keeping node (a ReLU after a conv:
            one tensor, one exponent on the chip), or None (float: a Softmax output, a layer
            QAT does not wrap).
        input_source: quantized node -> the quantizer of the tensor it reads, or None when it
            quantizes its input itself (the model input, a raw op's output).
        requantize: nodes with a quantizer whose inputs go to the output's exponent first
            (Add, Subtract, Concatenate, as the export writes them).
        preactivation: quantized node -> the activation it computes inside that the chip runs
            as its own node (its pre-activation tensor is observed, not trained: a warning).

    Example:
        >>> Pow2Plan({"c": "c", "r": "c"}, {"c": None}).own
        ['c']
    """

    source: dict[str, str | None] = field(default_factory=dict)
    input_source: dict[str, str | None] = field(default_factory=dict)
    requantize: set[str] = field(default_factory=set)
    preactivation: dict[str, str] = field(default_factory=dict)

    @property
    def own(self) -> list[str]:
        """Nodes with a quantizer of their own, in graph order."""
        return [n for n, src in self.source.items() if src == n]

    def preactivation_note(self, unit: str) -> str | None:
        """The warning for :attr:`preactivation` (``unit``: "layer" / "activation cell"), or
        None.

        Example:
            >>> print(Pow2Plan(preactivation={"c": "swish"}).preactivation_note("layer"))
            'c' (swish) compute an activation inside that the chip runs as a node of its own: \
the tensor before it gets the exponent of its observed range (the sidecar's preactivation, an \
EMA), not a trained one (use a separate layer to train it)
        """
        if not self.preactivation:
            return None
        named = ", ".join(f"{k!r} ({a})" for k, a in self.preactivation.items())
        return (
            f"{named} compute an activation inside that the chip runs as a node of its own: the "
            "tensor before it gets the exponent of its observed range (the sidecar's "
            f"preactivation, an EMA), not a trained one (use a separate {unit} to train it)"
        )


def refuse_shared_sites(
    key: str, nodes: list[str], unit: str, place: str = "site", call: str = "call"
) -> None:
    """Refuse power-of-two QAT of a ``unit`` ("layer" / "cell") called at several ``nodes``
    that each need an exponent of their own: one wrapper holds one. ``place`` / ``call``: the
    framework's words for a call site ("node" / "node" in Keras, "site" / "call" in MindSpore).

    Example:
        >>> refuse_shared_sites("c", ["c", "c@1"], "cell")
        Traceback (most recent call last):
        ...
        amct_bridge.errors.QuantError: power_of_two: cell 'c' is called at several sites (c, \
c@1), each needing an exponent of its own, and a cell holds one: give each call a cell of its own
    """
    raise QuantError(
        f"power_of_two: {unit} {key!r} is called at several {place}s ({', '.join(nodes)}), each "
        f"needing an exponent of its own, and a {unit} holds one: give each {call} a {unit} of "
        "its own"
    )


def pow2_plan(
    graph: Graph,
    quantized: Iterable[str],
    observed: Iterable[str],
    *,
    identity: Iterable[str] = (),
    bias_after: Mapping[str, str] | None = None,
) -> Pow2Plan:
    """Which node quantizes which tensor in power-of-two QAT: one quantizer per tensor the
    chip holds, at its producer, so each tensor has one exponent, as on the chip.

    Args:
        graph: the float model's graph IR.
        quantized, observed: layer keys wrapped to quantize (conv, dense, average pool) and to
            observe (activations, Add / Concatenate / Multiply, pools, unfolded BN).
        identity: layer keys that pass their input on (a BN folded into the layer before).
        bias_after: quantized node -> the observed node that adds its folded bias (MindSpore's
            folded BN): the latter quantizes that tensor, the quantized node does not.

    Rules, in graph order: a quantized node quantizes its output (not when ``bias_after``
    names it) and reads its input from the producer's quantizer, else quantizes the input
    itself; an observed node keeps its input's quantizer when it keeps values
    (:func:`amct_bridge.quant.qat.keeps_values`: ReLU, max pools, Flatten...) and that input
    has one, has none when it is a Softmax nobody reads (float on the chip), else its own; any
    other node passes its input's quantizer on when it keeps values, else has none.

    Example:
        >>> from amct_bridge.graph.ir import Graph, Node, TensorInfo
        >>> g = Graph(tensors={t: TensorInfo((None, 4)) for t in "xabc"}, inputs=["x"])
        >>> g.add_node(Node("fc", "fc", "Dense", "MatMul", ["x"], ["a"]))
        >>> g.add_node(Node("relu", "relu", "ReLU", "Relu", ["a"], ["b"]))
        >>> g.add_node(Node("out", "out", "Dense", "MatMul", ["b"], ["c"]))
        >>> plan = pow2_plan(g, ["fc", "out"], ["relu"])
        >>> plan.own, plan.source["relu"], plan.input_source
        (['fc', 'out'], 'fc', {'fc': None, 'out': 'fc'})
    """
    quantized, observed, identity = set(quantized), set(observed), set(identity)
    bias_after = dict(bias_after or {})
    plan = Pow2Plan()
    for node in graph.nodes:
        producer = graph.producer_of(node.inputs[0]) if node.inputs else None
        upstream = plan.source.get(producer.name) if producer is not None else None
        read = any(graph.consumers_of(t) for t in node.outputs)
        if node.layer in quantized:
            plan.input_source[node.name] = upstream
            act = str(node.params.get("activation") or "")
            if act not in FUSED_ACTIVATIONS:
                plan.preactivation[node.name] = act
            float_out = _is_softmax(node.kind, node.params) and not read
            own = node.name not in bias_after and not float_out
            plan.source[node.name] = node.name if own else None
        elif node.layer in observed:
            if keeps_values(node.kind, node.params) and upstream is not None:
                plan.source[node.name] = upstream
            elif _is_softmax(node.kind, node.params) and not read:
                plan.source[node.name] = None
            else:
                plan.source[node.name] = node.name
                if node.kind in REQUANTIZING and len(node.inputs) > 1:
                    plan.requantize.add(node.name)
        elif node.layer in identity or keeps_values(node.kind, node.params):
            plan.source[node.name] = upstream
        else:
            plan.source[node.name] = None
    return plan


def pow2_tensor_range(exponent: int, lo: float, hi: float, seen: float) -> TensorRange | None:
    """The sidecar range of a tensor trained at ``exponent``: :func:`amct_bridge.quant.qat.
    pow2_range` (from 0 when the tensor's EMA ``[lo, hi]`` never went below 0), the EMA as
    ``observed_min`` / ``observed_max``; None when no training batch reached it.

    Example:
        >>> pow2_tensor_range(-4, 0.0, 5.1, 3).to_dict()
        {'min': 0.0, 'max': 7.9375, 'observed_min': 0.0, 'observed_max': 5.1}
    """
    if seen <= 0:
        return None
    low, high = pow2_range(exponent, negative=float(lo) < 0.0)
    return TensorRange(low, high, float(lo), float(hi))


def pow2_factors(
    key: str,
    exponent: int,
    seen: float,
    kernel: ArrayLike | None = None,
    *,
    skip_fusion: bool | None = None,
    part: str = "input",
) -> LayerFactors:
    """The QAT record entry of one part trained with power-of-two exponents: ``scale_d =
    2^e_in``, ``offset_d = 0``, ``scale_w = [2^e_w]`` (one: per tensor, ``e_w`` the export's
    automatic exponent of the kernel, :func:`amct_bridge.quant.qat.weight_exponent`),
    ``dst_type`` INT8.

    Raises:
        QuantError: the input was never observed (``seen <= 0``).

    Example:
        >>> import numpy as np
        >>> f = pow2_factors("fc", -5, 3, np.float32([[1.0, -0.5]]))
        >>> f.scale_d, f.offset_d, f.scale_w, f.dst_type
        (0.03125, 0, [0.015625], 'INT8')
    """
    if seen <= 0:
        raise QuantError(
            f"layer {key!r}: its {part} range was never observed; train at least one step first"
        )
    f = LayerFactors(scale_d=2.0 ** int(exponent), offset_d=0, dst_type="INT8")
    if kernel is not None:
        f.scale_w = [2.0 ** weight_exponent(kernel)]
        f.offset_w = [0]
        if skip_fusion:
            f.skip_fusion = True
    return f


def write_qat_outputs(
    record: Record, stats: CalibrationStats, path: str | os.PathLike, *, what: str = "model"
) -> Record:
    """Validate ``record`` and write it with its sidecar ``stats`` atomically; return it.

    Raises:
        QuantError: the record is empty (no quantized part); nothing is written.
        ValidationError: the record breaks AMCT's rules; nothing is written.

    Example:
        >>> # save_qat_record(qat, "qat.txt") of either adapter ends here
    """
    if not record.layers:
        raise QuantError(f"{what}: no quantized layer to write; nothing written")
    problems = validate(record)
    if problems:
        raise ValidationError(problems)
    collapsed = _collapsed(record, stats)
    if collapsed:  # as the calibration warns: QAT's forward pass quantized them to one level
        stats.warnings = list(stats.warnings or []) + _warn_collapsed(collapsed)
    write_outputs(Built(record, dumps(record, record.flavor), stats), path)
    return record


def _collapsed(record: Record, stats: CalibrationStats) -> list[tuple[str, tuple, float]]:
    """Layers whose QAT input range gives a scale below FLT_EPSILON, written as 1.0 (AMCT's
    rule): every input value quantizes to one level, in training and on the device."""
    found = []
    for key, factors in record.layers.items():
        entry = stats.layers.get(key)
        rng = entry.input if entry is not None else None
        if rng is None or factors.scale_d != 1.0:
            continue
        bits = factors.dst_type or "INT8"
        raw = raw_activation_scale(rng.min, rng.max, bits, factors.offset_d == 0, name=key)
        if 0.0 < raw < FLT_EPSILON:
            found.append((key, (rng.min, rng.max), raw))
    return found
