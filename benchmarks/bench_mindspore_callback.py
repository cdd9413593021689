"""Cost of calibrating with ``amct_bridge.mindspore.QuantCalibration`` inside Model.eval / train.

Run: ``.venv/bin/python benchmarks/bench_mindspore_callback.py [--steps N] [--size S]``.

The small ResNet of ``bench_mindspore_instrument.py`` (stem, two stages of two basic blocks, one
with a downsample branch; 15 convs, BN, a ReLU called twice per block, Dense) on ``S x S``
images, batch 8. For each mode (GRAPH, PYNATIVE) and task (``Model.eval``, ``Model.train`` of one
epoch) three identical networks and Models are compiled by a warm-up run: one plain, one run
with a fresh ``QuantCalibration(algorithm="minmax")`` per timed run, one with ``"hfmg"``. Timed
in turn (interleaved and rotated, ``--repeat`` rounds) over ``--steps`` batches. Printed:

* ``step x``: the steady per-step cost with the callback / without: the median of all
  step-end-to-step-end intervals after each run's first step, pooled over the rounds (the
  median, because this VM's step time drifts by 30 % between runs of the same thing; the ring
  reads every 16 steps and the histogram grids are in the intervals; the observers' host work
  runs on the core's worker thread);
* ``fixed s``: the per-run cost of a calibration on top of the steady steps (median over the
  rounds of run time minus steps x the steady step): the final drain, the observers' search
  (HFMG) and writing record + sidecar. The warm-up is a calibrated run of the same network and
  points, so the timed runs take its kept probes, compiled graph and graph IR (no MindIR
  export, no compile; before they were kept, each run exported and compiled the graph with the
  probes again). A first run's export and compile are in ``bench_mindspore_calibrated_epoch.py``;
* ``run x``: the whole call (``Model.eval`` / ``train`` of ``--steps`` batches) with the
  callback / without, medians over the rounds;
* ``target at``: the run length (steps) from which ``run x`` is at most 1.10 (minmax) / 1.30
  (hfmg), from the measured step x and fixed s (``-`` if the steady cost alone is over).

The fixed cost is paid once per run (per ``Model.eval`` / ``train`` call, not per epoch); a
cold first run compiles the graph once either way, with the probes or without.

Targets of issue 12: GRAPH <= 1.10 (minmax) / 1.30 (hfmg); PYNATIVE is reported.

On a loaded machine the step ratios understate the probes' share: the network's convolutions
(multi-threaded) slow down far more under load than the probes' small kernels. The probes' own
kernel time per step is in ``bench_mindspore_probe_kernels.py``; the fixed cost of a calibrated
train epoch and of the plain epoch after it in ``bench_mindspore_calibrated_epoch.py``.
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


class StepClock(Callback):
    """perf_counter at every step end (the last callback in the list)."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_eval_step_end(self, run_context) -> None:
        self.ends.append(time.perf_counter())

    def on_train_step_end(self, run_context) -> None:
        self.ends.append(time.perf_counter())


class Setup:
    """One network + Model for one mode and task, compiled by a warm-up run."""

    def __init__(self, task: str, algorithm: str | None, steps: int, size: int, out: str):
        ms.set_seed(0)
        self.net = SmallResNet()
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        opt = nn.Momentum(self.net.trainable_params(), learning_rate=0.01, momentum=0.9)
        self.model = ms.Model(self.net, loss_fn=loss, optimizer=opt, metrics={"loss"})
        self.task, self.algorithm = task, algorithm
        self.record = os.path.join(out, f"{task}_{algorithm}.txt")
        self.warm, self.data = data(2, size), data(steps, size)
        self.go(self.warm)  # compiles in GRAPH mode; a calibration run warms the Python side

    def go(self, dataset) -> tuple[float, list[float]]:
        clock = StepClock()
        callbacks: list = [clock]
        if self.algorithm is not None:
            callbacks.insert(0, QuantCalibration(self.record, algorithm=self.algorithm))
        start = time.perf_counter()
        if self.task == "eval":
            self.model.eval(dataset, callbacks=callbacks)
        else:
            self.model.train(1, dataset, callbacks=callbacks)
        return time.perf_counter() - start, clock.ends


def intervals(ends: list[float]) -> list[float]:
    """Step-end-to-step-end intervals after the first step."""
    return list(np.diff(ends))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3, help="rounds per configuration")
    parser.add_argument("--modes", nargs="+", choices=("graph", "pynative"),
                        default=["graph", "pynative"])  # fmt: skip
    parser.add_argument("--tasks", nargs="+", choices=("eval", "train"), default=["eval", "train"])
    args = parser.parse_args()
    print(f"SmallResNet, batch 8, {args.size}x{args.size}, {args.steps} steps per run, "
          f"{args.repeat} rounds; x = with QuantCalibration / without")  # fmt: skip
    print(f"{'mode':9} {'task':5} {'algo':6} {'step ms':>8} {'step x':>7} {'fixed s':>8} "
          f"{'run x':>6} {'target at':>9}")  # fmt: skip
    modes = {"graph": ("GRAPH", ms.GRAPH_MODE), "pynative": ("PYNATIVE", ms.PYNATIVE_MODE)}
    with tempfile.TemporaryDirectory() as out:
        for name, mode in (modes[m] for m in args.modes):
            for task in args.tasks:
                ms.set_context(mode=mode)
                configs = [None, "minmax", "hfmg"]
                setups = {a: Setup(task, a, args.steps, args.size, out) for a in configs}
                runs: dict = {a: [] for a in configs}
                gaps: dict = {a: [] for a in configs}
                for r in range(args.repeat):  # interleaved and rotated: load hits all alike
                    for a in configs[r % 3 :] + configs[: r % 3]:
                        total, ends = setups[a].go(setups[a].data)
                        runs[a].append(total)
                        gaps[a] += intervals(ends)
                base = float(np.median(gaps[None]))
                for a in configs:
                    step = float(np.median(gaps[a]))
                    fixed = float(np.median([t - args.steps * step for t in runs[a]]))
                    run_x = float(np.median(runs[a]) / np.median(runs[None]))
                    target = {"minmax": 1.10, "hfmg": 1.30}.get(a)
                    at = "-"
                    if target is not None and step / base < target:
                        at = f"{fixed / ((target - step / base) * base):.0f}"
                    print(f"{name:9} {task:5} {a or 'plain':6} {1000 * step:8.1f} "
                          f"{step / base:7.2f} {fixed:8.2f} {run_x:6.2f} "
                          f"{at if target else '':>9}")  # fmt: skip
                sys.stdout.flush()


if __name__ == "__main__":
    main()
