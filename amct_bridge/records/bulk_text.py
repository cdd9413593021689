"""Parse record text whose long runs of repeated numbers would take protobuf's text parser minutes.

protobuf's ``text_format`` tokenizes in Python: about 150 µs a line, so a record holding 10^6
``scale_w`` lines (a per-channel model with a huge layer, or a damaged file) took 2.5 minutes to
validate. Record files are written one field a line (AMCT's writer and ours), and almost all of
their bulk is such runs. :func:`parse_text` takes every run of at least :data:`MIN_RUN`
consecutive lines ``name: NUMBER`` of one repeated numeric field out of the text, lets
``text_format`` parse the rest (its errors and checks unchanged, their line numbers mapped back
to the file's), and adds each run's numbers to the message the run was in, in its place.

Anything else, or any doubt (a line with two fields, a number ``text_format`` would spell
differently, the same field again outside the run), leaves the text to ``text_format`` whole:
the result is always what ``text_format`` gives.

Example:
    >>> from amct_bridge.records.flavors import get_flavor
    >>> text = 'record {\\n  key: "a"\\n  value {\\n' + '    scale_w: 0.5\\n' * 300 + '  }\\n}\\n'
    >>> message = get_flavor("inner").new_message()
    >>> parse_text(text, message, text_format.Parse)
    >>> len(message.record[0].value.scale_w), message.record[0].value.scale_w[0]
    (300, 0.5)
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
from google.protobuf import text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

__all__ = ["MIN_RUN", "parse_text"]

#: Shortest run taken out of the text: below it text_format's cost does not matter.
MIN_RUN = 64

_OPEN = re.compile(r"^\s*([A-Za-z_]\w*)\s*:?\s*\{\s*$")
_CLOSE = re.compile(r"^\s*\}\s*$")
_SCALAR = re.compile(r"^\s*([A-Za-z_]\w*)\s*:\s*(\S.*?)\s*$")
#: Numbers both parsers read alike (no hex, octal, 'inf', 'f' suffix: those go to text_format).
_FLOAT = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_INT = re.compile(r"-?(?:0|[1-9]\d*)")
_FLOATS = (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE)
_INTS = (
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64,
)


def _repeated_number(descriptor: Descriptor | None, name: str) -> FieldDescriptor | None:
    field = descriptor.fields_by_name.get(name) if descriptor is not None else None
    if field is None or not field.is_repeated:
        return None
    return field if field.type in _FLOATS + _INTS else None


def _runs(lines: list[str], root: Descriptor):
    """``[(path, field, first line, last line + 1, values)]`` of the runs, or None when the
    text is not one field a line (then text_format parses it whole).

    ``path`` is ``[(field name, index among its repeated siblings or None)]`` from the root.
    """
    stack: list[tuple[Descriptor | None, dict[str, int], set[str]]] = [(root, {}, set())]
    path: list[tuple[str, int | None]] = []
    runs = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        if _CLOSE.match(line):
            if len(stack) == 1:
                return None
            stack.pop()
            path.pop()
            i += 1
            continue
        opened = _OPEN.match(line)
        if opened:
            name = opened.group(1)
            descriptor, counts, _ = stack[-1]
            field = descriptor.fields_by_name.get(name) if descriptor is not None else None
            child = field.message_type if field is not None else None
            repeated = field is not None and field.is_repeated
            index = counts.get(name, 0) if repeated else None
            counts[name] = counts.get(name, 0) + 1
            path.append((name, index))
            stack.append((child, {}, set()))
            i += 1
            continue
        scalar = _SCALAR.match(line)
        if scalar is None or "{" in line or "}" in line:
            return None
        name = scalar.group(1)
        descriptor, _, seen = stack[-1]
        field = _repeated_number(descriptor, name)
        if field is None:
            i += 1
            continue
        pattern = _FLOAT if field.type in _FLOATS else _INT
        j, values = i, []
        while j < n:
            match = _SCALAR.match(lines[j])
            if match is None or match.group(1) != name or not pattern.fullmatch(match.group(2)):
                break
            values.append(match.group(2))
            j += 1
        if name in seen:  # the field again after a run, or a run after single lines: keep order
            return None
        seen.add(name)
        if j - i >= MIN_RUN:
            runs.append((list(path), field, i, j, values))
        i = max(j, i + 1)
    return runs if len(stack) == 1 else None


def parse_text(text: str, message, parse: Callable = text_format.Parse) -> None:
    """``parse(text, message)`` (``text_format.Parse`` or ``Merge``), with long runs of
    repeated numbers read in bulk (see the module's docstring).

    Example:
        >>> from amct_bridge.records.flavors import get_flavor
        >>> m = get_flavor("inner").new_message()
        >>> parse_text('record { key: "a" value { scale_d: 0.5 } }', m)
        >>> m.record[0].value.scale_d
        0.5
    """
    lines = text.split("\n")
    runs = _runs(lines, message.DESCRIPTOR) if len(lines) > MIN_RUN else None
    if not runs:
        parse(text, message)
        return
    kept: list[str] = []
    origin: list[int] = []  # 1-based line of the file for each kept line
    start = 0
    for _, _, first, end, _ in runs:
        kept.extend(lines[start:first])
        origin.extend(range(start + 1, first + 1))
        start = end
    kept.extend(lines[start:])
    origin.extend(range(start + 1, len(lines) + 1))
    try:
        parse("\n".join(kept), message)
    except text_format.ParseError as err:
        line = err.GetLine()
        mapped = origin[line - 1] if line and line <= len(origin) else line
        reason = re.sub(r"^\d+:\d+ : ", "", str(err))
        raise text_format.ParseError(reason, mapped, err.GetColumn()) from None
    try:
        for path, field, _, _, values in runs:
            target = message
            for name, index in path:
                target = getattr(target, name)
                target = target[index] if index is not None else target
            container = getattr(target, field.name)
            if len(container):  # values before the run in the kept text: the order would differ
                raise ValueError("values outside the run")
            dtype = np.float64 if field.type in _FLOATS else np.int64
            container.extend(np.array(values, dtype).tolist())
    except (ArithmeticError, IndexError, TypeError, ValueError):
        # an int beyond its field (or int64), values outside the run: text_format's own answer
        message.Clear()
        parse(text, message)
