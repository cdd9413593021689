"""The native summary op's float32 bin index (issue 33 §5: hfmg's cost in fit) is TF's bins.

``AmctSummary`` computes a value's bin in float32 (twice the lanes of float64) where its error
bound holds and divides as TF does for the values within that bound of a bin edge; ranges the
bound does not cover (a step below FLT_MIN, a width that overflows float32, more than 2^20 bins)
take the float64 path. Either way the histogram must be ``tf.histogram_fixed_width``'s bit for
bit: values on and next to every edge, ranges of every magnitude, the ranges at the limits of
the float32 path, and random ranges with values crowded around their edges.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_native_ops import NO_GRID, assert_same, native_summary, stock_summary

F32_MIN = float(np.finfo(np.float32).tiny)


def crowd(lo: float, hi: float, nbins: int, rng, ulps: int = 3, extra: int = 0) -> np.ndarray:
    """Values on every bin edge of [lo, hi] and up to ``ulps`` float32 steps either side, the
    ends themselves, and ``extra`` uniform values inside."""
    lo32, hi32 = np.float32(lo), np.float32(hi)
    step = np.float64(hi32) / nbins - np.float64(lo32) / nbins
    edges = (np.float64(lo32) + step * np.arange(nbins + 1)).astype(np.float32)
    near = [edges]
    down = up = edges
    for _ in range(ulps):
        down = np.nextafter(down, np.float32(-np.inf))
        up = np.nextafter(up, np.float32(np.inf))
        near += [down, up]
    inside = rng.uniform(np.float64(lo32), np.float64(hi32), extra).astype(np.float32)
    x = np.concatenate([*near, inside, [lo32, hi32]])
    return np.clip(x, lo32, hi32).astype(np.float32)


def check(x: np.ndarray, lo: float, hi: float, nbins: int) -> None:
    for grid in ([lo, hi], NO_GRID):  # binned on the grid, and on the batch's own range
        assert_same(native_summary(x, grid, nbins), stock_summary(x, grid, nbins))


@pytest.mark.parametrize("nbins", [16384, 32768, 8192, 2048, 7])
@pytest.mark.parametrize(
    ("lo", "hi"),
    [
        (-3.7, 11.3),
        (0.0, 6.0),
        (1000.0, 1000.5),  # c - lo rounds in float32 (large |lo| for its width)
        (-1e-3, 5e4),
        (1e30, 1.0001e30),
        (-7e-20, -3e-20),
        (-1e37, 1e37),
    ],
)
def test_bins_on_and_next_to_every_edge(lo, hi, nbins):
    check(crowd(lo, hi, nbins, np.random.default_rng(nbins)), lo, hi, nbins)


@pytest.mark.parametrize(
    ("lo", "steps"),
    [
        (1e-32, 1.3),  # a step just above FLT_MIN: float32 path; c - lo below FLT_MIN
        (1e-32, 0.9),  # just below it: float64 path
        (-2e-33, 40.0),
    ],
)
def test_steps_near_flt_min(lo, steps):
    """Where c - lo is a subnormal float (flushed to zero where TF runs with FTZ)."""
    nbins = 16384
    lo32 = np.float32(lo)
    hi32 = np.float32(np.float64(lo32) + nbins * steps * F32_MIN)
    x = crowd(float(lo32), float(hi32), nbins, np.random.default_rng(1), ulps=12)
    # the first float32 numbers above lo: differences from lo that are subnormal
    first = np.nextafter(np.full(60, lo32), np.float32(np.inf))
    for k in range(1, 60):
        first[k] = np.nextafter(first[k - 1], np.float32(np.inf))
    check(np.concatenate([x, first]), float(lo32), float(hi32), nbins)


def test_a_grid_whose_width_overflows_float32():
    """Grid [-3e38, 3e38]: hi - lo overflows float32, the float64 path bins onto it. (A batch
    that wide itself gets no histogram at all, with or without the native op: the
    instrumentation's NaN/Inf rule reads an infinite width as a non-finite batch.)"""
    lo, hi, nbins = -3e38, 3e38, 4096
    x = crowd(-1.5e38, 1.5e38, nbins, np.random.default_rng(3), extra=10_000)
    got = native_summary(x, [lo, hi], nbins)
    assert got[3]  # inside the grid
    assert_same(got, stock_summary(x, [lo, hi], nbins))


@pytest.mark.parametrize(
    ("lo", "hi", "nbins"),
    [
        (-1.6e38, 1.6e38, 4096),  # hi - lo just finite
        (0.0, 3.4e38, 16384),
        (-1.0, 1.0, 1 << 20),  # the largest bin count of the float32 path
        (-1.0, 1.0, (1 << 20) + 1),
    ],
)
def test_ranges_at_the_limits_of_the_float32_path(lo, hi, nbins):
    rng = np.random.default_rng(2)
    if nbins > 100_000:  # every edge of a million bins: a sample of them is enough
        x = crowd(lo, hi, nbins, rng, ulps=1)
        x = rng.choice(x, 200_000, replace=False)
    else:
        x = crowd(lo, hi, nbins, rng, extra=10_000)
    check(x, lo, hi, nbins)


def test_random_ranges_with_values_crowded_at_their_edges():
    rng = np.random.default_rng(33)
    for _ in range(60):
        magnitude = 10.0 ** rng.uniform(-30, 30)
        lo = float(np.float32(rng.uniform(-1, 1) * magnitude))
        width = magnitude * 10.0 ** rng.uniform(-6, 1)
        hi = float(np.float32(lo + width))
        if not lo < hi:
            continue
        nbins = int(rng.choice([2048, 4096, 8192, 16384, 32768, 1000, 3]))
        x = crowd(lo, hi, nbins, rng, ulps=2, extra=5000)
        # and some outside the grid: clamped to its ends there, the own range otherwise
        x = np.concatenate([x, np.float32([lo - width, hi + width])])
        check(x, lo, hi, nbins)
