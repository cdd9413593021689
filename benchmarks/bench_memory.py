"""Host memory of a long fit with QuantCalibration: flat, like the same fit without it.

Run: ``.venv/bin/python benchmarks/bench_memory.py [--steps 1200] [--quick]``.

A tiny model (Dense 16-32-32-4, batch 4) is fitted for ``--steps`` steps (one epoch), then again
as epochs of 100 steps with ``save_every_epoch=True`` (a record + sidecar write per epoch), with
and without the callback, all in this process, back to back. A probe callback (after ours) reads
the process RSS (psutil, else /proc/self/status VmRSS) and tracemalloc's traced size at steps
100, 500, every 1000 and the last. Growth per 1000 steps = (last - step s) / (last - s) * 1000,
from s = 100 (past the tracing of the step function and the first host reads) and from s = 500
(past the first epoch-end writes, whose thread pools make glibc set up its per-thread arenas).
Printed per run, so the calibrated runs can be read against the plain ones of the same process.
tracemalloc sees Python allocations only (the observers' numpy buffers included); RSS also sees
TensorFlow's C++ heap.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import tracemalloc
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from amct_bridge.keras import QuantCalibration  # noqa: E402

MiB = 2**20


def rss() -> int:
    """Resident set size of this process in bytes."""
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except ImportError:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    raise RuntimeError("no RSS source")


class Probe(keras.callbacks.Callback):
    """RSS and traced Python memory at the chosen global steps (counts across epochs)."""

    def __init__(self, at: list[int]):
        super().__init__()
        self.at, self.step, self.seen = set(at), 0, {}

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step in self.at:
            gc.collect()
            self.seen[self.step] = (rss(), tracemalloc.get_traced_memory()[0])


def make_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    inp = keras.Input((16,))
    x = keras.layers.Dense(32, activation="relu", name="fc1")(inp)
    x = keras.layers.Dense(32, activation="relu", name="fc2")(x)
    model = keras.Model(inp, keras.layers.Dense(4, name="fc3")(x), name="tiny")
    model.compile(optimizer=keras.optimizers.SGD(0.001), loss="mse")
    return model


def dataset(batch: int) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 16)).astype("float32")
    y = rng.normal(size=(256, 4)).astype("float32")
    options = tf.data.Options()
    options.autotune.enabled = False  # its iterator teardown stalls; see bench_keras_callback
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()
    return ds.with_options(options)


def run(steps: int, epochs: int, algorithm: str | None, out: Path) -> dict[int, tuple[int, int]]:
    """One fit of ``steps`` steps in total (``epochs`` epochs), with or without the callback."""
    model = make_model()
    marks = sorted({100, 500, *range(1000, steps + 1, 1000), steps})
    probe = Probe(marks)
    callbacks = [probe]
    if algorithm is not None:
        cb = QuantCalibration(out / "record.txt", algorithm=algorithm, save_every_epoch=epochs > 1)
        callbacks = [cb, probe]
    per_epoch = steps // epochs
    model.fit(
        dataset(4),
        steps_per_epoch=per_epoch,
        epochs=epochs,
        verbose=0,
        callbacks=callbacks,
    )
    if algorithm is not None:
        assert (out / "record.txt").exists()
    return probe.seen


def growth(seen: dict[int, tuple[int, int]], first: int) -> tuple[float, float]:
    """(RSS, traced) growth in bytes per 1000 steps from step ``first`` to the last mark."""
    last = max(seen)
    span = (last - first) / 1000
    return (
        (seen[last][0] - seen[first][0]) / span,
        (seen[last][1] - seen[first][1]) / span,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--algorithms", default="minmax,ifmr", help="comma separated")
    parser.add_argument("--quick", action="store_true", help="600 steps, minmax only")
    args = parser.parse_args()
    steps = 600 if args.quick else max(args.steps, 1000)
    algorithms = ["minmax"] if args.quick else args.algorithms.split(",")
    tracemalloc.start()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for epochs in (1, steps // 100):
            runs.append(("no callback", epochs, run(steps, epochs, None, Path(tmp))))
            for algorithm in algorithms:
                runs.append((algorithm, epochs, run(steps, epochs, algorithm, Path(tmp))))
    print(f"fit of {steps} steps, batch 4; memory at steps (RSS MiB / traced MiB)")
    for name, epochs, seen in runs:
        marks = "  ".join(f"{s}:{r / MiB:.1f}/{t / MiB:.2f}" for s, (r, t) in sorted(seen.items()))
        print(f"{name:<12} {epochs:>3} epochs  {marks}")
    print("growth per 1000 steps (kB), from step 100 / from step 500 to the last")
    print(f"{'run':<12} {'epochs':>6}  {'RSS':>16}  {'traced':>16}")
    for name, epochs, seen in runs:
        (r100, t100), (r500, t500) = growth(seen, 100), growth(seen, 500)
        print(
            f"{name:<12} {epochs:>6}  {r100 / 1024:>+7.0f} /{r500 / 1024:>+7.0f}  "
            f"{t100 / 1024:>+7.1f} /{t500 / 1024:>+7.1f}"
        )


if __name__ == "__main__":
    main()
