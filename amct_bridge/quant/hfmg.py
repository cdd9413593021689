"""HFMG: AMCT's histogram clip-range search (PyTorch HistogramObserver's L2 loss).

Given ``num_of_bins`` counts over ``[min, max]`` (AMCT ``hfmg.cpp``):

1. candidates: starting from the full range, repeatedly trim at least
   ``step = ceil(total / 1e5)`` counts from the left and from the right (scanning bins), and
   keep the trim that removes more bins (the sparser side; ties trim the right), while the
   range spans more than ``ceil(num_of_bins / 4)`` bins; every trimmed range is a candidate (the
   full range itself never is);
2. each candidate ``[left, right]`` is scored by the L2 error of mapping the source bins onto
   ``2**bits`` equal destination bins spanning it (PyTorch ``_compute_quantization_error``:
   ``density * (d_end**3 - d_begin**3) / 3`` per overlap);
3. the lowest loss wins; the clip range is ``[min + left * w, min + (right + 1) * w]``.

AMCT's C++ computes ``(index - left) * width`` in unsigned arithmetic, which wraps for bins
left of ``left``; we follow the signed (PyTorch) definition the algorithm is taken from.

Example:
    >>> import numpy as np
    >>> counts = np.r_[np.full(1000, 100.0), np.full(3096, 0.0)]
    >>> counts[-1] = 1.0  # one outlier at the top
    >>> lo, hi = hfmg_search(counts, 0.0, 4.096)
    >>> lo, round(hi, 2)
    (0.0, 1.0)
"""

from __future__ import annotations

import functools
import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from amct_bridge.errors import QuantError

#: AMCT's option values for ``hfmg_quantize { num_of_bins }``.
NUM_OF_BINS_CHOICES = (1024, 2048, 4096, 8192)
_STEP_DIVISOR = 100000
_MIN_BIN_RATIO = 4
_CHUNK = 1 << 20  # candidate x bin elements evaluated per vectorised block (per edge)
_CELLS = 1 << 14  # candidate x destination-bin cells per block (per destination bin)
_MAX_RUN = 32  # longest run of edges read from the moment table at once
_SHARED_ROWS = 256  # up to this many destination bins, per-residue rows are cached (~1.6 MB)
_KEPT_SEARCHES = 1024  # searched histograms whose best range is kept (~300 bytes each)

#: ``(left, right)`` bin ranges: a list of pairs, or an int ``(k, 2)`` array.
Ranges = Sequence[tuple[int, int]] | np.ndarray


def search_candidates(counts: np.ndarray) -> list[tuple[int, int]]:
    """AMCT's trimmed ``(left, right)`` bin ranges, in search order.

    Example:
        >>> search_candidates(np.array([0, 5, 5, 5, 5, 5, 5, 0.0]))
        [(0, 5), (2, 5), (2, 4)]
    """
    return [(int(a), int(b)) for a, b in _candidate_array(counts)]


def _candidate_array(counts: np.ndarray) -> np.ndarray:
    """:func:`search_candidates` as an int64 ``(k, 2)`` array (a list of tuples costs more to
    convert than the search itself)."""
    n = counts.size
    total = float(counts.sum())
    step = max(math.ceil(np.float32(total) / np.float32(_STEP_DIVISOR)), 1)
    min_bins = math.ceil(n / _MIN_BIN_RATIO)
    # prefix[i] = sum(counts[:i]). Each trim target depends on one end only, so it is looked up
    # for every possible end at once; the loop then reads lists, with plain comparisons (numpy
    # calls, or even min/max, would dominate its thousands of scalar steps).
    prefix = np.concatenate(([0.0], np.cumsum(counts)))
    # leftmost t with sum(counts[left:t]) >= step; rightmost t with sum(counts[t+1:right+1]) >= step
    left_target = np.searchsorted(prefix, prefix[:-1] + step, side="left").tolist()
    right_target = (np.searchsorted(prefix, prefix[1:] - step, side="right") - 2).tolist()
    left, right = 0, n - 1
    lefts: list[int] = []
    rights: list[int] = []
    while right - left > min_bins:
        t_left = left_target[left]  # > left, capped at right
        if t_left <= left:
            t_left = left + 1
        if t_left >= right:
            t_left = t_right = right
        else:  # < right, never below t_left
            t_right = right_target[right]
            if t_right >= right:
                t_right = right - 1
            if t_right < t_left:
                t_right = t_left
        if right - t_right >= t_left - left:
            right = t_right
        else:
            left = t_left
        lefts.append(left)
        rights.append(right)
    return np.array([lefts, rights], dtype=np.int64).T.reshape(-1, 2)


def l2_losses(counts: np.ndarray, ranges: Ranges, dst_bins: int) -> np.ndarray:
    """PyTorch HistogramObserver L2 error of each ``(left, right)`` range (unit bin width).

    With uniform density per source bin the loss is ``sum_i count_i * (F(e_i) - F(b_i))``
    where ``F`` integrates the squared distance to the nearest destination-bin centre (clamped
    to the first/last centre outside the range). Summation by parts turns it into
    ``F(edges) @ w`` with ``w = -diff([0, *counts, 0])``; the cubic tails outside the range come
    from prefix sums of ``w * edge**k``. Inside the range ``F`` is one cubic per destination bin,
    so :func:`_bin_sums` adds it up bin by bin from local moments of ``w`` (work ~ candidates x
    dst_bins); with few candidates or nonzero weights, or destination bins about a source bin
    wide, :func:`_edge_sums` evaluating ``F`` at every edge (candidates x weights) is less work.
    Losses scale with the bin width cubed, so comparing candidates needs no real width.

    Example:
        >>> float(l2_losses(np.array([1.0, 1.0]), [(0, 1)], 2)[0])  # two bins map exactly
        0.16666666666666666
    """
    terms = _LossTerms(counts, ranges, dst_bins)
    out = np.empty(terms.left.size)
    for sl in terms.blocks:
        out[sl] = terms.loss(sl)
    return out


def best_range(counts: np.ndarray, ranges: Ranges, dst_bins: int) -> int:
    """``argmin(l2_losses(counts, ranges, dst_bins))``, skipping the blocks of ranges that
    cannot win.

    A range's loss is at least its clipping loss: the counts outside it, each at the distance
    of the first or last destination-bin centre (:func:`clip_bounds`, O(1) per range from
    prefix sums). A block of ranges whose bounds all exceed the best loss found so far is not
    evaluated. Blocks are evaluated exactly as :func:`l2_losses` evaluates them, so the index
    is the same (ties included): a skipped range's loss exceeds the winner's. Most candidates
    are narrow trims whose clipping loss alone loses (about 95% of the blocks on activation
    histograms).

    Example:
        >>> counts = np.r_[np.full(1000, 100.0), np.zeros(3095), 1.0]
        >>> ranges = search_candidates(counts)
        >>> best_range(counts, ranges, 256) == int(np.argmin(l2_losses(counts, ranges, 256)))
        True
    """
    ranges = _pairs(ranges)
    if not ranges.size:
        raise QuantError("best_range needs at least one range")
    terms = _LossTerms(counts, ranges, dst_bins)
    bound = clip_bounds(counts, ranges, dst_bins)
    losses = np.full(len(ranges), np.inf)
    best = np.inf
    for sl in terms.blocks:
        # margins: the bound and the evaluated losses are each within ~1e-9 of exact
        if bound[sl].min() * (1.0 - 1e-6) > best * (1.0 + 1e-6):
            continue
        losses[sl] = terms.loss(sl)
        best = min(best, float(losses[sl].min()))
    return int(np.argmin(losses))


def clip_bounds(counts: np.ndarray, ranges: Ranges, dst_bins: int) -> np.ndarray:
    """Lower bounds of :func:`l2_losses`: each range's clipping loss alone, less a margin for
    rounding.

    A source bin ``[i, i + 1)`` outside ``[left, right + 1)`` maps to the first (last)
    destination-bin centre ``c``: ``count_i * ((i + 1/2 - c)**2 + 1/12)``. Bins inside add a
    loss of at least 0.

    Example:
        >>> # bin 0 clipped to the first centre 1.5: (0.5 - 1.5)**2 + 1/12
        >>> round(float(clip_bounds(np.array([1.0, 0.0, 0.0, 0.0]), [(1, 3)], 3)[0]), 9)
        1.083333333
    """
    counts = np.asarray(counts, dtype=np.float64)
    n = counts.size
    pos = np.arange(n, dtype=np.float64) - n / 2  # centred: smaller cancellations
    prefix = [
        np.concatenate(([0.0], np.cumsum(counts * p)))
        for p in (np.ones(n), pos, pos * pos, np.abs(pos))
    ]
    cand = _pairs(ranges)
    left, right = cand[:, 0], cand[:, 1]
    half = (right - left + 1) / dst_bins / 2
    total = np.zeros(left.size)
    scale = np.zeros(left.size)
    for lo, hi, centre in (
        (np.zeros_like(left), left, left + half),
        (right + 1, np.full_like(right, n), right + 1 - half),
    ):
        s0, s1, s2, s_abs = (p[hi] - p[lo] for p in prefix)
        a = centre - 0.5 - n / 2  # sum c_i * ((pos_i - a)**2 + 1/12)
        total += s2 - 2 * a * s1 + a * a * s0 + s0 / 12.0
        scale += s2 + 2 * np.abs(a) * s_abs + a * a * s0  # bounds every term's size
    return total - 1e-12 * scale


def _pairs(ranges) -> np.ndarray:
    return np.asarray(ranges, dtype=np.int64).reshape(-1, 2)


class _LossTerms:
    """:func:`l2_losses` by blocks of ranges: ``loss(sl)`` for each ``sl`` of ``blocks``. The
    form (per bin or per edge) and its tables are chosen from all the ranges, and the rest is
    elementwise, so a block's losses do not depend on which other blocks are asked for."""

    def __init__(self, counts: np.ndarray, ranges: Ranges, dst_bins: int) -> None:
        counts = np.asarray(counts, dtype=np.float64)
        n = self.n = counts.size
        padded = np.concatenate(([0.0], counts, [0.0]))
        w = -np.diff(padded)  # weight of F at edge i
        pos = np.arange(n + 1, dtype=np.float64) - n / 2  # centred edge positions
        powers = (np.ones_like(pos), pos, pos * pos, pos * pos * pos)  # exact: no pow()
        self.prefix = [np.concatenate(([0.0], np.cumsum(w * p))) for p in powers]
        cand = _pairs(ranges)
        self.left, self.right = left, right = cand[:, 0], cand[:, 1]
        self.half = (right - left + 1).astype(np.float64) / dst_bins / 2
        self.blocks: list[slice] = []
        self.inner: Callable[[slice], np.ndarray] = lambda sl: np.zeros(0)
        if cand.shape[0] == 0:
            return
        runs = _run_layout(float(self.half.max() * 2), n)
        if _per_bin_is_cheaper(cand.shape[0], int(np.count_nonzero(w)), dst_bins, runs):
            self.blocks, self.inner = _bin_sums(padded, w, left, right, dst_bins, runs)
        else:
            self.blocks, self.inner = _edge_sums(w, pos, left, right, dst_bins)

    def loss(self, sl: slice) -> np.ndarray:
        """The losses of the ranges ``sl``: the cubic tails outside the ranges, plus inside."""
        return self.outer(sl) + self.inner(sl)

    def outer(self, sl: slice) -> np.ndarray:
        """The cubic tails: edges left of ``left`` and from ``right + 2`` on."""
        n, prefix = self.n, self.prefix
        left, right, half = self.left[sl], self.right[sl], self.half[sl]

        def moment_cube(lo_idx, hi_idx, shift):
            """sum over edges lo_idx <= i < hi_idx of w_i * (pos_i - shift)**3."""
            s0, s1, s2, s3 = (p[hi_idx] - p[lo_idx] for p in prefix)
            return s3 - 3 * shift * s2 + 3 * shift**2 * s1 - shift**3 * s0

        low = moment_cube(0, left, left - n / 2 + half)
        low -= half**3 * (prefix[0][n + 1] - prefix[0][left])
        end = np.minimum(right + 2, n + 1)
        high = moment_cube(end, n + 1, right + 1 - n / 2 - half)
        high += half**3 * prefix[0][end]
        return (low + high) / 3.0


def _per_bin_is_cheaper(
    n_cand: int, n_weights: int, dst_bins: int, runs: tuple[int, int, int]
) -> bool:
    """Rough costs, in edge evaluations (measured): per edge, candidates x nonzero weights; per
    bin, about 1.5 for each entry of the ``(width + 1) x stride`` table and each candidate x
    destination bin x run."""
    width, pieces, stride = runs
    return 2 * n_cand * n_weights > 3 * ((width + 1) * stride + n_cand * dst_bins * pieces)


def _edge_sums(w, pos, left, right, dst_bins):
    """Blocks of ranges and ``inner(sl)``: ``dst_w**3 * sum_i w_i * F(q_i)`` of
    :func:`l2_losses` for the ranges ``sl``, with ``F`` evaluated at every edge."""
    n = w.size - 1
    keep = w != 0
    kept_w, kept_pos = w[keep], pos[keep]
    span = (right - left + 1).astype(np.float64)
    dst_w = span / dst_bins
    rows = max(1, _CHUNK // max(int(keep.sum()), 1))
    kept_prefix = np.concatenate(([0.0], np.cumsum(kept_w)))

    def inner(sl: slice) -> np.ndarray:
        # Edges left of every range in this block sit at q = 0 (F = -1/24 below), edges right
        # of every range at q = dst_bins (F = dst_bins/12 - 1/24): only the edges between
        # are evaluated. Candidates shrink as the search goes, so later blocks are narrower.
        c0 = int(np.searchsorted(kept_pos, left[sl].min() - n / 2, side="left"))
        c1 = int(np.searchsorted(kept_pos, right[sl].max() + 1 - n / 2, side="right"))
        below, above = kept_prefix[c0], kept_prefix[-1] - kept_prefix[c1]
        out = dst_w[sl] ** 3 * (-below / 24.0 + (dst_bins / 12.0 - 1.0 / 24.0) * above)
        block_pos, block_w = kept_pos[c0:c1], kept_w[c0:c1]
        # q = clamped edge position in destination-bin units; F = m / 12 + (t**3 + 1/8) / 3
        # with m = floor(q), t = q - m - 1/2 (the 1/8 term drops out: sum(w) == 0).
        q = block_pos[None, :] - (left[sl, None] - n / 2)
        np.clip(q, 0.0, span[sl, None], out=q)
        q *= (1.0 / dst_w[sl])[:, None]
        m = np.floor(q)
        q -= m
        q -= 0.5
        cube = q * q
        cube *= q
        out += dst_w[sl] ** 3 * ((m @ block_w) / 12.0 + (cube @ block_w) / 3.0)
        return out

    return _slices(left.size, rows), inner


def _slices(size: int, rows: int) -> list[slice]:
    return [slice(start, min(start + rows, size)) for start in range(0, size, rows)]


def _run_layout(max_dst_w: float, n: int) -> tuple[int, int, int]:
    """``(width, pieces, stride)`` of :func:`_bin_sums`' moment table for bins of up to
    ``max_dst_w`` edges: runs of up to ``width`` edges, ``pieces`` runs per bin, ``stride``
    starts per run length (past ``n``, runs read zeros)."""
    longest = math.ceil(max_dst_w)
    width = min(longest, _MAX_RUN)
    pieces = -(-longest // width)
    return width, pieces, n + 1 + (pieces - 1) * width


def _residue_rows(res, dst_bins, stride):
    """Per residue ``res`` (rows) and bin ``k`` (columns) of :func:`_bin_sums`:
    ``ceil(k * res / dst_bins)`` (k <= dst_bins), its excess over ``k * res / dst_bins``, and
    the run index of bin k less ``left + (span // dst_bins) * (stride + k)``.

    ``k * res`` is an exact integer, so its rounded quotient has the exact ceiling.
    """
    exact = np.multiply.outer(res, np.arange(dst_bins + 1)) / dst_bins
    ceil_part = np.ceil(exact)
    offset = ceil_part[:, :-1] - exact[:, :-1]  # a_k - (left + k * dst_w), in [0, 1)
    by_res = np.diff(ceil_part, axis=1) * stride + ceil_part[:, :-1]
    return ceil_part.astype(np.int64), offset, by_res.astype(np.int64)


@functools.lru_cache(maxsize=8)
def _all_residue_rows(dst_bins, stride):
    """:func:`_residue_rows` of every residue, read-only: shared by all calls (tensors) with the
    same ``dst_bins`` and table stride."""
    rows = _residue_rows(np.arange(dst_bins), dst_bins, stride)
    for r in rows:
        r.flags.writeable = False
    return rows


def _bin_sums(padded, w, left, right, dst_bins, runs):
    """Blocks of ranges and ``inner(sl)``: ``dst_w**3 * sum_i w_i * F(q_i)`` of
    :func:`l2_losses` for the ranges ``sl``, one destination bin at a time.

    Destination bin ``k`` holds the edges ``a_k <= i < a_{k+1}``, ``a_k = left + ceil(k * span /
    dst_bins)``, where ``dst_w**3 * F = k * dst_w**3 / 12 + (i - centre_k)**3 / 3``: a bin needs
    the moments ``M_j = sum w_i * (i - a_k)**j`` (j <= 3) of its edges about its first edge,
    which Horner's rule moves to ``centre_k``. A table holds them for every start and run
    length: short sums about a nearby origin, exact for integer counts, where differences of
    global prefix sums of ``w * i**j`` cancel (up to ~1e-9 of the loss on a ReLU histogram of
    1e8 counts). Edges left of ``left`` sit at ``F(0) = -1/24``, edges from ``right + 1`` on at
    ``F(dst_bins) = dst_bins/12 - 1/24``.
    """
    width, pieces, stride = runs
    span = right - left + 1
    half = span / dst_bins / 2
    # table[j, length * stride + start] = (1, 3, 3, 1)[j] * sum(w[start + r] * r**j, r < length)
    wpad = np.concatenate((w, np.zeros(stride - w.size + width)))
    table = np.empty((4, width + 1, stride))
    table[:, 0] = 0.0
    for length in range(1, width + 1):
        run, r = wpad[length - 1 : length - 1 + stride], float(length - 1)
        np.add(table[0, length - 1], run, out=table[0, length])
        for j, coef in ((1, 3 * r), (2, 3 * r * r), (3, r**3)):
            np.multiply(run, coef, out=table[j, length])
            table[j, length] += table[j, length - 1]
    table = table.reshape(4, -1)
    # a_k - left = k * (span // dst_bins) + ceil(k * res / dst_bins), res = span % dst_bins: the
    # second term, and a_k - (left + k * dst_w), come from one row per residue
    if dst_bins <= _SHARED_ROWS:
        res_row = span % dst_bins
        ceil_part, offset, by_res = _all_residue_rows(dst_bins, stride)
    else:
        res, res_row = np.unique(span % dst_bins, return_inverse=True)
        ceil_part, offset, by_res = _residue_rows(res, dst_bins, stride)
    whole = span // dst_bins
    if pieces == 1:  # run index of bin k: left + whole * (stride + k) + by_res
        by_whole = np.multiply.outer(np.arange(whole.max() + 1), stride + np.arange(dst_bins))
    else:  # start of bin k: left + whole * k + ceil_part
        by_whole = np.multiply.outer(np.arange(whole.max() + 1), np.arange(dst_bins + 1))
    bin_k = np.arange(dst_bins, dtype=np.float64)
    rows = max(1, _CELLS // dst_bins)
    fbuf = np.empty((3, rows, dst_bins))
    ibuf = np.empty((2, rows, dst_bins), dtype=np.int64)

    def inner(sl: slice) -> np.ndarray:
        rr = res_row[sl]
        cubes = np.zeros(rr.size)  # sum over bins of sum_i w_i * (i - centre_k)**3
        weighted = np.zeros(rr.size)  # sum over bins of k * M_0
        shift, acc, moment = fbuf[:, : rr.size]
        idx, part = ibuf[:, : rr.size]
        # take(out=) writes directly with mode="clip" ("raise" buffers); indices are in range
        np.take(offset, rr, axis=0, out=shift, mode="clip")
        shift -= half[sl, None]  # a_k - centre_k
        if pieces == 1:
            np.take(by_res, rr, axis=0, out=idx, mode="clip")
            idx += np.take(by_whole, whole[sl], axis=0, out=part, mode="clip")
            idx += left[sl, None]
            parts = [(idx, shift)]
        else:  # a bin longer than width: runs of width edges from a_k, a_k + width, ...
            a = ceil_part[rr] + by_whole[whole[sl]]
            a += left[sl, None]
            parts = []
            for i in range(pieces):
                first = a[:, :-1] + i * width
                length = np.clip(a[:, 1:] - first, 0, width)
                parts.append((length * stride + first, shift + i * width))
        for run_idx, d in parts:
            table[0].take(run_idx, out=acc, mode="clip")
            weighted += np.einsum("ij,j->i", acc, bin_k)
            # Horner: ((M0 d + 3 M1) d + 3 M2) d + M3, the last step summed over bins
            acc *= d
            acc += table[1].take(run_idx, out=moment, mode="clip")
            acc *= d
            acc += table[2].take(run_idx, out=moment, mode="clip")
            cubes += np.einsum("ij,ij->i", acc, d)
            cubes += np.einsum("ij->i", table[3].take(run_idx, out=moment, mode="clip"))
        # sum(w[:left]), sum(w[right + 1:])
        below, above = -padded[left[sl]], padded[right[sl] + 1]
        constant = weighted / 12.0 - below / 24.0 + (dst_bins / 12.0 - 1.0 / 24.0) * above
        return (span[sl] / dst_bins) ** 3 * constant + cubes / 3.0

    return _slices(left.size, rows), inner


def hfmg_search(counts: np.ndarray, vmin: float, vmax: float, bits: int = 8) -> tuple[float, float]:
    """HFMG clip range ``(lo, hi)`` for ``len(counts)`` bins over ``[vmin, vmax]``.

    A constant tensor (``vmin == vmax``) returns ``(vmin, vmax)``. The best bin range of the last
    :data:`_KEPT_SEARCHES` histograms is kept (:class:`_SearchCache`): calibrating one model on
    the same data again, e.g. with the algorithm changing between calls, searches nothing twice.

    Example:
        >>> hfmg_search(np.ones(1024), -1.0, 1.0)  # flat: trims one bin on the right
        (-1.0, 0.998046875)
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.size not in NUM_OF_BINS_CHOICES:
        raise QuantError(
            f"HFMG num_of_bins must be one of {NUM_OF_BINS_CHOICES}, got {counts.size}"
        )
    if vmax <= vmin or counts.sum() <= 0:
        return float(vmin), float(vmax)
    left, right = _SEARCHES.best(counts, bits)
    width = (vmax - vmin) / counts.size
    return float(vmin + left * width), float(vmin + (right + 1) * width)


def best_bins(counts: np.ndarray, bits: int = 8) -> tuple[int, int]:
    """The ``(left, right)`` bin range HFMG picks on ``counts`` for ``bits``-bit destination
    bins: the candidate of :func:`search_candidates` with the lowest :func:`l2_losses`.

    Example:
        >>> best_bins(np.ones(1024))
        (0, 1022)
    """
    counts = np.asarray(counts, dtype=np.float64)
    ranges = _candidate_array(counts)
    left, right = ranges[best_range(counts, ranges, 2**bits)]
    return int(left), int(right)


class _SearchCache:
    """:func:`best_bins` of the last ``size`` histograms, by a 128-bit digest of their bytes.

    The search (~2 ms for 4096 bins) is a pure function of the counts and ``bits``; the digest
    (~50 us) is the cost of a repeat. Thread-safe: records search tensors in a thread pool.

    Example:
        >>> cache = _SearchCache(2)
        >>> cache.best(np.ones(1024), 8)
        (0, 1022)
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: OrderedDict[tuple[bytes, int, int], tuple[int, int]] = OrderedDict()
        self._lock = threading.Lock()

    def best(self, counts: np.ndarray, bits: int) -> tuple[int, int]:
        """``best_bins(counts, bits)``, searched once per distinct histogram."""
        data = np.ascontiguousarray(counts, dtype=np.float64)
        key = (hashlib.blake2b(data, digest_size=16).digest(), data.size, int(bits))
        with self._lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
                return found
        found = best_bins(data, bits)  # outside the lock: other threads search meanwhile
        with self._lock:
            self._kept[key] = found
            self._kept.move_to_end(key)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return found

    def clear(self) -> None:
        """Forget every kept range (benchmarks time the search itself this way).

        Example:
            >>> _SearchCache(2).clear()
        """
        with self._lock:
            self._kept.clear()


_SEARCHES = _SearchCache(_KEPT_SEARCHES)
