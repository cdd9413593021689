"""QuantCalibration keeps its instrumented step function for the next run (issue 23 §4).

Traces are counted with two real counters: the kept ``tf.function``'s own
``experimental_get_tracing_count()`` and the session's ``python_calls`` (a Python side effect
of the wrapped layer calls, which run only while a step is traced). A run on the kept step must
write the bytes a fresh run (``keep_step=False``, same model, same data) writes; anything the
step function depends on (another model, plan, input shape, compile(), jit_compile,
steps_per_execution, strategy) must trace anew; and the kept step must not keep the model alive.
"""

from __future__ import annotations

import gc
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf
from isolate import in_fresh_process

from amct_bridge.keras import QuantCalibration, calibrate
from amct_bridge.keras.session import _KEPT_ATTR
from amct_bridge.records.calibration import sidecar_path


def _model(spatial=(8, 8), seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    x = keras.Input((*spatial, 3))
    y = keras.layers.Conv2D(4, 3, padding="same", name="conv")(x)
    y = keras.layers.ReLU(name="relu")(y)
    y = keras.layers.DepthwiseConv2D(3, padding="same", name="dw")(y)
    y = keras.layers.GlobalAveragePooling2D(name="gap")(y)
    y = keras.layers.Dense(2, name="fc")(y)
    model = keras.Model(x, y)
    model.compile(loss="mse")
    return model


def _data(n: int = 32, spatial=(8, 8), seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, *spatial, 3)).astype("float32")
    return x, rng.normal(size=(n, 2)).astype("float32")


def _kept(model, mode: str):
    """The most recently used step kept for ``mode``."""
    return vars(model)[_KEPT_ATTR][mode].latest


def _traces(fn, depth: int = 3) -> int:
    """Traces of every tf.function in ``fn`` or its closures (Keras' test and train
    functions are Python functions around ``tf.function``s)."""
    if hasattr(fn, "experimental_get_tracing_count"):
        return fn.experimental_get_tracing_count()
    if depth == 0:
        return 0
    cells = getattr(fn, "__closure__", None) or ()
    return sum(_traces(c.cell_contents, depth - 1) for c in cells if callable(c.cell_contents))


def _run(model, path, mode="predict", x=None, **options) -> QuantCalibration:
    """One calibration run of ``mode`` on ``x``: returns its callback."""
    options.setdefault("algorithm", "hfmg")
    x, y = _data() if x is None else (x, None)
    cb = QuantCalibration(path, **options)
    if mode == "predict":
        model.predict(x, batch_size=8, verbose=0, callbacks=[cb])
    else:
        y = np.zeros((len(x), 2), "float32") if y is None else y
        model.evaluate(x, y, batch_size=8, verbose=0, callbacks=[cb])
    return cb


def _texts(path) -> tuple[bytes, bytes]:
    return path.read_bytes(), sidecar_path(path).read_bytes()


@pytest.mark.parametrize("mode", ["predict", "test"])
def test_a_second_run_traces_nothing_and_writes_what_a_fresh_run_writes(mode, tmp_path):
    model = _model()
    first = _run(model, tmp_path / "a.txt", mode)
    assert first._session.python_calls > 0  # the first run traced its observed step
    fn = _kept(model, mode).fn
    traces = _traces(fn)
    assert traces >= 1  # a real count: the Keras test function holds its tf.functions
    # the user's step function is back after each run, the kept one is not left in place
    assert getattr(model, f"{mode}_function") is not fn
    again = _run(model, tmp_path / "b.txt", mode)
    assert again._session.python_calls == 0
    assert _kept(model, mode).fn is fn and _traces(fn) == traces
    fresh = _run(model, tmp_path / "c.txt", mode, keep_step=False)
    assert fresh._session.python_calls == first._session.python_calls  # traced anew
    assert mode not in vars(model)[_KEPT_ATTR]  # keep_step=False dropped it
    assert _texts(tmp_path / "b.txt") == _texts(tmp_path / "c.txt")
    assert _texts(tmp_path / "a.txt") == _texts(tmp_path / "c.txt")


def test_another_model_plan_or_input_shape_traces_anew(tmp_path):
    model = _model()
    calls = _run(model, tmp_path / "a.txt")._session.python_calls
    # another model object of the same architecture: its own step
    other = _model()
    assert _run(other, tmp_path / "b.txt")._session.python_calls == calls
    # another plan (minmax observes other tensors: no histograms) traces its own step; the
    # first plan again runs on the step kept for it (the last plans' steps are kept)
    fn = _kept(model, "predict").fn
    assert _run(model, tmp_path / "c.txt", algorithm="minmax")._session.python_calls > 0
    assert _kept(model, "predict").fn is not fn
    assert _run(model, tmp_path / "d.txt")._session.python_calls == 0
    assert _kept(model, "predict").fn is fn
    assert _texts(tmp_path / "d.txt") == _texts(tmp_path / "a.txt")
    # another input shape on a model with free spatial dimensions: the kept tf.function
    # traces again for it (with the layers wrapped, so the new trace is observed too)
    free = _model(spatial=(None, None))
    _run(free, tmp_path / "e.txt")
    fn = _kept(free, "predict").fn
    traces = _traces(fn)
    x12, _ = _data(spatial=(12, 12))
    cb = _run(free, tmp_path / "f.txt", x=x12)
    assert cb._session.python_calls > 0
    assert _traces(fn) == traces + 1
    _run(free, tmp_path / "g.txt", x=x12, keep_step=False)
    assert _texts(tmp_path / "f.txt") == _texts(tmp_path / "g.txt")


def test_compile_jit_and_steps_per_execution_make_a_new_step(tmp_path):
    model = _model()
    _run(model, tmp_path / "a.txt", "test", algorithm="minmax")
    assert _run(model, tmp_path / "b.txt", "test", algorithm="minmax")._session.python_calls == 0
    model.compile(loss="mse")
    assert _run(model, tmp_path / "c.txt", "test", algorithm="minmax")._session.python_calls > 0
    assert len(vars(model)[_KEPT_ATTR]["test"]) == 1  # the steps of the old compile() are gone
    model.jit_compile = True
    assert _run(model, tmp_path / "d.txt", "test", algorithm="minmax")._session.python_calls > 0
    assert _run(model, tmp_path / "e.txt", "test", algorithm="minmax")._session.python_calls == 0
    model.jit_compile = False
    model.steps_per_execution = 2
    assert _run(model, tmp_path / "f.txt", "test", algorithm="minmax")._session.python_calls > 0
    for name in "bcf":
        assert _texts(tmp_path / f"{name}.txt") == _texts(tmp_path / "a.txt"), name
    # XLA computes in another order (last bits): its kept step against its fresh one
    assert _texts(tmp_path / "e.txt") == _texts(tmp_path / "d.txt")


def test_another_distribution_strategy_makes_a_new_step(tmp_path):
    model = _model()
    _run(model, tmp_path / "a.txt")
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        assert _run(model, tmp_path / "b.txt")._session.python_calls > 0
        assert _kept(model, "predict").key[-1][0] is strategy
        assert _run(model, tmp_path / "c.txt")._session.python_calls == 0
    # back outside the scope: the step kept from the first run (default strategy) again
    assert _run(model, tmp_path / "d.txt")._session.python_calls == 0
    assert _texts(tmp_path / "c.txt") == _texts(tmp_path / "b.txt")
    np.testing.assert_equal(_texts(tmp_path / "d.txt"), _texts(tmp_path / "a.txt"))


def test_fit_validation_passes_share_one_trace(tmp_path):
    model = _model()
    x, y = _data(32)
    vx, vy = _data(16, seed=2)
    path = tmp_path / "val.txt"
    cb = QuantCalibration(path, algorithm="ifmr", on="validation")
    model.fit(x, y, batch_size=8, epochs=3, validation_data=(vx, vy), verbose=0, callbacks=[cb])
    fn = _kept(model, "test").fn
    # the three passes traced as much as one evaluate of another model does: the same
    # tf.function traces and as many wrapped calls
    other = _model()
    one = _run(other, tmp_path / "one.txt", "test", x=vx, algorithm="ifmr")
    assert _traces(fn) == _traces(_kept(other, "test").fn) > 0
    assert cb._session.python_calls == one._session.python_calls > 0
    assert cb._session.batches == 3 * 2


def test_calibrate_predict_fallback_keeps_the_callback_step(tmp_path):
    """calibrate() on a dataset goes through predict and the callback: keep_step reaches it."""
    model = _model()
    x, _ = _data()
    data = tf.data.Dataset.from_tensor_slices(x).batch(8)
    calibrate(model, data, tmp_path / "a.txt", algorithm="minmax")
    fn = _kept(model, "predict").fn
    calibrate(model, data, tmp_path / "b.txt", algorithm="minmax")
    assert _kept(model, "predict").fn is fn and _traces(fn) == 1
    calibrate(model, data, tmp_path / "c.txt", algorithm="minmax", keep_step=False)
    assert "predict" not in vars(model)[_KEPT_ATTR]
    assert _texts(tmp_path / "b.txt") == _texts(tmp_path / "c.txt")


def test_the_kept_steps_do_not_keep_the_model_alive(tmp_path, request):
    # its gc.collect() in a long-lived worker also frees every earlier test's garbage (58 s
    # there against 1.6 s alone): a fresh interpreter keeps the suite's time
    if in_fresh_process(request):
        return
    model = _model()
    x, y = _data()
    cb = QuantCalibration(tmp_path / "fit.txt", algorithm="hfmg")
    model.fit(x, y, batch_size=8, epochs=1, validation_data=(x, y), verbose=0, callbacks=[cb])
    _run(model, tmp_path / "p.txt")
    _run(model, tmp_path / "t.txt", "test")
    assert set(vars(model)[_KEPT_ATTR]) == {"train", "predict", "test"}
    ref = weakref.ref(model)
    del model, cb
    gc.collect()
    assert ref() is None


def test_a_model_with_kept_steps_saves_copies_and_exports_without_them(tmp_path):
    import copy

    model = _model()
    _run(model, tmp_path / "a.txt")
    assert _KEPT_ATTR in vars(model)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert _KEPT_ATTR not in vars(loaded)
    assert not vars(copy.deepcopy(model)).get(_KEPT_ATTR)  # a copy starts with none
    tf.saved_model.save(model, str(tmp_path / "saved"))  # nothing of ours is tracked
    restored = tf.saved_model.load(str(tmp_path / "saved"))
    names = {v.name for v in restored.variables} if hasattr(restored, "variables") else set()
    assert not any("amct_bridge" in name for name in names)
