"""hfmg_search keeps the best range of the histograms it searched: the same clip range as a
fresh search, every time, and a new search whenever the counts or the bit width differ."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from quant_reference import amct_search_range, torch_l2

from amct_bridge.quant import hfmg
from amct_bridge.quant.hfmg import NUM_OF_BINS_CHOICES, best_bins, hfmg_search


def fresh_search(counts, vmin, vmax, bits):
    """hfmg_search without the kept ranges: AMCT's loops, then the lowest L2 loss."""
    ranges = amct_search_range(counts)
    losses = np.array([torch_l2(counts, a, b, 2**bits) for a, b in ranges])
    left, right = ranges[int(np.argmin(losses))]
    width = (vmax - vmin) / counts.size
    return vmin + left * width, vmin + (right + 1) * width


def histogram(kind, n, rng):
    if kind == "one_bin":  # all the mass in one bin, one count at each end
        counts = np.zeros(n)
        counts[rng.integers(1, n - 1)] = 10.0 ** rng.integers(3, 9)
        counts[0] = counts[-1] = 1.0
    elif kind == "zero_ends":  # empty bins on both sides of the mass
        counts = np.zeros(n)
        lo = int(rng.integers(1, n // 3))
        counts[lo : n - lo] = rng.poisson(50.0, n - 2 * lo)
    elif kind == "relu":  # a huge first bin, a decaying tail
        counts = np.round(rng.exponential(1.0, n) * np.exp(-np.arange(n) / (n / 8)) * 1e3)
        counts[0] = 4e6
    else:  # sparse random counts of any size
        counts = rng.integers(0, 10 ** int(rng.integers(1, 8)), n).astype(np.float64)
        counts[rng.random(n) < rng.uniform(0.0, 0.9)] = 0.0
        counts[-1] = max(counts[-1], 1.0)
    return counts.astype(np.float64)


@pytest.fixture
def searches(monkeypatch):
    """A fresh, empty store of kept ranges; ``calls`` counts the searches that really ran."""
    cache = hfmg._SearchCache(hfmg._KEPT_SEARCHES)
    calls = []
    real = hfmg.best_bins
    monkeypatch.setattr(hfmg, "_SEARCHES", cache)
    monkeypatch.setattr(hfmg, "best_bins", lambda *args: calls.append(args) or real(*args))
    return calls


@pytest.mark.parametrize("n", [1024, 2048, 4096])
@pytest.mark.parametrize("kind", ["one_bin", "zero_ends", "relu", "random"])
def test_kept_ranges_give_the_fresh_clip_range(kind, n, searches):
    rng = np.random.default_rng(n + len(kind))
    for bits in (4, 8):
        counts = histogram(kind, n, rng)
        want = fresh_search(counts, -1.5, 3.0, bits)
        first = hfmg_search(counts, -1.5, 3.0, bits)
        again = hfmg_search(counts.copy(), -1.5, 3.0, bits)  # another array, the same bytes
        assert first == pytest.approx(want, abs=1e-12)
        assert again == first
    assert len(searches) == 2  # one search per (histogram, bits)


def test_8192_bins_and_a_strided_view(searches):
    rng = np.random.default_rng(5)
    counts = histogram("relu", 2 * 8192, rng)
    view = counts[::2]  # not contiguous: the digest reads a contiguous copy
    assert view.size in NUM_OF_BINS_CHOICES
    assert hfmg_search(view, 0.0, 6.0) == hfmg_search(np.array(view), 0.0, 6.0)
    assert len(searches) == 1
    left, right = best_bins(np.array(view))
    assert hfmg_search(view, 0.0, 6.0) == (left * 6.0 / 8192, (right + 1) * 6.0 / 8192)


def test_any_change_searches_again(searches):
    rng = np.random.default_rng(1)
    counts = histogram("random", 1024, rng)
    hfmg_search(counts, 0.0, 1.0, 8)
    hfmg_search(counts, -2.0, 5.0, 8)  # the range only scales the bins: no search
    assert len(searches) == 1
    hfmg_search(counts, 0.0, 1.0, 4)  # another bit width
    changed = counts.copy()
    changed[rng.integers(counts.size)] += 1.0
    assert hfmg_search(changed, 0.0, 1.0, 8) == fresh_search(changed, 0.0, 1.0, 8)
    assert len(searches) == 3


def test_the_least_recently_used_range_is_dropped(monkeypatch, searches):
    monkeypatch.setattr(hfmg, "_SEARCHES", hfmg._SearchCache(2))
    rng = np.random.default_rng(2)
    a, b, c = (histogram("random", 1024, rng) for _ in range(3))
    for counts in (a, b, a, c):  # a is used again before c comes: b is dropped
        hfmg_search(counts, 0.0, 1.0)
    assert len(searches) == 3
    hfmg_search(a, 0.0, 1.0)
    assert len(searches) == 3
    hfmg_search(b, 0.0, 1.0)
    assert len(searches) == 4


def test_threads_searching_at_once_get_the_serial_results(monkeypatch, searches):
    """Records search tensors in a thread pool: the same histogram from many threads, others
    beside it, with fewer kept ranges than histograms."""
    monkeypatch.setattr(hfmg, "_SEARCHES", hfmg._SearchCache(3))
    rng = np.random.default_rng(3)
    hists = [histogram(kind, 1024, rng) for kind in ("one_bin", "zero_ends", "relu", "random")]
    want = [fresh_search(h, 0.0, 1.0, 8) for h in hists]
    jobs = [i % len(hists) for i in range(64)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: hfmg_search(hists[i], 0.0, 1.0), jobs))
    for i, result in zip(jobs, got, strict=True):
        assert result == pytest.approx(want[i], abs=1e-12)
