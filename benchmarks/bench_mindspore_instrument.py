"""Cost of the MindSpore in-graph statistics: Model.eval / Model.train with probes / without.

Run: ``.venv/bin/python benchmarks/bench_mindspore_instrument.py [--steps N] [--size S]``.

A small ResNet (stem, two stages of two basic blocks, one with a downsample branch; 15 convs,
BN, ReLU used twice per block, Dense) on ``S x S`` images, batch 8. Observed like a calibration
would: every Conv2d / Dense input (a histogram for "hfmg", 16384 bins; min/max only for
"minmax"), every BatchNorm / ReLU / pool output (min/max). A callback reads the rings every 16
steps, gives histogram points their grids after the first read (as the calibration core does)
and takes the accumulated histograms at the end, so reading cost is included; the observers'
host work is not (it runs on a worker thread in the core).

For each mode (GRAPH, PYNATIVE) and each of eval / train it prints the time of ``--steps`` steps
without probes, with min/max probes and with histogram probes, and the ratios: three identical
networks and Models, each compiled by a warm-up run, then timed in turn, best of ``--repeat``
(interleaved, so a busy machine slows all three alike). Targets of
issue 12: GRAPH <= 1.10 (minmax) / 1.30 (hfmg); PYNATIVE is reported.
"""

from __future__ import annotations

import argparse
import time

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback

from amct_bridge.calibration.protocol import Point
from amct_bridge.mindspore.cells import describe, leaf_cells
from amct_bridge.mindspore.instrument import Instrumentation


class Block(nn.Cell):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.SequentialCell([nn.Conv2d(cin, cout, 1, stride=stride),
                                           nn.BatchNorm2d(cout)])  # fmt: skip

    def construct(self, x):
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        identity = self.down(x) if self.down is not None else x
        return self.relu(out + identity)


class SmallResNet(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        self.layer1 = nn.SequentialCell([Block(16, 16), Block(16, 16)])
        self.layer2 = nn.SequentialCell([Block(16, 32, 2), Block(32, 32)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(32, 10)

    def construct(self, x):
        x = self.layer2(self.layer1(self.relu(self.bn1(self.conv1(x)))))
        return self.fc(self.flatten(self.pool(x)))


def calls_per_step(net, x) -> dict[int, int]:
    """id(cell) -> calls in one forward pass (PYNATIVE forward hooks)."""
    before = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    counts: dict[int, int] = {}

    def hook(cell, args):
        counts[id(cell)] = counts.get(id(cell), 0) + 1

    handles = [c.register_forward_pre_hook(hook) for c in leaf_cells(net).values()]
    net(ms.Tensor(x))
    for h in handles:
        h.remove()
    ms.set_context(mode=before)
    return counts


def make_points(net, x, bins: int) -> list[Point]:
    calls = calls_per_step(net, x)
    points = []
    for key, cell in leaf_cells(net).items():
        d = describe(key, cell)
        n = calls.get(id(cell), 1)
        if d.quantizable:
            points.append(Point(key, "input", cell, bins=bins, calls=n))
        elif d.activation or d.runtime or d.kind == "BatchNormalization":
            points.append(Point(key, "output", cell, calls=n))
    return points


class Reader(Callback):
    """What the calibration core does on the host: drain every read_every steps, set grids."""

    def __init__(self, inst: Instrumentation) -> None:
        self.inst, self.ends, self.rows = inst, 0, 0
        self.spans: dict[int, tuple[float, float]] = {}

    def _step(self) -> None:
        self.ends += 1
        if self.ends == 1 or self.ends % self.inst.read_every == 0:
            self.read()

    def read(self) -> None:
        rows = self.inst.drain()
        self.rows += len(rows)
        own = {r.point for r in rows if r.stats.hist is not None}
        self.inst.take_histograms(sorted(own))
        for r in rows:
            lo, hi = self.spans.get(r.point, (r.stats.min, r.stats.max))
            self.spans[r.point] = (min(lo, r.stats.min), max(hi, r.stats.max))
        for i in own:
            lo, hi = self.spans[i]
            pad = (hi - lo) / 8
            self.inst.set_grid(i, lo - pad, hi + pad)

    def on_eval_step_end(self, run_context) -> None:
        self._step()

    def on_train_step_end(self, run_context) -> None:
        self._step()


def data(steps: int, size: int):
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (8 * steps, 3, size, size)).astype(np.float32)
    y = rng.integers(0, 10, 8 * steps).astype(np.int32)
    return ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(8)


class Setup:
    """One network + Model (+ probes) for one mode and task, compiled by a warm-up run."""

    def __init__(self, task: str, bins: int | None, steps: int, size: int) -> None:
        ms.set_seed(0)
        self.net = SmallResNet()
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        opt = nn.Momentum(self.net.trainable_params(), learning_rate=0.01, momentum=0.9)
        self.model = ms.Model(self.net, loss_fn=loss, optimizer=opt, metrics={"loss"})
        self.task, self.callbacks, self.inst = task, [], None
        if bins is not None:
            x = np.zeros((8, 3, size, size), np.float32)
            networks = [self.model._eval_network, self.model._train_network]
            points = make_points(self.net, x, bins)
            self.inst = Instrumentation(self.net, points, steps_per_read=16, compiled=networks)
            self.inst.install()
            self.callbacks = [Reader(self.inst)]
        self.warm, self.data = data(2, size), data(steps, size)
        self.go(self.warm)  # compiles in GRAPH mode

    def go(self, dataset) -> None:
        if self.task == "eval":
            self.model.eval(dataset, callbacks=self.callbacks)
        else:
            self.model.train(1, dataset, callbacks=self.callbacks)

    def timed(self) -> float:
        """Seconds for one pass over the timed data (with the final read)."""
        start = time.perf_counter()
        self.go(self.data)
        if self.inst is not None:
            self.callbacks[0].read()
            self.inst.take_histograms(list(range(len(self.inst.points))))
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3, help="best of N per configuration")
    parser.add_argument("--modes", nargs="+", choices=("graph", "pynative"),
                        default=["graph", "pynative"])  # fmt: skip
    parser.add_argument("--tasks", nargs="+", choices=("eval", "train"), default=["eval", "train"])
    args = parser.parse_args()
    print(f"SmallResNet, batch 8, {args.size}x{args.size}, {args.steps} steps, best of "
          f"{args.repeat}")  # fmt: skip
    print(f"{'mode':9} {'task':5} {'plain s':>8} {'minmax s':>9} {'hfmg s':>8} "
          f"{'minmax x':>9} {'hfmg x':>7}")  # fmt: skip
    modes = {"graph": ("GRAPH", ms.GRAPH_MODE), "pynative": ("PYNATIVE", ms.PYNATIVE_MODE)}
    for name, mode in (modes[m] for m in args.modes):
        for task in args.tasks:
            ms.set_context(mode=mode)
            configs = {"plain": None, "minmax": 0, "hfmg": 16384}
            setups = {k: Setup(task, b, args.steps, args.size) for k, b in configs.items()}
            t = {k: float("inf") for k in configs}
            order = list(setups)
            for r in range(args.repeat):  # interleaved and rotated: load hits all three alike
                for k in order[r % 3 :] + order[: r % 3]:
                    t[k] = min(t[k], setups[k].timed())
            print(f"{name:9} {task:5} {t['plain']:8.3f} {t['minmax']:9.3f} {t['hfmg']:8.3f} "
                  f"{t['minmax'] / t['plain']:9.2f} {t['hfmg'] / t['plain']:7.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
