"""Readable summaries of a record: a layer table and a pruning-group list (used by ``inspect``).

Example:
    >>> from amct_bridge.records import LayerFactors, Record
    >>> rec = Record({"conv1": LayerFactors(scale_d=1 / 255, offset_d=-128, scale_w=[0.1, 0.2],
    ...                                     offset_w=[0, 0])})
    >>> print(layer_table(rec))
    layer  scale_d     offset_d  channels  scale_w range  types  extra
    conv1  0.00392157  -128      2         0.1 .. 0.2     -      -
"""

from __future__ import annotations

import os

from amct_bridge.records.codec import detect_flavor
from amct_bridge.records.flavors import WIDEST_FIRST, a_record
from amct_bridge.records.model import PruneNode, Record


def flavor_phrase(record: Record, written: str | None = None) -> str:
    """The record's flavor as every command prints it: the narrowest flavor whose schema holds
    everything it uses (what ``load`` detects), and the wider ones that read it too.

    ``inspect`` and the writers (``calibrate``) use this one phrase, so a file written with
    ``--flavor inner`` that holds only convert_model's fields reads the same in both.

    Example:
        >>> from amct_bridge.records import LayerFactors
        >>> flavor_phrase(Record({"conv": LayerFactors(scale_d=0.5, offset_d=0)}))
        "a 'tf' record (also valid as 'inner')"
        >>> flavor_phrase(Record({"c": LayerFactors(scale_d=0.5, offset_d=0, dst_type="INT4")}))
        "an 'inner' record"
        >>> flavor_phrase(Record({"conv": LayerFactors(scale_d=0.5, offset_d=0)}), "mindspore")
        "a 'mindspore' record (the same text as a 'tf' record here; also valid as 'inner')"

    ``written``: the flavor the record was written as (a writer's ``flavor``, or the one its
    calibration sidecar names: ``inspect`` and ``validate`` read it), said first. When it is
    narrower than what the text shows (a mindspore record whose keys have no ``.`` is a tf
    record, byte for byte), the text's flavor follows; when it is wider (the callbacks' default
    'inner' holding only fields a 'tf' record has too), the narrower flavors that read it:

        >>> flavor_phrase(Record({"conv": LayerFactors(scale_d=0.5, offset_d=0)}), "inner")
        "an 'inner' record (also valid as 'tf')"
    """
    flavor = detect_flavor(record)
    if written in WIDEST_FIRST and WIDEST_FIRST.index(written) > WIDEST_FIRST.index(flavor):
        wider = [w for w in WIDEST_FIRST[: WIDEST_FIRST.index(flavor)][::-1] if w != written]
        also = f"; also valid as {' and '.join(repr(w) for w in wider)}" if wider else ""
        return f"{a_record(written)} (the same text as {a_record(flavor)} here{also})"
    if written in WIDEST_FIRST and WIDEST_FIRST.index(written) < WIDEST_FIRST.index(flavor):
        # every flavor from the text's up to the widest reads it; the written one leads
        others = [w for w in WIDEST_FIRST[: WIDEST_FIRST.index(flavor) + 1][::-1] if w != written]
        return f"{a_record(written)} (also valid as {' and '.join(repr(w) for w in others)})"
    wider = WIDEST_FIRST[: WIDEST_FIRST.index(flavor)][::-1]
    also = f" (also valid as {' and '.join(repr(w) for w in wider)})" if wider else ""
    return a_record(flavor) + also


def written_flavor(path: str | os.PathLike) -> str | None:
    """The flavor the record at ``path`` was written as, from its calibration sidecar
    (``<path>.calib.json``: the callbacks and ``calibrate`` write it there); None when there
    is no sidecar, or it was written before it said (an unreadable sidecar raises, named).

    Example:
        >>> written_flavor("/nonexistent/record.txt") is None
        True
    """
    from amct_bridge.records.calibration import load_stats, sidecar_path

    side = sidecar_path(path)
    if not side.is_file():
        return None
    flavor = load_stats(side).flavor
    return flavor if flavor in WIDEST_FIRST else None


def _g(value: float) -> str:
    return f"{value:.6g}"


def _extra(f) -> str:
    items = []
    if f.skip_fusion is not None:
        items.append(f"skip_fusion={str(f.skip_fusion).lower()}")
    if f.shift_bit:
        items.append(f"shift_bit[{min(f.shift_bit)}..{max(f.shift_bit)}]")
    if f.tensor_balance_factor:
        items.append(f"tensor_balance_factor[{len(f.tensor_balance_factor)}]")
    if f.cluster:
        items.append(f"cluster[{len(f.cluster)}]")
    if f.prune_producer:
        items.append(f"prune_producer={','.join(f.prune_producer)}")
    if f.prune_consumer:
        items.append(f"prune_consumer={','.join(f.prune_consumer)}")
    return " ".join(items) or "-"


def layer_table(record: Record) -> str:
    """One row per layer: scale_d, offset_d, channel count, scale_w range, types, extra fields."""
    header = ("layer", "scale_d", "offset_d", "channels", "scale_w range", "types", "extra")
    rows = [header]
    for key, f in record.layers.items():
        types = "/".join(t for t in (f.act_type, f.wts_type, f.dst_type) if t) or "-"
        rows.append(
            (
                key,
                _g(f.scale_d) if f.scale_d is not None else "-",
                str(f.offset_d) if f.offset_d is not None else "-",
                str(len(f.scale_w)) if f.scale_w else "-",
                f"{_g(min(f.scale_w))} .. {_g(max(f.scale_w))}" if f.scale_w else "-",
                types,
                _extra(f),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _node(node: PruneNode) -> str:
    op = node.get("type")
    begin, end = node.get("begin"), node.get("end")
    span = f"[{begin}, {end})" if begin is not None and end is not None else ""
    return f"{node.name}({op}){span}" if op else f"{node.name}{span}"


def prune_summary(record: Record) -> str:
    """One line per channel-pruning group and per selective (2:4) node.

    Example:
        >>> from amct_bridge.records import PruneNode, PruneRecord, Record
        >>> rec = Record(prune_records=[PruneRecord([PruneNode.channel("c1", "Conv2D", 0, 8)],
        ...                                         [PruneNode.channel("c2", "Conv2D", 0, 8)])])
        >>> print(prune_summary(rec))
        1 channel-pruning group(s), 0 selective node(s)
          group 0: c1(Conv2D)[0, 8) -> c2(Conv2D)[0, 8)
    """
    groups = [p for p in record.prune_records if p.producers]
    selective = [p.selective_prune for p in record.prune_records if p.selective_prune is not None]
    lines = [f"{len(groups)} channel-pruning group(s), {len(selective)} selective node(s)"]
    for index, group in enumerate(groups):
        producers = ", ".join(_node(n) for n in group.producers)
        consumers = ", ".join(_node(n) for n in group.consumers) or "(no consumer)"
        lines.append(f"  group {index}: {producers} -> {consumers}")
    for node in selective:
        lines.append(f"  selective: {node.name} mask_shape={node.get('mask_shape')}")
    return "\n".join(lines)
