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

from amct_bridge.graph.groups import Discovery, Member, PruneGroup
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
