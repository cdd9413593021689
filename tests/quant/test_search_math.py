"""The closed-form search kernels (IFMR histogram MSE, HFMG trimming and L2) vs brute force."""

import numpy as np
import pytest
from quant_reference import amct_search_range, c_round, pairwise_histogram_mse, torch_l2

from amct_bridge.quant.hfmg import l2_losses, search_candidates
from amct_bridge.quant.histogram import GridHistogram
from amct_bridge.quant.ifmr import candidate_clips, candidate_ratios, histogram_mse


def random_counts(rng, n):
    c = rng.poisson(rng.uniform(0.5, 40), n).astype(np.float64)
    c[rng.random(n) < 0.3] = 0
    c[0] = max(c[0], 1)
    c[-1] = max(c[-1], 1)
    return c


@pytest.mark.parametrize("seed", range(6))
def test_hfmg_search_path_matches_amct_loops(seed):
    rng = np.random.default_rng(seed)
    counts = random_counts(rng, int(rng.choice([1024, 2048])))
    if seed % 2:
        counts *= 7  # step = ceil(total / 1e5) > 1 for large totals
        counts[rng.random(counts.size) < 0.5] = 1
    assert search_candidates(counts) == amct_search_range(counts)


@pytest.mark.parametrize("seed", range(4))
def test_hfmg_l2_matches_torch_formula(seed):
    rng = np.random.default_rng(seed)
    counts = random_counts(rng, 1024)
    pairs = np.sort(rng.integers(0, 1024, size=(40, 2)), axis=1)
    ranges = [(int(a), int(b)) for a, b in pairs]
    got = l2_losses(counts, ranges, 256)
    ref = np.array([torch_l2(counts, a, b, 256) for a, b in ranges])
    assert np.allclose(got, ref, rtol=1e-9)


@pytest.mark.parametrize("symmetric", [False, True])
def test_histogram_mse_equals_brute_force_on_bin_uniform_data(symmetric):
    """Data spread uniformly inside each bin: the closed form must equal the sampled MSE."""
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 5, size=64).astype(np.float64)
    hist = GridHistogram(-1.0, 3.0 / 64, counts)
    per = 4_000  # sample points per unit count, evenly inside each bin
    xs = np.concatenate(
        [
            hist.lo + (i + (np.arange(int(c) * per) + 0.5) / (c * per)) * hist.width
            for i, c in enumerate(counts)
            if c
        ]
    )
    ratios = candidate_ratios(0.7, 1.3, 0.05)
    lo, hi, scale = candidate_clips(-1.0, 2.0, ratios, 4, symmetric)
    got = histogram_mse(hist, lo, hi, scale)
    for k in range(ratios.size):
        q = c_round(np.clip(xs, lo[k], hi[k]) / scale[k]) * scale[k]
        ref = np.mean((q - xs) ** 2) * counts.sum()
        assert got[k] == pytest.approx(ref, rel=1e-4)


def test_candidate_ratios_default_count():
    r = candidate_ratios(0.7, 1.3, 0.01)
    assert r.size == 61 and r[0] == np.float32(0.7) and abs(r[-1] - 1.3) < 1e-6


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_histogram_mse_edge_form_equals_pairwise_form(symmetric, seed):
    """The per-edge dot products give the per-(candidate, bin) sums on a realistic 8192-bin
    grid whose edges are clamped to the data support (partial first and last bins)."""
    rng = np.random.default_rng(seed)
    data = rng.standard_t(3, 200_000) * rng.uniform(0.1, 5)
    vmin, vmax = float(data.min()), float(data.max())
    width = (vmax - vmin) * 1.25 / 8192
    grid_lo = vmin - 0.1 * width * 8192
    counts = np.bincount(((data - grid_lo) / width).astype(np.int64), minlength=8192)
    hist = GridHistogram(grid_lo, width, counts.astype(np.float64))
    lo, hi, scale = candidate_clips(
        min(vmin, 0.0), max(vmax, 0.0), candidate_ratios(0.7, 1.3, 0.01), 8, symmetric
    )
    got = histogram_mse(hist, lo, hi, scale, support=(vmin, vmax))
    ref = pairwise_histogram_mse(hist, lo, hi, scale, (vmin, vmax))
    np.testing.assert_allclose(got, ref, rtol=1e-9)
    assert np.argmin(got) == np.argmin(ref)
