"""Cost of QuantCalibration: fit time with / without the callback, and calibration throughput.

Run: ``.venv/bin/python benchmarks/bench_keras_callback.py [--quick]``. Prints, per algorithm,
fit time with the callback divided by fit time without it (same model, data and epochs; targets
<= 1.10 for minmax/ema, <= 1.30 for hfmg/ifmr), the same ratio for the last epoch alone (steady
state: no tracing, no end-of-run search) and the samples per second of an ``evaluate``-based
calibration (re-trace of the instrumented step and the end-of-run clip search included) next to
a plain ``evaluate``. Every fit is of a model made just now, so plain and calibrated fits both
trace their step (``--one-model``: all on one model fitted before, so no fit traces after the
first round: the calibrated ones run on the steps kept for their plans). Runs are interleaved
rounds (one plain fit, then one calibrated fit per algorithm, ``--rounds`` times); a ratio is
the median of the per-round ratios, printed with their range: on a shared machine the load moves
between rounds, and each round's plain fit is its baseline. Models: ``light`` (depthwise blocks:
many activations per FLOP, the worst case), ``conv`` (plain 3x3 convolutions), ``mobilenet``
(keras.applications MobileNetV2, alpha 0.35, 96x96: a real network) and ``kws`` (a DS-CNN
keyword-spotting network on 49x10 MFCC-like inputs, Adam: a small CNN whose trace is a large
part of a short fit).

``--first-run`` measures what a *fresh* callback costs in seconds, per round (medians printed):

- a model made just now: plain fit against a fit with a new callback (both trace a step: the
  difference is what the instrumentation adds to the trace, the set-up and the record);
- the same model fitted again with another new callback of the same plan (the kept step: no
  trace);
- a model fitted before: a plain fit (Keras' step is traced already) against a fit with a new
  callback (the instrumented step is traced: the whole trace is extra).

Fits and evaluations read a ``tf.data`` pipeline built once with tf.data's autotuning off. With
NumPy input, Keras makes a new autotuned iterator every epoch, and dropping it can block the
main thread for ~1.2 s until the autotune thread's current wait ends (seen with gdb: the wait is
in ``RootDataset::Iterator``'s destructor). Whether that happens depends on the epoch's length:
a plain fit of ``conv`` with an 8 ms sleep per batch stalled in 2 of 6 runs, and calibrated
epochs of ~1.3 s were hit often; one stall in a 3-epoch fit of ~3.5 s moves its ratio by 0.35.

``--op-speed`` times the native summary op alone against the stock ops (ns per value).

``--stock-ops`` adds a column: the same calibrated fit with the native summary op turned off
(``AMCT_BRIDGE_NATIVE_OPS=0``: stock TF reductions and ``tf.histogram_fixed_width``), so the
op's gain is measured against a baseline in the same run. The load average (``os.getloadavg``)
is printed before and after each model.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from amct_bridge.keras import QuantCalibration, native  # noqa: E402

# Random-weight networks on random data: the records warn about vanishing activations at every
# calibrated fit (the KWS network's last layers); only errors are shown here.
logging.getLogger("amct_bridge").setLevel(logging.ERROR)

ALGORITHMS = ("minmax", "ema", "percentile", "hfmg", "ifmr")
TARGETS = {"minmax": 1.10, "ema": 1.10, "hfmg": 1.30, "ifmr": 1.30}


#: Input shape per model (the tiny models use 32x32, MobileNetV2 a small but real 96x96, the
#: KWS network 49 frames of 10 MFCCs).
SHAPES = {"light": (32, 32, 3), "conv": (32, 32, 3), "mobilenet": (96, 96, 3), "kws": (49, 10, 1)}


def make_model(kind: str = "light") -> keras.Model:
    """``light``: MobileNet-like blocks (conv/BN/ReLU6, depthwise), many activations per FLOP,
    the worst case for per-tensor statistics. ``conv``: VGG-like 3x3 convolutions.
    ``mobilenet``: keras.applications MobileNetV2 (alpha 0.35, 96x96, weights=None): a real
    network (52 convolutions, ~100 observed tensors). ``kws``: see :func:`kws_model`."""
    keras.utils.set_random_seed(0)
    if kind == "kws":
        return kws_model()
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


def kws_model() -> keras.Model:
    """DS-CNN (small) keyword spotting on 49x10 MFCC-like inputs, 12 classes, Adam: a 10x4
    stride-2 conv, four depthwise-separable blocks (64 channels, BN, ReLU), average pool, Dense.
    Its train step (Adam updates of 29 variables) takes ~1-3 s to trace, a large part of a
    3-epoch fit on 2048 samples."""
    inp = keras.Input(SHAPES["kws"])
    x = keras.layers.Conv2D(64, (10, 4), strides=2, padding="same", use_bias=False, name="c0")(inp)
    x = keras.layers.BatchNormalization(name="bn0")(x)
    x = keras.layers.ReLU(name="r0")(x)
    for i in range(4):
        x = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False, name=f"dw{i}")(x)
        x = keras.layers.BatchNormalization(name=f"dbn{i}")(x)
        x = keras.layers.ReLU(name=f"dr{i}")(x)
        x = keras.layers.Conv2D(64, 1, use_bias=False, name=f"pw{i}")(x)
        x = keras.layers.BatchNormalization(name=f"pbn{i}")(x)
        x = keras.layers.ReLU(name=f"pr{i}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    x = keras.layers.Dense(12, name="fc")(x)
    model = keras.Model(inp, x, name="kws")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(True))
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


def timed_fit(
    kind: str, x, y, epochs: int, callbacks: list, model=None
) -> tuple[float, float, float]:
    """(whole fit incl. tracing and the callback's end-of-run work, last epoch, the process's
    CPU time over the whole fit) in seconds, of ``model`` (default: one made just now). CPU
    time moves less than wall time with other processes' load (not at all with idle cores)."""
    model = make_model(kind) if model is None else model
    epochs_cb = EpochTimes()
    data = batches(x, y)
    start, cpu = time.perf_counter(), time.process_time()
    model.fit(data, epochs=epochs, verbose=0, callbacks=[epochs_cb, *callbacks])
    return time.perf_counter() - start, epochs_cb.times[-1], time.process_time() - cpu


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


def load() -> str:
    """The 1-minute load average, as printed next to the figures."""
    return f"{os.getloadavg()[0]:.1f}"


def spread(values: list[float]) -> str:
    """``median (min-max)`` of per-round values."""
    return f"{np.median(values):.3f} ({min(values):.2f}-{max(values):.2f})"


def fit_ratios(
    kind, x, y, epochs, algorithms, rounds, out, stock: bool, one_model: bool = False
) -> None:
    """Interleaved rounds: a plain fit, then a calibrated fit per algorithm; per-round ratios.
    ``one_model``: every fit of every round on one model (fitted once before the rounds: no
    trace left for the plain fits, the calibrated ones run on the steps kept for their plans);
    else each fit on a model made just now."""
    model = make_model(kind) if one_model else None
    if model is not None:
        timed_fit(kind, x, y, 1, [], model)
    base: list[tuple[float, float]] = []
    calib: dict[str, list] = {a: [] for a in algorithms}
    stocked: dict[str, list] = {a: [] for a in algorithms}
    for _ in range(rounds):
        base.append(timed_fit(kind, x, y, epochs, [], model))
        for algo in algorithms:
            cb = QuantCalibration(os.path.join(out, f"{algo}.txt"), algorithm=algo)
            calib[algo].append(timed_fit(kind, x, y, epochs, [cb], model))
            if stock:
                stock_ops(True)
                cb = QuantCalibration(os.path.join(out, f"{algo}-stock.txt"), algorithm=algo)
                stocked[algo].append(timed_fit(kind, x, y, epochs, [cb], model))
                stock_ops(False)
    print(
        f"plain fit: median {np.median([r[0] for r in base]):.2f} s, "
        f"last epoch {np.median([r[1] for r in base]):.2f} s, "
        f"CPU {np.median([r[2] for r in base]):.2f} s"
    )
    print(
        f"{'algorithm':<11} {'fit ratio (range)':>20} {'last epoch':>18} {'CPU ratio':>18} "
        f"{'target':>7} {'calibrating evaluate':>21}" + ("  stock-op fit ratio" if stock else "")
    )

    def per_round(runs: list, part: int) -> list[float]:
        return [r[part] / b[part] for r, b in zip(runs, base, strict=True)]

    for algo in algorithms:
        ratios = per_round(calib[algo], 0)
        cb = QuantCalibration(os.path.join(out, f"{algo}-eval.txt"), algorithm=algo)
        rate = len(x) / timed_evaluate(kind, x, y, [cb])
        target = TARGETS.get(algo)
        mark = "" if target is None else ("ok" if np.median(ratios) <= target else "over")
        extra = f" {spread(per_round(stocked[algo], 0)):>20}" if stock else ""
        print(
            f"{algo:<11} {spread(ratios):>20} {spread(per_round(calib[algo], 1)):>18} "
            f"{spread(per_round(calib[algo], 2)):>18} {target or '-':>7} "
            f"{rate:>12.0f} samples/s {mark:<4}" + extra
        )


def first_run(kind, x, y, epochs, algorithms, rounds, out) -> None:
    """What a fresh callback costs (seconds; see the module docstring), interleaved rounds."""
    for algo in algorithms:
        runs = first_run_rounds(kind, x, y, epochs, algo, rounds, out)
        print(f"\n{algo}: fit seconds, median of {rounds} rounds (load {load()}): wall, CPU")
        for label, v in runs.items():
            print(f"  {label:<28} {spread([w for w, _ in v])}  {spread([c for _, c in v])}")
        for label, base in (
            ("new callback, new model", "plain, new model"),
            ("new callback, fitted model", "plain, fitted model"),
            ("kept step, same model", "plain, fitted model"),
        ):
            pairs = list(zip(runs[label], runs[base], strict=True))
            wall = [a[0] - b[0] for a, b in pairs]
            cpu = [a[1] - b[1] for a, b in pairs]
            print(f"  {label} - {base}: wall {spread(wall)} s, CPU {spread(cpu)} s")


def first_run_rounds(
    kind, x, y, epochs, algo: str, rounds: int, out
) -> dict[str, list[tuple[float, float]]]:
    """Per round: a new model fitted plain twice, then with a new callback; another new model
    fitted with a new callback, then with another one (the kept step). (wall, CPU) seconds."""
    runs: dict[str, list[tuple[float, float]]] = {}
    path = os.path.join(out, f"{algo}-first.txt")
    for _ in range(rounds):
        fitted, model = make_model(kind), make_model(kind)
        for label, callbacks, on in (
            ("plain, new model", [], fitted),
            ("plain, fitted model", [], fitted),
            ("new callback, fitted model", [QuantCalibration(path, algorithm=algo)], fitted),
            ("new callback, new model", [QuantCalibration(path, algorithm=algo)], model),
            ("kept step, same model", [QuantCalibration(path, algorithm=algo)], model),
        ):
            wall, _, cpu = timed_fit(kind, x, y, epochs, callbacks, on)
            runs.setdefault(label, []).append((wall, cpu))
    return runs


def op_speed(repeat: int = 7) -> None:
    """ns per value of ``AmctSummary`` (16384 and 8192 bins, 1 M values: ReLU-like and normal,
    on a grid) against the stock path on the same tensors (``tf.histogram_fixed_width`` and two
    reductions), one thread, 20 tensors per graph call (best of ``repeat`` calls, CPU time)."""
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    rng = np.random.default_rng(0)
    n = 1 << 20
    cases = {
        "relu, 16384 bins": (np.maximum(rng.normal(0, 1, n), 0), 16384),
        "normal, 16384 bins": (rng.normal(0, 1, n), 16384),
        "relu, 8192 bins": (np.maximum(rng.normal(0, 1, n), 0), 8192),
    }

    def stock(v, grid, bins):
        lo, hi = tf.reduce_min(v), tf.reduce_max(v)
        return tf.histogram_fixed_width(v, grid, bins, dtype=tf.int32), lo, hi

    def per_value(make, xs, grid) -> float:
        # 20 ops on 20 copies (Grappler would merge the ops, and the stock reductions, of one)
        fn = tf.function(lambda vs, g: [make(v, g) for v in vs])
        fn(xs, grid)
        best = np.inf
        for _ in range(repeat):
            cpu = time.process_time()
            fn(xs, grid)
            best = min(best, time.process_time() - cpu)
        return best / len(xs) / n * 1e9

    print(f"\nAmctSummary against the stock ops, ns per value, one thread (load {load()})")
    for name, (values, bins) in cases.items():
        x = [tf.constant(values.astype("float32")) for _ in range(20)]
        grid = tf.constant([float(values.min()), float(values.max()) * 1.01], tf.float32)
        op = per_value(lambda v, g, b=bins: native.summary(v, g, b)[4], x, grid)
        ref = per_value(lambda v, g, b=bins: stock(v, g, b)[0], x, grid)
        print(f"  {name:<20} AmctSummary {op:.2f}  stock {ref:.2f}  ratio {op / ref:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples and epochs")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument(
        "--models", default="light,conv,mobilenet,kws", help="light, conv, mobilenet, kws"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds (the median is printed)"
    )
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
    parser.add_argument(
        "--one-model",
        action="store_true",
        help="all fits of all rounds on one model (kept steps, no trace after round 1)",
    )
    parser.add_argument(
        "--op-speed",
        action="store_true",
        help="only the native summary op against the stock ops (ns per value)",
    )
    parser.add_argument(
        "--first-run",
        action="store_true",
        help="time fresh callbacks on new and fitted models instead (see the docstring)",
    )
    args = parser.parse_args()
    if args.op_speed:
        op_speed()
        return
    n, epochs = (640, 2) if args.quick else (1280, 3)
    n, epochs = args.samples or n, args.epochs or epochs
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, n)
    out = tempfile.mkdtemp()
    algorithms = args.algorithms.split(",")
    print(f"fit: {n} samples x {epochs} epochs, batch 32; evaluate: {n} samples (after a warm-up)")
    print(f"native summary op: {'built' if native.load() is not None else 'NOT available'}")
    for kind in args.models.split(","):
        x = rng.uniform(0, 1, (n, *SHAPES[kind])).astype("float32")
        timed_fit(kind, x[:64], y[:64], 1, [])  # warm up TF for this model
        base_eval = timed_evaluate(kind, x, y, [])
        print(f"\nmodel {kind!r}: plain evaluate {n / base_eval:.0f} samples/s (load {load()})")
        if args.first_run:
            first_run(kind, x, y, epochs, algorithms, args.rounds, out)
        else:
            fit_ratios(
                kind, x, y, epochs, algorithms, args.rounds, out, args.stock_ops, args.one_model
            )
        print(f"(load {load()})")


if __name__ == "__main__":
    main()
