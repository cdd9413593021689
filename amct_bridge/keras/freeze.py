"""Frozen inference GraphDef (.pb) of a Keras model, with the record's TF op names and BN folded.

AMCT-TF's ``convert_model`` takes a frozen graph and a record keyed by TF op names. Keras 3 graphs
keep BatchNormalization unfused (Mul/Add ops), while the record's weight scales were computed on
Conv+BN folded kernels, so :func:`freeze_model` makes the two agree: for each :class:`Fold`, the
kernel constant of the keyed op is replaced by the folded kernel, and the BN layer is traced as a
single ``BiasAdd`` of the folded bias correction ``b' - b`` (the conv's own bias add stays).

Op names are found by tracing, not by guessing name scopes: while the inference function is traced,
each quantizable layer's ``call`` is wrapped (temporarily, as in calibration) to note the ops it
creates; the op of the registry's type among them is that record key's op
(:mod:`amct_bridge.keras.layers`: Conv2D, DepthwiseConv2dNative, Conv2DBackpropInput, MatMul,
AvgPool). A layer called twice has two ops; both are listed.

Example:
    >>> import keras
    >>> x = keras.Input((8, 8, 3))
    >>> m = keras.Model(x, keras.layers.Conv2D(4, 3, name="c1")(x), name="net")
    >>> frozen = freeze_model(m)
    >>> frozen.op_names["c1"], frozen.op_type("c1")
    (['net_1/c1_1/convolution'], 'Conv2D')
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import (
    convert_variables_to_constants_v2,
)

from amct_bridge.errors import GraphError
from amct_bridge.keras import layers as registry
from amct_bridge.keras.plan import walk_layers
from amct_bridge.records.atomic import atomic_write_bytes

#: Input index of the weights of each keyed op type.
_WEIGHT_INPUT = {"Conv2D": 1, "DepthwiseConv2dNative": 1, "MatMul": 1, "Conv2DBackpropInput": 1}
#: Ops between a weight constant and its consumer after freezing.
_PASS_THROUGH = ("Identity", "ReadVariableOp")
#: TF runs a 1-D conv as a 2-D one: its kernel reaches the Conv2D / DepthwiseConv2dNative through
#: an ExpandDims (height axis 0), which :func:`_inline_expanded_filter` makes a constant.
_EXPAND = "ExpandDims"


@dataclass
class Fold:
    """One Conv+BN fold to apply in the frozen graph.

    Args:
        key: record key of the folded part ("c1", "sep/pointwise").
        bn: the BatchNormalization layer (traced as a BiasAdd of ``bias_delta``).
        kernel: folded kernel, Keras layout (what scale_w was computed from).
        bias_delta: folded bias minus the layer's own bias (zeros-based if it has none).

    Example:
        >>> Fold("c1", None, np.ones((1, 1, 1, 2)), np.zeros(2)).key
        'c1'
    """

    key: str
    bn: object
    kernel: np.ndarray
    bias_delta: np.ndarray


@dataclass
class FrozenGraph:
    """A frozen inference graph and the TF op names of every quantizable record key.

    Example:
        >>> FrozenGraph(tf.compat.v1.GraphDef()).op_names
        {}
    """

    graph_def: tf.compat.v1.GraphDef
    op_names: dict[str, list[str]] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def node(self, name: str):
        """The NodeDef called ``name``."""
        for node in self.graph_def.node:
            if node.name == name:
                return node
        raise GraphError(f"frozen graph has no op {name!r}")

    def op_type(self, key: str) -> str:
        """TF op type of record key ``key``'s (first) op."""
        return self.node(self.op_names[key][0]).op

    def weights(self, op_name: str) -> np.ndarray:
        """The constant weights the op ``op_name`` multiplies by (Keras kernel layout; a 1-D
        conv's with the height axis of size 1 that TF's 2-D op reads)."""
        return tf.make_ndarray(
            _weight_const(self.graph_def, self.node(op_name)).attr["value"].tensor
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write the binary GraphDef atomically (``.pb``)."""
        atomic_write_bytes(path, self.graph_def.SerializeToString(deterministic=True))


def freeze_model(model, folds: list[Fold] = (), input_signature=None) -> FrozenGraph:
    """Trace ``model`` for inference, freeze its variables and apply ``folds``.

    Args:
        model: a built Keras model.
        folds: Conv+BN folds to bake in (from :func:`amct_bridge.keras.weights.folds_for`).
        input_signature: list of ``tf.TensorSpec``; default: from ``model.inputs``.

    Example:
        >>> # see the module docstring
    """
    signature = input_signature or _signature(model)
    folds_by_bn = {id(f.bn): f for f in folds}
    seen: dict[str, list[tuple[str, str]]] = {}
    targets = {
        key: layer
        for key, layer in walk_layers(model).items()
        if registry.quant_parts(layer) or id(layer) in folds_by_bn
    }
    wrapped = []
    try:
        for key, layer in targets.items():
            replace = folds_by_bn.get(id(layer))
            object.__setattr__(layer, "call", _noting_call(layer, key, seen, replace))
            wrapped.append(layer)
        fn = tf.function(lambda *xs: model(xs[0] if len(xs) == 1 else list(xs), training=False))
        concrete = fn.get_concrete_function(*signature)
    finally:
        for layer in wrapped:
            object.__delattr__(layer, "call")
    frozen_fn = convert_variables_to_constants_v2(concrete)
    graph_def = frozen_fn.graph.as_graph_def()
    op_names = _op_names(targets, seen, graph_def)
    result = FrozenGraph(
        graph_def,
        op_names,
        inputs=[t.name for t in frozen_fn.inputs if t.dtype != tf.resource],
        outputs=[t.name for t in frozen_fn.outputs],
    )
    for fold in folds:
        for op_name in op_names.get(fold.key, []):
            _set_const(_weight_const(graph_def, result.node(op_name)), fold.kernel)
    for names in op_names.values():  # after the folds, which write the Keras-layout kernel
        for op_name in names:
            _inline_expanded_filter(graph_def, result.node(op_name))
    return result


def _signature(model) -> list[tf.TensorSpec]:
    try:
        inputs = model.inputs
    except AttributeError:
        inputs = None
    if not inputs:
        raise GraphError(
            f"model {model.name!r} has no symbolic inputs; "
            "pass input_signature=[tf.TensorSpec(...)]"
        )
    return [tf.TensorSpec(t.shape, t.dtype, name=t._keras_history.operation.name) for t in inputs]


def _noting_call(layer, key: str, seen: dict, fold: Fold | None):
    """A call that records (key, op names created) and, for a folded BN, adds the bias delta."""
    original = layer.call

    def call(*args, **kwargs):
        graph = tf.compat.v1.get_default_graph()
        before = len(graph.get_operations())
        if fold is not None:
            x = args[0] if args else kwargs["inputs"]
            with tf.name_scope("batchnorm"):
                out = tf.nn.bias_add(x, tf.constant(fold.bias_delta.astype(np.float32)))
        else:
            out = original(*args, **kwargs)
        new_ops = graph.get_operations()[before:]
        seen.setdefault(key, []).append([(op.name, op.type) for op in new_ops])
        return out

    return call


def _op_names(targets: dict, seen: dict, graph_def) -> dict[str, list[str]]:
    present = {node.name for node in graph_def.node}
    out: dict[str, list[str]] = {}
    for key, layer in targets.items():
        for part in registry.quant_parts(layer):
            names = []
            for ops in seen.get(key, []):
                matches = [name for name, typ in ops if typ == part.op_type and name in present]
                if part.suffix == "pointwise":
                    matches = matches[-1:]  # the 1x1 Conv2D after the depthwise op
                if not matches:
                    raise GraphError(
                        f"layer {key!r}: no {part.op_type} op in its traced ops "
                        f"({sorted({t for _, t in ops})})"
                    )
                names.append(matches[0])
            if names:
                out[part.key(key)] = names
    return out


def _weight_source(graph_def, node):
    """The first node of the op's weight input that is not an Identity/ReadVariableOp."""
    by_name = {n.name: n for n in graph_def.node}
    index = _WEIGHT_INPUT.get(node.op)
    if index is None:
        raise GraphError(f"op {node.name!r} ({node.op}) has no weights")
    current = by_name[node.input[index].split(":")[0].lstrip("^")]
    while current.op in _PASS_THROUGH:
        current = by_name[current.input[0].split(":")[0]]
    return current, by_name


def _inline_expanded_filter(graph_def, node) -> None:
    """A 1-D conv's filter ``ExpandDims(kernel, 0)`` becomes the constant it computes, so the
    keyed op reads a Const filter ``[1, k, cin, cout]`` as AMCT-TF expects of a Conv2D (the
    record's scale_w are per output channel, the same for both shapes)."""
    if node.op not in _WEIGHT_INPUT:
        return
    current, by_name = _weight_source(graph_def, node)
    if current.op != _EXPAND:
        return
    source = by_name[current.input[0].split(":")[0]]
    while source.op in _PASS_THROUGH:
        source = by_name[source.input[0].split(":")[0]]
    axis = by_name[current.input[1].split(":")[0]]
    if source.op != "Const" or axis.op != "Const":
        return
    value = np.expand_dims(
        tf.make_ndarray(source.attr["value"].tensor),
        int(tf.make_ndarray(axis.attr["value"].tensor)),
    )
    dtype = source.attr["dtype"].type
    current.op = "Const"
    del current.input[:]
    current.attr.clear()
    current.attr["dtype"].type = dtype
    current.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))


def _weight_const(graph_def, node):
    """Follow the op's weight input through Identity/ReadVariableOp (and a 1-D conv's
    ExpandDims, before it is inlined) to the Const node."""
    current, by_name = _weight_source(graph_def, node)
    if current.op == _EXPAND:
        current = by_name[current.input[0].split(":")[0]]
        while current.op in _PASS_THROUGH:
            current = by_name[current.input[0].split(":")[0]]
    if current.op != "Const":
        raise GraphError(f"op {node.name!r}: weights come from {current.op}, not a constant")
    return current


def _set_const(node, value: np.ndarray) -> None:
    old = tf.make_ndarray(node.attr["value"].tensor)
    if old.shape != value.shape:
        raise GraphError(f"{node.name}: folded kernel shape {value.shape} != {old.shape}")
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value.astype(old.dtype)))
