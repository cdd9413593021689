"""IFMR (AMCT's default activation algorithm) evaluated on a histogram instead of raw data.

AMCT's IFMR (``ifmr.cpp``): take the percentile max (>= 0) and min (<= 0) of all data, then for
each ratio ``r = search_range_start + i * search_step`` (61 candidates 0.70..1.30 by default)
clip to ``[min, r * max]``, round onto the grid of ``scale = (r * max - min) / (2**b - 1)``,
dequantize and keep the candidate with the lowest mean squared error. Symmetric mode
(``activation_offset = false``) clips to ``[-r * A, r * A]`` with ``A`` the larger of |max|,
|min| and ``scale = r * A / 127`` (``/ 128`` when |min| dominates).

AMCT keeps every activation to compute the MSE. Here the MSE of every candidate is integrated in
closed form over a histogram, assuming uniform density inside each bin: one vectorised pass over
the bins for all candidates at once, no pass over the data per candidate. For rounding onto
``s * round(x / s)`` the antiderivative of the squared error is ``s**3 * H(x / s)`` with
``H(m + t) = m / 12 + (t**3 + 1/8) / 3`` (``m`` the nearest integer, ``|t| <= 1/2``); clipped
tails integrate ``(x - q_edge)**2``.

Example:
    >>> import numpy as np
    >>> ratios = candidate_ratios(0.7, 1.3, 0.01)
    >>> len(ratios), float(ratios[0]), float(ratios[-1])
    (61, 0.699999988079071, 1.2999999523162842)
"""

from __future__ import annotations

import numpy as np

from amct_bridge.errors import QuantError
from amct_bridge.quant.factors import FLT_EPSILON, round_half_away
from amct_bridge.quant.histogram import GridHistogram


def candidate_ratios(start: float, end: float, step: float) -> np.ndarray:
    """Float32 search ratios ``start + i * step`` for ``i`` in ``0 .. round((end-start)/step)``.

    AMCT evaluates ``start + i * step`` in float32; the count includes ``end`` (61 by default).

    Example:
        >>> candidate_ratios(0.9, 1.0, 0.05).tolist()
        [0.8999999761581421, 0.949999988079071, 1.0]
    """
    if not (0 < start <= end and step > 0):
        raise QuantError(
            f"IFMR search range must satisfy 0 < search_range_start <= search_range_end and "
            f"search_step > 0, got start={start}, end={end}, step={step}"
        )
    n = int(round((end - start) / step)) + 1
    f32 = np.float32
    i = np.arange(n, dtype=np.float32)
    return (f32(start) + i * f32(step)).astype(np.float32)


def candidate_clips(
    vmin: float, vmax: float, ratios: np.ndarray, bits: int, symmetric: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per candidate ``(clip_lo, clip_hi, scale)`` in AMCT's float32 arithmetic.

    ``vmin <= 0 <= vmax`` are the percentile min/max.

    Example:
        >>> lo, hi, s = candidate_clips(0.0, 6.0, np.float32([0.99, 1.0]), 8, False)
        >>> [f"{v:.9g}" for v in s]
        ['0.0232941173', '0.0235294122']
    """
    f32 = np.float32
    if symmetric:
        dominant = vmax if abs(vmax) > abs(vmin) else vmin
        c = (ratios * f32(abs(dominant))).astype(np.float32)
        limit = 2 ** (bits - 1) - 1 if dominant > 0 else 2 ** (bits - 1)
        scale = (c / f32(limit)).astype(np.float32)
        lo, hi = -c.astype(np.float64), c.astype(np.float64)
    else:
        hi32 = (ratios * f32(vmax)).astype(np.float32)
        scale = ((hi32 - f32(vmin)) / f32(2**bits - 1)).astype(np.float32)
        lo, hi = np.full(ratios.shape, float(f32(vmin))), hi32.astype(np.float64)
    scale = np.where(scale < FLT_EPSILON, np.float32(1.0), scale).astype(np.float64)
    return lo, hi, scale


def _round_antiderivative(u: np.ndarray, m: np.ndarray, t3: np.ndarray) -> np.ndarray:
    """``H(u) = integral_{-1/2}^{u} (round(t) - t)**2 dt`` (any u), without the constant 1/24
    (it cancels: the edge weights it multiplies sum to zero). ``u`` is overwritten; ``m`` and
    ``t3`` are scratch arrays of its shape; the result is ``m``."""
    np.add(u, 0.5, out=m)
    np.floor(m, out=m)
    u -= m  # t in [-1/2, 1/2)
    np.multiply(u, u, out=t3)
    t3 *= u
    t3 *= 1.0 / 3.0
    m *= 1.0 / 12.0
    m += t3
    return m


#: candidate x edge elements evaluated per vectorised block (bounds temporaries to ~8 MB each)
_CHUNK = 1 << 20


def histogram_mse(
    hist: GridHistogram,
    clip_lo: np.ndarray,
    clip_hi: np.ndarray,
    scale: np.ndarray,
    support: tuple[float, float] | None = None,
) -> np.ndarray:
    """Squared error sum of clamp -> round -> dequantize for each candidate, from a histogram.

    ``support``: the exact data ``(min, max)``; bins are clamped to it, and a bin clamped to
    zero width is a point mass.

    With density ``d_j = count_j / width_j`` on bin ``[e_j, e_j+1)``, each part of the error
    is ``sum_j d_j (A(e_j+1) - A(e_j))`` for an antiderivative ``A`` evaluated at the edges
    clamped into that part (tails below ``lo`` / above ``hi``, the rounded middle), i.e. one
    dot product of ``A(edges)`` with the edge weights ``d_j-1 - d_j``: each edge is evaluated
    once per candidate instead of each (bin, part).

    Example:
        >>> h = GridHistogram(0.0, 1.0, np.array([1.0]))  # uniform on [0, 1)
        >>> round(float(histogram_mse(h, np.zeros(1), np.ones(1), np.ones(1))[0]), 6)
        0.083333
    """
    lo, hi, s = clip_lo[:, None], clip_hi[:, None], scale[:, None]
    if hist.width == 0.0:
        x = np.full((1, 1), hist.lo)
        q = round_half_away(np.clip(x, lo, hi) / s) * s
        return ((q - x) ** 2 * hist.total)[:, 0]
    edges = hist.edges() if support is None else hist.edges_within(*support)
    widths = np.diff(edges)
    keep = hist.counts > 0
    point = keep & (widths <= 0.0)
    dens = np.where(keep & ~point, hist.counts / np.where(point | ~keep, 1.0, widths), 0.0)
    weight = np.concatenate(([0.0], dens)) - np.concatenate((dens, [0.0]))
    used = weight != 0.0  # edges between equally dense bins cancel
    e, w = edges[used], weight[used]
    q_lo = round_half_away(clip_lo / scale) * scale
    q_hi = round_half_away(clip_hi / scale) * scale
    out = np.zeros(clip_lo.shape[0])
    rows = max(1, _CHUNK // max(e.size, 1))
    # three scratch blocks reused by every chunk: fresh temporaries of this size are mapped
    # and page-faulted anew on each operation (that was half of the search's time)
    scratch = np.empty((3, min(rows, out.size), e.size))
    for start in range(0, out.size, rows):
        sl = slice(start, start + rows)
        t, c, d = scratch[:, : len(out[sl])]
        # below lo: integral of (x - q_lo)**2; above hi: of (x - q_hi)**2
        np.minimum(e[None, :], lo[sl], out=t)
        t -= q_lo[sl, None]
        np.multiply(t, t, out=c)
        c *= t
        total = c @ w
        np.maximum(e[None, :], hi[sl], out=t)
        t -= q_hi[sl, None]
        np.multiply(t, t, out=c)
        c *= t
        total += c @ w
        total /= 3.0
        # rounded middle: s**3 * H(clamp(x) / s)
        np.clip(e[None, :], lo[sl], hi[sl], out=t)
        t /= s[sl]
        total += scale[sl] ** 3 * (_round_antiderivative(t, c, d) @ w)
        out[sl] = total
    if point.any():
        x = edges[:-1][point][None, :]
        q = round_half_away(np.clip(x, lo, hi) / s) * s
        out += ((q - x) ** 2 * hist.counts[point][None, :]).sum(axis=1)
    return out


def ifmr_search(
    hist: GridHistogram,
    vmin: float,
    vmax: float,
    *,
    bits: int = 8,
    symmetric: bool = False,
    search_range_start: float = 0.7,
    search_range_end: float = 1.3,
    search_step: float = 0.01,
    support: tuple[float, float] | None = None,
) -> tuple[float, float]:
    """Clip range chosen by IFMR: ``(min, r * max)``, or ``(r * min, r * max)`` if symmetric.

    ``vmin``/``vmax`` are the percentile min/max (clamped here to <= 0 / >= 0). The symmetric
    range is reported with both ends scaled so that ``activation_factors(..., symmetric=True)``
    reproduces AMCT's /127 vs /128 choice.

    Example:
        >>> h = GridHistogram(0.0, 6.0 / 1000, np.ones(1000))
        >>> ifmr_search(h, 0.0, 6.0)
        (0.0, 6.0)
    """
    vmin, vmax = min(float(vmin), 0.0), max(float(vmax), 0.0)
    ratios = candidate_ratios(search_range_start, search_range_end, search_step)
    lo, hi, scale = candidate_clips(vmin, vmax, ratios, bits, symmetric)
    best = int(np.argmin(histogram_mse(hist, lo, hi, scale, support)))
    r = np.float32(ratios[best])
    if symmetric:
        return float(r * np.float32(vmin)), float(r * np.float32(vmax))
    return float(np.float32(vmin)), float(hi[best])
