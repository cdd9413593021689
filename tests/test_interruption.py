"""Interruption at every write point: the previous outputs stay whole, no temp file is left.

Failures are injected into the lowest-level calls our writers make (``os.fsync`` of a temp file:
its data is written but not yet renamed; ``os.replace``/``os.rename``: the commit), with both an
``OSError`` (disk full) and ``KeyboardInterrupt`` (Ctrl-C lands in the longest call, the write).
A write of several files that belong together (record + sidecar + frozen graph, the C++ files
of convert.py) is interrupted at each of its files: all of them must still be the previous ones.
Then the same inside ``model.fit``: a later callback raising at epoch end / train end, and
KeyboardInterrupt between epochs or during our epoch-end write.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import keras
import numpy as np
import pytest

from amct_bridge.calibration.records import Built
from amct_bridge.calibration.records import write_outputs as write_calibration
from amct_bridge.espdl.v1.cpp_coefficients import write_files
from amct_bridge.espdl.writer import write_directory
from amct_bridge.keras import QuantCalibration, export_espdl, freeze_model
from amct_bridge.keras.qat import quantize_aware, save_qat_record
from amct_bridge.records import LayerFactors, Record, dumps, load, save, validate
from amct_bridge.records.calibration import (
    CalibrationStats,
    LayerStats,
    TensorRange,
    load_stats,
    save_stats,
    sidecar_path,
)

FAILURES = [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()]
FAIL_IDS = ["ENOSPC", "KeyboardInterrupt"]


def fail_on(monkeypatch, name: str, nth: int, exc: BaseException) -> list[int]:
    """Make the ``nth`` call (1-based) of ``os.<name>`` raise ``exc``; the others run as usual."""
    real, calls = getattr(os, name), [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == nth:
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, wrapper)
    return calls


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (relative path -> bytes); temp files included."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def entries(directory: Path) -> list[str]:
    """Every name under ``directory``, files and folders (a leftover temp dir shows here)."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def record(scale: float) -> Record:
    return Record(
        {"c1": LayerFactors(scale_d=scale, offset_d=-3, scale_w=[0.01, 0.02], offset_w=[0, 0])}
    )


def stats(hi: float) -> CalibrationStats:
    r = TensorRange(-1.0, hi, -1.5, hi + 1.0)
    return CalibrationStats("minmax", 3, {"c1": LayerStats("Conv2D", input=r, output=r)})


# ------------------------------------------------------------------ single-file write points


def _write_record(path: Path, version: int) -> None:
    save(record(0.5 * version), path)


def _write_binary_record(path: Path, version: int) -> None:
    save(record(0.5 * version), path, binary=True)


def _write_sidecar(path: Path, version: int) -> None:
    save_stats(stats(float(version)), path)


_FROZEN = {}


def _write_frozen_graph(path: Path, version: int) -> None:
    if version not in _FROZEN:
        x = keras.Input((4,))
        model = keras.Model(x, keras.layers.Dense(2 + version, name="fc")(x))
        _FROZEN[version] = freeze_model(model)
    _FROZEN[version].save(path)


WRITERS = {
    "record": _write_record,
    "binary_record": _write_binary_record,
    "sidecar": _write_sidecar,
    "frozen_graph": _write_frozen_graph,
}


@pytest.mark.parametrize("exc", FAILURES, ids=FAIL_IDS)
@pytest.mark.parametrize("call", ["fsync", "replace"])
@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_single_file_write_point_keeps_previous(tmp_path, monkeypatch, kind, call, exc):
    path = tmp_path / "out.bin"
    WRITERS[kind](path, 1)
    before = snapshot(tmp_path)
    WRITERS[kind](tmp_path / "new.bin", 2)  # the new content really differs
    assert (tmp_path / "new.bin").read_bytes() != before["out.bin"]
    (tmp_path / "new.bin").unlink()
    calls = fail_on(monkeypatch, call, 1, exc)
    with pytest.raises(type(exc)):
        WRITERS[kind](path, 2)
    assert calls[0] == 1
    assert snapshot(tmp_path) == before  # old bytes, and no temp file beside them


@pytest.mark.parametrize("exc", FAILURES, ids=FAIL_IDS)
@pytest.mark.parametrize("nth", [1, 2], ids=["during-record", "during-sidecar"])
def test_qat_record_write_keeps_previous(tmp_path, monkeypatch, nth, exc):
    """save_qat_record writes the QAT record and its sidecar: both stay the previous ones."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, name="fc")], name="m")
    qat = quantize_aware(model, "INT8")
    qat.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x = np.random.default_rng(0).normal(size=(32, 5)).astype("float32")
    qat.fit(x, np.zeros((32, 3)), batch_size=16, epochs=1, verbose=0)
    path = tmp_path / "qat_record.txt"
    save(record(0.25), path)
    save_stats(stats(0.5), sidecar_path(path))
    before = snapshot(tmp_path)
    fail_on(monkeypatch, "fsync", nth, exc)
    with pytest.raises(type(exc)):
        save_qat_record(qat, path)
    assert snapshot(tmp_path) == before
    monkeypatch.undo()
    written = save_qat_record(qat, path)  # and the same call without a failure does write
    assert load(path).layers.keys() == written.layers.keys() == {"fc"}
    assert snapshot(tmp_path).keys() == before.keys()


# ------------------------------------------------------------------ files written together


def _calibration_outputs(tmp_path: Path, version: int) -> Built:
    rec = record(0.5 * version)
    built = Built(rec, dumps(rec), stats(float(version)))
    built.extra[tmp_path / "frozen.pb"] = b"graph version %d" % version
    return built


@pytest.mark.parametrize("exc", FAILURES, ids=FAIL_IDS)
@pytest.mark.parametrize("nth", [1, 2, 3])
def test_record_sidecar_graph_written_together(tmp_path, monkeypatch, nth, exc):
    """The calibration's three outputs: a failure while writing any of them leaves all three
    as they were (a new record beside the old sidecar would pair ranges of another run)."""
    path = tmp_path / "record.txt"
    write_calibration(_calibration_outputs(tmp_path, 1), path)
    before = snapshot(tmp_path)
    assert sorted(before) == ["frozen.pb", "record.txt", "record.txt.calib.json"]
    fail_on(monkeypatch, "fsync", nth, exc)
    with pytest.raises(type(exc)):
        write_calibration(_calibration_outputs(tmp_path, 2), path)
    assert snapshot(tmp_path) == before
    monkeypatch.undo()
    write_calibration(_calibration_outputs(tmp_path, 2), path)
    assert load(path).layers["c1"].scale_d == pytest.approx(1.0)
    assert load_stats(sidecar_path(path)).layers["c1"].input.max == 2.0


@pytest.mark.parametrize("exc", FAILURES, ids=FAIL_IDS)
def test_record_sidecar_commit_failure_keeps_all(tmp_path, monkeypatch, exc):
    """A failing first rename (the commit of the set) also leaves every previous file."""
    path = tmp_path / "record.txt"
    write_calibration(_calibration_outputs(tmp_path, 1), path)
    before = snapshot(tmp_path)
    fail_on(monkeypatch, "replace", 1, exc)
    with pytest.raises(type(exc)):
        write_calibration(_calibration_outputs(tmp_path, 2), path)
    assert snapshot(tmp_path) == before


def _cpp_files(version: int) -> dict[str, bytes]:
    return {
        "m_coefficient.cpp": b"// coefficients v%d\n" % version,
        "m_coefficient.hpp": b"// declarations v%d\n" % version,
        "m_model.hpp": b"// model class v%d\n" % version,
        "app_main.cpp": b"// app v%d\n" % version,
    }


@pytest.mark.parametrize("exc", FAILURES, ids=FAIL_IDS)
@pytest.mark.parametrize("nth", [1, 2, 4])
def test_cpp_files_written_together(tmp_path, monkeypatch, nth, exc):
    """convert.py's .cpp/.hpp (+ model class, app): all old or all new, never a header that
    declares what the .cpp beside it does not define."""
    out = tmp_path / "main"
    write_files(out, _cpp_files(1))
    (out / "CMakeLists.txt").write_bytes(b"other files are left alone\n")
    before = snapshot(tmp_path)
    fail_on(monkeypatch, "fsync", nth, exc)
    with pytest.raises(type(exc)):
        write_files(out, _cpp_files(2))
    assert snapshot(tmp_path) == before
    monkeypatch.undo()
    write_files(out, _cpp_files(2))
    assert snapshot(out) == {**_cpp_files(2), "CMakeLists.txt": b"other files are left alone\n"}


# ------------------------------------------------------------------ export directory


def _export_files(version: int) -> dict[str, bytes]:
    return {f"layer{i}.npy": b"v%d layer %d" % (version, i) for i in range(4)} | {
        "config.json": b'{"version": %d}' % version
    }


@pytest.mark.parametrize("exc", FAILURES, ids=FAIL_IDS)
@pytest.mark.parametrize(
    "call,nth",
    [("fsync", 1), ("fsync", 3), ("replace", 5), ("rename", 1), ("rename", 2)],
    ids=["first-file", "third-file", "last-file-rename", "move-old-away", "move-new-in"],
)
def test_export_directory_keeps_previous(tmp_path, monkeypatch, call, nth, exc):
    """rename 1 moves the previous export aside, rename 2 moves the new one in: a failure
    at the second puts the previous one back."""
    out = tmp_path / "model_espdl"
    write_directory(out, _export_files(1))
    before = entries(tmp_path), snapshot(tmp_path)
    calls = fail_on(monkeypatch, call, nth, exc)
    with pytest.raises(type(exc)):
        write_directory(out, _export_files(2), overwrite=True)
    assert calls[0] >= nth  # the rollback renames too
    assert (entries(tmp_path), snapshot(tmp_path)) == before
    monkeypatch.undo()
    write_directory(out, _export_files(2), overwrite=True)
    assert snapshot(out) == _export_files(2) and entries(tmp_path)[0] == "model_espdl"


@pytest.mark.parametrize("exc", FAILURES, ids=FAIL_IDS)
def test_keras_export_espdl_with_cpp_keeps_previous(tmp_path, monkeypatch, exc):
    """The real exporter (config.json, npy, export.json, C++ files) through the same path."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="fc")], name="m")
    r1, r2 = TensorRange(-1.0, 1.0), TensorRange(-8.0, 8.0)
    out = tmp_path / "espdl"
    st1 = CalibrationStats(layers={"fc": LayerStats("Dense", input=r1, output=r1)})
    st2 = CalibrationStats(layers={"fc": LayerStats("Dense", input=r2, output=r2)})
    export_espdl(model, None, out, stats=st1, cpp="m_coefficient")
    before = entries(tmp_path), snapshot(tmp_path)
    assert {"espdl/config.json", "espdl/m_coefficient.cpp", "espdl/m_coefficient.hpp"} <= set(
        before[1]
    )
    fail_on(monkeypatch, "fsync", 3, exc)
    with pytest.raises(type(exc)):
        export_espdl(model, None, out, stats=st2, cpp="m_coefficient", overwrite=True)
    assert (entries(tmp_path), snapshot(tmp_path)) == before
    monkeypatch.undo()
    export_espdl(model, None, out, stats=st2, cpp="m_coefficient", overwrite=True)
    assert snapshot(out) != before[1] and entries(tmp_path)[0] == "espdl"


# ------------------------------------------------------------------ inside model.fit


def _fit_setup(tmp_path: Path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((6,))
    x = keras.layers.Dense(8, activation="relu", name="fc1")(inp)
    model = keras.Model(inp, keras.layers.Dense(2, name="fc2")(x), name="tiny")
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    rng = np.random.default_rng(0)
    # each epoch sees wider data, so each epoch's record differs from the one before
    x = rng.normal(size=(32, 6)).astype("float32")
    path = tmp_path / "record.txt"
    save(record(0.125), path)  # a previous run's record
    save_stats(stats(0.5), sidecar_path(path))
    return model, x, path


def _data(x: np.ndarray, epochs: int):
    def gen():
        for epoch in range(epochs):
            for i in range(0, len(x), 8):
                yield x[i : i + 8] * (1 + epoch), np.zeros((8, 2), "float32")

    return gen()


class _Spy(keras.callbacks.Callback):
    """Copies the record and sidecar after each epoch end (it runs after QuantCalibration)."""

    def __init__(self, path: Path):
        super().__init__()
        self.path, self.seen = path, []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append((self.path.read_bytes(), sidecar_path(self.path).read_bytes()))


class _Raise(keras.callbacks.Callback):
    def __init__(self, hook: str, epoch: int, exc: BaseException):
        super().__init__()
        self.hook, self.epoch, self.exc = hook, epoch, exc

    def on_epoch_begin(self, epoch, logs=None):
        if self.hook == "epoch_begin" and epoch == self.epoch:
            raise self.exc

    def on_epoch_end(self, epoch, logs=None):
        if self.hook == "epoch_end" and epoch == self.epoch:
            raise self.exc

    def on_train_end(self, logs=None):
        if self.hook == "train_end":
            raise self.exc


def _outputs(path: Path) -> tuple[bytes, bytes]:
    return path.read_bytes(), sidecar_path(path).read_bytes()


def _check_complete(path: Path) -> None:
    rec = load(path)
    assert set(rec.layers) == {"fc1", "fc2"} and validate(rec) == []
    assert set(load_stats(sidecar_path(path)).layers) == {"fc1", "fc2"}


@pytest.mark.parametrize(
    "hook,epoch,exc",
    [
        ("epoch_end", 1, RuntimeError("later callback failed")),
        ("epoch_begin", 2, KeyboardInterrupt()),
        ("train_end", 0, RuntimeError("later callback failed")),
    ],
    ids=["later-callback-epoch-end", "ctrl-c-between-epochs", "later-callback-train-end"],
)
def test_fit_interrupted_leaves_a_complete_record(tmp_path, hook, epoch, exc):
    """Ours runs first at each hook; whatever raises after it, the record on disk is the last
    complete one ours wrote, with its own sidecar; the instrumentation can be removed."""
    model, x, path = _fit_setup(tmp_path)
    ours = QuantCalibration(path, algorithm="minmax", save_every_epoch=True)
    spy = _Spy(path)
    epochs = 3
    with pytest.raises(type(exc)):
        model.fit(
            _data(x, epochs),
            steps_per_epoch=4,
            epochs=epochs,
            verbose=0,
            shuffle=False,
            callbacks=[ours, spy, _Raise(hook, epoch, exc)],
        )
    ours.restore()
    assert "call" not in vars(model.get_layer("fc1"))  # instrumentation removed
    expected = {"epoch_end": 1, "epoch_begin": 1, "train_end": 2}[hook]
    assert len(spy.seen) == expected + 1
    assert len({s[0] for s in spy.seen}) == len(spy.seen)  # each epoch's record differs
    if hook == "train_end":  # the record written at train end holds the same statistics
        assert load(path).layers == load_from_bytes(tmp_path, spy.seen[-1][0]).layers
    else:
        assert _outputs(path) == spy.seen[expected]
    _check_complete(path)
    assert sorted(os.listdir(tmp_path)) == ["record.txt", "record.txt.calib.json"]


def load_from_bytes(tmp_path: Path, data: bytes) -> Record:
    other = tmp_path.parent / f"{tmp_path.name}_copy.txt"
    other.write_bytes(data)
    try:
        return load(other)
    finally:
        other.unlink()


@pytest.mark.parametrize("nth", [3, 4], ids=["during-record", "during-sidecar"])
def test_ctrl_c_during_the_epoch_end_write(tmp_path, monkeypatch, nth):
    """KeyboardInterrupt inside our epoch-1 write (fsync 1-2 are epoch 0's record and
    sidecar, 3-4 epoch 1's): record and sidecar stay epoch 0's, the model is restored."""
    model, x, path = _fit_setup(tmp_path)
    ours = QuantCalibration(path, algorithm="minmax", save_every_epoch=True)
    spy = _Spy(path)
    fail_on(monkeypatch, "fsync", nth, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        model.fit(
            _data(x, 3),
            steps_per_epoch=4,
            epochs=3,
            verbose=0,
            callbacks=[ours, spy],
            shuffle=False,
        )
    monkeypatch.undo()
    assert "call" not in vars(model.get_layer("fc1"))  # our guard removed it
    assert len(spy.seen) == 1 and _outputs(path) == spy.seen[0]
    _check_complete(path)
    assert sorted(os.listdir(tmp_path)) == ["record.txt", "record.txt.calib.json"]
