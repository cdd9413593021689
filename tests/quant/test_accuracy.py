"""Bounded-memory observers vs brute-force AMCT on all raw data: deviation < 0.5 % of scale_d.

The references (quant_reference.py) sort all data for percentiles, run one pass over all data
per IFMR candidate, and histogram all data at once for HFMG, as AMCT does. Batches here grow in
range so the merged histogram has to re-grid.
"""

import numpy as np
import pytest
from quant_reference import exact_hfmg, exact_ifmr, exact_percentile

from amct_bridge.quant.factors import activation_factors
from amct_bridge.quant.observers import make_observer

TOLERANCE = 0.005  # of scale_d


def dataset(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = {
        "relu": lambda: np.maximum(rng.normal(0.3, 1.0, n), 0.0),
        "relu6": lambda: np.clip(rng.normal(1.0, 2.5, n), 0.0, 6.0),
        "gaussian": lambda: rng.normal(0.0, 1.0, n),
        "heavy_tailed": lambda: rng.standard_t(3, n),
    }[kind]()
    return x.astype(np.float32)


def batches_of(x: np.ndarray, k: int = 4) -> list[np.ndarray]:
    """k batches whose ranges grow (forces the histogram grid to widen)."""
    return [b * np.float32(1 + 0.15 * i) for i, b in enumerate(np.array_split(x, k))]


def feed(algorithm: str, parts, **options):
    obs = make_observer(algorithm, **options)
    for b in parts:
        obs.update(b)
    return obs


def assert_close(got, ref):
    (s, o), (rs, ro) = got, ref
    assert abs(s - rs) <= TOLERANCE * rs, (got, ref)
    assert abs(o - ro) <= 1, (got, ref)


KINDS = ["relu", "relu6", "gaussian", "heavy_tailed"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("symmetric", [False, True])
def test_ifmr_matches_exact(kind, symmetric):
    parts = batches_of(dataset(kind, 120_000, seed=len(kind)))
    obs = feed("ifmr", parts, activation_offset=not symmetric)
    ref = exact_ifmr(np.concatenate(parts), symmetric=symmetric)
    assert_close(obs.factors(), ref)
    # below 1e6 values the percentile is the exact max: the same candidate as AMCT wins
    assert obs.factors() == ref


@pytest.mark.parametrize("kind", KINDS)
def test_ifmr_int16_and_custom_search(kind):
    parts = batches_of(dataset(kind, 60_000, seed=7))
    opts = dict(search_range_start=0.5, search_range_end=1.1, search_step=0.02)
    obs = feed("ifmr", parts, num_bits=16, **opts)
    ref = exact_ifmr(np.concatenate(parts), bits=16, start=0.5, end=1.1, step=0.02)
    assert_close(obs.factors(), ref)
    assert obs.factors() == ref


def test_percentile_and_ifmr_beyond_a_million_elements():
    """N > 1e6: k = N - floor(p*N) > 1, the percentile comes from the histogram tail."""
    x = dataset("heavy_tailed", 2_400_000, seed=11)
    parts = batches_of(x, 3)
    allx = np.concatenate(parts)
    lo_ref, hi_ref = exact_percentile(allx, 0.999999, 0.999999)
    assert hi_ref < allx.max()  # really not the max
    obs = feed("percentile", parts)
    lo, hi = obs.clip_range()
    scale_ref = activation_factors(lo_ref, hi_ref)[0]
    assert abs(hi - hi_ref) <= TOLERANCE * scale_ref * 255 / 8 and abs(lo - lo_ref) <= scale_ref
    assert_close(obs.factors(), activation_factors(lo_ref, hi_ref))
    assert_close(feed("ifmr", parts).factors(), exact_ifmr(allx))


@pytest.mark.parametrize("kind", KINDS)
def test_percentile_low_percentile_matches_sorting(kind):
    parts = batches_of(dataset(kind, 200_000, seed=3))
    obs = feed("percentile", parts, max_percentile=0.999, min_percentile=0.99)
    ref = exact_percentile(np.concatenate(parts), 0.999, 0.99)
    assert_close(obs.factors(), activation_factors(*ref))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_of_bins", [1024, 4096])
def test_hfmg_matches_exact_histogram_search(kind, num_of_bins):
    parts = batches_of(dataset(kind, 100_000, seed=5))
    obs = feed("hfmg", parts, num_of_bins=num_of_bins)
    ref = activation_factors(*exact_hfmg(np.concatenate(parts), num_of_bins))
    assert_close(obs.factors(), ref)


def test_hfmg_single_batch_is_exact():
    x = dataset("gaussian", 50_000, seed=9)
    obs = feed("hfmg", [x], num_of_bins=2048)
    assert obs.clip_range() == pytest.approx(exact_hfmg(x, 2048), abs=1e-6)
