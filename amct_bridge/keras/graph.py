"""Keras 3 model -> framework-free :class:`amct_bridge.graph.Graph` (the model is never modified).

Reads the model's own call graph (``_nodes_by_depth``), so raw ops that are not layers
(``x + y``, ``ops.concatenate``, ``ops.split``, ``ops.transpose``) are nodes too, only this model's
calls of a shared layer are counted, and nested Functional / Sequential models are recursed
(their layers are named ``"outer/inner"``). A raw op keeps the name Keras gave it (``add``,
``multiply_1``: the names of ``model.operations`` and ``model.summary()``, unique per model and
kept by save/load; nested: ``"outer/add_3"``); only an op Keras left without a name gets an
invented ``"<snake_kind>_op<k>"``. Node fields are documented in :mod:`amct_bridge.graph.ir`.

Example:
    >>> import keras
    >>> from amct_bridge.keras.graph import extract_graph
    >>> x = keras.Input((8, 8, 3))
    >>> y = keras.layers.Conv2D(4, 3, name="c1")(x)
    >>> g = extract_graph(keras.Model(x, y))
    >>> [(n.name, n.kind, n.op_type) for n in g]
    [('c1', 'Conv2D', 'Conv2D')]
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from amct_bridge.errors import GraphError
from amct_bridge.graph.ir import Graph, Node, TensorInfo
from amct_bridge.graph.op_types import ACTIVATION_OP_TYPES, OP_TYPES


def extract_graph(model: keras.Model) -> Graph:
    """Translate a built Keras 3 model into the graph IR (nodes in topological order).

    Args:
        model: a built Functional or Sequential model (nested models are recursed).

    Returns:
        The :class:`~amct_bridge.graph.Graph`; raises GraphError for an unbuilt model.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="fc")])
        >>> extract_graph(m).node("fc").params["units"]
        2
    """
    return extract_graph_and_operations(model)[0]


def extract_graph_and_operations(model: keras.Model) -> tuple[Graph, dict[str, Any]]:
    """:func:`extract_graph` plus the Keras operation behind each node's ``layer`` key.

    Raw ops such as ``x + y`` are not layers (``model.get_layer`` cannot find them), so an
    adapter that must reach them (e.g. to observe their outputs) takes them from here.

    Example:
        >>> import keras
        >>> x = keras.Input((4,))
        >>> graph, ops = extract_graph_and_operations(keras.Model(x, x + x))
        >>> [type(ops[n.layer]).__name__ for n in graph]
        ['Add']
    """
    functional = _functional_of(model, model.name)
    builder = _Builder()
    tensor_ids = {}
    for kt in functional.inputs:
        tid = builder.new_tensor(kt._keras_history[0].name + ":0", kt)
        tensor_ids[id(kt)] = tid
        builder.graph.inputs.append(tid)
    builder.walk(functional, "", tensor_ids)
    builder.graph.outputs = [tensor_ids[id(kt)] for kt in functional.outputs]
    builder.mark_shared()
    return builder.graph, builder.operations


def _functional_of(model: Any, name: str) -> Any:
    """The object holding the call graph of a Functional or (built) Sequential model."""
    if isinstance(model, keras.Sequential):
        functional = getattr(model, "_functional", None)
        if functional is None:
            raise GraphError(
                f"Sequential model {name!r} is not built: give it a keras.Input "
                "first or call model.build(input_shape)"
            )
        return functional
    if not hasattr(model, "_nodes_by_depth"):
        raise GraphError(
            f"model {name!r} ({type(model).__name__}) has no call graph: only Functional and "
            "Sequential models can be read (subclassed models cannot)"
        )
    return model


class _Builder:
    """Walks (nested) Keras call graphs, appending IR nodes."""

    def __init__(self) -> None:
        self.graph = Graph()
        self.layer_keys: dict[int, str] = {}
        self.calls: dict[int, int] = {}
        self.raw_counts: dict[tuple[str, str], int] = {}
        self.taken: set[str] = set()  # layer keys given so far
        self.reserved: set[str] = set()  # Keras names of the operations walked into
        self.operations: dict[str, Any] = {}  # layer key -> Keras operation

    def new_tensor(self, tid: str, kt: Any) -> str:
        shape = tuple(None if d is None else int(d) for d in kt.shape)
        self.graph.tensors[tid] = TensorInfo(shape, str(kt.dtype))
        return tid

    def walk(self, functional: Any, prefix: str, tensor_ids: dict[int, str]) -> None:
        """Add the nodes of ``functional``; ``tensor_ids`` maps id(KerasTensor) -> tensor id."""
        by_depth = functional._nodes_by_depth
        # An invented name must not take a name some later operation of this level carries.
        self.reserved.update(prefix + op.name for op in functional.operations if op.name)
        for depth in sorted(by_depth, reverse=True):
            for knode in by_depth[depth]:
                if knode.is_input or knode.operation is None:
                    continue
                self.add_call(knode, prefix, tensor_ids)

    def add_call(self, knode: Any, prefix: str, tensor_ids: dict[int, str]) -> None:
        op = knode.operation
        try:
            inputs = [tensor_ids[id(kt)] for kt in knode.input_tensors]
        except KeyError:
            raise GraphError(
                f"{prefix}{op.name}: input tensor not produced in this model"
            ) from None
        if isinstance(op, keras.Model):
            self.add_nested(op, knode, prefix, inputs, tensor_ids)
            return
        name, layer, call_index = self.name_call(op, prefix)
        outputs = []
        for i, kt in enumerate(knode.outputs):
            outputs.append(self.new_tensor(f"{name}:{i}", kt))
            tensor_ids[id(kt)] = outputs[-1]
        kind = type(op).__name__
        params = _params(op, knode, self.graph, inputs)
        node = Node(
            name=name,
            layer=layer,
            kind=kind,
            op_type=_op_type(op, kind),
            inputs=inputs,
            outputs=outputs,
            params=params,
            is_layer=isinstance(op, keras.layers.Layer),
            call_index=call_index,
        )
        self.graph.add_node(node)

    def add_nested(self, op: Any, knode: Any, prefix: str, inputs: list[str], outer: dict) -> None:
        inner_fn = _functional_of(op, prefix + op.name)
        inner_ids = {id(kt): tid for kt, tid in zip(inner_fn.inputs, inputs, strict=True)}
        # Repeated calls reuse the layer keys cached by object id, so one prefix is enough.
        self.walk(inner_fn, f"{prefix}{op.name}/", inner_ids)
        for kt_outer, kt_inner in zip(knode.outputs, inner_fn.outputs, strict=True):
            outer[id(kt_outer)] = inner_ids[id(kt_inner)]

    def name_call(self, op: Any, prefix: str) -> tuple[str, str, int]:
        """(node name, layer key, call index) for a call of ``op`` under ``prefix``."""
        key = id(op)
        if key not in self.layer_keys:
            if isinstance(op, keras.layers.Layer):
                self.layer_keys[key] = prefix + op.name
            else:
                self.layer_keys[key] = self.raw_op_key(op, prefix)
            self.taken.add(self.layer_keys[key])
        layer = self.layer_keys[key]
        self.operations.setdefault(layer, op)
        call = self.calls.get(key, 0)
        self.calls[key] = call + 1
        return (layer if call == 0 else f"{layer}@{call}"), layer, call

    def raw_op_key(self, op: Any, prefix: str) -> str:
        """Keras' own name of a raw op (``add``, ``multiply_1``: what ``model.operations`` and
        ``model.summary()`` show, kept by save/load); ``<snake_kind>_op<k>`` only when Keras
        gives none (an empty name, or one already taken in this model)."""
        name = getattr(op, "name", None)
        if isinstance(name, str) and name and prefix + name not in self.taken:
            return prefix + name
        snake = _snake(type(op).__name__)
        while True:
            count = self.raw_counts.get((prefix, snake), 0)
            self.raw_counts[(prefix, snake)] = count + 1
            invented = f"{prefix}{snake}_op{count}"
            if invented not in self.taken and invented not in self.reserved:
                return invented

    def mark_shared(self) -> None:
        by_layer: dict[str, int] = {}
        for node in self.graph.nodes:
            by_layer[node.layer] = by_layer.get(node.layer, 0) + 1
        for node in self.graph.nodes:
            node.shared = by_layer[node.layer] > 1


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _activation_name(fn: Any) -> str:
    if fn is None:
        return "linear"
    return getattr(fn, "__name__", type(fn).__name__).lower()


def _op_type(op: Any, kind: str) -> str:
    if kind == "Activation":
        return ACTIVATION_OP_TYPES.get(_activation_name(op.activation), "")
    if kind == "ReLU":
        if op.negative_slope:
            return "LeakyRelu"
        return "Relu6" if op.max_value == 6 else "Relu"
    return OP_TYPES.get(kind, "")


def _neg_axis(axis: int, rank: int) -> int:
    return axis - rank if axis >= 0 else axis


def _channel_axis(op: Any, rank: int) -> int:
    fmt = getattr(op, "data_format", "channels_last")
    return -(rank - 1) if fmt == "channels_first" else -1


def _shape(var: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in var.shape)


def _conv_params(op: Any, rank: int, graph: Graph, inputs: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {
        "channel_axis": _channel_axis(op, rank),
        "data_format": op.data_format,
        "strides": tuple(op.strides),
        "padding": op.padding,
        "dilation_rate": tuple(op.dilation_rate),
        "use_bias": bool(op.use_bias),
        "activation": _activation_name(op.activation),
    }
    shape = graph.tensors[inputs[0]].shape
    params["in_channels"] = shape[params["channel_axis"]]
    kind = type(op).__name__
    if kind.startswith("Depthwise"):
        params.update(depth_multiplier=op.depth_multiplier, kernel_layout="HWIM")
        params["kernel_shape"] = _shape(op.kernel)
    elif kind.startswith("Separable"):
        params.update(depth_multiplier=op.depth_multiplier, filters=op.filters)
        params["kernel_shape"] = _shape(op.depthwise_kernel)
        params["pointwise_kernel_shape"] = _shape(op.pointwise_kernel)
        params["kernel_layout"] = "HWIM"
    elif kind.endswith("Transpose"):
        params.update(filters=op.filters, kernel_layout="HWOI", kernel_shape=_shape(op.kernel))
    else:
        layout = "WIO" if getattr(op, "rank", 2) == 1 else "HWIO"  # Conv1D: [k, cin, cout]
        params.update(filters=op.filters, groups=getattr(op, "groups", 1), kernel_layout=layout)
        params["kernel_shape"] = _shape(op.kernel)
    return params


def _dense_params(op: Any, rank: int, graph: Graph, inputs: list[str]) -> dict[str, Any]:
    return {
        "channel_axis": -1,
        "units": op.units,
        "in_channels": graph.tensors[inputs[0]].shape[-1],
        "kernel_shape": _shape(op.kernel),
        "kernel_layout": "IO",
        "use_bias": bool(op.use_bias),
        "activation": _activation_name(op.activation),
    }


def _bn_params(op: Any, rank: int, graph: Graph, inputs: list[str]) -> dict[str, Any]:
    axis = op.axis[0] if isinstance(op.axis, (list, tuple)) else op.axis
    return {
        "channel_axis": _neg_axis(int(axis), rank),
        "axis": _neg_axis(int(axis), rank),
        "scale": bool(op.scale),
        "center": bool(op.center),
        "epsilon": float(op.epsilon),
    }


def _axis_params(op: Any, rank: int, graph: Graph, inputs: list[str]) -> dict[str, Any]:
    axis = op.axis
    if isinstance(axis, (list, tuple)):
        return {"axis": tuple(_neg_axis(int(a), rank) for a in axis)}
    return {"axis": _neg_axis(int(axis), rank)}


def _split_params(op: Any, rank: int, graph: Graph, inputs: list[str]) -> dict[str, Any]:
    axis = _neg_axis(int(op.axis), rank)
    total = graph.tensors[inputs[0]].shape[axis]
    sections = op.indices_or_sections
    if isinstance(sections, int):
        sizes = [total // sections] * sections if total is not None else None
    else:
        bounds = [0, *[int(i) for i in sections], total]
        sizes = (
            [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            if total is not None
            else None
        )
    return {"axis": axis, "split_sizes": sizes}


def _transpose_params(op: Any, rank: int, graph: Graph, inputs: list[str]) -> dict[str, Any]:
    axes = op.axes if op.axes is not None else tuple(reversed(range(rank)))
    return {"axes": tuple(int(a) for a in axes)}


def _permute_params(op: Any, rank: int, graph: Graph, inputs: list[str]) -> dict[str, Any]:
    return {"axes": (0, *[int(d) for d in op.dims])}


def _reshape_params(op: Any, rank: int, graph: Graph, inputs: list[str]) -> dict[str, Any]:
    target = getattr(op, "target_shape", None) or getattr(op, "newshape", None)
    return {"target_shape": tuple(target) if target is not None else None}


def _activation_params(op: Any, rank: int, graph: Graph, inputs: list[str]) -> dict[str, Any]:
    return {"activation": _activation_name(op.activation)}


def _relu_params(op: Any, rank: int, graph: Graph, inputs: list[str]) -> dict[str, Any]:
    return {
        "activation": "relu",
        "max_value": op.max_value,
        "negative_slope": float(op.negative_slope),
        "threshold": float(op.threshold),
    }


def _flatten_params(op: Any, rank: int, graph: Graph, inputs: list[str]) -> dict[str, Any]:
    return {"data_format": getattr(op, "data_format", "channels_last")}


def _rescaling_params(op: Any, rank: int, graph: Graph, inputs: list[str]) -> dict[str, Any]:
    scale, offset = np.asarray(op.scale), np.asarray(op.offset)
    return {
        "scale": scale.tolist(),
        "offset": offset.tolist(),
        "per_channel_constant": bool(scale.size > 1 or offset.size > 1),
    }


_PARAMS: dict[str, Callable[[Any, int, Graph, list[str]], dict[str, Any]]] = {
    **{k: _conv_params for k in OP_TYPES if k.startswith(("Conv", "Depthwise", "Separable"))},
    "Dense": _dense_params,
    "BatchNormalization": _bn_params,
    "Concatenate": _axis_params,
    "Softmax": _axis_params,
    "Split": _split_params,
    "Transpose": _transpose_params,
    "Permute": _permute_params,
    "Reshape": _reshape_params,
    "Flatten": _flatten_params,
    "Activation": _activation_params,
    "ReLU": _relu_params,
    "Rescaling": _rescaling_params,
}


def _params(op: Any, knode: Any, graph: Graph, inputs: list[str]) -> dict[str, Any]:
    kind = type(op).__name__
    rank = len(graph.tensors[inputs[0]].shape) if inputs else 0
    fn = _PARAMS.get(kind)
    params = fn(op, rank, graph, inputs) if fn is not None else {}
    if not isinstance(op, keras.layers.Layer):
        params["const_operands"] = sum(
            1
            for arg in knode.arguments._flat_arguments
            if not isinstance(arg, keras.KerasTensor) and np.ndim(arg) > 0
        )
        # scalar operands (x + 3.0, x * (1 / 6) in MobileNetV3's hard_sigmoid) and their
        # position among the operands: the ESP-DL v3 export writes them as constants
        scalars = [
            (i, float(arg))
            for i, arg in enumerate(knode.arguments._flat_arguments)
            if isinstance(arg, int | float | np.number) and not isinstance(arg, bool)
        ]
        if scalars:
            params["scalar_operands"] = scalars
    return params


def find_layer(model: keras.Model, key: str) -> keras.layers.Layer:
    """The layer whose record key is ``key`` (``"outer/inner"`` walks nested models).

    Example:
        >>> import keras
        >>> x = keras.Input((3,))
        >>> find_layer(keras.Model(x, keras.layers.Dense(2, name="fc")(x)), "fc").name
        'fc'
    """
    layer: Any = model
    for part in key.split("/"):
        try:
            layer = layer.get_layer(part)
        except (ValueError, AttributeError):
            raise GraphError(f"layer {key!r}: no layer {part!r} in model {model.name!r}") from None
    return layer
