"""The observed steps of the last few plans are kept (issue 33 §5): switching back to an
earlier algorithm traces nothing.

A user comparing algorithms calls ``calibrate()`` with minmax, ifmr, hfmg, minmax... With one
kept step per model every change of plan traced the step again (2.4-4.8x a warm predict on
MobileNetV2, against ~1x for a call on the kept step). Traces are counted, not timed, with a
layer whose ``call`` counts its Python runs: in a compiled step it runs once per trace and never
per batch. Each run on a kept step must write the bytes a fresh step (``keep_step=False``)
writes; the least recently used plan beyond ``KEEP_PLANS`` is dropped and traces again.
"""

from __future__ import annotations

import gc
import itertools
import weakref

import keras
import numpy as np
import pytest
from isolate import in_fresh_process

from amct_bridge.keras import QuantCalibration, calibrate
from amct_bridge.keras import session as keras_session
from amct_bridge.records.calibration import sidecar_path


class Counting(keras.layers.Layer):
    """The identity; counts the Python runs of its ``call`` (traces of a compiled step)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.runs = 0

    def call(self, x):
        self.runs += 1
        return x


def _model() -> tuple[keras.Model, Counting]:
    keras.utils.set_random_seed(0)
    count = Counting(name="count")
    x = keras.Input((8, 8, 3))
    y = keras.layers.Conv2D(4, 3, padding="same", name="conv")(count(x))
    y = keras.layers.ReLU(name="relu")(y)
    y = keras.layers.DepthwiseConv2D(3, padding="same", name="dw")(y)
    y = keras.layers.GlobalAveragePooling2D(name="gap")(y)
    y = keras.layers.Dense(2, name="fc")(y)
    model = keras.Model(x, y)
    model.compile(optimizer="sgd", loss="mse")
    return model, count


def _data(n: int = 32) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(n, 8, 8, 3)).astype("float32")


def _texts(path) -> tuple[bytes, bytes]:
    return path.read_bytes(), sidecar_path(path).read_bytes()


def _traces(count: Counting, run, *args, **kwargs) -> int:
    """How many times ``run(*args, **kwargs)`` traced the model (the counting layer's Python
    runs)."""
    before = count.runs
    run(*args, **kwargs)
    return count.runs - before


#: Four plans: minmax has no histograms, ifmr 8192 bins, hfmg 4 x num_of_bins.
ALGORITHMS = ("minmax", "ifmr", "hfmg")


def test_calibrate_switching_back_to_an_earlier_algorithm_traces_nothing(tmp_path):
    model, count = _model()
    x = _data()
    traces = []
    for i, algorithm in enumerate(ALGORITHMS * 2):
        path = tmp_path / f"{i}-{algorithm}.txt"
        traces.append(_traces(count, calibrate, model, x, path, algorithm=algorithm))
    assert traces[:3] == [1, 1, 1]  # each plan traced once...
    assert traces[3:] == [0, 0, 0]  # ...and reused when it comes back
    assert len(keras_session._KEPT[model]) == 3
    fresh, fresh_count = _model()
    for i, algorithm in enumerate(ALGORITHMS):
        path = tmp_path / f"fresh-{algorithm}.txt"
        # keep_step=False traces anew: what the kept steps wrote must be its bytes
        assert _traces(fresh_count, calibrate, fresh, x, path, algorithm=algorithm, keep_step=False)
        assert _texts(tmp_path / f"{i + 3}-{algorithm}.txt") == _texts(path), algorithm
        assert _texts(tmp_path / f"{i}-{algorithm}.txt") == _texts(path), algorithm


def test_the_least_recently_used_plan_goes_first(tmp_path):
    model, count = _model()
    x = _data(16)
    limit = keras_session.KEEP_PLANS
    # limit + 1 plans: minmax, then hfmg with other bin counts (other buffers, other steps)
    plans = [{"algorithm": "minmax"}] + [
        {"algorithm": "hfmg", "algorithm_options": {"num_of_bins": bins}}
        for bins in (1024, 2048, 4096, 8192)[:limit]
    ]

    names = itertools.count()

    def run(i):
        path = tmp_path / f"{next(names)}.txt"
        return _traces(count, calibrate, model, x, path, batch_size=8, **plans[i])

    assert [run(i) for i in range(limit)] == [1] * limit
    assert run(0) == 0  # a hit makes plan 0 the most recently used...
    assert run(limit) == 1  # ...so the new plan drops plan 1, the least recently used
    assert len(keras_session._KEPT[model]) == limit
    assert run(0) == 0
    assert run(1) == 1
    calibrate(model, x, tmp_path / "drop.txt", keep_step=False, **plans[0])
    assert model not in keras_session._KEPT  # keep_step=False drops every kept step


@pytest.mark.parametrize("mode", ["predict", "train"])
def test_the_callback_keeps_the_steps_of_earlier_plans(mode, tmp_path):
    model, count = _model()
    x = _data()
    y = np.zeros((len(x), 2), "float32")
    # Keras' first fit also calls the model symbolically (optimizer and metrics build)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)

    def run(name, algorithm, **options):
        cb = QuantCalibration(tmp_path / f"{name}.txt", algorithm=algorithm, **options)
        if mode == "predict":
            model.predict(x, batch_size=8, verbose=0, callbacks=[cb])
        else:
            model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
        return cb

    assert _traces(count, run, "a", "minmax") == 1
    assert _traces(count, run, "b", "hfmg") == 1
    again = []
    assert _traces(count, lambda: again.append(run("c", "minmax"))) == 0
    assert again[0]._session.python_calls == 0
    assert _traces(count, run, "d", "hfmg") == 0
    assert len(vars(model)[keras_session._KEPT_ATTR][mode]) == 2
    if mode == "predict":  # fit trains the model: each run sees other weights
        assert _texts(tmp_path / "c.txt") == _texts(tmp_path / "a.txt")
        assert _texts(tmp_path / "d.txt") == _texts(tmp_path / "b.txt")
        run("e", "hfmg", keep_step=False)
        assert _texts(tmp_path / "e.txt") == _texts(tmp_path / "b.txt")
        assert mode not in vars(model)[keras_session._KEPT_ATTR]


def test_several_kept_plans_do_not_keep_the_model_alive(tmp_path, request):
    # gc.collect() in a long-lived worker pays for every earlier test's garbage
    if in_fresh_process(request):
        return
    model, _ = _model()
    x = _data(16)
    for algorithm in ALGORITHMS:
        calibrate(model, x, tmp_path / f"{algorithm}.txt", algorithm=algorithm)
        cb = QuantCalibration(tmp_path / f"cb-{algorithm}.txt", algorithm=algorithm)
        model.predict(x, batch_size=8, verbose=0, callbacks=[cb])
    assert len(keras_session._KEPT[model]) == 3
    assert len(vars(model)[keras_session._KEPT_ATTR]["predict"]) == 3
    ref = weakref.ref(model)
    del model, cb
    gc.collect()
    assert ref() is None
