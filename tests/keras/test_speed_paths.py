"""Correctness of the callback's fast paths (not their speed: see benchmarks/).

- in-graph ring buffers (scatter path and one-slot assign path) hold exactly the numpy
  ``batch_stats`` of every batch (histograms bit for bit), read back as int32 rows;
- ``GridHistogram.add`` touching only the batch's span equals spreading over the whole grid;
- int32 histogram rows feed an observer exactly like int64 ones;
- the parallel end-of-run clip search returns the serial results and restores the observers.
"""

from __future__ import annotations

from contextlib import contextmanager

import keras
import numpy as np
import pytest

from amct_bridge.keras.instrument import Instrumentation, Point
from amct_bridge.keras.record_builder import search_clip_ranges
from amct_bridge.quant.histogram import GridHistogram
from amct_bridge.quant.observers import BatchStats, batch_stats, make_observer


@contextmanager
def installed(model, inst):
    """``inst`` installed and the predict step re-traced; both undone on exit."""
    inst.install()
    try:
        model.make_predict_function(force=True)
        yield inst
    finally:
        inst.remove()
        model.make_predict_function(force=True)


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(1)
    inp = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", name="c1")(inp)
    x = keras.layers.ReLU(name="r1")(x)
    out = keras.layers.Dense(2, name="fc")(keras.layers.Flatten()(x))
    m = keras.Model(inp, out)
    m.compile(loss="mse")
    return m


def test_ring_rows_equal_numpy_batch_stats(model):
    """Five batches in a five-slot ring (scatter path), read once at the end."""
    x = np.random.default_rng(0).standard_t(3, (40, 6, 6, 3)).astype("float32")
    x[32:] = 1.5  # last batch constant: every count in bin 0
    bins = 64
    points = [
        Point("c1", "input", model.get_layer("c1"), bins=bins),
        Point("c1", "output", model.get_layer("c1"), bins=bins),
    ]
    with installed(model, Instrumentation(model, points, steps_per_read=5)) as inst:
        model.predict(x, batch_size=8, verbose=0)
        rows = inst.drain()
    c1_out = keras.Model(model.inputs, model.get_layer("c1").output).predict(x, verbose=0)
    assert sorted((r.point, r.step) for r in rows) == [(p, s) for p in (0, 1) for s in range(5)]
    for row in rows:
        data = (x if row.point == 0 else c1_out)[8 * row.step : 8 * row.step + 8]
        ref = batch_stats(data, bins)
        assert (row.stats.count, row.stats.min, row.stats.max) == (ref.count, ref.min, ref.max)
        assert row.stats.hist.tolist() == ref.hist.tolist()


def test_one_slot_ring_reads_every_batch(model):
    """steps_per_read 1: the buffer is one row, written by assign, read after every batch."""
    x = np.random.default_rng(2).normal(size=(16, 6, 6, 3)).astype("float32")
    point = Point("c1", "input", model.get_layer("c1"), bins=32)
    inst = Instrumentation(model, [point], steps_per_read=1)
    seen = []

    class Read(keras.callbacks.Callback):
        def on_predict_batch_end(self, batch, logs=None):
            seen.extend(inst.drain())

    with installed(model, inst):
        model.predict(x, batch_size=8, verbose=0, callbacks=[Read()])
    assert [r.step for r in seen] == [0, 1]
    for row in seen:
        ref = batch_stats(x[8 * row.step : 8 * row.step + 8], 32)
        assert row.stats.hist.tolist() == ref.hist.tolist() and row.stats.min == ref.min


def _spread_whole_grid(grid: GridHistogram, other: GridHistogram) -> np.ndarray:
    """Reference: ``other`` spread by interpolating its cumulative counts at every grid edge."""
    cum = np.concatenate(([0.0], np.cumsum(other.counts)))
    at = np.interp(grid.edges(), other.edges(), cum)
    at[0], at[-1] = 0.0, cum[-1]
    return grid.counts + np.diff(at)


def test_grid_add_equals_whole_grid_spread():
    rng = np.random.default_rng(5)
    hist = GridHistogram.from_batch(-1.0, 1.0, rng.integers(0, 50, 256))
    for i in range(300):
        lo = rng.uniform(-3, 2) if i % 3 else rng.uniform(-0.99, 0.5)  # some grow the grid
        hi = lo + rng.choice([1e-6, 0.01, 0.7, 4.0])
        batch = GridHistogram.from_batch(lo, hi, rng.integers(0, 30, 256))
        ref = hist.copy()
        ref._grow(batch.lo, batch.hi)  # same grid as add() builds
        expected = _spread_whole_grid(ref, batch)
        hist.add(batch)
        assert (hist.lo, hist.width) == (ref.lo, ref.width)
        np.testing.assert_array_equal(hist.counts, expected)


def test_int32_rows_feed_observers_like_int64():
    rng = np.random.default_rng(7)
    a, b = make_observer("hfmg", num_of_bins=1024), make_observer("hfmg", num_of_bins=1024)
    for _ in range(5):
        s = batch_stats(rng.gamma(2.0, size=5000).astype("float32"), a.bins)
        a.update_stats(s)
        b.update_stats(BatchStats(s.count, s.min, s.max, s.hist.astype(np.int32)))
    assert a.state_dict() == b.state_dict() and a.clip_range() == b.clip_range()


def test_parallel_clip_search_equals_serial_and_leaves_observers_unchanged():
    rng = np.random.default_rng(9)
    observers = [make_observer(a) for a in ("ifmr", "hfmg", "minmax", "percentile", "ifmr")]
    for i, obs in enumerate(observers):
        obs.update(rng.standard_t(4, 20_000).astype("float32") * (i + 1))
    states = [obs.state_dict() for obs in observers]
    serial = [obs.clip_range() for obs in observers]
    assert search_clip_ranges(observers) == serial
    assert [obs.state_dict() for obs in observers] == states


def _grid_hist(data: np.ndarray, lo: float, hi: float, bins: int) -> np.ndarray:
    """numpy reference of tf.histogram_fixed_width on ``[lo, hi]`` (float64 bin index)."""
    pos = (data.ravel().astype(np.float64) - lo) / ((hi - lo) / bins)
    idx = np.clip(pos.astype(np.int64), 0, bins - 1)
    return np.bincount(idx, minlength=bins)


def test_grid_accumulates_inside_batches_and_rings_the_others(model):
    """Batches inside the host-set grid are binned onto it and summed in-graph (no ring row);
    a batch outside it gets its own histogram in the ring; past the step limit nothing is
    accumulated."""
    rng = np.random.default_rng(11)
    x = rng.uniform(-1.0, 1.0, (40, 6, 6, 3)).astype("float32")
    x[16:24] *= 3.0  # batch 2 leaves the grid
    bins = 64
    inst = Instrumentation(model, [Point("c1", "input", model.get_layer("c1"), bins=bins)], 5)
    inst.set_grid(0, -1.0, 1.0)
    inst.set_limit(4)  # batch 4 runs but must not be accumulated
    with installed(model, inst):
        model.predict(x, batch_size=8, verbose=0)
        rows = inst.drain()
        taken = inst.take_histograms([0])
        assert inst.take_histograms([0]) == []  # taking zeroes the accumulator
    # batch 4 is past the limit: its row goes to the ring too (the host drops such rows)
    assert [r.stats.hist is None for r in rows] == [True, True, False, True, False]
    ref = batch_stats(x[16:24], bins)
    assert rows[2].stats.hist.tolist() == ref.hist.tolist()
    [(index, lo, hi, counts)] = taken
    assert (index, lo, hi) == (0, -1.0, 1.0)
    expected = sum(_grid_hist(x[8 * b : 8 * b + 8], -1.0, 1.0, bins) for b in (0, 1, 3))
    assert counts.tolist() == expected.tolist()
    assert inst.grid(0) == (-1.0, 1.0)


def test_deferred_histograms_give_the_per_batch_result():
    """update_stats(hist_later=True) + add_histogram on the grid == one histogram per batch."""
    rng = np.random.default_rng(12)
    batches = [rng.gamma(2.0, size=4000).astype("float32") for _ in range(6)]
    lo = float(min(b.min() for b in batches))
    hi = float(max(b.max() for b in batches))
    a, b = make_observer("hfmg", num_of_bins=1024), make_observer("hfmg", num_of_bins=1024)
    for data in batches:
        a.update_stats(batch_stats(data, a.bins))
        b.update_stats(batch_stats(data, 0), hist_later=True)
    b.add_histogram(lo, hi, sum(_grid_hist(d, lo, hi, b.bins) for d in batches))
    scale_a, _ = a.factors()
    scale_b, _ = b.factors()
    assert scale_b == pytest.approx(scale_a, rel=5e-3)
    c = make_observer("hfmg", num_of_bins=1024)
    c.update_stats(batch_stats(batches[0], 0), hist_later=True)
    with pytest.raises(Exception, match="histogram holds 0 values but 4000 were seen"):
        c.clip_range()


def test_clamp_outputs_take_min_max_from_their_input():
    """ReLU6 / Activation("relu") after an observed tensor: min/max derived (no reduction)
    and equal to the extremes of the real outputs, also when the input is all negative."""
    inp = keras.Input((5, 5, 2))
    x = keras.layers.Conv2D(3, 3, padding="same", name="c1")(inp)
    a = keras.layers.ReLU(6.0, name="r6")(x)
    b = keras.layers.Activation("relu", name="act")(keras.layers.Conv2D(3, 1, name="c2")(a))
    m = keras.Model(inp, keras.layers.ReLU(negative_slope=0.2, name="leaky")(b))
    m.compile(loss="mse")
    points = [
        Point("c1", "output", m.get_layer("c1")),
        Point("r6", "output", m.get_layer("r6")),
        Point("c2", "output", m.get_layer("c2")),
        Point("act", "output", m.get_layer("act")),
        Point("leaky", "output", m.get_layer("leaky")),  # not a clamp: reduced
    ]
    data = np.random.default_rng(3).normal(0, 4, (16, 5, 5, 2)).astype("float32")
    data[8:] = -np.abs(data[8:]) - 50  # second batch: c1 output mostly far below 0
    with installed(m, Instrumentation(m, points, steps_per_read=2)) as inst:
        m.predict(data, batch_size=8, verbose=0)
        rows = inst.drain()
    assert inst.derived == 2
    names = ["c1", "r6", "c2", "act", "leaky"]
    outs = keras.Model(m.inputs, [m.get_layer(n).output for n in names]).predict(data, verbose=0)
    for row in rows:
        ref = outs[row.point][8 * row.step : 8 * row.step + 8]
        assert (row.stats.min, row.stats.max) == (float(ref.min()), float(ref.max()))
