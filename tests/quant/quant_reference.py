"""Brute-force exact references: AMCT's algorithms on ALL raw data (what AMCT itself computes).

Written independently of amct_bridge.quant (plain loops / sorting / per-candidate passes).
"""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32


def c_round(x):
    """C round(): half away from zero."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def exact_percentile(x: np.ndarray, p_max: float, p_min: float) -> tuple[float, float]:
    """AMCT FindMaxAndMinValueWithPercentile: k-th largest / smallest by full sort."""
    v = np.sort(x.ravel().astype(np.float32))
    n = v.size

    def rank(p):
        return 1 if p == 1.0 else n - int(math.floor(F32(p) * F32(n)))

    hi = float(v[n - rank(p_max)])
    lo = float(v[rank(p_min) - 1])
    return min(lo, 0.0), max(hi, 0.0)


def exact_ifmr(x, bits=8, symmetric=False, p=0.999999, start=0.7, end=1.3, step=0.01):
    """AMCT IFMR with one pass over all data per candidate; returns (scale, offset)."""
    data = x.ravel().astype(np.float32)
    lo, hi = exact_percentile(data, p, p)
    lo32, hi32 = F32(lo), F32(hi)
    d64 = data.astype(np.float64)
    losses, scales = [], []
    n_cand = int(round((end - start) / step)) + 1
    for i in range(n_cand):
        r = F32(F32(start) + F32(i) * F32(step))
        if symmetric:
            dom = hi32 if abs(hi32) > abs(lo32) else lo32
            c = F32(r * F32(abs(dom)))
            limit = 2 ** (bits - 1) - 1 if dom > 0 else 2 ** (bits - 1)
            s = F32(c / F32(limit))
            clo, chi = -float(c), float(c)
        else:
            c = F32(r * hi32)
            s = F32(F32(c - lo32) / F32(2**bits - 1))
            clo, chi = float(lo32), float(c)
        s = 1.0 if s < np.finfo(np.float32).eps else float(s)
        q = c_round(np.clip(d64, clo, chi) / s) * s
        losses.append(float(np.mean((q - d64) ** 2)))
        scales.append((s, clo, chi))
    best = int(np.argmin(losses))
    s, clo, chi = scales[best]
    if symmetric:
        return s, 0
    return s, int(-(2 ** (bits - 1)) - c_round(F32(clo) / F32(s)))


def tf_histogram(x: np.ndarray, bins: int, lo: float, hi: float) -> np.ndarray:
    """np.histogram over [lo, hi] (right edge inclusive), as AMCT's HfmgDistribute."""
    return np.histogram(x.astype(np.float64), bins=bins, range=(lo, hi))[0].astype(np.float64)


def amct_search_range(counts: np.ndarray) -> list[tuple[int, int]]:
    """Literal port of HfmgGetSearchRange's nested while loops."""
    left, right = 0, len(counts) - 1
    total = counts.sum()
    step = max(math.ceil(F32(total) / F32(100000)), 1)
    min_bins = math.ceil(len(counts) / 4)
    out = []
    while right - left > min_bins:
        tl, tr, ls, rs = left, right, 0, 0
        while tl < tr and ls < step:
            ls += counts[tl]
            tl += 1
        while tl < tr and rs < step:
            rs += counts[tr]
            tr -= 1
        if right - tr >= tl - left:
            right = tr
        else:
            left = tl
        out.append((left, right))
    return out


def torch_l2(counts: np.ndarray, left: int, right: int, dst: int) -> float:
    """PyTorch/AMCT HfmgCalculateLoss (L2) for one candidate, AMCT's two branches, unit width."""
    i = np.nonzero(counts)[0].astype(np.float64)
    dens = counts[counts > 0]
    dst_w = (right - left + 1) / dst
    half = dst_w / 2
    b = i - left
    e = b + 1.0
    bi = np.clip(np.floor(b / dst_w), 0, dst - 1)
    ei = np.clip(np.floor(e / dst_w), 0, dst - 1)
    cb = bi * dst_w + half
    ce = ei * dst_w + half
    inside = ((e - cb) ** 3 - (b - cb) ** 3) / 3
    across = (half**3 - (b - cb) ** 3) / 3 + (ei - bi - 1) * (2 * half**3) / 3
    across = across + ((e - ce) ** 3 + half**3) / 3
    return float(np.sum(dens * np.where(bi == ei, inside, across)))


def torch_l2_many(counts: np.ndarray, ranges, dst: int, chunk: int = 64) -> np.ndarray:
    """torch_l2 for many candidates, a block of candidates at a time (same two-branch formula)."""
    i = np.nonzero(counts)[0].astype(np.float64)[None, :]
    dens = counts[counts > 0][None, :]
    out = []
    for k in range(0, len(ranges), chunk):
        block = np.asarray(ranges[k : k + chunk], dtype=np.float64)
        left, right = block[:, :1], block[:, 1:]
        dst_w = (right - left + 1) / dst
        half = dst_w / 2
        b = i - left
        e = b + 1.0
        bi = np.clip(np.floor(b / dst_w), 0, dst - 1)
        ei = np.clip(np.floor(e / dst_w), 0, dst - 1)
        cb, ce = bi * dst_w + half, ei * dst_w + half
        inside = ((e - cb) ** 3 - (b - cb) ** 3) / 3
        across = (half**3 - (b - cb) ** 3) / 3 + (ei - bi - 1) * (2 * half**3) / 3
        across = across + ((e - ce) ** 3 + half**3) / 3
        out.append(np.sum(dens * np.where(bi == ei, inside, across), axis=1))
    return np.concatenate(out)


def exact_hfmg(x: np.ndarray, nbins: int = 4096, bits: int = 8) -> tuple[float, float]:
    """HFMG on the exact histogram of all data over [min, max]: clip (lo, hi)."""
    lo, hi = float(x.min()), float(x.max())
    counts = tf_histogram(x, nbins, lo, hi)
    ranges = amct_search_range(counts)
    losses = torch_l2_many(counts, ranges, 2**bits)
    a, b = ranges[int(np.argmin(losses))]
    w = (hi - lo) / nbins
    return lo + a * w, lo + (b + 1) * w


def pairwise_histogram_mse(hist, lo, hi, s, support):
    """IFMR histogram MSE evaluated per (candidate, bin) pair: each kept bin's error split into
    the tail below ``lo``, the rounded middle and the tail above ``hi`` (the direct form of
    ``amct_bridge.quant.ifmr.histogram_mse``; point-mass bins not handled)."""

    def h(u):
        m = np.floor(u + 0.5)
        t = u - m
        return m / 12.0 + (t**3 + 0.125) / 3.0

    def tail(p, q, edge):
        return ((q - edge) ** 3 - (p - edge) ** 3) / 3.0

    lo, hi, s = lo[:, None], hi[:, None], s[:, None]
    q_lo, q_hi = c_round(lo / s) * s, c_round(hi / s) * s
    keep = hist.counts > 0
    edges = np.clip(hist.edges(), *support)
    a, b = edges[:-1][keep][None, :], edges[1:][keep][None, :]
    err = tail(a, np.maximum(np.minimum(b, lo), a), q_lo)
    mid_a = np.maximum(a, lo)
    mid_b = np.maximum(np.minimum(b, hi), mid_a)
    err += s**3 * (h(mid_b / s) - h(mid_a / s))
    above = np.maximum(a, hi)
    err += tail(above, np.maximum(b, above), q_hi)
    return (err * hist.counts[keep][None, :] / (b - a)).sum(axis=1)
