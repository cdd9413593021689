"""The digits CNN that test_v3_search_keras.py and test_v3_mixed_precision.py share: Conv+BN+ReLU
(``c1``), MaxPool, Conv+ReLU (``c2``), GAP, ``Dense(activation="softmax")`` (``head``), trained on
1400 of scikit-learn's 8x8 digits in [0, 1] and calibrated on 256 of them; 397 held out."""

from __future__ import annotations

import shutil
from pathlib import Path

import keras
import numpy as np
from sklearn.datasets import load_digits

from amct_bridge.keras import calibrate

L = keras.layers


def digits(size: int = 8, channels: int = 1):
    """scikit-learn's digits in [0, 1] upscaled to ``size`` (nearest), ``channels`` copies;
    ``(x, y, train, test)`` with a seeded 1400 / 397 split. Also benchmarks/
    bench_espdl_v3_search.py's data."""
    data = load_digits()
    x = np.kron(data.images / 16.0, np.ones((size // 8, size // 8)))[..., None]
    x = np.repeat(x, channels, axis=-1).astype("float32")
    idx = np.random.default_rng(0).permutation(len(x))
    return x, data.target, idx[:1400], idx[1400:]


def digits_cnn() -> keras.Model:
    """The untrained net (seed first for repeatable weights); also the benchmark's "digits CNN"."""
    inp = keras.Input((8, 8, 1))
    h = L.Conv2D(16, 3, padding="same", name="c1")(inp)
    h = L.ReLU(name="r1")(L.BatchNormalization(name="bn1")(h))
    h = L.MaxPooling2D(name="mp")(h)
    h = L.Conv2D(32, 3, padding="same", activation="relu", name="c2")(h)
    h = L.GlobalAveragePooling2D(name="gap")(h)
    return keras.Model(inp, L.Dense(10, activation="softmax", name="head")(h))


def _train(folder: Path) -> None:
    """Train, calibrate and save into ``folder``: ``model.keras``, ``record.txt`` (+ sidecar)."""
    x, y, train, _ = digits()
    keras.utils.set_random_seed(0)
    model = digits_cnn()
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(x[train], y[train], epochs=30, batch_size=32, verbose=0)
    calibrate(model, x[train[:256]], folder / "record.txt")
    model.save(folder / "model.keras")


def trained_digits_cnn(tmp: Path, once) -> dict:
    """The trained model, its record in ``tmp``, 512 calibration digits (``calib``, with the
    float arg max ``float_calib``), the held-out digits ``x`` / ``y`` and their float arg max
    ``float``. Trained once per test session (the ``once`` fixture of tests/conftest.py); each
    caller gets its own copy of the model and of the record."""
    folder = once("digits_cnn", _train)
    for name in ("record.txt", "record.txt.calib.json"):
        shutil.copyfile(folder / name, tmp / name)
    model = keras.models.load_model(folder / "model.keras")
    x, y, train, test = digits()
    calib = x[train[:512]]
    return {
        "model": model,
        "record": tmp / "record.txt",
        "calib": calib,
        "float_calib": model.predict(calib, verbose=0).argmax(-1),
        "x": x[test],
        "y": y[test],
        "float": model.predict(x[test], verbose=0).argmax(-1),
        "tmp": tmp,
    }
