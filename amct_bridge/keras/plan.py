"""Calibration plan: which layers/parts of a Keras model get factors, how, and with which BN.

:func:`make_plan` reads the model once (via :func:`amct_bridge.keras.graph.extract_graph` for
Functional/Sequential models; a plain layer walk for subclassed ones) and resolves, per quantizable
part (see :mod:`amct_bridge.keras.layers`), its record key, its effective
:class:`~amct_bridge.config.LayerQuantConfig`, the BatchNormalization folded into it (Conv+BN chains
where the conv has no fused activation and the BN is its only reader) and how often it runs per
step. Activation layers are planned too: their ranges go to the calibration sidecar. So are
coefficient-free *runtime* layers (Add, Concatenate, average / max pooling; raw ``x + y`` and
``ops.concatenate`` calls too): runtimes such as ESP-DL need their output ranges. They come
last in :attr:`Plan.targets` and get a minmax config (min/max only, no histogram) unless every
tensor they read is already observed by one earlier target with the same settings, in which case
they take that target's config so the calibration session shares those points (no extra cost).

Example:
    >>> import keras
    >>> from amct_bridge.config import QuantConfig
    >>> x = keras.Input((8, 8, 3))
    >>> y = keras.layers.Conv2D(4, 3, use_bias=False, name="c1")(x)
    >>> y = keras.layers.BatchNormalization(name="bn1")(y)
    >>> y = keras.layers.ReLU(name="r1")(y)
    >>> plan = make_plan(keras.Model(x, y), QuantConfig())
    >>> [(t.key, t.bn.name if t.bn else None) for t in plan.targets]
    [('c1', 'bn1'), ('r1', None)]
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

import keras

from amct_bridge.config import LayerQuantConfig, QuantConfig
from amct_bridge.errors import CalibrationError, GraphError
from amct_bridge.keras import layers as registry
from amct_bridge.keras.graph import extract_graph_and_operations


@dataclass
class Target:
    """One record entry (quantized part) or one activation layer (sidecar only).

    Args:
        key: record / sidecar key ("conv1", "outer/inner", "sep/pointwise").
        layer_key: key of the Keras layer ("sep" for "sep/pointwise").
        layer: the Keras layer object.
        kind: registry class name ("Conv2D", "ReLU"...).
        part: the quantized part (None for activation layers).
        config: effective settings of this layer.
        bn: BatchNormalization folded into this part (None: none or fusion skipped).
        bn_key: that BN's layer key.
        skip_fusion: the user turned Conv+BN folding off for this layer.
        calls: times the layer runs per model call (shared layers).
        tensors: graph-IR ids of its (input, output) tensor, None when unknown or shared; equal
            ids mean the same tensor (one layer's output is the next one's input). With a
            folded BN the output is the BN's (what the folded op computes).
        inputs: runtime targets: ids of all input tensors (Add / Concatenate have several).

    Example:
        >>> Target("r1", "r1", None, "ReLU", None, LayerQuantConfig()).quantized
        False
    """

    key: str
    layer_key: str
    layer: object
    kind: str
    part: registry.QuantPart | None
    config: LayerQuantConfig
    bn: object | None = None
    skip_fusion: bool = False
    calls: int = 1
    tensors: tuple[str | None, str | None] = (None, None)
    bn_key: str | None = None
    inputs: tuple[str | None, ...] = ()

    @property
    def quantized(self) -> bool:
        """True if the target gets a record entry (not just sidecar ranges)."""
        return self.part is not None

    @property
    def runtime(self) -> bool:
        """True for coefficient-free runtime layers / raw ops (sidecar only, min/max)."""
        return self.part is None and self.kind in registry.RUNTIME

    @property
    def output_layer(self):
        """The layer whose output is this target's output: the folded BN, else the layer."""
        return self.bn if self.bn is not None else self.layer

    @property
    def types(self) -> tuple[str, ...]:
        """Type names a config may use for it: Keras class and TF op type."""
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

    @property
    def quantized(self) -> list[Target]:
        """Targets that get record entries."""
        return [t for t in self.targets if t.quantized]


def walk_layers(model, prefix: str = "") -> dict[str, object]:
    """Every leaf layer of ``model`` by key (nested models: "outer/inner"), in layer order.

    Example:
        >>> import keras
        >>> d = keras.layers.Dense(2, name="d")
        >>> inner = keras.Sequential([keras.Input((2,)), d], name="in")
        >>> outer = keras.Sequential([keras.Input((2,)), inner])
        >>> list(walk_layers(outer))
        ['in/d']
    """
    out: dict[str, object] = {}
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            out.update(walk_layers(layer, f"{prefix}{layer.name}/"))
        else:
            out.setdefault(prefix + layer.name, layer)
    return out


def make_plan(model, config: QuantConfig) -> Plan:
    """Resolve the calibration targets of ``model`` under ``config``.

    Raises CalibrationError for unknown skip_layers / skip_fusion_layers names and when nothing
    is left to quantize.

    Example:
        >>> # see the module docstring
    """
    by_key = walk_layers(model)
    order, calls, chains, tensors, runtime, rank = _graph_facts(model, by_key)
    _check_names(config.skip_layers, by_key, "skip_layers")
    _check_names(config.skip_fusion_layers, by_key, "skip_fusion_layers")
    targets: list[Target] = []
    for layer_key in order:
        layer = by_key[layer_key]
        kind = registry.class_name(layer)
        parts = registry.quant_parts(layer)
        for part in parts:
            key = part.key(layer_key)
            types = (kind, part.op_type)
            if config.is_skipped(layer_key, types) or config.is_skipped(key, types):
                continue
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
                    layer,
                    kind,
                    part,
                    cfg,
                    bn,
                    skip_fusion,
                    calls[layer_key],
                    io,
                    bn_key,
                )
            )
        if not parts and registry.is_activation(layer):
            cfg = config.for_layer(layer_key, (kind,))
            targets.append(
                Target(
                    layer_key,
                    layer_key,
                    layer,
                    kind,
                    None,
                    cfg,
                    calls=calls[layer_key],
                    tensors=tensors.get(layer_key, (None, None)),
                )
            )
    targets.extend(_runtime_targets(runtime, targets))
    plan = Plan(targets, rank)
    if not plan.quantized:
        raise CalibrationError(
            f"model {model.name!r} has no quantizable layer left "
            f"(quantizable types: {', '.join(registry.QUANTIZABLE)}; skipped: "
            f"{config.skip_layers + config.skip_layer_types or 'none'})"
        )
    return plan


@dataclass
class _Runtime:
    """A runtime layer / raw op call: key, object, calls, input tensor ids, output tensor id."""

    key: str
    obj: object
    calls: int
    inputs: list[str | None]
    output: str | None


def _runtime_calls(graph, objects: dict, calls: dict) -> list[_Runtime]:
    result: dict[str, _Runtime] = {}
    for node in graph:
        obj = objects.get(node.layer)
        if obj is None or not registry.is_runtime(obj):
            continue
        if node.layer in result:  # shared: the tensors differ per call, keep none
            result[node.layer].inputs, result[node.layer].output = [None], None
            continue
        result[node.layer] = _Runtime(
            node.layer, obj, calls.get(node.layer, 1), list(node.inputs), node.outputs[0]
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
        kind = registry.class_name(r.obj)
        target = Target(r.key, r.key, r.obj, kind, None, cfg, calls=r.calls)
        target.tensors, target.inputs = (first, r.output), tuple(r.inputs)
        note(first, cfg)
        note(r.output, cfg)
        result.append(target)
    return result


def _graph_facts(model, by_key: dict[str, object]):
    """(layer keys in execution order, calls per layer, foldable layer -> BN layer,
    layer -> (input, output) tensor ids for single-call single-input/output layers,
    runtime layer / raw op calls, layer key -> position of its first call)."""
    try:
        graph, objects = extract_graph_and_operations(model)
    except GraphError:
        # subclassed model: no call graph, so no fusion and one call per layer
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
    chains = _batchnorm_chains(graph, by_key)
    all_calls: dict[str, int] = {}
    rank: dict[str, int] = {}
    for i, node in enumerate(graph):
        all_calls[node.layer] = all_calls.get(node.layer, 0) + 1
        rank.setdefault(node.layer, i)
    runtime = _runtime_calls(graph, objects, all_calls)
    return order, calls, chains, tensors, runtime, rank


def batchnorm_chains(model) -> dict[str, tuple[str, object]]:
    """Layer key -> (BN key, BN layer) for every BatchNormalization AMCT folds into that layer.

    The one rule shared by calibration, simulate and QAT: a foldable quantizable layer without
    activation whose only reader is a BN on its channel axis (neither shared nor a model output).
    Subclassed models have no call graph, hence no fusion.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 1, name="c"),
        ...                       keras.layers.BatchNormalization(name="bn")])
        >>> {k: bn_key for k, (bn_key, _) in batchnorm_chains(m).items()}
        {'c': 'bn'}
    """
    try:
        graph, _ = extract_graph_and_operations(model)
    except GraphError:
        return {}
    return _batchnorm_chains(graph, walk_layers(model))


def _batchnorm_chains(graph, by_key: dict[str, object]) -> dict[str, tuple[str, object]]:
    foldable = tuple(k for k, parts in registry.QUANTIZABLE.items() if parts[-1].foldable)
    chains = {}
    for chain in graph.chains(foldable, tuple(registry.BATCH_NORMS)):
        head = chain[0]
        if len(chain) < 2 or head.shared or chain[1].shared:
            continue
        if head.params.get("activation", "linear") != "linear":
            continue
        bn_layer = by_key.get(chain[1].layer)
        if bn_layer is not None and _bn_on_channels(bn_layer):
            chains[head.layer] = (chain[1].layer, bn_layer)
    return chains


def _bn_on_channels(bn) -> bool:
    axis = bn.axis if isinstance(bn.axis, int) else (bn.axis[0] if len(bn.axis) == 1 else None)
    return axis is not None and axis in (-1, len(bn.input.shape) - 1)


def _check_names(names: list[str], by_key: dict[str, object], option: str) -> None:
    known = set(by_key)
    for key, layer in by_key.items():
        known.update(part.key(key) for part in registry.quant_parts(layer))
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise CalibrationError(f"{option}: no layer named {name!r} in the model{hint}")
