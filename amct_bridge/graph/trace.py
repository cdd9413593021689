"""Channel tracing: follow every producer's channels through the graph as symbolic masks.

Each tensor gets a list of :class:`~amct_bridge.graph.mapping.Piece` (which root channels of
which producer sit where); positions no piece covers are opaque (model inputs, channels after
an op that stopped propagation). Walking the nodes once in topological order collects:

- ``uses``: every node whose channels follow a producer, with the piece in the node's coordinates;
- ``couplings``: pairs of root ranges that must be pruned together (element-wise ops, concat on a
  non-channel axis, calls of one shared layer);
- ``taints``: root ranges that cannot be pruned, with a :class:`Reason` and the node where it
  happened. Nothing is guessed: an unknown op taints what reaches it. The producer that
  computes a model output (directly, or through its head's activation / softmax / dropout) is
  tainted MODEL_OUTPUT first, so that reason wins over what its head does (CHANNEL_MIXING of a
  softmax).

A SeparableConv2D is two record layers, ``<layer>/depthwise`` and ``<layer>/pointwise`` (as the
quantization record and the ESP-DL export name them): its uses and its source carry those names.

Example:
    >>> from amct_bridge.graph.ir import Graph, Node, TensorInfo
    >>> g = Graph(tensors={"x": TensorInfo((None, 3)), "y": TensorInfo((None, 4)),
    ...                    "z": TensorInfo((None, 2))}, inputs=["x"], outputs=["z"])
    >>> g.add_node(Node("fc1", "fc1", "Dense", "MatMul", ["x"], ["y"], {"units": 4}))
    >>> g.add_node(Node("fc2", "fc2", "Dense", "MatMul", ["y"], ["z"], {"units": 2}))
    >>> t = trace_channels(g)
    >>> [(u.name, u.piece.lo, u.piece.hi) for u in t.uses]
    [('fc2', 0, 4)]
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from amct_bridge.graph.ir import Graph, Node
from amct_bridge.graph.mapping import Misaligned, Piece
from amct_bridge.graph.reasons import Reason
from amct_bridge.graph.rules import (
    HEAD_OP_TYPES,
    MIXING_ACTIVATIONS,
    classify,
    depth_multiplier,
    is_weighted,
)


@dataclass(frozen=True)
class Source:
    """A producer layer whose output channels are roots (``size`` of them)."""

    layer: str
    op_type: str
    size: int
    order: int


@dataclass(frozen=True)
class Use:
    """A node (record name ``name``) whose channels ``piece`` follow a producer."""

    name: str
    op_type: str
    piece: Piece
    order: int
    closing: bool = False
    attrs: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Taint:
    """Root channels ``[lo, hi)`` of ``source`` cannot be pruned (``reason`` at node ``at``)."""

    source: int
    lo: int
    hi: int
    reason: Reason
    at: str


@dataclass
class Trace:
    """Everything collected by :func:`trace_channels`."""

    sources: list[Source] = field(default_factory=list)
    uses: list[Use] = field(default_factory=list)
    couplings: list[tuple[Piece, Piece]] = field(default_factory=list)
    taints: list[Taint] = field(default_factory=list)
    #: layer key -> (reason, node) for weighted layers that stopped propagation themselves.
    stopped: dict[str, tuple[Reason, str]] = field(default_factory=dict)


def trace_channels(graph: Graph) -> Trace:
    """Walk ``graph`` once and collect uses, couplings and taints (see module docstring).

    Example:
        >>> trace_channels(Graph()).uses
        []
    """
    return _Tracer(graph).run()


class _Tracer:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.trace = Trace()
        self.maps: dict[str, list[Piece]] = {tid: [] for tid in graph.inputs}
        self.source_of: dict[str, int] = {}
        self.first_inputs: dict[str, list[Piece]] = {}
        self.produced: dict[str, str] = {}  # node layer -> its source's name (sep/pointwise)
        self.order = 0
        self.node: Node | None = None

    def run(self) -> Trace:
        for order, node in enumerate(self.graph.nodes):
            self.order, self.node = order, node
            self.visit(node)
        for tid in self.graph.outputs:
            self.taint(self.maps.get(tid, []), Reason.REACHES_OUTPUT, f"model output {tid}")
        self.trace.taints[:0] = [t for tid in self.graph.outputs for t in self.output_taint(tid)]
        return self.trace

    def output_taint(self, tid: str) -> list[Taint]:
        """MODEL_OUTPUT on the producer whose channels are model output ``tid``: its own output,
        or through single-input head ops that keep the channels (softmax, sigmoid, dropout)."""
        node = self.graph.producer_of(tid)
        while node is not None and node.layer not in self.produced:
            if len(node.inputs) != 1 or node.op_type not in HEAD_OP_TYPES:
                return []
            if self.width(node.inputs[0]) != self.width(node.outputs[0]):
                return []
            node = self.graph.producer_of(node.inputs[0])
        if node is None:
            return []
        index = self.source_of[self.produced[node.layer]]
        size = self.trace.sources[index].size
        return [Taint(index, 0, size, Reason.MODEL_OUTPUT, f"model output {tid}")]

    # ---- helpers ---------------------------------------------------------------------------
    def width(self, tid: str) -> int | None:
        return self.graph.channels(tid)

    def axis(self, tid: str) -> int:
        return self.graph.channel_axis(tid)

    def taint(self, pieces: list[Piece], reason: Reason, at: str | None = None) -> None:
        where = at if at is not None else self.node.name
        for p in pieces:
            self.trace.taints.append(Taint(p.source, p.lo, p.hi, reason, where))

    def use(self, name: str, op_type: str, pieces: list[Piece], **kw) -> None:
        for p in pieces:
            self.trace.uses.append(Use(name, op_type, p, self.order, **kw))

    def new_source(self, node: Node, op_type: str, name: str | None = None) -> list[Piece]:
        size = self.width(node.outputs[0])
        if size is None:
            return []
        name = name or node.layer
        if name not in self.source_of:
            self.source_of[name] = len(self.trace.sources)
            self.trace.sources.append(Source(name, op_type, size, self.order))
            self.produced[node.layer] = name
        pieces = [Piece(self.source_of[name], 0, size)]
        if node.params.get("activation") in MIXING_ACTIVATIONS:
            self.taint(pieces, Reason.CHANNEL_MIXING)  # a fused softmax normalizes over them
        return pieces

    def stop(self, node: Node, inputs: list[list[Piece]], reason: Reason) -> None:
        for pieces in inputs:
            self.taint(pieces, reason)
        self.trace.stopped.setdefault(node.layer, (reason, node.name))
        for tid in node.outputs:
            self.maps[tid] = []

    # ---- dispatch --------------------------------------------------------------------------
    def visit(self, node: Node) -> None:
        inputs = [self.maps.get(tid, []) for tid in node.inputs]
        role, reason = classify(node, self.axis(node.inputs[0]) if node.inputs else -1)
        if any(self.width(t) is None for t in node.inputs + node.outputs) and role != "STOP":
            role, reason = "STOP", Reason.UNKNOWN_SHAPE
        if (
            role in ("PASS", "ELEMENTWISE")
            and node.inputs
            and any(self.width(t) != max(self.width(i) for i in node.inputs) for t in node.outputs)
        ):
            role, reason = "STOP", Reason.CHANNEL_MIXING  # channel count changed: not channel-wise
        if role == "STOP":
            self.stop(node, inputs, reason)
            return
        if len(node.inputs) > 1 and role == "PASS":
            role = "ELEMENTWISE"  # e.g. a raw op with two tensor operands
        if is_weighted(node, role) and node.inputs:
            self.couple_calls(node, inputs[0])
        outputs = getattr(self, "on_" + role.lower())(node, inputs)
        for tid, pieces in zip(node.outputs, outputs, strict=True):
            self.maps[tid] = pieces

    def couple_calls(self, node: Node, pieces: list[Piece]) -> None:
        """Calls of one weighted layer share weights: their inputs are pruned together."""
        first = self.first_inputs.setdefault(node.layer, pieces)
        if first is not pieces:
            self.merge([first, pieces], self.width(node.inputs[0]))

    def on_producer(self, node: Node, inputs: list[list[Piece]]) -> list[list[Piece]]:
        self.use(node.layer, node.op_type, inputs[0], closing=True)
        return [self.new_source(node, node.op_type)]

    def on_separable(self, node: Node, inputs: list[list[Piece]]) -> list[list[Piece]]:
        m = depth_multiplier(node)
        attrs = (("depth_multiplier", m),) if m > 1 else ()
        self.use(f"{node.layer}/depthwise", "DepthwiseConv2dNative", inputs[0], attrs=attrs)
        pointwise = f"{node.layer}/pointwise"
        self.use(pointwise, "Conv2D", [p.repeated(m) for p in inputs[0]], closing=True)
        return [self.new_source(node, "Conv2D", pointwise)]

    def on_depthwise(self, node: Node, inputs: list[list[Piece]]) -> list[list[Piece]]:
        m = depth_multiplier(node)
        attrs = (("depth_multiplier", m),) if m > 1 else ()
        self.use(node.layer, node.op_type, inputs[0], attrs=attrs)
        return [[p.repeated(m) for p in inputs[0]]]

    def on_pass(self, node: Node, inputs: list[list[Piece]]) -> list[list[Piece]]:
        pieces = inputs[0] if inputs else []
        self.use(node.layer, node.op_type, pieces)
        return [pieces for _ in node.outputs]

    def on_elementwise(self, node: Node, inputs: list[list[Piece]]) -> list[list[Piece]]:
        widths = [self.width(t) for t in node.inputs]
        pieces = self.merge_inputs(inputs, widths)
        self.use(node.layer, node.op_type, pieces)
        return [pieces]

    def on_concatenate(self, node: Node, inputs: list[list[Piece]]) -> list[list[Piece]]:
        if node.params.get("axis", -1) != self.axis(node.inputs[0]):
            return self.on_elementwise(node, inputs)
        out, offset = [], 0
        for tid, pieces in zip(node.inputs, inputs, strict=True):
            out.extend(p.shifted(offset) for p in pieces)
            offset += self.width(tid)
        self.use(node.layer, node.op_type, out)
        return [out]

    def on_split(self, node: Node, inputs: list[list[Piece]]) -> list[list[Piece]]:
        if node.params.get("axis", -1) != self.axis(node.inputs[0]):
            return self.on_pass(node, inputs)
        outputs, start = [], 0
        for branch, tid in enumerate(node.outputs):
            end = start + self.width(tid)
            out = []
            for p in inputs[0]:
                try:
                    part = p.sliced(start, end)
                except Misaligned:
                    self.taint([p], Reason.MAPPING_MISMATCH)
                    continue
                if part is not None:
                    out.append(part)
                    attrs = (("branch_idx", branch),)
                    self.use(node.layer, node.op_type, [part.shifted(start)], attrs=attrs)
            outputs.append(out)
            start = end
        return outputs

    def on_reshape(self, node: Node, inputs: list[list[Piece]]) -> list[list[Piece]]:
        src = self.graph.tensors[node.inputs[0]].shape[1:]
        dst = self.graph.tensors[node.outputs[0]].shape[1:]
        pieces = inputs[0]
        # channel positions among the non-batch dims
        p, q = len(src) + self.axis(node.inputs[0]), len(dst) + self.axis(node.outputs[0])
        if (
            dst
            and src
            and dst[q] == src[p]
            and ((p, q) == (len(src) - 1, len(dst) - 1) or _prod(src[:p]) == _prod(dst[:q]))
            and not any(x.tiles > 1 for x in pieces)
        ):
            return self.on_pass(node, inputs)
        if len(dst) == 1 and None not in src and dst[0] == math.prod(src):
            # channel c of a (outer, C, inner) map lands on rows (o * C + c) * inner + i:
            # NHWC (inner 1) tiles every C rows, NCHW (outer 1) is a block of inner rows.
            outer, inner = math.prod(src[:p]), math.prod(src[p + 1 :])
            try:
                out = [x.repeated(inner).tiled(outer, src[p] * inner) for x in pieces]
            except Misaligned:
                self.stop(node, inputs, Reason.MAPPING_MISMATCH)
                return [[]]
            self.use(node.layer, node.op_type, out)
            return [out]
        self.stop(node, inputs, Reason.CHANNEL_MIXING)
        return [[]]

    def on_transpose(self, node: Node, inputs: list[list[Piece]]) -> list[list[Piece]]:
        axes = node.params.get("axes")
        src_axis = len(axes) + self.axis(node.inputs[0]) if axes is not None else None
        if axes is not None and axes[self.axis(node.outputs[0])] == src_axis:
            return self.on_pass(node, inputs)
        self.stop(node, inputs, Reason.CHANNEL_MIXING)
        return [[]]

    # ---- merging (element-wise coupling) ---------------------------------------------------
    def merge_inputs(self, inputs: list[list[Piece]], widths: list[int]) -> list[Piece]:
        full = max(widths)
        active = []
        for pieces, w in zip(inputs, widths, strict=True):
            if w == full:
                active.append(pieces)
            elif w == 1:
                self.taint(pieces, Reason.BROADCAST)
            else:
                for other in inputs:
                    self.taint(other, Reason.WIDTH_MISMATCH)
                return []
        return self.merge(active, full)

    def merge(self, active: list[list[Piece]], full: int) -> list[Piece]:
        """Couple position-aligned pieces of equal-width maps; returns the merged map."""
        if len(active) == 1:
            return active[0]
        if any(p.tiles != 1 for ps in active for p in ps):
            return self.merge_tiled(active)
        bounds = sorted({0, full, *(b for ps in active for p in ps for b in (p.offset, p.end))})
        starts = [[p.offset for p in ps] for ps in active]
        out = []
        for x0, x1 in zip(bounds[:-1], bounds[1:], strict=True):
            covering = [_find(ps, st, x0) for ps, st in zip(active, starts, strict=True)]
            present = [p for p in covering if p is not None]
            try:
                subs = [p.sub(*p.roots_of(x0, x1)) for p in present]
            except Misaligned:
                self.taint(present, Reason.MAPPING_MISMATCH)
                continue
            if len(present) < len(covering):
                self.taint(subs, Reason.MERGED_WITH_UNPRUNABLE)
            elif any(s.repeat != subs[0].repeat for s in subs):
                self.taint(subs, Reason.MAPPING_MISMATCH)
            else:
                self.trace.couplings.extend((subs[0], s) for s in subs[1:])
                out.append(subs[0])
        return out

    def merge_tiled(self, active: list[list[Piece]]) -> list[Piece]:
        def layout(ps: list[Piece]) -> list[tuple[int, ...]]:
            return [(p.offset, p.width, p.repeat, p.tiles, p.stride) for p in ps]

        if any(layout(ps) != layout(active[0]) for ps in active):
            for ps in active:
                self.taint(ps, Reason.MAPPING_MISMATCH)
            return []
        for ps in active[1:]:
            self.trace.couplings.extend(zip(active[0], ps, strict=True))
        return active[0]


def _prod(dims: tuple[int | None, ...]) -> int | None:
    return None if None in dims else math.prod(dims)


def _find(pieces: list[Piece], starts: list[int], x: int) -> Piece | None:
    """The piece covering position ``x`` (pieces sorted by offset, non-overlapping)."""
    i = bisect.bisect_right(starts, x) - 1
    if i >= 0 and pieces[i].offset <= x < pieces[i].end:
        return pieces[i]
    return None
