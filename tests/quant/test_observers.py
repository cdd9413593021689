"""Observer protocol: batch summaries, merging, state round-trips, errors."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quant_reference import exact_ifmr

from amct_bridge.errors import QuantError
from amct_bridge.quant.factors import activation_factors
from amct_bridge.quant.observers import (
    BatchStats,
    batch_stats,
    make_observer,
    observer_from_state,
)

ALGORITHMS = ["minmax", "ema", "percentile", "ifmr", "hfmg"]
# small histograms keep the property tests fast; the defaults are exercised in test_accuracy
SMALL = {"percentile": {"bins": 64}, "ifmr": {"bins": 64}, "hfmg": {"num_of_bins": 1024}}


def small_observer(algorithm, **extra):
    return make_observer(algorithm, **SMALL.get(algorithm, {}), **extra)


def loop_histogram(x, bins):
    """Per-element loop with TF's float64 bin formula (independent of the numpy vectorisation)."""
    lo, hi = float(np.min(x)), float(np.max(x))
    out = np.zeros(bins, dtype=np.int64)
    step = (hi - lo) / bins
    for v in np.ravel(x):
        out[min(int((float(v) - lo) / step), bins - 1)] += 1
    return out


def test_batch_stats_matches_loop_and_channel_absmax():
    x = np.random.default_rng(0).normal(size=(4, 5, 3)).astype(np.float32)
    s = batch_stats(x, bins=37, channel_axis=-1)
    assert s.count == 60 and s.min == float(x.min()) and s.max == float(x.max())
    assert s.hist.tolist() == loop_histogram(x, 37).tolist()
    assert s.channel_absmax.tolist() == np.abs(x).max(axis=(0, 1)).tolist()
    const = batch_stats(np.full(7, 2.5), bins=4)
    assert const.hist.tolist() == [7, 0, 0, 0]


def test_batch_stats_matches_tf_histogram_fixed_width():
    import tensorflow as tf  # the in-graph summary the Keras adapter uses

    rng = np.random.default_rng(3)
    for scale, bins in ((1.0, 2048), (1e3, 8192), (1e-3, 16384)):
        x = (rng.standard_t(3, size=300_000) * scale).astype(np.float32)
        expected = tf.histogram_fixed_width(x, [x.min(), x.max()], nbins=bins).numpy()
        assert batch_stats(x, bins).hist.tolist() == expected.tolist()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_batch_names_tensor(bad):
    obs = make_observer("ifmr", name="block2/relu")
    with pytest.raises(QuantError, match="block2/relu"):
        obs.update(np.array([0.0, bad, 1.0], dtype=np.float32))
    with pytest.raises(QuantError, match="block2/relu"):
        obs.update_stats(BatchStats(3, 0.0, float(bad), np.ones(obs.bins), None))


def test_bad_options_and_stats():
    with pytest.raises(QuantError, match="num_of_bins"):
        make_observer("hfmg", num_of_bins=1000)
    with pytest.raises(QuantError, match="accepted"):
        make_observer("ifmr", num_of_bin=10)
    with pytest.raises(QuantError, match="unknown observer"):
        make_observer("kl")
    with pytest.raises(QuantError, match="search_range"):
        make_observer("ifmr", search_range_start=1.3, search_range_end=0.7)
    obs = make_observer("percentile")
    with pytest.raises(QuantError, match="histogram"):
        obs.update_stats(BatchStats(10, 0.0, 1.0, None, None))
    with pytest.raises(QuantError, match="sum"):
        obs.update_stats(BatchStats(10, 0.0, 1.0, np.ones(obs.bins, np.int64), None))
    with pytest.raises(QuantError, match="no data"):
        obs.clip_range()
    with pytest.raises(QuantError, match="cannot merge"):
        obs.merge(make_observer("ifmr"))


def test_minmax_and_ema_formulas():
    batches = [np.array([-1.0, 2.0]), np.array([0.5, 4.0]), np.array([-3.0, 1.0])]
    mm, ema = make_observer("minmax"), make_observer("ema", momentum=0.9)
    for b in batches:
        mm.update(b)
        ema.update(b)
    assert mm.clip_range() == (-3.0, 4.0)
    lo, hi = -1.0, 2.0
    for b in batches[1:]:
        lo, hi = 0.9 * lo + 0.1 * b.min(), 0.9 * hi + 0.1 * b.max()
    assert ema.clip_range() == pytest.approx((lo, hi), rel=1e-12)
    assert mm.factors() == activation_factors(-3.0, 4.0)
    assert mm.factors(bits=16, symmetric=True) == activation_factors(-3.0, 4.0, 16, True)


def test_constant_and_all_zero_data():
    for algorithm in ALGORITHMS:
        obs = make_observer(algorithm)
        obs.update(np.zeros(100, dtype=np.float32))
        assert obs.factors() == (1.0, -128), algorithm
        obs = make_observer(algorithm)
        obs.update(np.full(10, 3.0, dtype=np.float32))
        # IFMR's MSE search legitimately prefers the ratio putting 3.0 exactly on the grid
        expected = (
            exact_ifmr(np.full(10, 3.0)) if algorithm == "ifmr" else (0.0117647061124444, -128)
        )
        assert obs.factors() == expected, algorithm


def test_channel_absmax_accumulates():
    obs = make_observer("minmax")
    obs.update(np.array([[1.0, -5.0], [2.0, 0.0]]), channel_axis=1)
    obs.update(np.array([[-3.0, 1.0]]), channel_axis=1)
    assert obs.channel_absmax.tolist() == [3.0, 5.0]
    with pytest.raises(QuantError, match="channels"):
        obs.update(np.ones((2, 3)), channel_axis=1)


batch = st.tuples(
    st.integers(1, 300),
    st.floats(-100, 100),
    st.floats(0, 50),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["normal", "relu", "const", "t"]),
)


def make_batch(spec):
    n, loc, scale, seed, kind = spec
    rng = np.random.default_rng(seed)
    x = {
        "normal": rng.normal(loc, scale + 1e-3, n),
        "relu": np.maximum(rng.normal(loc, scale + 1e-3, n), 0),
        "const": np.full(n, loc),
        "t": loc + scale * rng.standard_t(2, n),
    }[kind]
    return x.astype(np.float32)


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    ha, hb = sa.pop("hist", None), sb.pop("hist", None)
    assert sa == sb
    if ha is not None:
        assert (ha["lo"], ha["width"]) == (hb["lo"], hb["width"])
        assert np.array_equal(ha["counts"], hb["counts"])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(batch, min_size=2, max_size=4),
    st.sampled_from(["minmax", "percentile", "ifmr", "hfmg"]),
)
def test_merge_equals_sequential_feeding(specs, algorithm):
    xs = [make_batch(s) for s in specs]
    seq = small_observer(algorithm)
    for x in xs:
        seq.update(x)
    head = small_observer(algorithm)
    for x in xs[:-1]:
        head.update(x)
    tail = small_observer(algorithm)
    tail.update(xs[-1])
    head.merge(tail)
    assert_same_state(head, seq)
    assert head.factors() == seq.factors()
    empty = small_observer(algorithm)
    empty.merge(seq)
    assert_same_state(empty, seq)


@settings(max_examples=30, deadline=None)
@given(st.lists(batch, min_size=1, max_size=4), st.sampled_from(ALGORITHMS))
def test_state_round_trip_and_resume(specs, algorithm):
    xs = [make_batch(s) for s in specs]
    full = small_observer(algorithm, name="conv")
    part = small_observer(algorithm, name="conv")
    for x in xs:
        full.update(x)
    for x in xs[:-1]:
        part.update(x)
    restored = observer_from_state(json.loads(json.dumps(part.state_dict())))
    assert_same_state(restored, part)
    restored.update(xs[-1])
    assert_same_state(restored, full)
    assert restored.factors() == full.factors()
    assert restored.clip_range(16, True) == full.clip_range(16, True)


@settings(max_examples=30, deadline=None)
@given(st.lists(batch, min_size=1, max_size=3), st.sampled_from(ALGORITHMS), st.booleans())
def test_factors_consistent_with_clip_range(specs, algorithm, symmetric):
    obs = small_observer(algorithm)
    for s in specs:
        obs.update(make_batch(s))
    lo, hi = obs.clip_range(8, symmetric)
    scale, offset = obs.factors(8, symmetric)
    assert (scale, offset) == activation_factors(lo, hi, 8, symmetric)
    assert np.isfinite(scale) and scale > 0 and -128 <= offset <= 127
    assert obs.min - 1e-6 * abs(obs.min) <= obs.max


def test_denormal_width_grid_grows_to_a_wide_range():
    """Found by hypothesis: a grid of width ~1e-45 meeting a batch spanning thousands needs
    regroup factors beyond int64; the counts keep their total and order."""
    from amct_bridge.quant.histogram import GridHistogram

    hist = GridHistogram.from_batch(-6.0e-44, -6.0e-44 + 64 * 1.0e-45, np.ones(64))
    hist.add(GridHistogram.from_batch(-232.65, 12240.35, np.r_[np.zeros(63), 5.0]))
    assert hist.total == 69.0 and hist.lo <= -232.65 and hist.hi >= 12240.35
    assert hist.counts[-1] == pytest.approx(5.0) and hist.counts[: hist.nbins // 2].sum() == 64.0
