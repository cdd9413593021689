"""Cost of QuantCalibration: fit time with / without the callback, and calibration throughput.

Run: ``.venv/bin/python benchmarks/bench_keras_callback.py [--quick]``. Prints, per algorithm,
fit time with the callback divided by fit time without it (same model, data and epochs, measured
in this run; targets <= 1.10 for minmax/ema, <= 1.30 for hfmg/ifmr) and the samples per second of
an ``evaluate``-based calibration next to a plain ``evaluate``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from amct_bridge.keras import QuantCalibration  # noqa: E402

ALGORITHMS = ("minmax", "ema", "percentile", "hfmg", "ifmr")
TARGETS = {"minmax": 1.10, "ema": 1.10, "hfmg": 1.30, "ifmr": 1.30}


def make_model() -> keras.Model:
    """A small MobileNet-like CNN: conv/BN/ReLU blocks, depthwise, pooling, dense head."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((32, 32, 3))
    x = inp
    for i, filters in enumerate((16, 32, 64)):
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"c{i}")(x)
        x = keras.layers.BatchNormalization(name=f"bn{i}")(x)
        x = keras.layers.ReLU(6.0, name=f"r{i}")(x)
        x = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False, name=f"dw{i}")(x)
        x = keras.layers.BatchNormalization(name=f"dbn{i}")(x)
        x = keras.layers.ReLU(6.0, name=f"dr{i}")(x)
        x = keras.layers.AveragePooling2D(2, name=f"ap{i}")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(10, name="fc")(x)
    model = keras.Model(inp, x, name="bench")
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True))
    return model


def timed_fit(x, y, epochs: int, callbacks: list) -> float:
    model = make_model()
    start = time.perf_counter()
    model.fit(x, y, batch_size=32, epochs=epochs, verbose=0, callbacks=callbacks)
    return time.perf_counter() - start


def timed_evaluate(x, y, callbacks: list) -> float:
    model = make_model()
    model.evaluate(x[:32], y[:32], verbose=0)  # build + trace the plain step once
    start = time.perf_counter()
    model.evaluate(x, y, batch_size=32, verbose=0, callbacks=callbacks)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples and epochs")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    args = parser.parse_args()
    n, epochs = (640, 2) if args.quick else (2560, 3)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (n, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, n)
    out = tempfile.mkdtemp()
    algorithms = args.algorithms.split(",")
    print(f"fit: {n} samples x {epochs} epochs, batch 32; evaluate: {n} samples")
    timed_fit(x[:64], y[:64], 1, [])  # warm up TF
    base_fit = timed_fit(x, y, epochs, [])
    base_eval = timed_evaluate(x, y, [])
    print(f"{'algorithm':<11} {'fit ratio':>9} {'target':>7} {'eval samples/s':>15} {'plain':>8}")
    for algo in algorithms:
        cb = QuantCalibration(os.path.join(out, f"{algo}.txt"), algorithm=algo)
        ratio = timed_fit(x, y, epochs, [cb]) / base_fit
        cb = QuantCalibration(os.path.join(out, f"{algo}-eval.txt"), algorithm=algo)
        rate = n / timed_evaluate(x, y, [cb])
        target = TARGETS.get(algo)
        mark = "" if target is None else ("ok" if ratio <= target else "SLOW")
        print(
            f"{algo:<11} {ratio:>9.3f} {target or '-':>7} {rate:>15.0f} "
            f"{n / base_eval:>8.0f} {mark}"
        )


if __name__ == "__main__":
    main()
