"""Cost of QuantCalibration: fit time with / without the callback, and calibration throughput.

Run: ``.venv/bin/python benchmarks/bench_keras_callback.py [--quick]``. Prints, per algorithm,
fit time with the callback divided by fit time without it (same model, data and epochs, measured
back to back in this run; targets <= 1.10 for minmax/ema, <= 1.30 for hfmg/ifmr), the same ratio
for the last epoch alone (steady state: no tracing, no end-of-run search) and the samples per
second of an ``evaluate``-based calibration (re-trace of the instrumented step and the end-of-run
clip search included) next to a plain ``evaluate``. Three models: ``light`` (depthwise blocks:
many activations per FLOP, the worst case), ``conv`` (plain 3x3 convolutions) and ``mobilenet``
(keras.applications MobileNetV2, alpha 0.35, 96x96: a real network).

Fits and evaluations read a ``tf.data`` pipeline built once with tf.data's autotuning off. With
NumPy input, Keras makes a new autotuned iterator every epoch, and dropping it can block the
main thread for ~1.2 s until the autotune thread's current wait ends (seen with gdb: the wait is
in ``RootDataset::Iterator``'s destructor). Whether that happens depends on the epoch's length:
a plain fit of ``conv`` with an 8 ms sleep per batch stalled in 2 of 6 runs, and calibrated
epochs of ~1.3 s were hit often; one stall in a 3-epoch fit of ~3.5 s moves its ratio by 0.35.

``--stock-ops`` adds a column: the same calibrated fit with the native summary op turned off
(``AMCT_BRIDGE_NATIVE_OPS=0``: stock TF reductions and ``tf.histogram_fixed_width``), so the
op's gain is measured against a baseline in the same run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from amct_bridge.keras import QuantCalibration, native  # noqa: E402

ALGORITHMS = ("minmax", "ema", "percentile", "hfmg", "ifmr")
TARGETS = {"minmax": 1.10, "ema": 1.10, "hfmg": 1.30, "ifmr": 1.30}


#: Input size per model (the tiny models use 32x32, MobileNetV2 a small but real 96x96).
SIZES = {"light": 32, "conv": 32, "mobilenet": 96}


def make_model(kind: str = "light") -> keras.Model:
    """``light``: MobileNet-like blocks (conv/BN/ReLU6, depthwise), many activations per FLOP,
    the worst case for per-tensor statistics. ``conv``: VGG-like 3x3 convolutions.
    ``mobilenet``: keras.applications MobileNetV2 (alpha 0.35, 96x96, weights=None): a real
    network (52 convolutions, ~100 observed tensors)."""
    keras.utils.set_random_seed(0)
    if kind == "mobilenet":
        model = keras.applications.MobileNetV2(
            input_shape=(96, 96, 3), alpha=0.35, weights=None, classes=10
        )
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy())
        return model
    inp = keras.Input((32, 32, 3))
    x = inp
    for i, filters in enumerate((16, 32, 64)):
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"c{i}")(x)
        x = keras.layers.BatchNormalization(name=f"bn{i}")(x)
        x = keras.layers.ReLU(6.0, name=f"r{i}")(x)
        if kind == "light":
            x = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False, name=f"dw{i}")(x)
            x = keras.layers.BatchNormalization(name=f"dbn{i}")(x)
            x = keras.layers.ReLU(6.0, name=f"dr{i}")(x)
        else:
            x = keras.layers.Conv2D(2 * filters, 3, padding="same", name=f"cc{i}")(x)
            x = keras.layers.ReLU(name=f"cr{i}")(x)
        x = keras.layers.AveragePooling2D(2, name=f"ap{i}")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(10, name="fc")(x)
    model = keras.Model(inp, x, name="bench")
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True))
    return model


class EpochTimes(keras.callbacks.Callback):
    """Wall time of each epoch (the last one shows the steady state, without tracing)."""

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times = [*getattr(self, "times", []), time.perf_counter() - self.start]


def batches(x, y) -> tf.data.Dataset:
    """Batches of 32 without tf.data autotuning (see the module docstring)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(32).with_options(options)


def timed_fit(kind: str, x, y, epochs: int, callbacks: list) -> tuple[float, float]:
    """(whole fit incl. tracing and the callback's end-of-run work, last epoch) in seconds."""
    model = make_model(kind)
    epochs_cb = EpochTimes()
    data = batches(x, y)
    start = time.perf_counter()
    model.fit(data, epochs=epochs, verbose=0, callbacks=[epochs_cb, *callbacks])
    return time.perf_counter() - start, epochs_cb.times[-1]


def stock_ops(on: bool) -> None:
    """Turn the native summary op off (stock TF ops) or back on for the next runs."""
    if on:
        os.environ["AMCT_BRIDGE_NATIVE_OPS"] = "0"
    else:
        os.environ.pop("AMCT_BRIDGE_NATIVE_OPS", None)
    native.reset()


def timed_evaluate(kind: str, x, y, callbacks: list) -> float:
    model = make_model(kind)
    model.evaluate(batches(x[:32], y[:32]), verbose=0)  # build + trace the plain step once
    data = batches(x, y)
    start = time.perf_counter()
    model.evaluate(data, verbose=0, callbacks=callbacks)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples and epochs")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--models", default="light,conv,mobilenet", help="light, conv, mobilenet")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing (best is kept)")
    parser.add_argument("--samples", type=int, help="training samples (default 1280)")
    parser.add_argument(
        "--epochs",
        type=int,
        help="epochs per fit (default 3); longer fits amortise tracing and the search",
    )
    parser.add_argument(
        "--stock-ops",
        action="store_true",
        help="also time each calibrated fit with the native summary op turned off",
    )
    args = parser.parse_args()
    n, epochs = (640, 2) if args.quick else (1280, 3)
    n, epochs = args.samples or n, args.epochs or epochs
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, n)
    out = tempfile.mkdtemp()
    algorithms = args.algorithms.split(",")
    print(f"fit: {n} samples x {epochs} epochs, batch 32; evaluate: {n} samples (after a warm-up)")
    print(f"native summary op: {'built' if native.load() is not None else 'NOT available'}")
    for kind in args.models.split(","):
        size = SIZES[kind]
        x = rng.uniform(0, 1, (n, size, size, 3)).astype("float32")
        timed_fit(kind, x[:64], y[:64], 1, [])  # warm up TF for this model
        base_eval = timed_evaluate(kind, x, y, [])
        print(f"\nmodel {kind!r}: plain evaluate {n / base_eval:.0f} samples/s")
        print(
            f"{'algorithm':<11} {'fit ratio':>9} {'last epoch':>10} {'target':>7} "
            f"{'calibrating evaluate':>21}" + ("  stock-op fit ratio" if args.stock_ops else "")
        )
        for algo in algorithms:
            # plain and calibrated fits back to back (so load changes hit both alike), best of
            # --repeat runs each: the machine may be shared
            base, calib, stock = [], [], []
            for _ in range(args.repeat):
                base.append(timed_fit(kind, x, y, epochs, []))
                cb = QuantCalibration(os.path.join(out, f"{algo}.txt"), algorithm=algo)
                calib.append(timed_fit(kind, x, y, epochs, [cb]))
                if args.stock_ops:
                    stock_ops(True)
                    cb = QuantCalibration(os.path.join(out, f"{algo}-stock.txt"), algorithm=algo)
                    stock.append(timed_fit(kind, x, y, epochs, [cb]))
                    stock_ops(False)
            base_total, base_epoch = min(t for t, _ in base), min(e for _, e in base)
            total, epoch = min(t for t, _ in calib), min(e for _, e in calib)
            cb = QuantCalibration(os.path.join(out, f"{algo}-eval.txt"), algorithm=algo)
            rate = n / timed_evaluate(kind, x, y, [cb])
            ratio, target = total / base_total, TARGETS.get(algo)
            mark = "" if target is None else ("ok" if ratio <= target else "over")
            print(
                f"{algo:<11} {ratio:>9.3f} {epoch / base_epoch:>10.3f} {target or '-':>7} "
                f"{rate:>12.0f} samples/s {mark:<4}"
                + (f" {min(t for t, _ in stock) / base_total:>9.3f}" if stock else "")
            )


if __name__ == "__main__":
    main()
