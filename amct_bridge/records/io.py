"""Reading and writing record files: protobuf text (AMCT's ``record.txt``) or binary.

Parsing is protobuf's own ``text_format``; this module adds what AMCT's parser lacks: flavor
detection, duplicate-key detection, and errors that name the file, line and column.

Example:
    >>> from amct_bridge.records import LayerFactors, Record, dumps, loads
    >>> rec = Record({"conv1": LayerFactors(scale_d=1 / 255, offset_d=-128)}, flavor="tf")
    >>> print(dumps(rec), end="")
    record {
      key: "conv1"
      value {
        scale_d: 0.00392156886
        offset_d: -128
      }
    }
    >>> loads(dumps(rec)).layers["conv1"].offset_d
    -128
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import fields
from pathlib import Path

import numpy as np
from google.protobuf import text_encoding, text_format
from google.protobuf.message import DecodeError

from amct_bridge.errors import RecordError
from amct_bridge.records.atomic import atomic_write_bytes
from amct_bridge.records.flavors import FLAVORS, WIDEST_FIRST, Flavor, get_flavor
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
                    f"layer {key!r}: field {name!r} cannot be written in a {flav.name!r} record "
                    f"(its schema has no such field); convert the record to {flav.name!r} first"
                )
            value = getattr(factors, name)
            if name in _OPTIONAL:
                setattr(entry.value, name, value)
            else:
                getattr(entry.value, name).extend(value)
    if record.prune_records and not flav.has_prune_records:
        raise RecordError(f"a {flav.name!r} record cannot hold prune_record entries")
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
    return record


# ---------------------------------------------------------------- flavor detection
def detect_flavor(record: Record) -> str:
    """The narrowest flavor whose schema holds everything ``record`` uses.

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


# ---------------------------------------------------------------- text and binary
def loads(
    text: str, flavor: str | None = None, *, source: str = "<string>", on_duplicate: str = "error"
) -> Record:
    """Parse record text. ``flavor=None`` parses with the widest schema and detects the flavor.

    An optional field written twice in one layer is an error unless ``on_duplicate="keep_last"``
    (AMCT silently keeps the last value of both a repeated field and a repeated layer key).

    Example:
        >>> loads('record { key: "a" value { scale_d: 0.5 offset_d: 3 } }').layers["a"].offset_d
        3
    """
    flav = get_flavor(flavor or "inner")
    message = flav.new_message()
    parse = text_format.Merge if on_duplicate == "keep_last" else text_format.Parse
    try:
        parse(text, message)
    except text_format.ParseError as err:
        raise RecordError(_parse_error_message(err, text, source, flav)) from None
    source_map = SourceMap(text)
    record = from_proto(
        message, flav.name, source=source, on_duplicate=on_duplicate, source_map=source_map
    )
    if flavor is None:
        record.flavor = detect_flavor(record)
    return record


def _parse_error_message(err: text_format.ParseError, text: str, source: str, flav: Flavor) -> str:
    line, column = err.GetLine(), err.GetColumn()
    reason = re.sub(r"^\d+:\d+ : ", "", str(err))
    where = f"{source}:{line}:{column}" if line else source
    lines = text.splitlines()
    snippet = f" (text: {lines[line - 1].strip()!r})" if line and line <= len(lines) else ""
    return (
        f"{where}: {reason}{snippet}; the record cannot be parsed as a {flav.name!r} record "
        f"({flav.message.DESCRIPTOR.full_name})"
    )


def format_float(value: float) -> str:
    """A float32 as AMCT's C++ protobuf writes it: ``%.6g``, or ``%.9g`` when that loses bits.

    Example:
        >>> format_float(1 / 255), format_float(0.5), format_float(6 / 255 * 0.99)
        ('0.00392156886', '0.5', '0.0232941173')
    """
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    value = float(np.float32(value))  # proto floats are float32; spell that value
    short = f"{value:.6g}"
    return short if np.float32(short) == np.float32(value) else f"{value:.9g}"


def _format_layer(message, indent: int, as_one_line: bool) -> str | None:
    # Layer values hold scalars only; printing them here gives AMCT's float spelling
    # (protobuf-python would print the shortest repr, e.g. 0.023529412 for 0.0235294122).
    if not message.DESCRIPTOR.name.endswith("SingleLayerRecord"):
        return None
    parts = []
    for fd, value in message.ListFields():
        values = value if fd.is_repeated else [value]
        for v in values:
            if fd.cpp_type == fd.CPPTYPE_FLOAT:
                text = format_float(v)
            elif fd.cpp_type == fd.CPPTYPE_BOOL:
                text = "true" if v else "false"
            elif fd.cpp_type == fd.CPPTYPE_STRING:
                text = '"' + text_encoding.CEscape(v.encode("utf-8"), False) + '"'
            else:
                text = str(v)
            parts.append(f"{fd.name}: {text}")
    if not parts:
        return None
    return (" " if as_one_line else "\n" + " " * indent).join(parts)


def _to_text(message) -> str:
    return text_format.MessageToString(message, message_formatter=_format_layer)


def dumps(record: Record, flavor: str | None = None) -> str:
    """Record text exactly as AMCT writes it (protobuf text format, fields in number order).

    Example:
        >>> dumps(Record()) == ""
        True
    """
    return _to_text(to_proto(record, flavor))


def _looks_binary(data: bytes) -> bool:
    if not data:
        return False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return any(ord(c) < 32 and c not in "\t\n\r\f\v" for c in text)


def load(
    path: str | os.PathLike, flavor: str | None = None, *, on_duplicate: str = "error"
) -> Record:
    """Read a record file, text or binary (detected from its bytes).

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "record.txt"
        >>> save(Record({"conv1": LayerFactors(scale_d=0.5, offset_d=0)}), p)
        >>> load(p).layers["conv1"].scale_d
        0.5
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise RecordError(f"{path}: cannot read record file: {err.strerror}") from None
    if not _looks_binary(data):
        return loads(data.decode("utf-8"), flavor, source=str(path), on_duplicate=on_duplicate)
    flav = get_flavor(flavor or "inner")
    message = flav.new_message()
    try:
        message.ParseFromString(data)
    except DecodeError as err:
        raise RecordError(
            f"{path}: not a {flav.name!r} record: neither protobuf text nor binary "
            f"{flav.message.DESCRIPTOR.full_name} ({err})"
        ) from None
    record = from_proto(message, flav.name, source=str(path), on_duplicate=on_duplicate)
    if flavor is None:
        record.flavor = detect_flavor(record)
    return record


def save(
    record: Record, path: str | os.PathLike, *, flavor: str | None = None, binary: bool = False
) -> None:
    """Write ``record`` atomically; the same record always gives the same bytes.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "record.txt"
        >>> save(Record({"a": LayerFactors(scale_d=0.25, offset_d=1)}), p)
        >>> p.read_text().splitlines()[1]
        '  key: "a"'
    """
    message = to_proto(record, flavor)
    data = message.SerializeToString(deterministic=True) if binary else _to_text(message).encode()
    atomic_write_bytes(path, data)
