"""Three seeded Keras models and calibration cases whose outputs are pinned byte for byte.

Run as a script to (re)generate the pinned files in tests/data/calibration_pins/:

    .venv/bin/python tests/calibration/pin_models.py

Weights, BN statistics and data come from numpy generators with fixed seeds (not from Keras
initializers), so the pinned record text and sidecar JSON depend only on the calibration code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

PINS = Path(__file__).resolve().parent.parent / "data" / "calibration_pins"


def _seed_weights(model: keras.Model, seed: int) -> keras.Model:
    """Every weight from one numpy generator: kernels/biases ~U(-0.5, 0.5), BN stats positive."""
    rng = np.random.default_rng(seed)
    for layer in _leaves(model):
        values = []
        for w in layer.weights:
            shape, name = tuple(w.shape), w.path.rsplit("/", 1)[-1]
            if name in ("moving_variance", "gamma"):
                values.append(rng.uniform(0.5, 2.0, shape).astype("float32"))
            else:
                values.append(rng.uniform(-0.5, 0.5, shape).astype("float32"))
        if values:
            layer.set_weights(values)
    return model


def _leaves(model):
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _leaves(layer)
        else:
            yield layer


def cnn() -> keras.Model:
    """Conv+BN+ReLU stem, Conv+BN+ReLU6 (fusion skipped), max pool, Dense head."""
    x = inp = keras.Input((12, 12, 3))
    x = keras.layers.Conv2D(8, 3, use_bias=False, name="c1")(x)
    x = keras.layers.BatchNormalization(name="bn1")(x)
    x = keras.layers.ReLU(name="r1")(x)
    x = keras.layers.Conv2D(8, 3, padding="same", name="c2")(x)
    x = keras.layers.BatchNormalization(name="bn2")(x)
    x = keras.layers.ReLU(6.0, name="r2")(x)
    x = keras.layers.MaxPooling2D(2, name="mp")(x)
    x = keras.layers.Flatten(name="flat")(x)
    x = keras.layers.Dense(5, name="fc")(x)
    return _seed_weights(keras.Model(inp, x, name="pin_cnn"), 11)


def branchy() -> keras.Model:
    """Residual Add, Concatenate, DepthwiseConv2D+BN, SeparableConv2D+BN, avg pools, Dense."""
    inp = keras.Input((10, 10, 4), name="img")
    a = keras.layers.Conv2D(6, 3, padding="same", name="ca")(inp)
    a = keras.layers.ReLU(name="ra")(a)
    b = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False, name="dw")(inp)
    b = keras.layers.BatchNormalization(name="bn_dw")(b)
    b = keras.layers.Conv2D(6, 1, name="pw")(b)
    x = keras.layers.Add(name="add")([a, b])
    x = keras.layers.Concatenate(name="cat")([x, inp])
    x = keras.layers.SeparableConv2D(8, 3, padding="same", name="sep")(x)
    x = keras.layers.BatchNormalization(name="bn_sep")(x)
    x = keras.layers.ReLU(name="rs")(x)
    x = keras.layers.AveragePooling2D(2, name="ap")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    x = keras.layers.Dense(4, name="fc")(x)
    return _seed_weights(keras.Model(inp, x, name="pin_branchy"), 12)


def dmq() -> keras.Model:
    """Conv+BN, Conv2DTranspose, Dense: DMQ balance factors and joint_quant shift bits."""
    x = inp = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(6, 3, padding="same", name="c1")(x)
    x = keras.layers.BatchNormalization(name="bn1")(x)
    x = keras.layers.Activation("relu", name="act")(x)
    x = keras.layers.Conv2DTranspose(4, 3, strides=2, padding="same", name="tr")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    x = keras.layers.Dense(3, name="fc")(x)
    return _seed_weights(keras.Model(inp, x, name="pin_dmq"), 13)


def _data(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.3, 1.0, (40, *shape)).astype("float32")


#: name -> (model factory, data seed, calibrate() options)
CASES = {
    "cnn": (
        cnn,
        21,
        {"algorithm": "ifmr", "batch_num": 3, "skip_fusion_layers": ["c2"]},
    ),
    "cnn_tf": (
        cnn,
        21,
        {"algorithm": "minmax", "flavor": "tf", "keys": "tf_op", "batch_num": 2},
    ),
    "branchy": (
        branchy,
        22,
        {"algorithm": "hfmg", "algorithm_options": {"num_of_bins": 1024}, "batch_num": 3},
    ),
    "dmq": (
        dmq,
        23,
        {
            "algorithm": "minmax",
            "migration_strength": 0.5,
            "joint_quant": True,
            "batch_num": 3,
            "skip_layers": ["fc"],
        },
    ),
}


def run_case(name: str, out_dir: Path, returned: list | None = None) -> tuple[Path, Path]:
    """Calibrate case ``name`` into ``out_dir``; returns (record path, sidecar path).

    ``returned``: a list that gets the Record calibrate() returned."""
    from amct_bridge.keras import calibrate
    from amct_bridge.records.calibration import sidecar_path

    factory, seed, options = CASES[name]
    model = factory()
    record = Path(out_dir) / f"{name}.record.txt"
    rec = calibrate(model, _data(model.input_shape[1:], seed), record, batch_size=8, **options)
    if returned is not None:
        returned.append(rec)
    return record, sidecar_path(record)


if __name__ == "__main__":
    PINS.mkdir(parents=True, exist_ok=True)
    for case in sys.argv[1:] or CASES:
        print(*run_case(case, PINS))
