"""The closed-form search kernels (IFMR histogram MSE, HFMG trimming and L2) vs brute force."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quant_reference import amct_search_range, c_round, pairwise_histogram_mse, torch_l2

from amct_bridge.quant import hfmg
from amct_bridge.quant.hfmg import hfmg_search, l2_losses, search_candidates
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


# The L2 kernel before the per-destination-bin form: F evaluated at every edge of every
# candidate (O(candidates x bins)). The fast form must reproduce it.
_REF_CHUNK = 1 << 20


def _l2_losses_reference(counts, ranges, dst_bins):
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
    rows = max(1, _REF_CHUNK // max(int(keep.sum()), 1))
    kept_prefix = np.concatenate(([0.0], np.cumsum(kept_w)))
    for start in range(0, cand.shape[0], rows):
        sl = slice(start, start + rows)
        c0 = int(np.searchsorted(kept_pos, left[sl].min() - n / 2, side="left"))
        c1 = int(np.searchsorted(kept_pos, right[sl].max() + 1 - n / 2, side="right"))
        below, above = kept_prefix[c0], kept_prefix[-1] - kept_prefix[c1]
        out[sl] += dst_w[sl] ** 3 * (-below / 24.0 + (dst_bins / 12.0 - 1.0 / 24.0) * above)
        block_pos, block_w = kept_pos[c0:c1], kept_w[c0:c1]
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


def activation_counts(kind, n, total, seed=0):
    """Integer histogram of ``total`` values of a typical activation over its [min, max]."""
    rng = np.random.default_rng(seed)
    size = int(min(total, 400_000))
    if kind == "half_normal":
        x = np.abs(rng.normal(0.0, 1.0, size))
    elif kind == "relu":  # ~40% exact zeros: one huge first bin
        x = np.maximum(rng.normal(0.3, 1.0, size), 0.0)
    elif kind == "relu6":  # fills the range: ~3n/4 candidates
        x = np.clip(rng.normal(1.0, 2.5, size), 0.0, 6.0)
    elif kind == "long_tail":  # Student t with a few far outliers
        x = rng.standard_t(3, size)
        x[:4] = rng.uniform(30.0, 80.0, 4)
    else:
        raise ValueError(kind)
    counts = np.histogram(x, bins=n)[0].astype(np.float64)
    return np.round(counts * (total / size))


@pytest.fixture(params=["auto", "per_bin", "per_edge"])
def l2_form(request, monkeypatch):
    """l2_losses with its own choice of form, or forced to one (both must match the reference)."""
    if request.param != "auto":
        forced = request.param == "per_bin"
        monkeypatch.setattr(hfmg, "_per_bin_is_cheaper", lambda *args: forced)
    return request.param


def assert_matches_reference(counts, ranges, dst_bins, exact_ties=False):
    """Losses within 1e-9 and the same argmin (among exactly tied ranges, if allowed: then
    rounding picks one)."""
    got = l2_losses(counts, ranges, dst_bins)
    ref = _l2_losses_reference(counts, ranges, dst_bins)
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=0.0)
    if len(ranges) and exact_ties:
        assert np.argmin(got) in np.flatnonzero(ref <= ref.min() * (1 + 1e-12))
    elif len(ranges):
        assert np.argmin(got) == np.argmin(ref)


@pytest.mark.parametrize("dst_bins", [16, 256])
@pytest.mark.parametrize("total", [1e5, 1e8])
@pytest.mark.parametrize("kind", ["half_normal", "relu", "relu6", "long_tail"])
def test_hfmg_l2_matches_reference_on_activation_histograms(kind, total, dst_bins, l2_form):
    counts = activation_counts(kind, 2048, total)
    assert_matches_reference(counts, search_candidates(counts), dst_bins)


@pytest.mark.parametrize("n", [1024, 4096, 8192])
def test_hfmg_l2_per_bin_form_at_scale(n, monkeypatch):
    """1e9 ReLU values (one bin of ~4e8 at zero), hundreds to thousands of candidates."""
    counts = activation_counts("relu", n, 1e9, seed=n)
    ranges = search_candidates(counts)
    calls = []
    real = hfmg._bin_sums
    monkeypatch.setattr(hfmg, "_bin_sums", lambda *a: calls.append(1) or real(*a))
    assert_matches_reference(counts, ranges, 256)
    assert calls  # hundreds of candidates: the per-bin form


def adversarial_counts(name, n, rng):
    if name == "spikes":  # isolated huge counts: |w| ~ 2 * total
        counts = np.where(rng.random(n) < 0.05, rng.integers(1, 10**8, n), 0)
    elif name == "alternating":
        counts = np.where(np.arange(n) % 2 == 0, 5 * 10**8 // n, 0)
    elif name == "spike_at_zero":  # ReLU: one bin holding most of 1e9
        counts = rng.poisson(1e4, n)
        counts[0] = 6 * 10**8
    elif name == "far_outliers":
        counts = np.zeros(n, dtype=np.int64)
        counts[: n // 8] = rng.poisson(1e6, n // 8)
        counts[[n // 2, n - 3, n - 1]] = 1
    elif name == "ones":
        counts = np.ones(n, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.float64)
    counts[0], counts[-1] = max(counts[0], 1.0), max(counts[-1], 1.0)
    return counts


@pytest.mark.parametrize("dst_bins", [1, 3, 16, 256, 1000, 65536])
@pytest.mark.parametrize("name", ["spikes", "alternating", "spike_at_zero", "far_outliers", "ones"])
def test_hfmg_l2_matches_reference_on_adversarial_histograms(name, dst_bins, l2_form):
    """Totals near 1e9, isolated spikes, candidates from one bin to the whole range, and
    destination bins from wider than the whole range to narrower than a source bin."""
    rng = np.random.default_rng(7)
    n = 1024
    counts = adversarial_counts(name, n, rng)
    pairs = np.sort(rng.integers(0, n, size=(60, 2)), axis=1)
    ranges = [(0, n - 1), (0, 0), (n - 1, n - 1), (5, 6), (3, 700)]
    ranges += [(int(a), int(b)) for a, b in pairs]
    if not (l2_form == "per_bin" and dst_bins > n):  # that is dst_bins cells per candidate
        ranges += search_candidates(counts)
    assert_matches_reference(counts, ranges, dst_bins, exact_ties=True)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    scale=st.integers(0, 9),
    sparsity=st.floats(0.0, 0.95),
    dst_bins=st.sampled_from([1, 2, 3, 7, 16, 256, 65536]),
    seed=st.integers(0, 2**32 - 1),
    form=st.sampled_from([True, False]),
)
def test_hfmg_l2_matches_reference_on_random_histograms(n, scale, sparsity, dst_bins, seed, form):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 10**scale, n, endpoint=True).astype(np.float64)
    counts[rng.random(n) < sparsity] = 0
    pairs = np.sort(rng.integers(0, n, size=(rng.integers(0, 40), 2)), axis=1)
    ranges = [(int(a), int(b)) for a, b in pairs]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(hfmg, "_per_bin_is_cheaper", lambda *args: form)
        assert_matches_reference(counts, ranges, dst_bins, exact_ties=True)


@pytest.mark.parametrize("bits", [4, 8, 16])
@pytest.mark.parametrize("kind", ["half_normal", "relu", "relu6", "long_tail"])
def test_hfmg_search_same_clip_range_as_reference(kind, bits):
    counts = activation_counts(kind, 4096, 1e7, seed=bits)
    ranges = search_candidates(counts)
    left, right = ranges[int(np.argmin(_l2_losses_reference(counts, ranges, 2**bits)))]
    width = 3.0 / counts.size
    assert hfmg_search(counts, -1.0, 2.0, bits) == (-1.0 + left * width, -1.0 + (right + 1) * width)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(8, 600),
    scale=st.integers(0, 8),
    sparsity=st.floats(0.0, 0.98),
    seed=st.integers(0, 2**32 - 1),
)
def test_hfmg_search_path_matches_amct_loops_random(n, scale, sparsity, seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 10**scale, n, endpoint=True).astype(np.float64)
    counts[rng.random(n) < sparsity] = 0
    assert search_candidates(counts) == amct_search_range(counts)


# ---- best_range: the argmin with the blocks that cannot win skipped ---------------------------


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("name", ["spikes", "alternating", "spike_at_zero", "far_outliers", "ones"])
def test_clip_bounds_never_exceed_the_torch_loss(name, bits):
    """The bound is the clipping loss alone: at most the whole loss of PyTorch's formula."""
    rng = np.random.default_rng(3)
    counts = adversarial_counts(name, 512, rng)
    ranges = search_candidates(counts)[::7] + [(0, 511), (200, 300), (0, 0), (511, 511)]
    bounds = hfmg.clip_bounds(counts, ranges, 2**bits)
    ref = np.array([torch_l2(counts, a, b, 2**bits) for a, b in ranges])
    assert np.all(bounds <= ref * (1 + 1e-9))
    # and it is the clipping loss, not a loose constant: equal where nothing is inside
    assert bounds[-1] > 0.5 * ref[-1] or ref[-1] == 0


@pytest.mark.parametrize("dst_bins", [4, 16, 256])
@pytest.mark.parametrize("kind", ["half_normal", "relu", "relu6", "long_tail"])
def test_best_range_is_the_argmin_and_skips_blocks(kind, dst_bins, l2_form, monkeypatch):
    counts = activation_counts(kind, 4096, 1e8, seed=dst_bins)
    ranges = search_candidates(counts)
    terms = hfmg._LossTerms(counts, ranges, dst_bins)
    evaluated = []
    real = hfmg._LossTerms

    class Counting(real):
        def __init__(self, *args):
            super().__init__(*args)
            inner = self.inner
            self.inner = lambda sl: evaluated.append(sl) or inner(sl)

    monkeypatch.setattr(hfmg, "_LossTerms", Counting)
    best = hfmg.best_range(counts, ranges, dst_bins)
    used = len(evaluated)
    assert best == int(np.argmin(_l2_losses_reference(counts, ranges, dst_bins)))
    assert best == int(np.argmin(l2_losses(counts, ranges, dst_bins)))
    if len(terms.blocks) > 4 and dst_bins == 256:
        assert used < len(terms.blocks) / 2  # most blocks cannot win


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 400),
    scale=st.integers(0, 9),
    sparsity=st.floats(0.0, 0.95),
    dst_bins=st.sampled_from([1, 2, 3, 7, 16, 256]),
    seed=st.integers(0, 2**32 - 1),
    form=st.sampled_from([True, False]),
)
def test_best_range_equals_argmin_on_random_histograms(n, scale, sparsity, dst_bins, seed, form):
    """Random ranges in random order (the winner anywhere), ties included: the same index as
    argmin over every loss."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 10**scale, n, endpoint=True).astype(np.float64)
    counts[rng.random(n) < sparsity] = 0
    pairs = np.sort(rng.integers(0, n, size=(rng.integers(1, 300), 2)), axis=1)
    ranges = [(int(a), int(b)) for a, b in pairs]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(hfmg, "_per_bin_is_cheaper", lambda *args: form)
        assert hfmg.best_range(counts, ranges, dst_bins) == int(
            np.argmin(l2_losses(counts, ranges, dst_bins))
        )


def test_best_range_refuses_no_ranges():
    with pytest.raises(hfmg.QuantError, match="at least one range"):
        hfmg.best_range(np.ones(4), [], 2)


def test_best_range_finds_a_winner_behind_a_block_of_near_misses(monkeypatch):
    """64 ranges 1-10% worse than the winner fill the first block; the winner's loss is mostly
    clipping (its bound near it), so a bound or a skip test off by 2x would skip it."""
    monkeypatch.setattr(hfmg, "_per_bin_is_cheaper", lambda *args: True)  # blocks of 64
    counts = np.zeros(4096)
    counts[:1000] = 1000.0
    counts[-1] = 1.0  # one far outlier: clipping it costs ~(3000 bins)**2
    ranges = [(0, r) for r in range(1000, 4096, 10)]
    losses = _l2_losses_reference(counts, ranges, 256)
    winner = ranges[int(np.argmin(losses))]
    ratio = losses / losses.min()
    near = [r for r, q in zip(ranges, ratio, strict=True) if 1.0 < q < 1.1]
    bound = hfmg.clip_bounds(counts, [winner], 256)[0]
    assert len(near) >= 8 and 0.5 * 1.1 < bound / losses.min() < 1.0  # the setup holds
    # blocks of 64 (256 destination bins): near misses, then the winner alone, then the rest
    order = [near[i % len(near)] for i in range(64)] + [winner] * 64 + ranges
    assert hfmg.best_range(counts, order, 256) == 64
    # a block is skipped only if every range in it loses: the winner beside hopeless ranges
    order = [near[i % len(near)] for i in range(64)] + [winner] + [(0, 10)] * 63
    assert hfmg.best_range(counts, order, 256) == 64
