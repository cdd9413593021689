"""HFMG: AMCT's histogram clip-range search (PyTorch HistogramObserver's L2 loss).

Given ``num_of_bins`` counts over ``[min, max]`` (AMCT ``hfmg.cpp``):

1. candidates: starting from the full range, repeatedly trim at least
   ``step = ceil(total / 1e5)`` counts from the left and from the right (scanning bins), and
   keep the trim that removes fewer bins (the sparser side; ties trim the right), while the
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

import bisect
import math

import numpy as np

from amct_bridge.errors import QuantError

#: AMCT's option values for ``hfmg_quantize { num_of_bins }``.
NUM_OF_BINS_CHOICES = (1024, 2048, 4096, 8192)
_STEP_DIVISOR = 100000
_MIN_BIN_RATIO = 4
_CHUNK = 1 << 20  # candidate x bin elements evaluated per vectorised block


def search_candidates(counts: np.ndarray) -> list[tuple[int, int]]:
    """AMCT's trimmed ``(left, right)`` bin ranges, in search order.

    Example:
        >>> search_candidates(np.array([0, 5, 5, 5, 5, 5, 5, 0.0]))
        [(0, 5), (2, 5), (2, 4)]
    """
    n = counts.size
    total = float(counts.sum())
    step = max(math.ceil(np.float32(total) / np.float32(_STEP_DIVISOR)), 1)
    min_bins = math.ceil(n / _MIN_BIN_RATIO)
    # prefix[i] = sum(counts[:i]); a list and bisect: thousands of scalar lookups, where
    # numpy's per-call overhead dominated
    prefix = np.concatenate(([0.0], np.cumsum(counts))).tolist()
    left, right = 0, n - 1
    out: list[tuple[int, int]] = []
    while right - left > min_bins:
        # leftmost t > left with sum(counts[left:t]) >= step, capped at right
        t_left = bisect.bisect_left(prefix, prefix[left] + step)
        t_left = min(max(t_left, left + 1), right)
        # rightmost t < right with sum(counts[t+1:right+1]) >= step, never below t_left
        need = prefix[right + 1] - step
        t_right = bisect.bisect_right(prefix, need) - 2
        t_right = max(min(t_right, right - 1), t_left) if t_left < right else right
        if right - t_right >= t_left - left:
            right = t_right
        else:
            left = t_left
        out.append((left, right))
    return out


def l2_losses(counts: np.ndarray, ranges: list[tuple[int, int]], dst_bins: int) -> np.ndarray:
    """PyTorch HistogramObserver L2 error of each ``(left, right)`` range (unit bin width).

    With uniform density per source bin the loss is ``sum_i count_i * (F(e_i) - F(b_i))``
    where ``F`` integrates the squared distance to the nearest destination-bin centre (clamped
    to the first/last centre outside the range). Summation by parts turns it into
    ``F(edges) @ w`` with ``w = -diff([0, *counts, 0])``; the cubic tails outside the range come
    from prefix sums of ``w * edge**k``, so only the periodic part is evaluated per edge.
    Losses scale with the bin width cubed, so comparing candidates needs no real width.

    Example:
        >>> float(l2_losses(np.array([1.0, 1.0]), [(0, 1)], 2)[0])  # two bins map exactly
        0.16666666666666666
    """
    n = counts.size
    w = -np.diff(np.concatenate(([0.0], counts, [0.0])))  # weight of F at edge i
    pos = np.arange(n + 1, dtype=np.float64) - n / 2  # centred edge positions: fewer cancellations
    prefix = [np.concatenate(([0.0], np.cumsum(w * pos**k))) for k in range(4)]
    keep = w != 0
    kept_w, kept_pos = w[keep], pos[keep]
    cand = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    left, right = cand[:, 0], cand[:, 1]
    span = (right - left + 1).astype(np.float64)
    dst_w = span / dst_bins
    half = dst_w / 2

    def moment_cube(lo_idx, hi_idx, shift):
        """sum over edges lo_idx <= i < hi_idx of w_i * (pos_i - shift)**3."""
        s0, s1, s2, s3 = (p[hi_idx] - p[lo_idx] for p in prefix)
        return s3 - 3 * shift * s2 + 3 * shift**2 * s1 - shift**3 * s0

    zero = np.zeros_like(left)
    low = moment_cube(zero, left, left - n / 2 + half) - half**3 * (
        prefix[0][n + 1] - prefix[0][left]
    )
    end = np.minimum(right + 2, n + 1)
    high = moment_cube(end, np.full_like(end, n + 1), right + 1 - n / 2 - half)
    high += half**3 * prefix[0][end]
    out = (low + high) / 3.0
    rows = max(1, _CHUNK // max(int(keep.sum()), 1))
    kept_prefix = np.concatenate(([0.0], np.cumsum(kept_w)))
    for start in range(0, cand.shape[0], rows):
        sl = slice(start, start + rows)
        # Edges left of every range in this block sit at q = 0 (F = -1/24 below), edges right
        # of every range at q = dst_bins (F = dst_bins/12 - 1/24): only the edges between
        # are evaluated. Candidates shrink as the search goes, so later blocks are narrower.
        c0 = int(np.searchsorted(kept_pos, left[sl].min() - n / 2, side="left"))
        c1 = int(np.searchsorted(kept_pos, right[sl].max() + 1 - n / 2, side="right"))
        below, above = kept_prefix[c0], kept_prefix[-1] - kept_prefix[c1]
        out[sl] += dst_w[sl] ** 3 * (-below / 24.0 + (dst_bins / 12.0 - 1.0 / 24.0) * above)
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
        out[sl] += dst_w[sl] ** 3 * ((m @ block_w) / 12.0 + (cube @ block_w) / 3.0)
    return out


def hfmg_search(counts: np.ndarray, vmin: float, vmax: float, bits: int = 8) -> tuple[float, float]:
    """HFMG clip range ``(lo, hi)`` for ``len(counts)`` bins over ``[vmin, vmax]``.

    A constant tensor (``vmin == vmax``) returns ``(vmin, vmax)``.

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
    ranges = search_candidates(counts)
    losses = l2_losses(counts, ranges, 2**bits)
    left, right = ranges[int(np.argmin(losses))]
    width = (vmax - vmin) / counts.size
    return float(vmin + left * width), float(vmin + (right + 1) * width)
