"""Channel-pruning groups from a channel trace: cut, couple, close, refuse.

1. Cut every producer's channels at every boundary any use, coupling or taint mentions, and
   mirror cuts across couplings until nothing changes: each resulting interval ("atom") is
   either wholly in or out of every range that matters.
2. Union coupled atoms: a class of atoms is one group (one mask; index ``i`` of every member
   range is the same channel).
3. A class with a taint is refused with its first reason; one without a closing consumer (a
   layer with weights reading the channels) is refused with NO_CLOSING_CONSUMER.

Example:
    >>> from amct_bridge.graph.ir import Graph, Node, TensorInfo
    >>> g = Graph(tensors={"x": TensorInfo((None, 3)), "y": TensorInfo((None, 4)),
    ...                    "z": TensorInfo((None, 2))}, inputs=["x"], outputs=["z"])
    >>> g.add_node(Node("fc1", "fc1", "Dense", "MatMul", ["x"], ["y"], {"units": 4}))
    >>> g.add_node(Node("fc2", "fc2", "Dense", "MatMul", ["y"], ["z"], {"units": 2}))
    >>> d = discover_groups(g)
    >>> [(m.name, m.begin, m.end) for m in d.groups[0].members]
    [('fc1', 0, 4), ('fc2', 0, 4)]
    >>> [(r.layer, r.reason.value) for r in d.refusals]
    [('fc2', 'MODEL_OUTPUT')]
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from amct_bridge.graph.ir import Graph
from amct_bridge.graph.reasons import Reason
from amct_bridge.graph.rules import DEPTHWISE_KINDS, PRODUCER_KINDS, SEPARABLE_KINDS
from amct_bridge.graph.trace import Trace, Use, trace_channels

#: Layer kinds whose weights a quantization record covers (each is grouped or refused).
QUANTIZABLE_KINDS = PRODUCER_KINDS | DEPTHWISE_KINDS | SEPARABLE_KINDS


@dataclass(frozen=True)
class Member:
    """One producer or consumer entry of a group: record name, TF op type, channel range.

    ``attrs`` carries what begin/end cannot say: ``multiplier`` (each root channel is that many
    consecutive channels here), ``tile``/``stride`` (the range repeats ``tile`` times every
    ``stride`` channels: Flatten of NHWC), ``branch_idx`` (split output), ``depth_multiplier``
    (on a depthwise node, whose range is in its input channels: outputs per input channel).

    Example:
        >>> Member("fc", "MatMul", 0, 4, (("tile", 9), ("stride", 16))).attr("tile")
        9
    """

    name: str
    op_type: str
    begin: int
    end: int
    attrs: tuple[tuple[str, int], ...] = ()
    closing: bool = False

    def attr(self, key: str, default: int | None = None) -> int | None:
        """Value of an extra attr (``multiplier``, ``tile``, ``stride``, ``branch_idx``)."""
        return dict(self.attrs).get(key, default)


@dataclass
class PruneGroup:
    """Producers whose output channels share one mask, and the consumers that follow them.

    ``width`` = root channels in the group: each producer range has ``width`` channels; a
    consumer range has ``width * multiplier`` (per tile).
    """

    width: int
    producers: list[Member] = field(default_factory=list)
    consumers: list[Member] = field(default_factory=list)

    @property
    def members(self) -> list[Member]:
        """Producers then consumers."""
        return self.producers + self.consumers


@dataclass(frozen=True)
class Refusal:
    """Channels ``[begin, end)`` of ``layer`` cannot be pruned: ``reason`` (+ where, in detail)."""

    layer: str
    begin: int
    end: int
    reason: Reason
    detail: str


@dataclass
class Discovery:
    """Result of :func:`discover_groups`: accepted groups and refusals, deterministic order."""

    groups: list[PruneGroup] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)


def discover_groups(graph: Graph) -> Discovery:
    """Find every channel-pruning group of ``graph`` and every refusal with its reason.

    Example:
        >>> discover_groups(Graph()).groups
        []
    """
    trace = trace_channels(graph)
    return _Resolver(trace).resolve(graph)


class _Resolver:
    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.cuts: list[list[int]] = [[0, s.size] for s in trace.sources]
        self.atom_ids: list[dict[int, int]] = []
        self.parent: list[int] = []

    def add_cut(self, source: int, x: int) -> bool:
        cuts = self.cuts[source]
        i = bisect.bisect_left(cuts, x)
        if i < len(cuts) and cuts[i] == x:
            return False
        cuts.insert(i, x)
        return True

    def inner_cuts(self, source: int, lo: int, hi: int) -> list[int]:
        cuts = self.cuts[source]
        return cuts[bisect.bisect_left(cuts, lo) : bisect.bisect_right(cuts, hi)]

    def make_cuts(self) -> None:
        t = self.trace
        ranges = [(u.piece.source, u.piece.lo, u.piece.hi) for u in t.uses]
        ranges += [(x.source, x.lo, x.hi) for x in t.taints]
        ranges += [(p.source, p.lo, p.hi) for pair in t.couplings for p in pair]
        for source, lo, hi in ranges:
            self.add_cut(source, lo)
            self.add_cut(source, hi)
        changed = True
        while changed:  # mirror cuts across couplings until stable
            changed = False
            for a, b in t.couplings:
                for x, y in ((a, b), (b, a)):
                    for c in self.inner_cuts(x.source, x.lo, x.hi):
                        changed |= self.add_cut(y.source, y.lo + c - x.lo)

    def atoms_in(self, source: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """(atom id, start, end) of the atoms covering roots [lo, hi) of ``source``."""
        cuts = self.inner_cuts(source, lo, hi)
        ids = self.atom_ids[source]
        return [(ids[s], s, e) for s, e in zip(cuts[:-1], cuts[1:], strict=True)]

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union_couplings(self) -> None:
        self.atom_list: list[tuple[int, int, int]] = []
        for source, cuts in enumerate(self.cuts):
            ids = {}
            for s, e in zip(cuts[:-1], cuts[1:], strict=True):
                ids[s] = len(self.atom_list)
                self.atom_list.append((source, s, e))
            self.atom_ids.append(ids)
        self.parent = list(range(len(self.atom_list)))
        for a, b in self.trace.couplings:
            for (ia, _, _), (ib, _, _) in zip(
                self.atoms_in(a.source, a.lo, a.hi),
                self.atoms_in(b.source, b.lo, b.hi),
                strict=True,
            ):
                ra, rb = self.find(ia), self.find(ib)
                if ra != rb:
                    self.parent[max(ra, rb)] = min(ra, rb)

    def resolve(self, graph: Graph) -> Discovery:
        self.make_cuts()
        self.union_couplings()
        reasons: dict[int, tuple[Reason, str]] = {}
        for t in self.trace.taints:
            for atom, _, _ in self.atoms_in(t.source, t.lo, t.hi):
                reasons.setdefault(self.find(atom), (t.reason, t.at))
        uses: dict[int, list[tuple[Use, int, int]]] = {}
        for u in self.trace.uses:
            for atom, s, e in self.atoms_in(u.piece.source, u.piece.lo, u.piece.hi):
                uses.setdefault(self.find(atom), []).append((u, s, e))
        classes: dict[int, list[int]] = {}
        for atom in range(len(self.atom_list)):
            classes.setdefault(self.find(atom), []).append(atom)
        for root in classes:
            if root not in reasons and not any(u.closing for u, _, _ in uses.get(root, [])):
                reasons[root] = (Reason.NO_CLOSING_CONSUMER, "")
        result = Discovery()
        for root, atoms in classes.items():
            if root in reasons:
                result.refusals.extend(self.refuse(atoms, *reasons[root]))
            else:
                result.groups.append(self.group(atoms, uses.get(root, [])))
        result.groups.sort(key=lambda g: self.sort_key(g.producers[0]))
        result.refusals.extend(self.consumer_refusals(graph, result, reasons, uses))
        result.refusals.sort(key=lambda r: (self.layer_order.get(r.layer, 1 << 30), r.begin))
        result.refusals = _merge_adjacent(result.refusals)
        return result

    @property
    def layer_order(self) -> dict[str, int]:
        if not hasattr(self, "_layer_order"):
            order = {s.layer: s.order for s in self.trace.sources}
            for u in self.trace.uses:
                order.setdefault(u.name, u.order)
            self._layer_order = order
        return self._layer_order

    def sort_key(self, m: Member) -> tuple[int, int]:
        return (self.layer_order.get(m.name, 1 << 30), m.begin)

    def group(self, atoms: list[int], uses: list[tuple[Use, int, int]]) -> PruneGroup:
        sources = self.trace.sources
        producers = []
        for atom in atoms:
            source, s, e = self.atom_list[atom]
            producers.append(Member(sources[source].layer, sources[source].op_type, s, e))
        consumers = {}
        for u, s, e in uses:
            sub = u.piece.sub(s, e)
            attrs = dict(u.attrs)
            if sub.repeat > 1:
                attrs["multiplier"] = sub.repeat
            if sub.tiles > 1:
                attrs.update(tile=sub.tiles, stride=sub.stride)
            m = Member(u.name, u.op_type, sub.offset, sub.end, tuple(attrs.items()), u.closing)
            consumers.setdefault(m, (u.order, sub.offset))
        _, s, e = self.atom_list[atoms[0]]
        return PruneGroup(
            width=e - s,
            producers=sorted(producers, key=self.sort_key),
            consumers=sorted(consumers, key=consumers.__getitem__),  # stable: trace order
        )

    def refuse(self, atoms: list[int], reason: Reason, at: str) -> list[Refusal]:
        detail = f"at {at}: {reason.explain()}" if at else reason.explain()
        out = []
        for atom in sorted(atoms, key=lambda a: self.atom_list[a]):
            source, s, e = self.atom_list[atom]
            layer = self.trace.sources[source].layer
            if out and out[-1].layer == layer and out[-1].end == s:
                out[-1] = Refusal(layer, out[-1].begin, e, reason, detail)
            else:
                out.append(Refusal(layer, s, e, reason, detail))
        return out

    def consumer_refusals(self, graph, result, reasons, uses) -> list[Refusal]:
        """Quantizable layers in no accepted group and not refused as a producer."""
        covered = {m.name for g in result.groups for m in g.members}
        covered |= {r.layer for r in result.refusals}
        refused_by_use = {}
        for root, entries in uses.items():
            if root in reasons:
                for u, _, _ in entries:
                    name = u.name.removesuffix("/depthwise").removesuffix("/pointwise")
                    refused_by_use.setdefault(name, reasons[root])
        covered |= {n.removesuffix("/pointwise") for n in covered}  # a SeparableConv2D
        out = []
        for node in graph.nodes:
            if node.kind not in QUANTIZABLE_KINDS or node.layer in covered:
                continue
            covered.add(node.layer)
            width = graph.channels(node.outputs[0]) or 0
            if node.layer in self.trace.stopped:
                reason, at = self.trace.stopped[node.layer]
            elif node.layer in refused_by_use:
                reason, at = refused_by_use[node.layer]
            else:
                reason, at = Reason.INPUT_NOT_PRUNABLE, node.name
            detail = f"at {at}: {reason.explain()}" if at else reason.explain()
            name = f"{node.layer}/pointwise" if node.kind in SEPARABLE_KINDS else node.layer
            out.append(Refusal(name, 0, width, reason, detail))
        return out


def _merge_adjacent(refusals: list[Refusal]) -> list[Refusal]:
    """Join touching ranges of one layer refused for the same reason at the same place."""
    out: list[Refusal] = []
    for r in refusals:
        last = out[-1] if out else None
        if last and (last.layer, last.reason, last.detail, last.end) == (
            r.layer,
            r.reason,
            r.detail,
            r.begin,
        ):
            out[-1] = Refusal(r.layer, last.begin, r.end, r.reason, r.detail)
        else:
            out.append(r)
    return out
