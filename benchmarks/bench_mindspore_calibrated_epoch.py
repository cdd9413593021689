"""Fixed cost of a calibrated GRAPH_MODE ``Model.train`` epoch, and of the plain epoch after it.

Run: ``.venv/bin/python benchmarks/bench_mindspore_calibrated_epoch.py [--steps N] [--repeat R]``.

The small ResNet of ``bench_mindspore_instrument.py`` on 32 x 32 images, batch 8, one epoch of
``--steps`` batches per ``Model.train`` call, in GRAPH_MODE, one process, one Model:

1. ``cold``: the first plain epoch (compiles the train graph);
2. ``plain``: plain epochs (the compiled graph runs);
3. ``calibrated``: an epoch with ``QuantCalibration(algorithm=...)`` (a fresh callback each
   time). The first one exports the graph (MindIR) at the first step and compiles the graph
   with the probes; the later ones (``again``) find both kept (same network, same points):
   drains, the observers' search, record + sidecar only;
4. ``after``: the plain epoch right after a calibrated one (before: the probes' swap cleared the
   compile cache, so it compiled the plain graph again).

The calibrated epoch's fixed part is split with clocks around the callback: ``start`` (train
begin to the first step's graph call: MindIR export, plan, probes in), ``first step`` over a
steady step (the compile of the graph with the probes), ``end`` (final drain, search, write).

Rounds ``plain, calibrated, after`` repeat ``--repeat`` times (at least 2); printed are the
medians and ``fixed`` = calibrated - plain for the first calibrated epoch and for the later
ones (``again``), ``recompile`` = after - plain (seconds; the steady per-step cost of the
probes is in ``fixed`` too, see ``bench_mindspore_callback.py`` for it). The graph export
alone (``extract_graph``, a copy of the network: no graph of it compiled yet) is timed apart.
Run it from a checkout with ``PYTHONPATH`` pointing at another one to compare versions; the
machine's load (``os.getloadavg``) is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.train import Callback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mindspore_instrument import SmallResNet, data  # noqa: E402

from amct_bridge.mindspore import QuantCalibration  # noqa: E402
from amct_bridge.mindspore.graph import extract_graph  # noqa: E402


class Clock(Callback):
    """perf_counter at train begin, every step begin / end and train end."""

    def __init__(self) -> None:
        self.t: dict[str, list[float]] = {"begin": [], "step_begin": [], "step_end": [], "end": []}

    def on_train_begin(self, run_context) -> None:
        self.t["begin"].append(time.perf_counter())

    def on_train_step_begin(self, run_context) -> None:
        self.t["step_begin"].append(time.perf_counter())

    def on_train_step_end(self, run_context) -> None:
        self.t["step_end"].append(time.perf_counter())

    def on_train_end(self, run_context) -> None:
        self.t["end"].append(time.perf_counter())


def parts(pre: Clock, post: Clock) -> dict[str, float]:
    """Where a calibrated epoch's fixed time goes: ``pre`` runs before the callback, ``post``
    after it. start: train begin to the first step's graph call (MindIR export, plan, install);
    first: the first step minus a steady one (the compile of the graph with the probes); end:
    the last step's end to train end (final drain, search, record + sidecar)."""
    steps = np.diff(post.t["step_end"]) if len(post.t["step_end"]) > 1 else np.array([0.0])
    return {
        "start": post.t["step_begin"][0] - pre.t["begin"][0],
        "first": post.t["step_end"][0] - post.t["step_begin"][0] - float(np.median(steps)),
        "end": post.t["end"][0] - pre.t["step_end"][-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--algorithm", default="minmax")
    args = parser.parse_args()
    load = os.getloadavg()
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    net = SmallResNet()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    model = ms.Model(net, loss_fn=loss, optimizer=opt)
    dataset = data(args.steps, 32)
    times: dict[str, list[float]] = {"plain": [], "calibrated": [], "after": []}
    with tempfile.TemporaryDirectory() as out:

        def epoch(callbacks) -> float:
            start = time.perf_counter()
            model.train(1, dataset, callbacks=callbacks)
            return time.perf_counter() - start

        cold = epoch([])
        for r in range(max(2, args.repeat)):
            record = os.path.join(out, f"r{r}.txt")
            times["plain"].append(epoch([]))
            pre, post = Clock(), Clock()
            cb = QuantCalibration(record, algorithm=args.algorithm)
            times["calibrated"].append(epoch([pre, cb, post]))
            for key, value in parts(pre, post).items():
                times.setdefault(key, []).append(value)
            times["after"].append(epoch([]))
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as cwd:
            here = os.getcwd()
            os.chdir(cwd)
            try:
                ms.set_seed(0)
                extract_graph(SmallResNet(), (8, 3, 32, 32))
            finally:
                os.chdir(here)
        export = time.perf_counter() - start

    def med(key: str, rounds: slice = slice(None)) -> float:
        return float(np.median(times[key][rounds]))

    first, again = slice(0, 1), slice(1, None)
    plain = med("plain")
    print(f"SmallResNet GRAPH_MODE Model.train, 1 epoch of {args.steps} steps (batch 8, 32x32), "
          f"{args.algorithm}, {max(2, args.repeat)} rounds, medians in s; load average "
          f"{load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    print(f"cold {cold:.2f}  plain {plain:.2f}  calibrated: first {med('calibrated', first):.2f}"
          f" again {med('calibrated', again):.2f}  after {med('after'):.2f}  | fixed: first "
          f"{med('calibrated', first) - plain:.2f} again {med('calibrated', again) - plain:.2f}"
          f"  recompile {med('after') - plain:.2f}  export alone {export:.2f}")  # fmt: skip
    for name, rounds in (("first", first), ("again", again)):
        print(f"{name} calibrated epoch's fixed part: start {med('start', rounds):.2f} (export, "
              f"plan, install)  first step {med('first', rounds):.2f} over a steady one "
              f"(compile with probes)  end {med('end', rounds):.2f} (drain, search, "
              "write)")  # fmt: skip


if __name__ == "__main__":
    main()
