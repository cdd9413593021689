"""Calibration plan: which layers/parts get factors, with which settings and which folded BN.

:func:`make_plan` reads a :class:`~amct_bridge.calibration.layers.ModelDesc` once and resolves,
per quantized part, its record key, its effective :class:`~amct_bridge.config.LayerQuantConfig`,
the BatchNorm folded into it (:func:`batchnorm_chains`) and how often it runs per step.
Activation layers are planned too: their ranges go to the calibration sidecar. So are
coefficient-free *runtime* layers and raw ops (Add, concat, average / max pooling): runtimes
such as ESP-DL need their output ranges. They come last in :attr:`Plan.targets` and get a minmax
config (min/max only, no histogram) unless every tensor they read is already observed by one
earlier target with the same settings, in which case they take that target's config so the
session shares those points (no extra cost).

Example:
    >>> from amct_bridge.config import QuantConfig
    >>> from amct_bridge.calibration.layers import LayerDesc, ModelDesc, QuantPart
    >>> conv = QuantPart("", "Conv2D", True, True, True)
    >>> layers = {"c1": LayerDesc("c1", "Conv2D", (conv,)), "r1": LayerDesc("r1", "ReLU",
    ...           activation=True)}
    >>> plan = make_plan(ModelDesc("m", layers), QuantConfig())
    >>> [(t.key, t.quantized) for t in plan.targets]
    [('c1', True), ('r1', False)]
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Container
from dataclasses import dataclass, field

from amct_bridge.calibration.layers import LayerDesc, ModelDesc, QuantPart
from amct_bridge.config import LayerQuantConfig, QuantConfig
from amct_bridge.errors import CalibrationError
from amct_bridge.graph.ir import Graph

log = logging.getLogger(__name__)


@dataclass
class Target:
    """One record entry (quantized part) or one activation / runtime layer (sidecar only).

    Args:
        key: record / sidecar key ("conv1", "outer/inner", "sep/pointwise").
        layer_key: key of the layer ("sep" for "sep/pointwise").
        layer: the layer's framework object (the descriptor's opaque handle).
        kind: registry kind ("Conv2D", "ReLU"...).
        part: the quantized part (None for activation / runtime layers).
        config: effective settings of this layer.
        bn: the BatchNorm's handle folded into this part (None: none or fusion skipped).
        skip_fusion: the user turned Conv+BN folding off for this layer.
        skipped: the config skips this part (skip_layers / skip_layer_types): sidecar only.
        calls: times the layer runs per model call (shared layers).
        tensors: graph-IR ids of its (input, output) tensor, None when unknown or shared; equal
            ids mean the same tensor. With a folded BN the output is the BN's.
        bn_key: that BN's layer key.
        inputs: runtime targets: ids of all input tensors (Add / concat have several).
        desc: the layer's descriptor; bn_desc: the folded BN's.
        preactivation: the last part of a layer with a fused activation that the exports
            cannot undo from its output range (:func:`fused_activations`): that activation's
            name; the session then also observes the output before it (sidecar only).

    Example:
        >>> Target("r1", "r1", None, "ReLU", None, LayerQuantConfig()).quantized
        False
    """

    key: str
    layer_key: str
    layer: object
    kind: str
    part: QuantPart | None
    config: LayerQuantConfig
    bn: object | None = None
    skip_fusion: bool = False
    calls: int = 1
    tensors: tuple[str | None, str | None] = (None, None)
    bn_key: str | None = None
    inputs: tuple[str | None, ...] = ()
    desc: LayerDesc | None = None
    bn_desc: LayerDesc | None = None
    skipped: bool = False
    preactivation: str | None = None

    @property
    def quantized(self) -> bool:
        """True if the target gets a record entry (not just sidecar ranges: an activation, a
        runtime layer, or a part the config skips)."""
        return self.part is not None and not self.skipped

    @property
    def runtime(self) -> bool:
        """True for coefficient-free runtime layers / raw ops (sidecar only, min/max)."""
        return self.part is None and self.desc is not None and self.desc.runtime

    @property
    def output_layer(self):
        """The layer whose output is this target's output: the folded BN, else the layer."""
        return self.bn if self.bn is not None else self.layer

    @property
    def types(self) -> tuple[str, ...]:
        """Type names a config may use for it: registry kind and op type."""
        return (self.kind, self.part.op_type) if self.part else (self.kind,)


@dataclass
class Plan:
    """All targets in execution order.

    Example:
        >>> Plan([]).quantized
        []
    """

    targets: list[Target]
    rank: dict[str, int] = field(default_factory=dict)  # layer key -> first call's position
    #: layers with weights that stay float (no record entry), see :func:`unquantized_layers`
    unquantized: list[FloatLayer] = field(default_factory=list)
    #: their warning lines (one per layer), which the sidecar keeps
    warnings: list[str] = field(default_factory=list)

    @property
    def quantized(self) -> list[Target]:
        """Targets that get record entries."""
        return [t for t in self.targets if t.quantized]


def make_plan(model: ModelDesc, config: QuantConfig) -> Plan:
    """Resolve the calibration targets of ``model`` under ``config``.

    Raises CalibrationError for unknown skip_layers / skip_fusion_layers names and when nothing
    is left to quantize.

    Example:
        >>> # see the module docstring
    """
    by_key = model.layers
    order, calls, chains, tensors, runtime, rank = _graph_facts(model)
    fused = fused_activations(model)
    check_names(config.skip_layers, by_key, "skip_layers")
    check_names(config.skip_fusion_layers, by_key, "skip_fusion_layers")
    idle = [n for n in config.skip_layers if n in by_key and not by_key[n].parts]
    if len(idle) == 1:  # a name of no part: nothing to skip
        log.warning(
            "skip_layers: %r (%s) is not a quantizable layer, so skipping it changes "
            "nothing (quantizable types: %s)",
            idle[0],
            by_key[idle[0]].kind,
            ", ".join(model.quantizable_kinds),
        )
    elif idle:  # one warning, not one per name
        log.warning(
            "skip_layers: %s are not quantizable layers, so skipping them changes nothing "
            "(quantizable types: %s)",
            ", ".join(f"{n!r} ({by_key[n].kind})" for n in idle),
            ", ".join(model.quantizable_kinds),
        )
    targets: list[Target] = []
    for layer_key in order:
        desc = by_key[layer_key]
        kind = desc.kind
        for part in desc.parts:
            key = part.key(layer_key)
            types = (kind, part.op_type)
            # skipped: no record entry, but its ranges still go to the sidecar (a runtime such
            # as ESP-DL v1, which has no float layers, still needs its output exponent)
            skipped = config.is_skipped(layer_key, types) or config.is_skipped(key, types)
            skip_fusion = config.skips_fusion(layer_key)
            bn_key, bn = chains.get(layer_key, (None, None))
            if not part.foldable or skip_fusion:
                bn_key, bn = None, None
            cfg = config.for_layer(key, types) if key in config.by_name else None
            cfg = cfg or config.for_layer(layer_key, types)
            io = tensors.get(layer_key, (None, None))
            if bn_key is not None:  # the folded op computes the BN's output
                io = (io[0], tensors.get(bn_key, (None, None))[1])
            targets.append(
                Target(
                    key,
                    layer_key,
                    desc.handle,
                    kind,
                    part,
                    cfg,
                    bn.handle if bn is not None else None,
                    skip_fusion,
                    calls[layer_key],
                    io,
                    bn_key,
                    desc=desc,
                    bn_desc=bn,
                    skipped=skipped,
                    preactivation=fused.get(layer_key) if part is desc.parts[-1] else None,
                )
            )
        if not desc.parts and desc.activation:
            cfg = config.for_layer(layer_key, (kind,))
            target = Target(layer_key, layer_key, desc.handle, kind, None, cfg, desc=desc)
            target.calls, target.tensors = calls[layer_key], tensors.get(layer_key, (None, None))
            targets.append(target)
    targets.extend(_runtime_targets(runtime, targets))
    plan = Plan(targets, rank)
    if not plan.quantized:
        raise CalibrationError(
            f"model {model.name!r} has no quantizable layer left "
            f"(quantizable types: {', '.join(model.quantizable_kinds)}; skipped: "
            f"{config.skip_layers + config.skip_layer_types or 'none'})"
        )
    # what the user skipped is float by request; everything else with weights must be named
    covered = {t.layer_key for t in targets if t.part is not None}
    covered |= {k for k, d in by_key.items() if config.is_skipped(k, (d.kind,))}
    plan.unquantized = unquantized_layers(model, covered)
    plan.warnings = warn_unquantized(plan.unquantized, model.quantizable_kinds)
    return plan


#: Fused activations whose input range follows from the output range (or is not needed): no
#: pre-activation point for them. Every other fused activation (softmax, sigmoid, tanh, swish,
#: gelu...) hides its input's range: a classifier's logits behind its softmax.
EXACT_ACTIVATIONS: frozenset[str] = frozenset({"linear", "relu", "relu6"})


def fused_activations(model: ModelDesc) -> dict[str, str]:
    """Layer key -> its fused activation, for quantizable layers called once whose activation
    is not in :data:`EXACT_ACTIVATIONS` (graph node ``params["activation"]``; no graph: none).

    Their output range is the activation's; the session also observes the tensor before it
    (role ``"preactivation"``), which the sidecar keeps as ``preactivation``: the logits of a
    ``Dense(activation="softmax")`` head, which the ESP-DL exports quantize.

    Example:
        >>> from amct_bridge.graph.ir import Graph, Node, TensorInfo
        >>> g = Graph(tensors={t: TensorInfo((None, 2)) for t in "xyz"}, inputs=["x"],
        ...           outputs=["z"])
        >>> g.add_node(Node("a", "a", "Dense", "MatMul", ["x"], ["y"], {"activation": "relu"}))
        >>> g.add_node(Node("b", "b", "Dense", "MatMul", ["y"], ["z"],
        ...                 {"activation": "softmax"}))
        >>> part = QuantPart("", "MatMul", True, False, True)
        >>> fused_activations(ModelDesc("m", {k: LayerDesc(k, "Dense", (part,)) for k in "ab"}, g))
        {'b': 'softmax'}
    """
    if model.graph is None:
        return {}
    return preactivation_layers(model.graph, {k for k, d in model.layers.items() if d.parts})


def preactivation_layers(graph: Graph, quantized: Container[str]) -> dict[str, str]:
    """Layer key -> its fused activation, for the ``quantized`` layers called once in ``graph``
    whose activation is not in :data:`EXACT_ACTIVATIONS`: where the tensor before the activation
    is observed (:func:`fused_activations`; QAT tracks the same tensors).

    Example:
        >>> from amct_bridge.graph.ir import Graph, Node, TensorInfo
        >>> g = Graph(tensors={t: TensorInfo((None, 2)) for t in "xy"}, inputs=["x"],
        ...           outputs=["y"])
        >>> g.add_node(Node("b", "b", "Dense", "MatMul", ["x"], ["y"], {"activation": "sigmoid"}))
        >>> preactivation_layers(g, {"b"}), preactivation_layers(g, set())
        ({'b': 'sigmoid'}, {})
    """
    found: dict[str, str] = {}
    for node in graph:
        act = str(node.params.get("activation") or "linear")
        if node.layer in quantized and not node.shared and act not in EXACT_ACTIVATIONS:
            found[node.layer] = act
    return found


@dataclass(frozen=True)
class FloatLayer:
    """A layer with weights that gets no record entry, so AMCT and ``simulate`` run it in float.

    Example:
        >>> FloatLayer("lstm", "LSTM", "not a quantizable type").key
        'lstm'
    """

    key: str
    kind: str
    reason: str


def unquantized_layers(model: ModelDesc, covered: set[str]) -> list[FloatLayer]:
    """Layers of ``model`` that hold weights (:attr:`LayerDesc.weighted`) but get no record
    entry, in layer order: a quantized model would compute them in float while the record
    looks complete (issue 33: Conv1D was such a layer, silently).

    Not listed: layers in ``covered`` (quantized, or skipped by the user's ``skip_layers`` /
    ``skip_layer_types``), activations (a PReLU slope belongs to the activation, whose ranges
    go to the sidecar), layers the graph never calls, and a BatchNorm in the position AMCT folds
    into the Conv/Dense before it (:func:`batchnorm_chains`: folded, or kept apart by the
    user's ``skip_fusion_layers`` / a skipped conv).

    Example:
        >>> lstm = LayerDesc("lstm", "LSTM", weighted=True)
        >>> fc = LayerDesc("fc", "Dense", (QuantPart("", "MatMul", True, False, True),),
        ...                weighted=True)
        >>> unquantized_layers(ModelDesc("m", {"lstm": lstm, "fc": fc}), {"fc"})
        [FloatLayer(key='lstm', kind='LSTM', reason='not a quantizable type')]
    """
    chained = {bn_key for bn_key, _ in batchnorm_chains(model).values()}
    called = None if model.graph is None else {node.layer for node in model.graph}
    found = []
    for key, desc in model.layers.items():
        if not desc.weighted or desc.activation or key in covered or key in chained:
            continue
        if called is not None and key not in called:
            continue
        if desc.kind in model.batch_norm_kinds:
            reason = (
                "not folded: AMCT folds a BatchNorm only into a Conv/Dense without activation "
                "whose output it alone reads"
            )
        elif desc.parts:
            reason = "not quantized in this run"
        else:
            reason = "not a quantizable type"
        found.append(FloatLayer(key, desc.kind, reason))
    return found


#: A warning about many layers names this many of them; DEBUG (-v) and the sidecar: all.
NAMED_IN_WARNING = 10


def warn_unquantized(found: list[FloatLayer], quantizable_kinds: tuple[str, ...] = ()) -> list[str]:
    """Log one warning naming the layers of :func:`unquantized_layers`; return one line per
    layer (logged at DEBUG too; the calibration sidecar keeps them in ``warnings``).

    Example:
        >>> warn_unquantized([FloatLayer("lstm", "LSTM", "not a quantizable type")])
        ["layer 'lstm' (LSTM) has weights but no record entry: AMCT and simulate run it in \
float (not a quantizable type)"]
    """
    lines = [
        f"layer {f.key!r} ({f.kind}) has weights but no record entry: AMCT and simulate run it "
        f"in float ({f.reason})"
        for f in found
    ]
    if not lines:
        return lines
    kinds = f" (quantizable types: {', '.join(quantizable_kinds)})" if quantizable_kinds else ""
    if len(lines) == 1:
        log.warning("%s%s", lines[0], kinds)
    else:
        shown = ", ".join(f"{f.key!r} ({f.kind}: {f.reason})" for f in found[:NAMED_IN_WARNING])
        more = len(found) - NAMED_IN_WARNING
        rest = f" and {more} more (-v, or the sidecar's warnings)" if more > 0 else ""
        log.warning(
            "%d layers have weights but no record entry: AMCT and simulate run them in float: "
            "%s%s%s",
            len(found),
            shown,
            rest,
            kinds,
        )
        for line in lines:
            log.debug("%s", line)
    return lines


@dataclass
class _Runtime:
    """A runtime layer / raw op call: descriptor, calls, input tensor ids, output tensor id."""

    desc: LayerDesc
    calls: int
    inputs: list[str | None]
    output: str | None


def _runtime_calls(model: ModelDesc, calls: dict) -> list[_Runtime]:
    result: dict[str, _Runtime] = {}
    for node in model.graph:
        desc = model.lookup(node.layer)
        if desc is None or not desc.runtime or desc.parts:
            continue
        if node.layer in result:  # shared: the tensors differ per call, keep none
            result[node.layer].inputs, result[node.layer].output = [None], None
            continue
        result[node.layer] = _Runtime(
            desc, calls.get(node.layer, 1), list(node.inputs), node.outputs[0]
        )
    return list(result.values())


def observer_settings(cfg: LayerQuantConfig) -> tuple:
    """What must be equal for two targets to share one observed tensor (and its observer).

    Example:
        >>> observer_settings(LayerQuantConfig(algorithm="minmax", options={}))
        ('minmax', (), 'INT8')
    """
    return cfg.algorithm, tuple(sorted(cfg.options.items())), cfg.act_type


def _runtime_targets(runtime: list[_Runtime], targets: list[Target]) -> list[Target]:
    """Sidecar-only targets of runtime layers, after all others (see the module docstring)."""
    seen: dict[str, LayerQuantConfig] = {}  # tensor id -> config of the point observing it

    def note(tid, cfg):
        if tid is not None and (
            tid not in seen or observer_settings(seen[tid]) != observer_settings(cfg)
        ):
            seen[tid] = cfg

    for t in targets:
        note(t.tensors[0], t.config)
        note(t.tensors[1], t.config)
    result = []
    for r in runtime:
        first = r.inputs[0] if r.inputs else None
        owners = [seen.get(first), seen.get(r.output)]
        cfg = LayerQuantConfig(algorithm="minmax", options={})
        if owners[0] is not None and owners[1] is not None:
            if observer_settings(owners[0]) == observer_settings(owners[1]):
                cfg = owners[0]
        key = r.desc.key
        target = Target(key, key, r.desc.handle, r.desc.kind, None, cfg, calls=r.calls)
        target.tensors, target.inputs, target.desc = (first, r.output), tuple(r.inputs), r.desc
        note(first, cfg)
        note(r.output, cfg)
        result.append(target)
    return result


def _graph_facts(model: ModelDesc):
    """(layer keys in execution order, calls per layer, foldable layer -> BN descriptor,
    layer -> (input, output) tensor ids for single-call single-input/output layers,
    runtime layer / raw op calls, layer key -> position of its first call)."""
    by_key, graph = model.layers, model.graph
    if graph is None:  # no call graph: no fusion and one call per layer
        return list(by_key), dict.fromkeys(by_key, 1), {}, {}, [], {}
    order: list[str] = []
    calls: dict[str, int] = {}
    for node in graph:
        if node.layer in by_key:
            if node.layer not in calls:
                order.append(node.layer)
            calls[node.layer] = calls.get(node.layer, 0) + 1
    tensors = {
        node.layer: (node.inputs[0], node.outputs[0])
        for node in graph
        if not node.shared and len(node.inputs) == 1 and len(node.outputs) == 1
    }
    chains = batchnorm_chains(model)
    all_calls: dict[str, int] = {}
    rank: dict[str, int] = {}
    for i, node in enumerate(graph):
        all_calls[node.layer] = all_calls.get(node.layer, 0) + 1
        rank.setdefault(node.layer, i)
    runtime = _runtime_calls(model, all_calls)
    return order, calls, chains, tensors, runtime, rank


def batchnorm_chains(model: ModelDesc) -> dict[str, tuple[str, LayerDesc]]:
    """Layer key -> (BN key, BN descriptor) for every BatchNorm AMCT folds into that layer.

    The one rule shared by calibration, simulate and QAT: a layer of a foldable kind without
    fused activation whose only reader is a BN on its channel axis (neither shared nor a model
    output). Models without a graph have no fusion.

    Example:
        >>> from amct_bridge.graph.ir import Graph, Node, TensorInfo
        >>> g = Graph(tensors={t: TensorInfo((None, 2)) for t in "xyz"}, inputs=["x"],
        ...           outputs=["z"])
        >>> g.add_node(Node("c", "c", "Conv2D", "Conv2D", ["x"], ["y"]))
        >>> g.add_node(Node("bn", "bn", "BatchNormalization", "", ["y"], ["z"]))
        >>> m = ModelDesc("m", {k: LayerDesc(k, "") for k in ("c", "bn")}, g, {},
        ...               ("Conv2D",), ("BatchNormalization",))
        >>> {k: bn_key for k, (bn_key, _) in batchnorm_chains(m).items()}
        {'c': 'bn'}
    """
    if model.graph is None:
        return {}
    return _chains(model.graph, model)


def _chains(graph: Graph, model: ModelDesc) -> dict[str, tuple[str, LayerDesc]]:
    chains = {}
    for chain in graph.chains(tuple(model.foldable_kinds), tuple(model.batch_norm_kinds)):
        head = chain[0]
        if len(chain) < 2 or head.shared or chain[1].shared:
            continue
        if head.params.get("activation", "linear") != "linear":
            continue
        bn = model.layers.get(chain[1].layer)
        if bn is not None and bn.params.get("on_channels", True):
            chains[head.layer] = (chain[1].layer, bn)
    return chains


def check_names(names: list[str], by_key: dict[str, LayerDesc], option: str) -> None:
    """CalibrationError (with a "did you mean") for a name that is neither a layer nor a part.

    Example:
        >>> check_names(["cv1"], {"conv1": LayerDesc("conv1", "Conv2D")}, "skip_layers")
        Traceback (most recent call last):
        ...
        amct_bridge.errors.CalibrationError: skip_layers: no layer named 'cv1' in the model; \
did you mean 'conv1'?
    """
    known = set(by_key)
    for key, desc in by_key.items():
        known.update(part.key(key) for part in desc.parts)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise CalibrationError(f"{option}: no layer named {name!r} in the model{hint}")
