"""Discovery results -> AMCT PruneRecords, and the prune_producer/prune_consumer layer fields.

A group becomes one ``PruneRecord``: a ``producer`` node per producer range and a ``consumer``
node per consumer range, each with ``type`` (TF op type), ``begin`` and ``end``. Extra INT attrs
say what begin/end cannot: ``multiplier`` (each pruned root channel is that many consecutive
channels of this node: depthwise multiplier), ``tile`` + ``stride`` (the range repeats ``tile``
times every ``stride`` channels: rows of a Dense after Flatten of an NHWC map),
``branch_idx`` (which split output the range goes to), ``depth_multiplier`` (on a depthwise
node, whose range counts its input channels: filters per input channel).

Example:
    >>> from amct_bridge.graph.groups import Member, PruneGroup
    >>> g = PruneGroup(8, [Member("c1", "Conv2D", 0, 8)], [Member("c2", "Conv2D", 0, 8)])
    >>> rec = group_record(g)
    >>> rec.producers[0].name, rec.consumers[0].get("end")
    ('c1', 8)
"""

from __future__ import annotations

from typing import Any

from amct_bridge.graph.groups import Discovery, Member, PruneGroup, discover_groups
from amct_bridge.graph.ir import Graph
from amct_bridge.graph.selective import selective_candidates, selective_record
from amct_bridge.records.model import Attr, PruneNode, PruneRecord, Record


def member_node(member: Member) -> PruneNode:
    """A PruneNode with type/begin/end and the member's extra INT attrs.

    Example:
        >>> member_node(Member("fc", "MatMul", 0, 4, (("tile", 9), ("stride", 16)))).get("tile")
        9
    """
    extra = {key: Attr(key, "INT", int(value)) for key, value in member.attrs}
    return PruneNode.channel(member.name, member.op_type, member.begin, member.end, **extra)


def group_record(group: PruneGroup) -> PruneRecord:
    """One PruneRecord for ``group`` (producers, then consumers in graph order)."""
    return PruneRecord(
        producers=[member_node(m) for m in group.producers],
        consumers=[member_node(m) for m in group.consumers],
    )


def discovery_records(discovery: Discovery) -> list[PruneRecord]:
    """One PruneRecord per accepted group, in discovery order.

    Example:
        >>> discovery_records(Discovery())
        []
    """
    return [group_record(g) for g in discovery.groups]


def graph_prune_record(
    graph: Graph,
    *,
    channel: bool = True,
    selective: bool = False,
    masks: dict[str, Any] | None = None,
    record: Record | None = None,
) -> Record:
    """The prune part of a record from a framework's graph (both adapters' ``prune_record``):
    one PruneRecord per channel-pruning group (``channel``), one 2:4 selective PruneRecord per
    eligible layer (``selective``; ``mask_shape`` from the node's ``kernel_shape``, the mask
    from ``masks`` by layer if given), added to ``record`` (default: a new inner-flavor one)
    whose quantized layers then get ``prune_producer`` / ``prune_consumer``.

    Example:
        >>> from amct_bridge.graph.ir import Node, TensorInfo
        >>> g = Graph(tensors={"x": TensorInfo((None, 3)), "y": TensorInfo((None, 4)),
        ...                    "z": TensorInfo((None, 2))}, inputs=["x"], outputs=["z"])
        >>> g.add_node(Node("fc1", "fc1", "Dense", "MatMul", ["x"], ["y"],
        ...                 {"units": 4, "kernel_shape": (3, 4)}))
        >>> g.add_node(Node("fc2", "fc2", "Dense", "MatMul", ["y"], ["z"],
        ...                 {"units": 2, "kernel_shape": (4, 2)}))
        >>> rec = graph_prune_record(g, selective=True)
        >>> [p.producers[0].name for p in rec.prune_records[:1]], rec.flavor
        (['fc1'], 'inner')
        >>> [p.selective_prune.name for p in rec.prune_records[1:]]
        ['fc1', 'fc2']
    """
    record = record if record is not None else Record(flavor="inner")
    if channel:
        record.prune_records.extend(discovery_records(discover_groups(graph)))
    if selective:
        eligible, _ = selective_candidates(graph)
        for node in eligible:
            mask = masks.get(node.layer) if masks is not None else None
            record.prune_records.append(
                selective_record(node.layer, node.params["kernel_shape"], mask)
            )
    return fill_prune_fields(record)


def fill_prune_fields(record: Record) -> Record:
    """Set ``prune_producer`` / ``prune_consumer`` of the record's layers from its prune_records.

    A layer that is a producer of a group lists that group's consumers in ``prune_consumer``; a
    layer that is a consumer lists the group's producers in ``prune_producer`` (names in record
    order, each once; a layer's own name is never listed). Layers not in ``record.layers`` are
    left out: only quantized layers carry these fields. Returns ``record`` (changed in place).

    Example:
        >>> from amct_bridge.records.model import LayerFactors
        >>> rec = Record(layers={"c1": LayerFactors(), "c2": LayerFactors()})
        >>> rec.prune_records.append(PruneRecord([PruneNode.channel("c1", "Conv2D", 0, 8)],
        ...                                      [PruneNode.channel("c2", "Conv2D", 0, 8)]))
        >>> fill_prune_fields(rec).layers["c2"].prune_producer
        ['c1']
    """
    producers: dict[str, list[str]] = {}
    consumers: dict[str, list[str]] = {}
    for pr in record.prune_records:
        p_names = [n.name for n in pr.producers]
        c_names = [n.name for n in pr.consumers]
        for name in p_names:
            _extend(consumers.setdefault(name, []), c_names, name)
        for name in c_names:
            _extend(producers.setdefault(name, []), p_names, name)
    for key, factors in record.layers.items():
        factors.prune_producer = producers.get(key, [])
        factors.prune_consumer = consumers.get(key, [])
    return record


def _extend(target: list[str], names: list[str], own: str) -> None:
    for name in names:
        if name != own and name not in target:
            target.append(name)
