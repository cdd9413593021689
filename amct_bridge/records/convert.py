"""Conversion between record flavors (inner -> tf -> mindspore), listing what was dropped.

Example:
    >>> from amct_bridge.records import LayerFactors, Record
    >>> rec = Record({"c": LayerFactors(scale_d=0.1, offset_d=0, act_type="INT8")}, flavor="tf")
    >>> out, dropped = convert(rec, "mindspore")
    >>> dropped
    ["layer 'c': act_type ('INT8')"]
"""

from __future__ import annotations

import copy

from amct_bridge.records.codec import used_fields
from amct_bridge.records.flavors import UNSUPPORTED_FIELDS, get_flavor
from amct_bridge.records.model import Record


def convert(record: Record, to: str) -> tuple[Record, list[str]]:
    """A copy of ``record`` in flavor ``to`` and a line per dropped field or prune record.

    Fields the target schema lacks, and fields its consumer refuses (shift_bit for convert_model),
    are dropped; nothing is invented.

    Example:
        >>> from amct_bridge.records import Record
        >>> convert(Record(flavor="inner"), "tf")[1]
        []
    """
    target = get_flavor(to)
    out = Record(flavor=target.name, source=record.source)
    dropped: list[str] = []
    for key, factors in record.layers.items():
        factors = copy.deepcopy(factors)
        for name in used_fields(factors):
            if name not in target.fields or name in UNSUPPORTED_FIELDS[target.name]:
                value = getattr(factors, name)
                shown = repr(value) if not isinstance(value, list) else f"{len(value)} values"
                dropped.append(f"layer {key!r}: {name} ({shown})")
                setattr(factors, name, [] if isinstance(value, list) else None)
        out.layers[key] = factors
    if record.prune_records and not target.has_prune_records:
        dropped.append(f"{len(record.prune_records)} prune_record entries")
    else:
        out.prune_records = copy.deepcopy(record.prune_records)
    return out, dropped
