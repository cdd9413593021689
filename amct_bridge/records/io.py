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
from pathlib import Path

import numpy as np
from google.protobuf import text_encoding, text_format
from google.protobuf.message import DecodeError

from amct_bridge.errors import RecordError
from amct_bridge.records.atomic import atomic_write_bytes
from amct_bridge.records.bulk_text import parse_text
from amct_bridge.records.codec import detect_flavor, from_proto, to_proto
from amct_bridge.records.flavors import Flavor, a_record, get_flavor
from amct_bridge.records.model import Record
from amct_bridge.records.sniff import describe_bytes
from amct_bridge.records.source_map import SourceMap


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
        parse_text(text, message, parse)  # text_format, with long runs of numbers in bulk
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
    cut = (
        "; the error is at the end of the file: it looks truncated (cut short while being "
        "written or copied?)"
        if line and _at_end(text, line, column)
        else ""
    )
    return (
        f"{where}: {reason}{snippet}; the record cannot be parsed as {a_record(flav.name)} "
        f"({flav.message.DESCRIPTOR.full_name}){cut}"
    )


def _at_end(text: str, line: int, column: int) -> bool:
    """Whether nothing but the token at ``line:column`` (1-based) and white space follows it:
    a record cut mid-word reads ``has no field named "offset_"``, like a typo."""
    lines = text.split("\n")
    if line > len(lines):
        return True
    offset = sum(len(x) + 1 for x in lines[: line - 1]) + max(column - 1, 0)
    rest = re.sub(r"^\S*", "", text[offset:])
    return not rest.strip()


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


#: Control characters that never occur in record text (tab, newline, \v, \f, \r do).
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f]")


def _looks_binary(data: bytes) -> bool:
    if not data:
        return False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    # one regex scan: a per-character generator took ~1.5 s of a 15 MB (10,000-layer) load
    return _CONTROL.search(text) is not None


def load(
    path: str | os.PathLike, flavor: str | None = None, *, on_duplicate: str = "error"
) -> Record:
    """Read a record file, text or binary (detected from its bytes).

    Example:
        >>> import tempfile, pathlib
        >>> from amct_bridge.records.model import LayerFactors
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
    kind = describe_bytes(data)
    if kind is not None:  # a wrong file: say what it is rather than a protobuf parse error
        full_name = get_flavor(flavor or "inner").message.DESCRIPTOR.full_name
        raise RecordError(
            f"{path}: not a record file: it looks like {kind}; expected an AMCT record "
            f"(protobuf text or binary {full_name})"
        )
    if not _looks_binary(data):
        return loads(data.decode("utf-8"), flavor, source=str(path), on_duplicate=on_duplicate)
    flav = get_flavor(flavor or "inner")
    message = flav.new_message()
    try:
        message.ParseFromString(data)
    except DecodeError as err:
        raise RecordError(
            f"{path}: not {a_record(flav.name)}: neither protobuf text nor binary "
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
        >>> from amct_bridge.records.model import LayerFactors
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "record.txt"
        >>> save(Record({"a": LayerFactors(scale_d=0.25, offset_d=1)}), p)
        >>> p.read_text().splitlines()[1]
        '  key: "a"'
    """
    atomic_write_bytes(path, record_bytes(record, flavor=flavor, binary=binary))


def record_bytes(record: Record, *, flavor: str | None = None, binary: bool = False) -> bytes:
    """The bytes :func:`save` writes (text, or deterministic binary protobuf).

    Example:
        >>> from amct_bridge.records.model import LayerFactors
        >>> record_bytes(Record({"a": LayerFactors(scale_d=0.25, offset_d=1)})).splitlines()[1]
        b'  key: "a"'
    """
    message = to_proto(record, flavor)
    return message.SerializeToString(deterministic=True) if binary else _to_text(message).encode()
