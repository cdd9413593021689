"""Post-training calibration cost: ``amct_bridge.keras.calibrate()`` against a warm ``predict``.

Run: ``.venv/bin/python benchmarks/bench_ptq.py [--images 256] [--repeat 5] [--no-tflite]``.

Model: keras.applications MobileNetV2 (alpha 0.35, 96x96, ``weights=None``), batch 32. For each
algorithm it prints ``calibrate()`` wall time divided by a warm ``model.predict`` of the same
images (``--repeat`` runs, each against a predict timed just before it; the median ratio;
goals: minmax <= 2x, ifmr/hfmg <= 3x),
as a first call (``keep_step=False``: the observed step is traced and instantiated) and as a
call again on the same model (the step kept from the call before), and
TFLite's int8 converter (``TFLiteConverter`` with a representative dataset of the same images) in
the same units, a plain ``predict`` whose step is traced anew (``retrace``), and the bare
model traced into a ``tf.function`` of its own and run on the same batches (``bare trace``, with
Grappler off as calibrate() runs its step): calibration observes tensors inside a compiled step,
so a first call traces a new one, and the bare trace is its floor. Ratios are medians of
per-run ratios, each run against the warm predict timed just before it: this machine's speed
drifts by 2x over seconds, and a ratio of two best-of times taken minutes apart drifts with it.
Then where ``calibrate()``'s time goes, from one profiled run per algorithm:

- ``keras in``: from the call to the first callback hook (the callback, predict's data adapter);
- ``setup``: the plan and the observers, the instrumentation and tracing calibrate()'s observed
  step (none on a call again);
- ``trace+1st``: the first batch, with the step's instantiation (none on a call again);
- ``batches``: the other batches (the steady per-batch cost is this over their number);
- ``keras out``: from the last batch to the end hook;
- ``drain``: the last read of the summaries and waiting for the observer thread;
- ``search``: the HFMG/IFMR clip searches;
- ``build``: the rest of the record and sidecar building;
- ``write``: writing both files and reading the record back.

The parts are timed by wrapping the session's methods in this process only.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from amct_bridge.calibration import records as core_records  # noqa: E402
from amct_bridge.keras import calibrate  # noqa: E402
from amct_bridge.keras import session as keras_session  # noqa: E402

# The random-weight MobileNetV2's activations shrink to ~1e-10 by its last blocks, and every run
# would log the collapsed-scale warning for ~30 layers: only errors are shown here.
logging.getLogger("amct_bridge").setLevel(logging.ERROR)

# the module (amct_bridge.keras.calibrate is also the name of the function)
calibrate_module = importlib.import_module("amct_bridge.keras.calibrate")

ALGORITHMS = ("minmax", "ifmr", "hfmg")
GOALS = {"minmax": 2.0, "ifmr": 3.0, "hfmg": 3.0}


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


def timed_calibrate(model, x, path: str, algo: str, keep: bool) -> float:
    """One calibrate(); ``keep=False``: a first call (no step kept from before, none kept)."""
    start = time.perf_counter()
    calibrate(model, x, path, algorithm=algo, batch_size=32, keep_step=keep)
    return time.perf_counter() - start


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


def ratio(times: list[float], predicts: list[float]) -> float:
    """Median of ``times[i] / predicts[i]``."""
    return float(np.median(np.divide(times, predicts)))


class Profile:
    """Wall time per part of one ``calibrate()`` (see the module docstring)."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = defaultdict(float)
        self.marks: dict[str, float] = {}
        self.batch_ends: list[float] = []

    @contextmanager
    def wrapped(self):
        """Wrap the session's steps with timers for the duration of the block."""
        patches = []

        def wrap(owner, name, part, mark=None):
            original = getattr(owner, name)

            def timed(*args, **kwargs):
                start = time.perf_counter()
                if mark is not None:
                    self.marks.setdefault(f"{mark} begin", start)
                try:
                    return original(*args, **kwargs)
                finally:
                    end = time.perf_counter()
                    self.parts[part] += end - start
                    if mark == "batch":
                        self.batch_ends.append(end)
                    elif mark is not None:
                        self.marks[f"{mark} end"] = end

            patches.append((owner, name, original))
            setattr(owner, name, timed)

        session = keras_session.Session
        wrap(session, "new_run", "setup", mark="run")
        wrap(session, "start_pass", "setup", mark="pass")
        wrap(session, "batch_end", "batch hooks", mark="batch")
        wrap(session, "stop_pass", "drain", mark="stop")
        wrap(core_records, "search_clip_ranges", "search")
        wrap(keras_session, "build_outputs", "build")
        wrap(keras_session, "write_outputs", "write")
        wrap(calibrate_module, "load", "write")
        try:
            yield self
        finally:
            for owner, name, original in reversed(patches):
                setattr(owner, name, original)

    def table(self, start: float, total: float) -> dict[str, float]:
        """Parts in seconds; ``build`` excludes the search it contains."""
        parts, marks, ends = dict(self.parts), self.marks, self.batch_ends
        parts["build"] = parts.get("build", 0.0) - parts.get("search", 0.0)
        parts["keras in"] = marks["run begin"] - start  # callback, predict's data adapter
        parts["trace+1st"] = ends[0] - marks["pass end"]
        parts["batches"] = ends[-1] - ends[0] if len(ends) > 1 else 0.0
        parts["per batch"] = parts["batches"] / max(1, len(ends) - 1)
        parts["keras out"] = marks["stop begin"] - ends[-1]
        known = (
            "keras in", "setup", "trace+1st", "batches", "keras out", "drain", "search", "build",
            "write",
        )  # fmt: skip
        parts["other"] = total - sum(parts.get(k, 0.0) for k in known)
        return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument(
        "--repeat", type=int, default=5, help="runs per timing (the median ratio is printed)"
    )
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--no-tflite", action="store_true", help="skip TFLite's converter")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (args.images, 96, 96, 3)).astype("float32")
    out = tempfile.mkdtemp()
    model = make_model()
    model.predict(x[:32], batch_size=32, verbose=0)  # build and trace the plain step
    print(f"MobileNetV2 a0.35 96x96, {args.images} images, batch 32, {args.repeat} runs each")
    algorithms = args.algorithms.split(",")
    results = {}  # name -> (predicts, first calls, calls again), one of each per run
    for algo in ("retrace", "bare trace", *algorithms):
        base, first, again = [], [], []
        for i in range(args.repeat):
            if algo in ("retrace", "bare trace"):
                base.append(timed_predict(model, x))
                timer = timed_retrace if algo == "retrace" else timed_bare_trace
                first.append(timer(model, x))
                continue
            path = os.path.join(out, f"{algo}{i}.txt")
            base.append(timed_predict(model, x))
            first.append(timed_calibrate(model, x, path, algo, keep=False))
            timed_calibrate(model, x, path, algo, keep=True)  # traces the step it keeps
            base.append(timed_predict(model, x))
            again.append(timed_calibrate(model, x, path, algo, keep=True))
            timed_calibrate(model, x, path, algo, keep=False)  # drops it again
        if again:  # first calls against the even predicts, calls again against the odd ones
            results[algo] = (base[0::2], first, base[1::2], again)
        else:
            results[algo] = (base, first, None, None)
    if not args.no_tflite:
        results["tflite int8"] = ([timed_predict(model, x)], [timed_tflite(model, x)], None, None)
    predicts = [t for r in results.values() for t in (*r[0], *(r[2] or ()))]
    print(
        f"warm predict: best {min(predicts):.3f} s, median {np.median(predicts):.3f} s, "
        f"slowest {max(predicts):.3f} s over {len(predicts)} runs"
    )
    print(f"{'':<12} {'first s':>8} {'x predict':>9} {'again s':>8} {'x predict':>9} {'goal':>5}")
    for algo, (b1, c, b2, w) in results.items():
        goal = GOALS.get(algo)
        first_ratio = ratio(c, b1)
        again_ratio = None if w is None else ratio(w, b2)
        again = "" if w is None else f"{min(w):>8.3f} {again_ratio:>9.2f}"
        marks = ""
        if goal is not None:
            marks = " ".join(
                f"{label} {'ok' if r <= goal else 'over'}"
                for label, r in (("first", first_ratio), ("again", again_ratio))
            )
        print(f"{algo:<12} {min(c):>8.3f} {first_ratio:>9.2f} {again:>18} {goal or '':>5} {marks}")
    print(
        "(seconds: best run; x predict: median of per-run ratios. first: calibrate() traces and\n"
        " instantiates its observed step; again: the step kept from the call before, as Keras\n"
        " keeps its predict function; retrace: a plain predict with its step traced anew;\n"
        " bare trace: the model alone traced and run, the floor of any first call)"
    )

    print("\nwhere calibrate() spends its time (one profiled run each, seconds):")
    cols = (
        "keras in", "setup", "trace+1st", "batches", "per batch", "keras out", "drain", "search",
        "build", "write",
    )  # fmt: skip
    print(f"{'algorithm':<16} {'total':>6} " + " ".join(f"{c:>9}" for c in (*cols, "other")))
    # the profiled runs come after the timed ones: every part has been run once before
    for algo in algorithms:
        for keep in (False, True):
            if keep:
                timed_calibrate(model, x, os.path.join(out, f"{algo}-k.txt"), algo, keep)
            profile = Profile()
            with profile.wrapped():
                start = time.perf_counter()
                path = os.path.join(out, f"{algo}-p.txt")
                total = timed_calibrate(model, x, path, algo, keep)
            parts = profile.table(start, total)
            label = f"{algo} {'again' if keep else 'first'}"
            print(
                f"{label:<16} {total:>6.3f} "
                + " ".join(f"{parts.get(c, 0.0):>9.3f}" for c in (*cols, "other"))
            )


if __name__ == "__main__":
    main()
