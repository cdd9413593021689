"""Framework-free graph IR: nodes in topological order, edges by tensor id.

Adapters (``amct_bridge.keras.graph.extract_graph``) translate a framework model into a
:class:`Graph`; the core (pruning discovery, exporters, calibration planning) reads only this.

Node fields (what other modules may rely on):

- ``name``: unique node name in record-key style. A Keras layer's name; layers inside nested
  models are ``"outer/inner"``. The 2nd, 3rd... call of a shared layer is ``"<layer>@1"``,
  ``"<layer>@2"``. Raw ops that are not layers (``x + y``, ``ops.concatenate``) are named by the
  framework's own name where it has one, and by an invented one only where it has none:

  - Keras names every op (``model.operations`` / ``model.summary()`` list ``x + y`` as ``add``,
    ``ops.multiply`` as ``multiply_1``...; unique in a model, kept by save/load, counted per
    process, so the same code run twice may give ``add``, then ``add_1``). That name is used;
    nested: ``"outer/add_3"``. Only an op Keras left without a name (an empty name) gets
    ``"<snake_kind>_op<k>"`` (k counts that kind in topological order, per model level).
  - MindSpore has no names for functional ops (``x + y``, ``ops.concat`` in ``construct``), so
    they are ``"<owner cell>.<prim>_op<k>"`` (``<prim>`` the primitive in lower case:
    ``layer1.0.add_op0``; ``add_op0`` in the top cell), k counting that primitive per owning cell
    in topological order (owner rule: docs/mindspore.md).
- ``layer``: the record key of the layer (or raw op) this node calls: equal to ``name`` except for
  repeated calls of a shared layer, where every call has the same ``layer``. Use it as record key.
- ``kind``: the layer kind in the core's vocabulary, which is Keras' class names
  (``"Conv2D"``, ``"BatchNormalization"``, ``"Add"``, ``"Concatenate"``...). A raw op and its
  layer twin share the kind (``x + y`` is ``"Add"``). Other adapters map their classes onto it
  (MindSpore ``nn.Conv2d`` is ``"Conv2D"``, ``ops.concat`` is ``"Concatenate"``) and keep the
  framework's own class in ``params["framework_class"]``; a class they do not know keeps a
  name no rule table holds, so it stops propagation.
- ``op_type``: the TF op type AMCT-TF writes for it (``"Conv2D"``, ``"MatMul"``,
  ``"FusedBatchNormV3"``, ``"DepthwiseConv2dNative"``, ``"Conv2DBackpropInput"``, ``"Relu"``,
  ``"AddV2"``, ``"ConcatV2"``...); ``""`` when there is no obvious twin.
- ``inputs`` / ``outputs``: tensor ids (strings), in call order; shapes are in ``Graph.tensors``,
  each with its ``channel_axis`` (-1 for NHWC / NC tensors, the default; -3 for NCHW).
- ``params``: the attributes that matter downstream (only keys that apply are present):
  ``channel_axis`` (int, negative = from the end; must equal the channel axis of the tensors
  the node reads, else the node stops propagation with UNSUPPORTED_LAYOUT),
  ``filters``/``units`` (output channels), ``in_channels``, ``groups``, ``depth_multiplier``,
  ``kernel_shape`` (tuple),
  ``kernel_layout`` (``"HWIO"`` Conv2D, ``"HWIM"`` depthwise, ``"IO"`` Dense, ``"HWOI"``
  Conv2DTranspose; MindSpore: ``"OIHW"`` Conv2d, depthwise included (C·m, 1, kH, kW),
  ``"OI"`` Dense (out, in), ``"IOHW"`` Conv2dTranspose), ``pointwise_kernel_shape``
  (SeparableConv2D), ``use_bias``, ``scale`` /
  ``center`` (BatchNormalization), ``activation`` (name of the fused activation, ``"linear"`` if
  none), ``axis`` (concat/split/normalization axis, normalized to be negative), ``split_sizes``,
  ``axes`` (transpose), ``target_shape`` (reshape), ``data_format``, ``strides``, ``padding``,
  ``dilation_rate``, ``const_operands`` (count of non-scalar constant arguments of a raw op),
  ``per_channel_constant`` (a layer such as Rescaling holding a per-channel constant).
- ``is_layer``: False for raw ops. ``shared``: the layer is called more than once in this graph.
- ``call_index``: which call of the layer this node is (0 for the first).

Example:
    >>> from amct_bridge.graph.ir import Graph, Node, TensorInfo
    >>> g = Graph(tensors={"t0": TensorInfo((None, 4)), "t1": TensorInfo((None, 2))},
    ...           inputs=["t0"], outputs=["t1"])
    >>> g.add_node(Node("fc", "fc", "Dense", "MatMul", ["t0"], ["t1"], {"units": 2}))
    >>> g.producer_of("t1").name, [n.name for n in g.consumers_of("t0")]
    ('fc', ['fc'])
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from amct_bridge.errors import GraphError


@dataclass(frozen=True)
class TensorInfo:
    """Static facts about one tensor: shape (``None`` for unknown dims), dtype, channel axis.

    ``channel_axis`` is negative (from the end): -1 for NHWC / NC tensors (Keras), -3 for an
    NCHW map (MindSpore); the adapter sets it.

    Example:
        >>> TensorInfo((None, 8, 8, 16)).channels
        16
        >>> TensorInfo((1, 16, 8, 8), channel_axis=-3).channels
        16
    """

    shape: tuple[int | None, ...]
    dtype: str = "float32"
    channel_axis: int = -1

    @property
    def channels(self) -> int | None:
        """Size of the channel axis, None if unknown."""
        if not self.shape or -self.channel_axis > len(self.shape):
            return None
        return self.shape[self.channel_axis]


@dataclass
class Node:
    """One call of a layer or raw op (see the module docstring for every field).

    Example:
        >>> Node("bn", "bn", "BatchNormalization", "FusedBatchNormV3", ["t1"], ["t2"]).is_layer
        True
    """

    name: str
    layer: str
    kind: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    params: dict[str, Any] = field(default_factory=dict)
    is_layer: bool = True
    shared: bool = False
    call_index: int = 0


@dataclass
class Graph:
    """A model as nodes in topological order plus tensor facts and model inputs/outputs.

    Example:
        >>> g = Graph(tensors={"x": TensorInfo((None, 3))}, inputs=["x"], outputs=["x"])
        >>> len(g), g.is_output("x")
        (0, True)
    """

    nodes: list[Node] = field(default_factory=list)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    _by_name: dict[str, Node] = field(default_factory=dict, repr=False, init=False)
    _producer: dict[str, Node] = field(default_factory=dict, repr=False, init=False)
    _consumers: dict[str, list[Node]] = field(default_factory=dict, repr=False, init=False)

    def __post_init__(self) -> None:
        nodes, self.nodes = self.nodes, []
        for node in nodes:  # index nodes given to the constructor (and check them)
            self.add_node(node)

    def add_node(self, node: Node) -> None:
        """Append ``node`` (callers add nodes in topological order); names must be unique."""
        if node.name in self._by_name:
            raise GraphError(f"duplicate node name {node.name!r} in graph")
        for tid in node.inputs:
            if tid not in self.tensors:
                raise GraphError(f"node {node.name!r}: input tensor {tid!r} is unknown")
            self._consumers.setdefault(tid, []).append(node)
        for tid in node.outputs:
            if tid in self._producer:
                raise GraphError(
                    f"node {node.name!r}: tensor {tid!r} already produced by "
                    f"{self._producer[tid].name!r}"
                )
            self._producer[tid] = node
        self._by_name[node.name] = node
        self.nodes.append(node)

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def node(self, name: str) -> Node:
        """The node called ``name`` (GraphError naming the closest miss otherwise)."""
        try:
            return self._by_name[name]
        except KeyError:
            raise GraphError(f"no node {name!r} in graph ({len(self.nodes)} nodes)") from None

    def producer_of(self, tensor: str) -> Node | None:
        """The node that outputs ``tensor``; None for a model input."""
        return self._producer.get(tensor)

    def consumers_of(self, tensor: str) -> list[Node]:
        """Nodes that read ``tensor``, in topological order (a node reading it twice is once)."""
        seen: dict[int, Node] = {}
        for node in self._consumers.get(tensor, []):
            seen.setdefault(id(node), node)
        return list(seen.values())

    def channel_axis(self, tensor: str) -> int:
        """Channel axis of ``tensor`` (negative, from the end)."""
        return self.tensors[tensor].channel_axis

    def is_output(self, tensor: str) -> bool:
        """True when ``tensor`` is a model output."""
        return tensor in self.outputs

    def channels(self, tensor: str) -> int | None:
        """Channel-axis size of ``tensor`` (None if unknown)."""
        return self.tensors[tensor].channels

    def layer_nodes(self, layer: str) -> list[Node]:
        """Every call (node) of the layer whose record key is ``layer``."""
        return [n for n in self.nodes if n.layer == layer]

    def chains(
        self, start_kinds: tuple[str, ...], follow_kinds: tuple[str, ...]
    ) -> list[list[Node]]:
        """Chains ``start -> follow -> follow...`` where each link is the only reader of the tensor.

        Handy for conv -> BN -> activation fusion: a link is followed only when the producer's
        single output is read by exactly one node and is not a model output.

        Example:
            >>> Graph().chains(("Conv2D",), ("BatchNormalization",))
            []
        """
        result = []
        for node in self.nodes:
            if node.kind not in start_kinds:
                continue
            chain = [node]
            while len(chain[-1].outputs) == 1:
                tid = chain[-1].outputs[0]
                readers = self.consumers_of(tid)
                if self.is_output(tid) or len(readers) != 1 or readers[0].kind not in follow_kinds:
                    break
                chain.append(readers[0])
            result.append(chain)
        return result
