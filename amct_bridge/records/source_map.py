"""Line numbers of layers and fields in record text, so problems can say ``FILE:LINE``.

protobuf's Python parser keeps no positions; this scans the text for each ``key:`` (one per
layer entry, in order) and for field names between one entry and the next.

Example:
    >>> sm = SourceMap('record {\\n  key: "a"\\n  value {\\n    scale_d: 1\\n  }\\n}\\n')
    >>> sm.bind("a", 0)
    >>> sm.line_of("a"), sm.line_of("a", "scale_d")
    (2, 4)
"""

from __future__ import annotations

import bisect
import re

_KEY = re.compile(r'(?m)^\s*(?:record\s*\{\s*)?key\s*:\s*"')


class SourceMap:
    """Positions of the layer entries of one record text."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self._entries = [m.end() for m in _KEY.finditer(text)]
        self._index: dict[str, int] = {}

    def bind(self, key: str, index: int) -> None:
        """Remember that layer ``key`` is entry number ``index`` (its last occurrence wins)."""
        self._index[key] = index

    def _line(self, offset: int) -> int:
        return bisect.bisect_right(self._line_starts, offset)

    def entry_line(self, index: int) -> int | None:
        """Line of the ``key:`` of entry ``index`` (1-based), or None if unknown."""
        return self._line(self._entries[index]) if index < len(self._entries) else None

    def line_of(self, key: str, field: str | None = None, occurrence: int = 0) -> int | None:
        """Line of layer ``key`` or of its ``field`` (the ``occurrence``-th one), or None."""
        index = self._index.get(key)
        if index is None or index >= len(self._entries):
            return None
        start = self._entries[index]
        if field is None:
            return self._line(start)
        end = self._entries[index + 1] if index + 1 < len(self._entries) else len(self._text)
        hits = list(re.finditer(rf"\b{re.escape(field)}\s*:", self._text[start:end]))
        if occurrence < len(hits):
            return self._line(start + hits[occurrence].start())
        return self._line(start)
