"""Record model <-> protobuf messages of each flavor, and flavor detection.

Example:
    >>> from amct_bridge.records.model import LayerFactors, Record
    >>> msg = to_proto(Record({"conv1": LayerFactors(scale_d=0.5, offset_d=0)}), "tf")
    >>> type(msg).DESCRIPTOR.full_name, msg.record[0].key
    ('AMCTTensorflow.ScaleOffsetRecord', 'conv1')
"""

from __future__ import annotations

from dataclasses import fields

from amct_bridge.errors import RecordError
from amct_bridge.records.flavors import (
    FLAVORS,
    UNSUPPORTED_FIELDS,
    WIDEST_FIRST,
    a_record,
    get_flavor,
)
from amct_bridge.records.model import ATTR_TYPES, Attr, LayerFactors, PruneNode, PruneRecord, Record
from amct_bridge.records.source_map import SourceMap

_LAYER_FIELDS = tuple(f.name for f in fields(LayerFactors))
_OPTIONAL = frozenset({"scale_d", "offset_d", "skip_fusion", "dst_type", "act_type", "wts_type"})
# AttrType name -> AttrProto field that carries its value.
_ATTR_FIELD = {
    "FLOAT": "f",
    "INT": "i",
    "STRING": "s",
    "FLOATS": "floats",
    "INTS": "ints",
    "STRINGS": "strings",
}
_ON_DUPLICATE = ("error", "keep_last")


# ---------------------------------------------------------------- model <-> protobuf
def used_fields(factors: LayerFactors) -> list[str]:
    """Names of the fields of ``factors`` that would be written (set optionals, non-empty lists).

    Example:
        >>> used_fields(LayerFactors(scale_d=1.0, offset_d=0, scale_w=[0.5]))
        ['scale_d', 'offset_d', 'scale_w']
    """
    used = []
    for name in _LAYER_FIELDS:
        value = getattr(factors, name)
        if (value is not None) if name in _OPTIONAL else len(value) > 0:
            used.append(name)
    return used


def _factors_from_proto(value) -> LayerFactors:
    factors = LayerFactors()
    for fd in value.DESCRIPTOR.fields:
        if fd.name in _OPTIONAL:
            if value.HasField(fd.name):
                setattr(factors, fd.name, getattr(value, fd.name))
        else:
            setattr(factors, fd.name, list(getattr(value, fd.name)))
    return factors


def _attr_from_proto(proto) -> Attr:
    type_name = ATTR_TYPES[proto.type] if proto.type < len(ATTR_TYPES) else str(proto.type)
    value = None
    # The declared type's field first, then any filled one (a mismatch is kept for validate()).
    order = [_ATTR_FIELD.get(type_name)] + [f for f in _ATTR_FIELD.values()]
    for name in order:
        if name is None:
            continue
        if name in ("floats", "ints", "strings"):
            if len(getattr(proto, name)):
                value = list(getattr(proto, name))
                break
        elif proto.HasField(name):
            value = getattr(proto, name)
            break
    if value is None and type_name in ("FLOATS", "INTS", "STRINGS"):
        value = []
    if isinstance(value, bytes):
        value = _decode(value)
    elif isinstance(value, list) and value and isinstance(value[0], bytes):
        value = [_decode(v) for v in value]
    return Attr(proto.name, type_name, value)


def _decode(raw: bytes) -> str | bytes:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _attr_to_proto(attr: Attr, proto) -> None:
    proto.name = attr.name
    if attr.type in ATTR_TYPES:
        proto.type = ATTR_TYPES.index(attr.type)
    value = attr.value
    if value is None:
        return
    target = _ATTR_FIELD.get(attr.type)
    if target is None or not _fits(target, value):
        target = _field_for_value(value)
    if target in ("floats", "ints", "strings"):
        getattr(proto, target).extend(_encode(v) for v in value)
    else:
        setattr(proto, target, _encode(value))


def _fits(target: str, value) -> bool:
    if target in ("floats", "ints", "strings"):
        return isinstance(value, (list, tuple)) and all(_fits(target[:-1], v) for v in value)
    if target in ("s", "string"):
        return isinstance(value, (str, bytes))
    if target in ("i", "int"):
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # f / float


def _field_for_value(value) -> str:
    if isinstance(value, (list, tuple)):
        first = value[0] if value else 0
        return {str: "strings", bytes: "strings", int: "ints"}.get(type(first), "floats")
    return {str: "s", bytes: "s", int: "i", bool: "i"}.get(type(value), "f")


def _encode(value):
    return value.encode("utf-8") if isinstance(value, str) else value


def _node_from_proto(proto) -> PruneNode:
    return PruneNode(proto.name, [_attr_from_proto(a) for a in proto.attr])


def _node_to_proto(node: PruneNode, proto) -> None:
    proto.name = node.name
    for attr in node.attrs:
        _attr_to_proto(attr, proto.attr.add())


def to_proto(record: Record, flavor: str | None = None):
    """The protobuf message of ``record`` in ``flavor`` (default: ``record.flavor``).

    Raises RecordError when the record holds a field the flavor cannot (use ``convert`` first).

    Example:
        >>> to_proto(Record({"a": LayerFactors(scale_d=0.5, offset_d=0)}), "tf").record[0].key
        'a'
    """
    flav = get_flavor(flavor or record.flavor)
    message = flav.new_message()
    for key, factors in record.layers.items():
        entry = message.record.add()
        entry.key = key
        entry.value.SetInParent()  # an empty layer still writes `value {}` (AMCT needs it)
        for name in used_fields(factors):
            if name not in flav.fields:
                raise RecordError(
                    f"layer {key!r}: field {name!r} cannot be written in {a_record(flav.name)} "
                    f"(its schema has no such field); convert the record to {flav.name!r} first"
                )
            value = getattr(factors, name)
            if name in _OPTIONAL:
                setattr(entry.value, name, value)
            else:
                getattr(entry.value, name).extend(value)
    if record.prune_records and not flav.has_prune_records:
        raise RecordError(f"{a_record(flav.name)} cannot hold prune_record entries")
    for prune in record.prune_records:
        out = message.prune_record.add()
        for node in prune.producers:
            _node_to_proto(node, out.producer.add())
        for node in prune.consumers:
            _node_to_proto(node, out.consumer.add())
        if prune.selective_prune is not None:
            _node_to_proto(prune.selective_prune, out.selective_prune)
    return message


def from_proto(
    message,
    flavor: str,
    *,
    source: str = "<message>",
    on_duplicate: str = "error",
    source_map: SourceMap | None = None,
) -> Record:
    """Build a :class:`Record` from a parsed protobuf message of ``flavor``.

    Example:
        >>> msg = to_proto(Record({"a": LayerFactors(scale_d=0.5, offset_d=0)}))
        >>> from_proto(msg, "inner").layers["a"].scale_d
        0.5
    """
    if on_duplicate not in _ON_DUPLICATE:
        raise RecordError(f"on_duplicate must be one of {_ON_DUPLICATE}, got {on_duplicate!r}")
    record = Record(flavor=flavor, source=source, source_map=source_map)
    seen: dict[str, int] = {}
    for index, entry in enumerate(message.record):
        key = entry.key
        if key in seen and on_duplicate == "error":
            first, again = (
                source_map.entry_line(i) if source_map else None for i in (seen[key], index)
            )
            where = (
                f"lines {first} and {again}"
                if first and again
                else f"entries {seen[key]} and {index}"
            )
            raise RecordError(
                f"{source}: layer {key!r} is recorded twice ({where}); AMCT would silently keep "
                "the last one. Remove one, or load with on_duplicate='keep_last'."
            )
        seen[key] = index
        record.layers[key] = _factors_from_proto(entry.value)
        if source_map is not None:
            source_map.bind(key, index)
    for prune in getattr(message, "prune_record", ()):
        record.prune_records.append(
            PruneRecord(
                [_node_from_proto(n) for n in prune.producer],
                [_node_from_proto(n) for n in prune.consumer],
                _node_from_proto(prune.selective_prune)
                if prune.HasField("selective_prune")
                else None,
            )
        )
    _refuse_bytes(record, source)
    return record


def _refuse_bytes(record: Record, source: str) -> None:
    # proto2 string fields are not UTF-8-checked when parsed from binary: protobuf hands back
    # bytes, which no later step (flavor detection, writing, matching model names) can take.
    def check(value, where: str) -> None:
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, bytes):
                raise RecordError(
                    f"{source}: {where}: {v!r} is not UTF-8 text; the file is corrupt or not "
                    "an AMCT record"
                )

    for index, (key, factors) in enumerate(record.layers.items()):
        check(key, f"record entry {index}: key")
        for name in ("dst_type", "act_type", "wts_type", "prune_producer", "prune_consumer"):
            check(getattr(factors, name), f"layer {key!r}: {name}")
    for index, prune in enumerate(record.prune_records):
        nodes = [*prune.producers, *prune.consumers, prune.selective_prune]
        for node in [n for n in nodes if n is not None]:
            check(node.name, f"prune_record[{index}]: node name")
            for attr in node.attrs:
                check(attr.name, f"prune_record[{index}]: node {node.name!r}: attr name")


# ---------------------------------------------------------------- flavor detection
def detect_flavor(record: Record) -> str:
    """The narrowest flavor whose schema holds everything ``record`` uses, and whose consumer
    accepts it (``shift_bit`` is in convert_model's schema but refused: such a record is
    "inner").

    A record that fits both "tf" and "mindspore" (only scale/offset/skip_fusion) is "mindspore"
    when its keys look like MindSpore Cell names (some dotted, none with "/"), else "tf".

    Example:
        >>> detect_flavor(Record({"layer1.0.conv1": LayerFactors(scale_d=1.0, offset_d=0)}))
        'mindspore'
    """
    used = {name for factors in record.layers.values() for name in used_fields(factors)}
    fits = [
        name
        for name in WIDEST_FIRST
        if used <= FLAVORS[name].fields
        and not used & UNSUPPORTED_FIELDS[name]
        and (FLAVORS[name].has_prune_records or not record.prune_records)
    ]
    if not fits:
        return "inner"
    if fits[-1] == "mindspore" and not _cell_style(record.layers):
        return "tf"
    if not record.layers and not record.prune_records:
        return "inner"
    return fits[-1]


def _cell_style(keys) -> bool:
    keys = list(keys)
    return any("." in k for k in keys) and not any("/" in k for k in keys)
