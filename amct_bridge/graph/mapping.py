"""Composable channel index mappings that keep each channel's root index.

A :class:`Piece` says where root channels ``[lo, hi)`` of a source (a producer's output) sit
in some tensor: root ``k`` occupies positions
``offset + (k - lo) * repeat + j + t * stride`` for ``j < repeat`` and ``t < tiles``.
``repeat`` comes from depthwise multipliers, ``tiles``/``stride`` from flattening an NHWC
tensor (channel ``c`` of a ``S x C`` map lands on rows ``s * C + c``).

Example:
    >>> from amct_bridge.graph.mapping import Piece
    >>> p = Piece(0, 0, 4, offset=8)           # root channels 0..3 at positions 8..11
    >>> p.repeated(2).positions()               # depthwise multiplier 2
    [16, 17, 18, 19, 20, 21, 22, 23]
    >>> p.tiled(2, 16).positions()              # flatten 2 spatial positions of 16 channels
    [8, 9, 10, 11, 24, 25, 26, 27]
"""

from __future__ import annotations

from dataclasses import dataclass


class Misaligned(Exception):
    """A slice or merge boundary falls inside one root channel's positions."""


@dataclass(frozen=True)
class Piece:
    """Root channels ``[lo, hi)`` of source ``source`` placed in a tensor (see module doc).

    Example:
        >>> Piece(3, 2, 6, offset=0).width
        4
    """

    source: int
    lo: int
    hi: int
    offset: int = 0
    repeat: int = 1
    tiles: int = 1
    stride: int = 0

    @property
    def _layout(self) -> tuple[int, int, int]:
        return (self.repeat, self.tiles, self.stride)

    @property
    def width(self) -> int:
        """Contiguous positions covered in one tile."""
        return (self.hi - self.lo) * self.repeat

    @property
    def end(self) -> int:
        """One past the last position of the first tile."""
        return self.offset + self.width

    def shifted(self, delta: int) -> Piece:
        """The piece moved by ``delta`` positions (concat offsets)."""
        return Piece(self.source, self.lo, self.hi, self.offset + delta, *self._layout)

    def repeated(self, m: int) -> Piece:
        """Each position expanded to ``m`` consecutive ones (depthwise multiplier ``m``)."""
        return Piece(
            self.source,
            self.lo,
            self.hi,
            self.offset * m,
            self.repeat * m,
            self.tiles,
            self.stride * m,
        )

    def tiled(self, tiles: int, stride: int) -> Piece:
        """Repeated ``tiles`` times every ``stride`` positions (flatten of NHWC)."""
        if self.tiles != 1:
            raise Misaligned("flattening an already tiled mapping")
        if tiles == 1:
            return self
        return Piece(self.source, self.lo, self.hi, self.offset, self.repeat, tiles, stride)

    def roots_of(self, a: int, b: int) -> tuple[int, int]:
        """Root range whose positions are exactly ``[a, b)`` (within one tile)."""
        if (a - self.offset) % self.repeat or (b - self.offset) % self.repeat:
            raise Misaligned(f"positions [{a}, {b}) split a root channel of width {self.repeat}")
        return (
            self.lo + (a - self.offset) // self.repeat,
            self.lo + (b - self.offset) // self.repeat,
        )

    def sub(self, lo: int, hi: int) -> Piece:
        """The part of this piece holding roots ``[lo, hi)`` (same coordinates)."""
        offset = self.offset + (lo - self.lo) * self.repeat
        return Piece(self.source, lo, hi, offset, *self._layout)

    def sliced(self, a: int, b: int) -> Piece | None:
        """The part inside positions ``[a, b)``, re-based to start at 0; None if disjoint."""
        lo_pos, hi_pos = max(a, self.offset), min(b, self.end)
        if lo_pos >= hi_pos:
            return None
        if self.tiles != 1 and (lo_pos, hi_pos) != (self.offset, self.end):
            raise Misaligned("slicing a flattened (tiled) mapping")
        if self.tiles != 1 and a + self.stride * (self.tiles - 1) + self.width > b:
            raise Misaligned("slicing a flattened (tiled) mapping")
        lo, hi = self.roots_of(lo_pos, hi_pos)
        return self.sub(lo, hi).shifted(-a)

    def positions(self) -> list[int]:
        """Every position of the piece, sorted (for tests and small examples)."""
        return sorted(
            self.offset + (k - self.lo) * self.repeat + j + t * self.stride
            for k in range(self.lo, self.hi)
            for j in range(self.repeat)
            for t in range(self.tiles)
        )
