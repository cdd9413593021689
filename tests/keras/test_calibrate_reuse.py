"""calibrate() keeps its traced observed step for the next call on the same model and plan.

The kept step must give exactly what a fresh one gives: the pinned records and sidecars of
tests/data/calibration_pins (written before the step was kept; compared as test_keras_pins
does, floats within pin_compare.RTOL since TensorFlow's kernels differ between CPUs, and a
second call on the same machine byte for byte equal to the first), weights changed between calls
(against a fresh model with those weights), another plan (a new step), and nothing kept alive
once the model is gone.
"""

from __future__ import annotations

import gc
import importlib
import sys
import threading
import weakref
from pathlib import Path

import keras
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "calibration"))
from pin_compare import pin_differences  # noqa: E402
from pin_models import CASES, PINS, _data  # noqa: E402

from amct_bridge.keras import calibrate  # noqa: E402
from amct_bridge.records.calibration import sidecar_path  # noqa: E402

session = importlib.import_module("amct_bridge.keras.session")


def _outputs(path: Path) -> tuple[bytes, bytes]:
    return path.read_bytes(), sidecar_path(path).read_bytes()


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_kept_step_gives_the_pinned_outputs_again(case, tmp_path):
    factory, seed, options = CASES[case]
    model = factory()
    x = _data(model.input_shape[1:], seed)
    first = tmp_path / f"{case}.record.txt"
    calibrate(model, x, first, batch_size=8, **options)
    kept = session._KEPT[model].latest
    assert kept.fn is not None and kept.inst.model is None  # kept, without the model
    again = tmp_path / "again" / f"{case}.record.txt"
    again.parent.mkdir()
    calibrate(model, x, again, batch_size=8, **options)
    assert session._KEPT[model].latest.fn is kept.fn  # not traced again
    # same process, same kernels: the kept step gives the first call's bytes
    assert _outputs(again) == _outputs(first)
    differences = pin_differences(PINS, first, sidecar_path(first))
    assert not differences, "\n".join(differences[:40])


def _branchy_with(weights):
    factory, seed, _ = CASES["branchy"]
    model = factory()
    if weights is not None:
        model.set_weights(weights)
    return model, _data(model.input_shape[1:], seed)


def test_weights_changed_between_calls_are_seen(tmp_path):
    model, x = _branchy_with(None)
    options = {"algorithm": "hfmg", "algorithm_options": {"num_of_bins": 1024}}
    calibrate(model, x, tmp_path / "a.txt", **options)
    fn = session._KEPT[model].latest.fn
    scaled = [w * 1.5 for w in model.get_weights()]
    model.set_weights(scaled)
    calibrate(model, x, tmp_path / "b.txt", **options)
    assert session._KEPT[model].latest.fn is fn
    fresh, _ = _branchy_with(scaled)
    calibrate(fresh, x, tmp_path / "c.txt", **options)
    assert _outputs(tmp_path / "b.txt") == _outputs(tmp_path / "c.txt")
    assert _outputs(tmp_path / "a.txt") != _outputs(tmp_path / "b.txt")


def test_another_plan_traces_a_new_step_and_keep_step_false_drops_it(tmp_path):
    model, x = _branchy_with(None)
    calibrate(model, x, tmp_path / "a.txt", algorithm="minmax")
    fn = session._KEPT[model].latest.fn
    # histograms: other observed tensors (skip_layers alone would not change them: a skipped
    # layer keeps its sidecar ranges)
    calibrate(model, x, tmp_path / "b.txt", algorithm="hfmg", skip_layers=["fc"])
    assert session._KEPT[model].latest.fn is not fn
    assert [kept.fn for kept in session._KEPT[model]][0] is fn  # the minmax step stays kept
    fresh, _ = _branchy_with(model.get_weights())
    calibrate(fresh, x, tmp_path / "c.txt", algorithm="hfmg", skip_layers=["fc"])
    assert _outputs(tmp_path / "b.txt") == _outputs(tmp_path / "c.txt")
    calibrate(model, x, tmp_path / "d.txt", algorithm="minmax", keep_step=False)
    assert model not in session._KEPT
    assert _outputs(tmp_path / "d.txt") == _outputs(tmp_path / "a.txt")


def test_nothing_is_kept_once_the_model_is_gone(tmp_path):
    model, x = _branchy_with(None)
    calibrate(model, x, tmp_path / "a.txt", algorithm="ifmr")
    assert model in session._KEPT
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None  # the kept step held neither the model nor a closure over it


def test_a_nan_batch_then_a_clean_call_on_the_kept_step(tmp_path):
    """A run that stopped on a NaN leaves a kept step whose next run starts from zero."""
    from amct_bridge.errors import CalibrationError

    model, x = _branchy_with(None)
    calibrate(model, x, tmp_path / "a.txt", algorithm="minmax")
    bad = x.copy()
    bad[20, 1, 1, 1] = np.nan
    with pytest.raises(CalibrationError, match="batch 2 contains NaN"):
        calibrate(model, bad, tmp_path / "b.txt", algorithm="minmax", batch_size=8)
    calibrate(model, x, tmp_path / "c.txt", algorithm="minmax")
    assert _outputs(tmp_path / "c.txt") == _outputs(tmp_path / "a.txt")


def test_two_threads_on_one_model_never_share_a_step(tmp_path):
    model, x = _branchy_with(None)
    calibrate(model, x, tmp_path / "ref.txt", algorithm="minmax")
    errors = []

    def run(i):
        try:
            for k in range(3):
                calibrate(model, x, tmp_path / f"t{i}_{k}.txt", algorithm="minmax")
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ref = _outputs(tmp_path / "ref.txt")
    assert all(_outputs(tmp_path / f"t{i}_{k}.txt") == ref for i in range(2) for k in range(3))
    keras.backend.clear_session()
