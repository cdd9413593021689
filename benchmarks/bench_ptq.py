"""Post-training calibration cost: ``calibrate()`` and the ``QuantCalibration`` callback
against ``predict``.

Run: ``.venv/bin/python benchmarks/bench_ptq.py [--images 256] [--repeat 5] [--no-tflite]``.

Model: keras.applications MobileNetV2 (alpha 0.35, 96x96, ``weights=None``), batch 32. Two
paths: ``calibrate()`` on the array (its own observed step), and ``callback``: ``model.predict``
with a :class:`~amct_bridge.keras.QuantCalibration` (Keras' predict step re-made with the
instrumentation). Per algorithm and path it prints (goals of issue 23 in brackets):

- ``first``: a fresh model's first calibration divided by another fresh model's first
  ``predict`` (both trace their step; goal <= 1x);
- ``again``: a calibration of a model calibrated before with the same settings (the kept step,
  no trace) divided by a warm ``predict`` of the same images timed just before it (goals:
  minmax <= 1.3x, ifmr/hfmg <= 2x);
- ``switching``: calibrations of one model with the algorithm changing at every call (minmax,
  ifmr, hfmg, minmax, ..., as a user comparing algorithms does), each against a warm predict
  timed just before it; the first cycle (each plan's first trace) is printed apart, the ratio
  is the median over the ``--repeat`` cycles after it (the steps of the last plans are kept:
  issue 33 §5 goals minmax <= 1.3x, ifmr/hfmg <= 2x).

Ratios are medians of per-run ratios (``--repeat`` runs, each against its own baseline timed
just before it): this machine's speed drifts by 2x over seconds, and a ratio of two best-of
times taken minutes apart drifts with it. Also printed: TFLite's int8 converter (representative
dataset of the same images) against a warm predict, a plain ``predict`` whose step is traced
anew (``retrace``) and the bare model traced into a ``tf.function`` of its own (``bare trace``,
Grappler off as calibrate() runs its step).

Then where a repeated call goes, from profiled runs (the median of ``--repeat`` per part):

- ``steps``: the observed batches (the model and the in-graph statistics);
- ``drain``: host reads of the summaries (rows, histogram rings) and moving the grids;
- ``observers``: waiting for the observer thread (merging histograms) at the end of the pass;
- ``search``: the HFMG/IFMR clip searches;
- ``weights``: the weight scales (kernel reads, BN folds, ARQ), per quantized layer;
- ``text``: the record's protobuf text;
- ``write``: writing record and sidecar, and the Record handed back;
- ``other``: the rest (predict's data adapter and outputs for the callback, sidecar building,
  Python glue).

The parts are timed by wrapping the session's methods in this process only.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from functools import partial

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from amct_bridge.calibration import records as core_records  # noqa: E402
from amct_bridge.keras import (  # noqa: E402
    QuantCalibration,
    calibrate,
    record_builder,  # noqa: E402
)
from amct_bridge.keras import session as keras_session  # noqa: E402

# The random-weight MobileNetV2's activations shrink to ~1e-10 by its last blocks, and every run
# would log the collapsed-scale warning for ~30 layers: only errors are shown here.
logging.getLogger("amct_bridge").setLevel(logging.ERROR)

# the module (amct_bridge.keras.calibrate is also the name of the function)
calibrate_module = importlib.import_module("amct_bridge.keras.calibrate")

ALGORITHMS = ("minmax", "ifmr", "hfmg")
GOALS = {"minmax": 1.3, "ifmr": 2.0, "hfmg": 2.0}  # issue 23, calls again


def make_model() -> keras.Model:
    """MobileNetV2 alpha 0.35 at 96x96, random weights (seeded)."""
    keras.utils.set_random_seed(0)
    return keras.applications.MobileNetV2(
        input_shape=(96, 96, 3), alpha=0.35, weights=None, classes=10
    )


def timed_predict(model, x) -> float:
    start = time.perf_counter()
    model.predict(x, batch_size=32, verbose=0)
    return time.perf_counter() - start


def timed_retrace(model, x) -> float:
    """A plain ``predict`` whose step function is traced anew: the floor of any calibration
    that runs its statistics inside the compiled step (the instrumented step is a new graph)."""
    model.make_predict_function(force=True)
    return timed_predict(model, x)


def timed_bare_trace(model, x) -> float:
    """The model alone traced into a new ``tf.function`` and run on the batches of ``x``, with
    Grappler off (as calibrate() runs its observed step): the floor of a first call."""
    spec = tf.TensorSpec((None, *x.shape[1:]), x.dtype)
    start = time.perf_counter()
    step = tf.function(lambda t: model(t, training=False), input_signature=[spec], autograph=False)
    with calibrate_module._plain_calls():
        for i in range(0, len(x), 32):
            step(tf.constant(x[i : i + 32]))
    return time.perf_counter() - start


def timed_calibrate(model, x, path: str, algo: str, keep: bool = True) -> float:
    """One calibrate(); ``keep=False``: no step kept from before is used, none is kept."""
    start = time.perf_counter()
    calibrate(model, x, path, algorithm=algo, batch_size=32, keep_step=keep)
    return time.perf_counter() - start


def timed_callback(model, x, path: str, algo: str, keep: bool = True) -> float:
    """``model.predict`` with a QuantCalibration (the callback path)."""
    start = time.perf_counter()
    cb = QuantCalibration(path, algorithm=algo, keep_step=keep)
    model.predict(x, batch_size=32, verbose=0, callbacks=[cb])
    return time.perf_counter() - start


PATHS = {"calibrate": timed_calibrate, "callback": timed_callback}


def timed_tflite(model, x) -> float:
    """TFLite's full-integer post-training quantization on the same images, batch 1."""

    def representative():
        for i in range(len(x)):
            yield [x[i : i + 1]]

    start = time.perf_counter()
    with quiet():  # the converter prints its SavedModel signature and MLIR notes
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.convert()
    return time.perf_counter() - start


@contextmanager
def quiet():
    """Send file descriptors 1 and 2 (C++ and Python output alike) to /dev/null."""
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def ratio(times: list[float], bases: list[float]) -> float:
    """Median of ``times[i] / bases[i]``."""
    return float(np.median(np.divide(times, bases)))


def fresh_first(timer, x) -> float:
    """``timer`` on a model made just now (nothing traced, nothing kept), then dropped."""
    model = make_model()
    try:
        return timer(model)
    finally:
        del model
        gc.collect()


def switching(path: str, timer, x, out: str, algorithms: list[str], cycles: int) -> dict:
    """Calibrations of one model made for this, the algorithm changing at every call (each
    against a warm predict timed just before it): rows ``<algo>-<path> switching`` (the median
    over ``cycles`` cycles after the first) and ``... switching, 1st cycle``."""
    model = make_model()
    model.predict(x[:32], batch_size=32, verbose=0)  # build and trace the plain step
    runs: dict[tuple[str, int], tuple[float, float]] = {}
    for cycle in range(cycles + 1):
        for algo in algorithms:
            base = timed_predict(model, x)
            file = os.path.join(out, f"{algo}-{path}-switch{cycle}.txt")
            runs[(algo, cycle)] = (timer(model, x, file, algo), base)
    rows = {}
    for algo in algorithms:
        later = [runs[(algo, c)] for c in range(1, cycles + 1)]
        t, base = runs[(algo, 0)]
        rows[f"{algo}-{path} switching, 1st cycle"] = (t, t / base, "warm")
        rows[f"{algo}-{path} switching"] = (
            min(t for t, _ in later),
            ratio(*zip(*later, strict=True)),
            "warm",
        )
    del model
    gc.collect()
    return rows


PARTS = ("steps", "drain", "observers", "search", "weights", "text", "write", "other")


class Profile:
    """Wall time per part of one calibration (see the module docstring)."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = defaultdict(float)

    @contextmanager
    def wrapped(self):
        """Wrap the session's steps with timers for the duration of the block."""
        patches = []

        def wrap(owner, name, part):
            original = getattr(owner, name)

            def timed(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    self.parts[part] += time.perf_counter() - start

            patches.append((owner, name, original))
            setattr(owner, name, timed)

        session = keras_session.Session
        core = keras_session.CalibrationSession
        wrap(session, "_drain", "drain")
        wrap(core, "_settle", "observers")
        wrap(core_records, "search_clip_ranges", "search")
        wrap(core_records, "_layer_factors", "weights")
        wrap(record_builder, "finish_record", "text")
        wrap(keras_session, "write_outputs", "write")
        wrap(keras_session, "from_proto", "write")
        wrap(keras_session, "to_proto", "write")
        wrap(keras_session, "build_outputs", "build")
        wrap(session, "write", "all writes")
        try:
            yield self
        finally:
            for owner, name, original in reversed(patches):
                setattr(owner, name, original)

    def table(self, total: float) -> dict[str, float]:
        """Parts in seconds (each once: nested ones are taken out of their callers)."""
        p = dict(self.parts)
        built = p.get("build", 0.0) - sum(p.get(k, 0.0) for k in ("search", "weights", "text"))
        # Session.write: settle (observers), build, write; what is left of it is the last read
        in_write = p.get("all writes", 0.0)
        steps = total - in_write - p.get("drain", 0.0) - p.get("observers", 0.0)
        p["steps"] = steps  # the batches and the hooks around them (callback: Keras' loop)
        p["other"] = built + max(
            0.0, in_write - p.get("build", 0.0) - p.get("write", 0.0) - p.get("observers", 0.0)
        )
        return p


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument(
        "--repeat", type=int, default=5, help="runs per timing (the median ratio is printed)"
    )
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--no-tflite", action="store_true", help="skip TFLite's converter")
    parser.add_argument("--no-first", action="store_true", help="skip the fresh-model calls")
    parser.add_argument(
        "--switching-only", action="store_true", help="only the switching rows (and the load)"
    )
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (args.images, 96, 96, 3)).astype("float32")
    out = tempfile.mkdtemp()
    print(f"load average {os.getloadavg()[0]:.1f}")
    if args.switching_only:
        print(f"MobileNetV2 a0.35 96x96, {args.images} images, batch 32, {args.repeat} cycles")
        for path, timer in PATHS.items():
            rows = switching(path, timer, x, out, args.algorithms.split(","), args.repeat)
            for label, (t, r, _) in rows.items():
                goal = "" if label.endswith("1st cycle") else GOALS.get(label.split("-")[0], "")
                print(f"{label:<38} best {t:>7.3f} s  ratio {r:>6.2f} x warm predict  goal {goal}")
        print(f"load average {os.getloadavg()[0]:.1f}")
        return
    model = make_model()
    model.predict(x[:32], batch_size=32, verbose=0)  # build and trace the plain step
    print(f"MobileNetV2 a0.35 96x96, {args.images} images, batch 32, {args.repeat} runs each")
    algorithms = args.algorithms.split(",")
    warm: list[float] = []

    def against_warm(timer) -> tuple[float, float]:
        base = timed_predict(model, x)
        warm.append(base)
        return timer(), base

    rows = {}  # label -> (seconds, ratio, baseline kind)
    for name, timer in (
        ("retrace", lambda: timed_retrace(model, x)),
        ("bare trace", lambda: timed_bare_trace(model, x)),
    ):
        runs = [against_warm(timer) for _ in range(args.repeat)]
        rows[name] = (min(t for t, _ in runs), ratio(*zip(*runs, strict=True)), "warm")
    first_predicts = []
    for algo in algorithms:
        for path, timer in PATHS.items():
            tag = f"{algo}-{path}"
            again, firsts = [], []
            for i in range(args.repeat):
                file = os.path.join(out, f"{tag}{i}.txt")
                timer(model, x, file, algo)  # the step kept for the next call
                again.append(against_warm(partial(timer, model, x, file, algo)))
                if not args.no_first:
                    first_predicts.append(fresh_first(lambda m: timed_predict(m, x), x))
                    call = fresh_first(partial(timer, x=x, path=file, algo=algo), x)
                    firsts.append((call, first_predicts[-1]))
            rows[f"{tag} again"] = (
                min(t for t, _ in again),
                ratio(*zip(*again, strict=True)),
                "warm",
            )
            if firsts:
                rows[f"{tag} first"] = (
                    min(t for t, _ in firsts),
                    ratio(*zip(*firsts, strict=True)),
                    "first",
                )
    for path, timer in PATHS.items():
        rows.update(switching(path, timer, x, out, algorithms, args.repeat))
    if not args.no_tflite:
        t, base = against_warm(lambda: timed_tflite(model, x))
        rows["tflite int8"] = (t, t / base, "warm")
    print(
        f"warm predict: best {min(warm):.3f} s, median {np.median(warm):.3f} s, "
        f"slowest {max(warm):.3f} s over {len(warm)} runs"
    )
    if first_predicts:
        print(
            f"first predict of a fresh model: best {min(first_predicts):.3f} s, "
            f"median {np.median(first_predicts):.3f} s over {len(first_predicts)} runs"
        )
    print(f"{'':<38} {'best s':>7} {'ratio':>6}  {'against':<14} goal")
    for label, (t, r, kind) in rows.items():
        algo = label.split("-")[0]
        goal = 1.0 if label.endswith(" first") else GOALS.get(algo)
        goal = None if label.endswith("1st cycle") else goal  # each plan's first trace
        mark = "" if goal is None or kind is None else f"{goal:<4} {'ok' if r <= goal else 'over'}"
        against = "first predict" if kind == "first" else "warm predict"
        print(f"{label:<38} {t:>7.3f} {r:>6.2f}  {against:<14} {mark}")
    print(
        "(best s: best run; ratio: median of per-run ratios. again: the step kept from the call\n"
        " before; first: a fresh model, against a fresh model's first predict; switching: the\n"
        " algorithm changed at every call (1st cycle: each plan traced once); retrace: a plain\n"
        " predict with its step traced anew; bare trace: the model alone traced and run)"
    )

    print("\nwhere a repeated call goes (median of profiled runs, seconds; x: per warm predict):")
    print(f"{'':<20} {'total':>6} " + " ".join(f"{c:>9}" for c in PARTS))
    for algo in algorithms:
        for path, timer in PATHS.items():
            tables, bases = [], []
            for _ in range(args.repeat):
                file = os.path.join(out, f"{algo}-{path}-p.txt")
                timer(model, x, file, algo)
                bases.append(timed_predict(model, x))
                profile = Profile()
                with profile.wrapped():
                    total = timer(model, x, file, algo)
                parts = profile.table(total)
                parts["total"] = total
                tables.append(parts)
            base = float(np.median(bases))
            med = {k: float(np.median([t.get(k, 0.0) for t in tables])) for k in ("total", *PARTS)}
            label = f"{algo} {path}"
            print(f"{label:<20} {med['total']:>6.3f} " + " ".join(f"{med[c]:>9.3f}" for c in PARTS))
            print(
                f"{'  x predict':<20} {med['total'] / base:>6.2f} "
                + " ".join(f"{med[c] / base:>9.2f}" for c in PARTS)
            )


if __name__ == "__main__":
    main()
