"""A mergeable fixed-size histogram: the bounded-memory summary behind percentile/IFMR/HFMG.

The histogram keeps ``nbins`` float64 counts on an equal-width grid ``lo + i * width``. A new
batch histogram (``bins`` counts over the batch's own ``[min, max]``, the in-graph summary) is
spread onto the grid by linear interpolation of its cumulative counts (uniform density inside
each source bin). When a batch falls outside the grid, the grid grows by an integer factor ``k``
with boundaries aligned to the old ones, so old counts move by exact integer grouping: growing
never blurs what was already seen. The first batch defines the grid exactly, hence
``a.add(b)`` performs the same arithmetic as feeding ``a``'s batch then ``b``'s batch.

A grid of width 0 is a point mass (every value seen so far equal to ``lo``).

Example:
    >>> import numpy as np
    >>> h = GridHistogram.from_batch(0.0, 1.0, np.array([1, 0, 0, 3]))
    >>> h.add(GridHistogram.from_batch(2.0, 2.0, np.array([2, 0, 0, 0])))
    >>> h.lo, h.width, h.counts.tolist()
    (0.0, 0.5, [1.0, 3.0, 0.0, 2.0])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from amct_bridge.errors import QuantError


@dataclass
class GridHistogram:
    """Counts on the grid ``[lo + i * width, lo + (i + 1) * width)``, ``i < len(counts)``.

    Example:
        >>> GridHistogram(0.0, 0.5, np.array([1.0, 2.0])).hi
        1.0
    """

    lo: float
    width: float
    counts: np.ndarray

    @property
    def nbins(self) -> int:
        """Number of bins."""
        return int(self.counts.size)

    @property
    def hi(self) -> float:
        """Upper edge of the grid."""
        return self.lo + self.nbins * self.width

    @property
    def total(self) -> float:
        """Sum of counts."""
        return float(self.counts.sum())

    def edges(self) -> np.ndarray:
        """The ``nbins + 1`` bin edges.

        Example:
            >>> GridHistogram(1.0, 0.5, np.zeros(2)).edges().tolist()
            [1.0, 1.5, 2.0]
        """
        return self.lo + np.arange(self.nbins + 1, dtype=np.float64) * self.width

    @classmethod
    def from_batch(cls, vmin: float, vmax: float, hist: np.ndarray) -> GridHistogram:
        """The grid of one batch: ``len(hist)`` bins over ``[vmin, vmax]``.

        Example:
            >>> GridHistogram.from_batch(0.0, 2.0, np.array([3, 1])).width
            1.0
        """
        counts = np.asarray(hist, dtype=np.float64).copy()
        if counts.ndim != 1 or counts.size == 0:
            raise QuantError(f"batch histogram must be a non-empty 1-D array, got {counts.shape}")
        width = (float(vmax) - float(vmin)) / counts.size
        if width <= 0.0:
            # A constant batch: every count is the point mass at vmin.
            point = np.zeros_like(counts)
            point[0] = counts.sum()
            return cls(float(vmin), 0.0, point)
        return cls(float(vmin), width, counts)

    def copy(self) -> GridHistogram:
        """Independent copy."""
        return GridHistogram(self.lo, self.width, self.counts.copy())

    def add(self, other: GridHistogram) -> None:
        """Add ``other``'s counts in place, growing this grid to cover ``other``.

        Example:
            >>> h = GridHistogram(0.0, 1.0, np.array([1.0, 1.0, 0.0, 0.0]))
            >>> h.add(GridHistogram(0.5, 1.0, np.array([2.0, 0.0])))  # spread over [0.5, 1.5)
            >>> h.counts.tolist()
            [2.0, 2.0, 0.0, 0.0]
        """
        if other.width == 0.0:
            self._add_point(other.lo, other.total)
            return
        if self.width == 0.0:
            point, mass = self.lo, self.total
            self.lo, self.width, self.counts = other.lo, other.width, other.counts.copy()
            self._add_point(point, mass)
            return
        self._grow(other.lo, other.hi)
        cum = np.concatenate(([0.0], np.cumsum(other.counts)))
        # Only grid edges next to other's span can differ from 0 or the total: interpolate
        # those (a margin of one bin each side absorbs rounding); the result is the same.
        n = self.nbins
        i0 = max(0, math.floor((other.lo - self.lo) / self.width) - 1)
        i1 = min(n, math.ceil((other.hi - self.lo) / self.width) + 1)
        edges = self.lo + np.arange(i0, i1 + 1, dtype=np.float64) * self.width
        at = np.interp(edges, other.edges(), cum)
        # Mass beyond the grid by float rounding lands in the edge bins (tf clip semantics).
        if i0 == 0:
            at[0] = 0.0
        if i1 == n:
            at[-1] = cum[-1]
        self.counts[i0:i1] += np.diff(at)

    def _add_point(self, value: float, mass: float) -> None:
        if self.width == 0.0:
            if value == self.lo:
                self.counts[0] += mass
                return
            n, old = self.nbins, (self.lo, self.total)
            lo, hi = min(value, self.lo), max(value, self.lo)
            self.lo, self.width, self.counts = lo, (hi - lo) / n, np.zeros(n)
            for v, m in (old, (value, mass)):
                self.counts[-1 if v == hi else 0] += m
            return
        self._grow(value, value)
        idx = math.floor((value - self.lo) / self.width)
        self.counts[min(max(idx, 0), self.nbins - 1)] += mass

    def _grow(self, vmin: float, vmax: float) -> None:
        """Widen the grid by an integer factor so it covers ``[vmin, vmax]`` (exact regrouping)."""
        lo, w, n = self.lo, self.width, self.nbins
        if vmin >= lo and vmax <= self.hi:
            return
        shift = 0
        if vmin < lo:
            shift = math.ceil((lo - vmin) / w)
            while lo - shift * w > vmin:
                shift += 1
        new_lo = lo - shift * w
        top = max(vmax, self.hi)
        k = max(1, math.ceil((top - new_lo) / (n * w)))
        while new_lo + n * k * w < top:
            k += 1
        if max(shift, k) < 2**62:
            groups = (np.arange(n) + shift) // k
        else:  # a denormal-width grid meeting a wide range: exact in Python integers
            groups = np.array([(i + shift) // k for i in range(n)], dtype=np.int64)
        self.counts = np.bincount(groups, weights=self.counts, minlength=n)[:n]
        self.lo, self.width = new_lo, w * k

    def edges_within(self, vmin: float, vmax: float) -> np.ndarray:
        """Bin edges clamped to the known data support ``[vmin, vmax]``.

        The merged grid usually extends past the exact min/max; clamping keeps the
        uniform-density model from placing mass where no value was ever seen.

        Example:
            >>> GridHistogram(0.0, 1.0, np.ones(3)).edges_within(0.5, 2.5).tolist()
            [0.5, 1.0, 2.0, 2.5]
        """
        return np.clip(self.edges(), vmin, vmax)

    def rebin(self, lo: float, hi: float, nbins: int) -> np.ndarray:
        """Counts of ``nbins`` equal bins over ``[lo, hi]`` (mass outside goes to the end bins).

        Example:
            >>> GridHistogram(0.0, 1.0, np.array([2.0, 2.0])).rebin(0.0, 2.0, 4).tolist()
            [1.0, 1.0, 1.0, 1.0]
        """
        out = np.zeros(nbins)
        if self.width == 0.0 or hi <= lo:
            idx = 0 if hi <= lo else math.floor((self.lo - lo) / (hi - lo) * nbins)
            out[min(max(idx, 0), nbins - 1)] = self.total
            return out
        cum = np.concatenate(([0.0], np.cumsum(self.counts)))
        at = np.interp(
            lo + np.arange(nbins + 1) * ((hi - lo) / nbins), self.edges_within(lo, hi), cum
        )
        at[0], at[-1] = 0.0, cum[-1]
        return np.diff(at)

    def kth_largest(self, k: float, vmin: float = -math.inf, vmax: float = math.inf) -> float:
        """Estimated k-th largest value (1-based): order statistic of uniform data in its bin.

        ``vmin``/``vmax``: the exact data support (bin edges are clamped to it).

        Example:
            >>> GridHistogram(0.0, 1.0, np.array([0.0, 3.0])).kth_largest(1)
            1.75
        """
        if self.width == 0.0:
            return self.lo
        above = np.cumsum(self.counts[::-1])[::-1]  # count in bins >= i
        i = int(np.searchsorted(-above, -k, side="right")) - 1
        i = min(max(i, 0), self.nbins - 1)
        c = self.counts[i]
        beyond = above[i] - c
        r = min(max(k - beyond, 0.0), c)
        a, b = np.clip([self.lo + i * self.width, self.lo + (i + 1) * self.width], vmin, vmax)
        return float(b - r / (c + 1.0) * (b - a))

    def kth_smallest(self, k: float, vmin: float = -math.inf, vmax: float = math.inf) -> float:
        """Estimated k-th smallest value (1-based).

        Example:
            >>> GridHistogram(0.0, 1.0, np.array([3.0, 0.0])).kth_smallest(1)
            0.25
        """
        if self.width == 0.0:
            return self.lo
        mirrored = GridHistogram(-self.hi, self.width, self.counts[::-1])
        return -mirrored.kth_largest(k, -vmax, -vmin)

    def state_dict(self) -> dict:
        """JSON-ready state."""
        return {"lo": self.lo, "width": self.width, "counts": self.counts.tolist()}

    @classmethod
    def from_state(cls, d: dict) -> GridHistogram:
        """Inverse of :meth:`state_dict`."""
        return cls(float(d["lo"]), float(d["width"]), np.asarray(d["counts"], dtype=np.float64))
