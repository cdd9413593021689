"""The native summary ops (amct_bridge.keras.native): same results as stock TF, and the
fallback when they cannot be built.

The reference for ``AmctSummary`` is what the instrumentation computes without it:
``tf.reduce_min``/``reduce_max`` and ``tf.histogram_fixed_width`` over the grid or the batch's
own range; the ops must agree bit for bit, so that records do not depend on the machine.
"""

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from calib_models import assert_c1_input_range, branchy_model, images, sequential_model

from amct_bridge.keras import QuantCalibration, native
from amct_bridge.records import load
from amct_bridge.records.calibration import sidecar_path

NO_GRID = [np.inf, -np.inf]


@pytest.fixture
def fresh_native():
    """Let a test change the environment native.load() reads; look again afterwards."""
    native.reset()
    yield
    native.reset()


def stock_summary(x: np.ndarray, grid, nbins: int):
    """The instrumentation's stock-TF path for one tensor, eagerly."""
    t = tf.constant(x, tf.float32)
    grid = np.asarray(grid, np.float32)  # the in-graph grid is float32
    lo, hi = float(tf.reduce_min(t)), float(tf.reduce_max(t))
    inside = bool(lo >= grid[0] and hi <= grid[1])
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return lo, hi, x.size, inside, np.zeros(nbins, np.int32)
    up = np.float32(lo) + np.float32(1.0)  # a constant tensor: [lo, lo + 1] or the next float
    up = up if up > lo else np.nextafter(np.float32(lo), np.float32(np.inf))
    top = hi if hi > lo else float(up)
    value_range = tf.constant(grid if inside else [lo, top], tf.float32)
    hist = tf.histogram_fixed_width(tf.reshape(t, [-1]), value_range, nbins, dtype=tf.int32)
    return lo, hi, x.size, inside, hist.numpy()


def native_summary(x: np.ndarray, grid, nbins: int):
    out = native.summary(tf.constant(x, tf.float32), tf.constant(grid, tf.float32), nbins)
    lo, hi, count, inside, hist = (v.numpy() for v in out)
    return float(lo), float(hi), int(count), bool(inside), hist


def assert_same(got, want):
    lo, hi, count, inside, hist = got
    np.testing.assert_array_equal([lo, hi], want[:2])  # NaN == NaN here
    assert (count, inside) == (want[2], want[3])
    np.testing.assert_array_equal(hist, want[4])


def edge_values(lo: float, hi: float, nbins: int) -> np.ndarray:
    """Values on and next to every bin edge of [lo, hi] (and inside it, so that a grid
    [lo, hi] is used and the batch's own range is [lo, hi] too): where the quotient is an
    integer or within rounding of one."""
    lo32, hi32 = np.float32(lo), np.float32(hi)
    step = np.float64(hi32) / nbins - np.float64(lo32) / nbins
    edges = (np.float64(lo32) + step * np.arange(nbins + 1)).astype(np.float32)
    down, up = np.nextafter(edges, np.float32(-np.inf)), np.nextafter(edges, np.float32(np.inf))
    return np.clip(np.concatenate([edges, down, up, [lo32, hi32]]), lo32, hi32)


def multiply_misses(x: np.ndarray, lo: float, hi: float, nbins: int) -> int:
    """How many values a bin index by multiplication with 1 / step puts in another bin than
    TF's division does (the op must notice and divide for those)."""
    lo32, hi32 = np.float32(lo), np.float32(hi)
    step = np.float64(hi32) / nbins - np.float64(lo32) / nbins
    d = np.clip(x, lo32, hi32).astype(np.float64) - np.float64(lo32)
    return int(
        np.sum(
            np.minimum(d / step, nbins - 1).astype(int)
            != np.minimum(d * (1 / step), nbins - 1).astype(int)
        )
    )


# ranges (found by search) where multiplication and division disagree on some bin edges
MISSES = [
    (-5.57490348815918, 9.800763130187988, 2048),
    (-2.1155571937561035, 0.8662542104721069, 7),
]


@pytest.mark.parametrize(("lo", "hi", "nbins"), MISSES)
def test_summary_divides_where_multiplying_would_miss(lo, hi, nbins):
    x = edge_values(lo, hi, nbins)
    assert multiply_misses(x, lo, hi, nbins) > 0  # the case this test is about
    for grid in ([lo, hi], NO_GRID):
        assert_same(native_summary(x, grid, nbins), stock_summary(x, grid, nbins))


def test_native_ops_build_on_this_machine():
    """The project's CI has a C++ compiler: a missing op is a failed install, not a skip."""
    op = native.load()
    assert op is not None and hasattr(op, "amct_summary") and hasattr(op, "amct_min_max")
    assert native.library_path().exists()


rng = np.random.default_rng(0)
relu = np.maximum(rng.normal(size=(8, 33, 31, 16)), 0).astype(np.float32)  # not a chunk multiple
normal = rng.normal(0, 3, size=(7, 300)).astype(np.float32)


@pytest.mark.parametrize(
    ("name", "x", "grid", "nbins"),
    [
        ("relu, no grid yet", relu, NO_GRID, 4096),
        ("relu, inside the grid", relu, [0.0, float(relu.max()) * 1.2], 4096),
        ("relu, grid lo on the data min", relu, [0.0, float(relu.max())], 2048),
        ("normal, sticks out below", normal, [float(normal.min()) / 2, 20.0], 1024),
        ("normal, sticks out above", normal, [-20.0, float(normal.max()) / 2], 8192),
        ("normal, 2 bins", normal, NO_GRID, 2),
        ("normal, 7 bins inside", normal, [-30.0, 30.0], 7),
        ("one bin", normal, [-30.0, 30.0], 1),
        ("constant tensor", np.full((5, 5), 2.5, np.float32), NO_GRID, 4096),
        ("constant on a grid", np.full((5, 5), 2.5, np.float32), [2.5, 3.0], 16),
        ("constant 2^24 (lo + 1 == lo)", np.full((5, 5), 2.0**24, np.float32), NO_GRID, 4096),
        ("constant -3e38", np.full((3, 7), -3e38, np.float32), NO_GRID, 2048),
        ("bin edges, own range", edge_values(-3.7, 11.3, 4096), NO_GRID, 4096),
        ("bin edges, on the grid", edge_values(-3.7, 11.3, 4096), [-3.7, 11.3], 4096),
        ("bin edges, 2048 bins", edge_values(0.0, 6.0, 2048), [0.0, 6.0], 2048),
        ("bin edges, tiny range", edge_values(1.0, 1.0001, 1024), [1.0, 1.0001], 1024),
        ("NaN", np.array([1.0, np.nan, 3.0], np.float32), NO_GRID, 64),
        ("NaN inside a grid", np.array([1.0, 2.0, np.nan] * 900, np.float32), [0.0, 4.0], 64),
        ("+Inf", np.array([1.0, np.inf, 3.0], np.float32), [0.0, 4.0], 64),
        ("-Inf", np.array([-np.inf, 3.0], np.float32), NO_GRID, 64),
        ("empty", np.zeros((0, 4), np.float32), NO_GRID, 64),
    ],
)
def test_summary_equals_stock_tf(name, x, grid, nbins):
    got = native_summary(x, grid, nbins)
    want = stock_summary(x, grid, nbins)
    if x.size and np.isfinite(x).all():
        assert got[4].sum() == x.size, name
    assert_same(got, want)


def test_summary_in_a_graph_on_millions_of_values():
    """Inside tf.function, on 3.2 M values of several distributions at once."""
    parts = [
        np.maximum(rng.normal(size=1_600_000), 0),
        rng.uniform(-5, 5, size=1_000_000),
        rng.standard_cauchy(size=600_001),
    ]
    x = np.concatenate(parts).astype(np.float32)
    grid = [-5.0, float(np.quantile(x, 0.999))]
    fn = tf.function(lambda v, g: native.summary(v, g, 4096))
    out = [v.numpy() for v in fn(tf.constant(x), tf.constant(grid, tf.float32))]
    got = (float(out[0]), float(out[1]), int(out[2]), bool(out[3]), out[4])
    assert_same(got, stock_summary(x, grid, 4096))
    assert not got[3]  # Cauchy tails stick out: the batch's own range was used


@pytest.mark.parametrize(
    "x",
    [
        rng.normal(size=(3, 17, 5)).astype(np.float32),
        np.array([np.nan, 1.0], np.float32),
        np.array([-np.inf, 1.0, np.inf], np.float32),
        np.zeros((0,), np.float32),
        np.array([-0.0, 0.0], np.float32),
    ],
)
def test_min_max_equals_reduce(x):
    lo, hi, count = (v.numpy() for v in native.min_max(tf.constant(x)))
    want = [tf.reduce_min(x).numpy(), tf.reduce_max(x).numpy()]
    np.testing.assert_array_equal([lo, hi], want)
    assert count == x.size


def _calibrate(model_fn, x, path, algorithm):
    model = model_fn()
    model.compile(loss="mse")
    model.predict(
        x, batch_size=8, verbose=0, callbacks=[QuantCalibration(path, algorithm=algorithm)]
    )
    return path.read_text(), sidecar_path(path).read_text()


@pytest.mark.parametrize("algorithm", ["ifmr", "hfmg", "minmax"])
@pytest.mark.parametrize("model_fn", [sequential_model, branchy_model], ids=["seq", "branchy"])
def test_records_equal_with_and_without_native_ops(
    tmp_path, monkeypatch, fresh_native, algorithm, model_fn
):
    """The same record and sidecar, byte for byte, from native and stock-TF summaries; and
    the native ones were really used."""
    shape = model_fn().input_shape[1:]
    x = np.random.default_rng(11).normal(0.3, 1.0, (40, *shape)).astype(np.float32)
    x[8:16] *= 3.0  # batch 1 widens every range: grids move, own histograms again
    calls = []
    real_summary, real_min_max = native.summary, native.min_max
    monkeypatch.setattr(native, "summary", lambda *a: calls.append("s") or real_summary(*a))
    monkeypatch.setattr(native, "min_max", lambda *a: calls.append("m") or real_min_max(*a))
    with_native = _calibrate(model_fn, x, tmp_path / "native.txt", algorithm)
    assert ("s" in calls) == (algorithm != "minmax") and "m" in calls
    monkeypatch.setenv("AMCT_BRIDGE_NATIVE_OPS", "0")
    native.reset()
    stock = _calibrate(model_fn, x, tmp_path / "stock.txt", algorithm)
    assert native.load() is None
    assert with_native[0] == stock[0]
    assert with_native[1].replace("native.txt", "stock.txt") == stock[1]


@pytest.mark.parametrize("algorithm", ["ifmr", "hfmg"])
def test_constant_input_beyond_float_step_one_calibrates(tmp_path, monkeypatch, algorithm):
    """Constant data at 2^24: lo + 1 == lo in float32, so the batch's own histogram range was
    empty (a segfault in the native op, a TF error in the stock one); both give one record."""
    x = np.full((16, *sequential_model().input_shape[1:]), 2.0**24, np.float32)
    native_text = _calibrate(sequential_model, x, tmp_path / "native.txt", algorithm)[0]
    monkeypatch.setenv("AMCT_BRIDGE_NATIVE_OPS", "0")
    native.reset()
    try:
        stock_text = _calibrate(sequential_model, x, tmp_path / "stock.txt", algorithm)[0]
    finally:
        monkeypatch.delenv("AMCT_BRIDGE_NATIVE_OPS")
        native.reset()
    assert native_text == stock_text
    first = load(tmp_path / "native.txt").layers["c1"]
    assert first.scale_d == pytest.approx(2.0**24 / 255, rel=0.35)  # clip search may trim


def test_failed_build_falls_back_with_one_warning(tmp_path, monkeypatch, fresh_native, caplog):
    """A compiler that fails: a warning with its exit status, nothing half-written in the
    cache, and calibration still works (on stock TF ops)."""
    monkeypatch.setenv("AMCT_BRIDGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "false")
    with caplog.at_level(logging.WARNING, logger="amct_bridge.keras.native"):
        assert native.load() is None
        assert native.load() is None  # remembered: no second build, no second warning
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "exited with 1" in warnings[0], warnings
    assert "stock TF ops" in warnings[0]
    assert sorted(p.suffix for p in (tmp_path / "cache").iterdir()) == [".lock"]
    _calibrate(sequential_model, images(16), tmp_path / "r.txt", "hfmg")
    assert load(tmp_path / "r.txt").layers["c1"].scale_d > 0


def test_no_compiler_is_named(tmp_path, monkeypatch, fresh_native, caplog):
    monkeypatch.setenv("AMCT_BRIDGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no c++, g++ or clang++ on it
    with caplog.at_level(logging.WARNING, logger="amct_bridge.keras.native"):
        assert native.load() is None
    assert "no C++ compiler found" in caplog.text


def test_fresh_build_in_an_empty_cache(tmp_path):
    """From nothing: built into $AMCT_BRIDGE_CACHE, loadable, only the library and its lock
    left there. (A subprocess: one process cannot load two copies of the same ops.)"""
    env = {**os.environ, "AMCT_BRIDGE_CACHE": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "3"}
    code = (
        "import tensorflow as tf; from amct_bridge.keras import native; "
        "out = native.summary(tf.constant([0.0, 0.4, 1.0]), tf.constant([0.0, 1.0]), 2); "
        "print(out[4].numpy().tolist(), native.library_path())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts, path = done.stdout.strip().rsplit(" ", 1)
    assert counts == "[2, 1]"
    library = Path(path)
    assert library.parent == tmp_path
    assert sorted(tmp_path.iterdir()) == sorted([library, library.with_suffix(".lock")])


def test_xla_minmax_pass_keeps_stock_ops(tmp_path, monkeypatch):
    """A minmax pass keeps the user's XLA step, which cannot run the native ops: stock TF
    reductions there (c1's input range still exact)."""
    x = images(24)
    calls = []
    real = native.min_max
    monkeypatch.setattr(native, "min_max", lambda *a: calls.append(1) or real(*a))
    for jit in (False, True):
        calls.clear()
        model = sequential_model()
        model.compile(loss="mse", jit_compile=jit)
        path = tmp_path / f"r{jit}.txt"
        cb = QuantCalibration(path, algorithm="minmax")
        model.predict(x, batch_size=8, verbose=0, callbacks=[cb])
        assert bool(calls) is not jit and model.jit_compile is jit
        assert_c1_input_range(path, x.min(), x.max())
