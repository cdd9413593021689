"""The per-step writes of the instrumentation in unusual steps.

Summaries are collected while a step is traced and written when it returns, so these check
what that design has to get right: other passes' steps are not observed (fit's validation),
a model called twice per step or inside ``tf.cond``, NaN with histogram algorithms, XLA, and
the int32 accumulators being taken before they could overflow.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from calib_models import assert_c1_input_range, images, sequential_model

import amct_bridge.keras.instrument as instrument
from amct_bridge.errors import CalibrationError
from amct_bridge.keras import QuantCalibration
from amct_bridge.quant.observers import batch_stats, make_observer
from amct_bridge.records import load
from amct_bridge.records.calibration import load_stats, sidecar_path


def test_fit_validation_batches_are_not_calibrated(tmp_path):
    """on="auto" in fit: training batches only, although the validation step is traced
    while the layers are wrapped; that step carries no instrumentation afterwards."""
    model = sequential_model()
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    train, val = images(16), images(16, seed=9) + 5.0
    path = tmp_path / "r.txt"
    cb = QuantCalibration(path, algorithm="minmax")
    y = np.zeros((16, 5))
    model.fit(train, y, validation_data=(val, y), batch_size=8, epochs=2, verbose=0, callbacks=[cb])
    assert_c1_input_range(path, train.min(), train.max())
    assert load_stats(sidecar_path(path)).batches == 4  # 2 training batches x 2 epochs
    # the validation step traced during fit runs afterwards without touching our buffers
    before = path.read_text()
    model.evaluate(val, y, batch_size=8, verbose=0)
    assert path.read_text() == before and "call" not in vars(model.get_layer("c1"))


class _TwicePerStep(keras.Model):
    """A custom test_step with two forward passes per batch (x, then 3x)."""

    def test_step(self, data):
        x, _ = data
        a, b = self(x, training=False), self(3.0 * x, training=False)
        return {"m": tf.reduce_mean(a + b)}


class _CondStep(keras.Model):
    """A custom test_step that runs the model in a tf.cond branch chosen by the batch."""

    def test_step(self, data):
        x, _ = data
        out = tf.cond(tf.reduce_mean(x) > 0.5, lambda: self(x, training=False), lambda: self(-x))
        return {"m": tf.reduce_mean(out)}


def _as(cls):
    """``sequential_model``'s layers as a functional model of class ``cls``."""
    seq = sequential_model()
    inp = keras.Input((12, 12, 3))
    x = inp
    for layer in seq.layers:
        x = layer(x)
    model = cls(inp, x, name=cls.__name__.strip("_").lower())
    model.compile(loss="mse")
    return model


def test_model_called_twice_per_step(tmp_path):
    """Two rows per step: the host reads twice as often (24 steps would overflow a ring
    read every 16), and every forward pass counts as one batch."""
    model = _as(_TwicePerStep)
    x = images(48)
    path = tmp_path / "r.txt"
    model.evaluate(
        x,
        np.zeros((48, 5)),
        batch_size=2,
        verbose=0,
        callbacks=[QuantCalibration(path, algorithm="minmax")],
    )
    assert_c1_input_range(path, x.min(), 3.0 * x.max())
    assert load_stats(sidecar_path(path)).batches == 48


@pytest.mark.parametrize("algorithm", ["minmax", "hfmg"])
def test_model_inside_tf_cond(tmp_path, algorithm):
    """Layers run in a control-flow branch write their rows there; only the branch taken
    reaches the statistics."""
    model = _as(_CondStep)
    x = images(32, seed=4)
    x[8:16] += 1.0  # batch 1 takes the x branch, the others -x
    path = tmp_path / "r.txt"
    model.evaluate(
        x,
        np.zeros((32, 5)),
        batch_size=8,
        verbose=0,
        callbacks=[QuantCalibration(path, algorithm=algorithm)],
    )
    seen = [b if b.mean() > 0.5 else -b for b in np.split(x, 4)]
    lo, hi = min(b.min() for b in seen), max(b.max() for b in seen)
    stats = load_stats(sidecar_path(path))
    assert stats.batches == 4
    seen_range = stats.layers["c1"].input
    assert (seen_range.observed_min, seen_range.observed_max) == (lo, hi)
    if algorithm == "minmax":
        assert_c1_input_range(path, lo, hi)
    else:
        obs = make_observer("hfmg")
        for batch in seen:
            obs.update_stats(batch_stats(batch, obs.bins))
        assert load(path).layers["c1"].scale_d == pytest.approx(obs.factors()[0], rel=5e-3)


@pytest.mark.parametrize(
    ("algorithm", "bad"), [("ifmr", np.nan), ("hfmg", np.nan), ("hfmg", -np.inf)]
)
def test_nan_with_histogram_algorithms_names_layer_and_batch(tmp_path, algorithm, bad):
    """tf.histogram_fixed_width raises on NaN inside the step (and bins an infinite range
    wrongly); the batch's histogram is skipped instead, so the host names layer and batch."""
    model = sequential_model()
    x = images(16)
    x[12, 1, 1, 2] = bad
    cb = QuantCalibration(tmp_path / "r.txt", algorithm=algorithm)
    with pytest.raises(CalibrationError, match=r"layer 'c1': input of batch 1 contains NaN or Inf"):
        model.predict(x, batch_size=8, verbose=0, callbacks=[cb])
    assert not (tmp_path / "r.txt").exists()
    assert "call" not in vars(model.get_layer("c1"))


def test_xla_step_runs_uncompiled_while_histogramming(tmp_path):
    """XLA has no histogram op: the pass's step is built without it, the user's XLA step
    comes back afterwards, and the record equals the one without XLA."""
    x = images(32)
    records = []
    for jit in (False, True):
        model = sequential_model()
        model.compile(loss="mse", jit_compile=jit)
        path = tmp_path / f"r{jit}.txt"
        cb = QuantCalibration(path, algorithm="hfmg")
        model.predict(x, batch_size=8, verbose=0, callbacks=[cb])
        assert model.jit_compile is jit
        records.append(load(path).layers)
    assert records[0] == records[1]


def test_accumulators_are_taken_before_int32_could_overflow(tmp_path, monkeypatch):
    """With a tiny accumulator limit the host takes the histograms at every read; the
    record is the same as with the real int32 limit."""
    x = images(96, seed=5) * np.linspace(1.0, 2.0, 96, dtype="float32")[:, None, None, None]
    taken = []
    real_due = instrument.Instrumentation.due

    def due(self):
        out = real_due(self)
        taken.extend(out)
        return out

    monkeypatch.setattr(instrument.Instrumentation, "due", due)
    scales = []
    for limit in (2**31 - 1, 20_000):
        monkeypatch.setattr(instrument, "_ACC_LIMIT", limit)
        path = tmp_path / f"r{limit}.txt"
        model = sequential_model()
        cb = QuantCalibration(path, algorithm="hfmg")
        model.predict(x, batch_size=8, verbose=0, callbacks=[cb])
        scales.append({k: (v.scale_d, v.offset_d) for k, v in load(path).layers.items()})
        if limit == 2**31 - 1:
            assert taken == []
    assert taken  # the small limit made the host take early
    for key, (scale, offset) in scales[0].items():
        assert scales[1][key][0] == pytest.approx(scale, rel=1e-9) and scales[1][key][1] == offset


def test_steps_per_execution_past_batch_num_with_histograms(tmp_path):
    """steps_per_execution 3 runs past batch_num 4 inside one execution: the steps past it are
    neither binned nor kept, so the record equals the one from one step per execution."""
    x = images(64, seed=6) * np.linspace(1.0, 3.0, 64, dtype="float32")[:, None, None, None]
    records = []
    for spe in (1, 3):
        model = sequential_model()
        model.compile(loss="mse", steps_per_execution=spe)
        path = tmp_path / f"r{spe}.txt"
        cb = QuantCalibration(path, algorithm="hfmg", batch_num=4)
        model.evaluate(x, np.zeros((64, 5)), batch_size=8, verbose=0, callbacks=[cb])
        assert load_stats(sidecar_path(path)).batches == 4
        records.append(load(path).layers)
    assert records[0] == records[1]


@pytest.mark.parametrize("algorithm", ["minmax", "hfmg"])
def test_run_eagerly_gives_the_compiled_record(tmp_path, algorithm):
    """run_eagerly=True: the same summaries run op by op, the record is the compiled one's."""
    x = images(32, seed=8)
    records = []
    for eager in (False, True):
        model = sequential_model()
        model.compile(loss="mse", run_eagerly=eager)
        path = tmp_path / f"r{eager}.txt"
        model.predict(
            x, batch_size=8, verbose=0, callbacks=[QuantCalibration(path, algorithm=algorithm)]
        )
        records.append(load(path).layers)
    assert records[0] == records[1]
