"""Cost of a MindSpore QAT training step against a plain training step (GRAPH_MODE).

Run: ``.venv/bin/python benchmarks/bench_mindspore_qat.py [--steps N] [--repeat R] [--size S]
[--tiny | --dp]``.

``--tiny``: the digits CNN of ``examples/mindspore_qat.py`` instead (Conv(4)+BN+ReLU,
Conv(8, stride 2)+BN+ReLU, Dense; 8x8 inputs, batch 32), where the per-op host cost of the QAT
cells weighs most against the tiny convolutions.

The small ResNet of ``bench_mindspore_instrument.py`` (15 convs with BN, ReLUs, Dense) on
``S x S`` images, batch 8: one plain copy and one ``quantize_aware`` copy (INT8, BN folded, EMA
ranges), each with its own ``Model`` (Momentum), compiled by a warm-up epoch. Then ``--repeat``
rounds, in turn, of one ``Model.train`` epoch of ``--steps`` batches each; the step time is the
median of the step-end-to-step-end intervals after each run's first step, pooled over the rounds
(this VM's step times drift by tens of percent between runs). Printed: the load average, both
step times as the wall median, the wall 10th percentile (the steps the other jobs of a shared
machine disturbed least) and the median process CPU time per step (all threads; less sensitive
to being descheduled), and ``QAT step x`` = QAT / plain in each column. Goal of issue 21:
<= 1.5x.

``--dp``: data-parallel QAT instead (``qat_dp_bench_worker.py``): the tiny net of
tests/mindspore/ms_dp_worker.py (3 quantized cells, no BN), batches of 4, plain / EMA / learned
ranges, run once alone and once under ``msrun --worker_num=2``; printed per process the step
medians and the ratios learned dp / ema dp, dp / single, and what the learned ranges' cross-rank
sync adds per step: (learned dp - learned single) - (ema dp - ema single).

The QAT step computes per quantized cell: the input range (reduce min/max, EMA, 3 assigns),
the fake-quantized input (scale, offset, round, clip), the ARQ weight scales and fake-quantized
weight, the cell's op, the output EMA; plus an output EMA per observed cell, and the backward of
all of it. Each op costs a fixed host time on CPU, which on the tiny CNN outweighs its
arithmetic: MindSpore's profiler counts 29 kernels per plain step there, 276 per QAT step
(EMA; 376 learned), 330 (438) before the cells were trimmed (docs/mindspore.md, "Quantization-
aware training", Cost).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import Callback, Model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import msrun_command, msrun_env  # noqa: E402
from bench_mindspore_instrument import SmallResNet, data  # noqa: E402

# the digits CNN of the MindSpore QAT example, the net this bench's --tiny times
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from mindspore_qat import DigitsCNN as TinyCNN  # noqa: E402

from amct_bridge.mindspore.qat import quantize_aware  # noqa: E402


class StepClock(Callback):
    """perf_counter and process CPU time (all threads) at every train step end."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.cpu: list[float] = []

    def on_train_step_end(self, run_context) -> None:
        self.ends.append(time.perf_counter())
        self.cpu.append(time.process_time())


def tiny_data(steps: int):
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (32 * steps, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 32 * steps).astype(np.int32)
    return ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(32)


def model_of(net: nn.Cell) -> Model:
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return Model(net, loss, nn.Momentum(net.trainable_params(), 0.01, 0.9))


def intervals(model: Model, dataset) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each step after the first of one epoch."""
    clock = StepClock()
    model.train(1, dataset, callbacks=[clock], dataset_sink_mode=False)
    return list(np.diff(clock.ends)), list(np.diff(clock.cpu))


DP_WORKER = Path(__file__).resolve().with_name("qat_dp_bench_worker.py")


def data_parallel(steps: int, repeat: int) -> None:
    """``--dp``: the worker alone, then under ``msrun`` with 2 CPU workers; the step medians
    and their ratios (module docstring)."""
    env = msrun_env(DP_WORKER.parents[1])
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        args = [str(DP_WORKER), str(out), str(steps), str(repeat)]
        runs = {
            "single": [sys.executable, *args, "single"],
            "dp": msrun_command(out / "log", [*args, "dp"]),
        }
        reports = {}
        for kind, cmd in runs.items():
            done = subprocess.run(
                cmd, env=env, cwd=out, capture_output=True, text=True, timeout=900
            )
            if done.returncode:
                sys.exit(done.stdout[-2000:] + done.stderr[-2000:])
            ranks = (0, 1) if kind == "dp" else (0,)
            reports[kind] = [json.loads((out / kind / f"rank{r}.json").read_text()) for r in ranks]
            loads.append(os.getloadavg()[0])
    print(
        f"QAT data-parallel (msrun, 2 CPU workers) against one process: tests/mindspore/"
        f"ms_dp_worker.py's net, batches of 4 per process, {steps} steps x {repeat} rounds"
    )
    print(f"load average (1 min) before / after single / after dp: {loads}, {os.cpu_count()} cores")
    med = {}
    for kind, reps in reports.items():
        for rep in reps:
            for mode in ("plain", "ema", "learned"):
                key = (kind, rep["rank"], mode)
                med[key] = (float(np.median(rep["wall"][mode])), float(np.median(rep["cpu"][mode])))
    print(f"{'process':14}{'plain ms':>10}{'ema ms':>10}{'learned ms':>12}   (wall median; CPU)")
    for kind, rank in [("single", 0), ("dp", 0), ("dp", 1)]:
        row = [med[(kind, rank, m)] for m in ("plain", "ema", "learned")]
        label = "single" if kind == "single" else f"dp rank {rank}"
        walls = "".join(f"{w * 1e3:{n}.2f}" for (w, _), n in zip(row, (10, 10, 12), strict=True))
        cpus = ", ".join(f"{c * 1e3:.2f}" for _, c in row)
        print(f"{label:14}{walls}   ({cpus})")
    for rank in (0, 1):

        def r(a, b):
            return med[a][0] / med[b][0]

        dp, one = ("dp", rank), ("single", 0)
        print(
            f"rank {rank}: learned dp / ema dp {r((*dp, 'learned'), (*dp, 'ema')):.2f}   "
            f"learned dp / learned single {r((*dp, 'learned'), (*one, 'learned')):.2f}   "
            f"ema dp / ema single {r((*dp, 'ema'), (*one, 'ema')):.2f}   "
            f"plain dp / plain single {r((*dp, 'plain'), (*one, 'plain')):.2f}   "
            f"learned single / ema single {r((*one, 'learned'), (*one, 'ema')):.2f}"
        )
    for rank in (0, 1):
        # what the learned ranges' AllReduce adds to a dp step beyond what dp adds to an ema step
        extra = (med[("dp", rank, "learned")][0] - med[("single", 0, "learned")][0]) - (
            med[("dp", rank, "ema")][0] - med[("single", 0, "ema")][0]
        )
        print(f"rank {rank}: the learned-range sync adds {extra * 1e3:+.2f} ms per step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--tiny", action="store_true", help="the digits CNN (8x8, batch 32)")
    parser.add_argument(
        "--dp", action="store_true", help="data-parallel QAT under msrun (2 workers) instead"
    )
    args = parser.parse_args()
    if args.dp:
        data_parallel(args.steps, args.repeat)
        return
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    if args.tiny:
        datasets = {"plain": tiny_data(args.steps), "qat": tiny_data(args.steps)}
        plain, sample, make = TinyCNN(), (1, 1, 8, 8), TinyCNN
        args.size = 8
    else:
        datasets = {"plain": data(args.steps, args.size), "qat": data(args.steps, args.size)}
        plain, sample, make = SmallResNet(), (1, 3, args.size, args.size), SmallResNet
    qat = quantize_aware(make(), "INT8", sample_input=sample)
    models = {"plain": model_of(plain), "qat": model_of(qat)}
    for name, model in models.items():  # compile (a Model keeps its own dataset)
        start = time.perf_counter()
        intervals(model, datasets[name])
        print(f"warm-up epoch {name:5} {time.perf_counter() - start:6.1f} s (compile included)")
    wall: dict[str, list[float]] = {name: [] for name in models}
    cpu: dict[str, list[float]] = {name: [] for name in models}
    for r in range(args.repeat):
        order = list(models) if r % 2 == 0 else list(models)[::-1]
        for name in order:
            w, c = intervals(models[name], datasets[name])
            wall[name] += w
            cpu[name] += c
    step = {name: float(np.median(v)) for name, v in wall.items()}
    fast = {name: float(np.percentile(v, 10)) for name, v in wall.items()}
    used = {name: float(np.median(v)) for name, v in cpu.items()}
    print(f"steps per run {args.steps}, rounds {args.repeat}, input {args.size}x{args.size}")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores")
    print(f"{'':12}{'wall median':>12}{'wall p10':>10}{'CPU median':>12}   (ms per step)")
    for name, label in (("plain", "plain step"), ("qat", "QAT step")):
        print(f"{label:12}{step[name] * 1e3:12.2f}{fast[name] * 1e3:10.2f}{used[name] * 1e3:12.2f}")
    print(
        f"{'QAT step x':12}{step['qat'] / step['plain']:12.2f}{fast['qat'] / fast['plain']:10.2f}"
        f"{used['qat'] / used['plain']:12.2f}   (goal <= 1.5)"
    )


if __name__ == "__main__":
    main()
