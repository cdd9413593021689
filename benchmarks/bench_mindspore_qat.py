"""Cost of a MindSpore QAT training step against a plain training step (GRAPH_MODE).

Run: ``.venv/bin/python benchmarks/bench_mindspore_qat.py [--steps N] [--repeat R] [--size S]
[--tiny]``.

``--tiny``: the digits CNN of ``examples/mindspore_qat.py`` instead (Conv(4)+BN+ReLU,
Conv(8, stride 2)+BN+ReLU, Dense; 8x8 inputs, batch 32), where the per-op host cost of the QAT
cells weighs most against the tiny convolutions.

The small ResNet of ``bench_mindspore_instrument.py`` (15 convs with BN, ReLUs, Dense) on
``S x S`` images, batch 8: one plain copy and one ``quantize_aware`` copy (INT8, BN folded, EMA
ranges), each with its own ``Model`` (Momentum), compiled by a warm-up epoch. Then ``--repeat``
rounds, in turn, of one ``Model.train`` epoch of ``--steps`` batches each; the step time is the
median of the step-end-to-step-end intervals after each run's first step, pooled over the rounds
(this VM's step times drift by tens of percent between runs). Printed: both step times and
``QAT step x`` = QAT / plain. Goal of issue 21: <= 1.5x.

The QAT step computes per quantized cell: the input range (reduce min/max, EMA, 3 assigns),
the fake-quantized input (scale, offset, round, clip), the ARQ weight scales and fake-quantized
weight, the cell's op, the output EMA; plus an output EMA per observed cell, and the backward of
all of it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import Callback, Model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mindspore_instrument import SmallResNet, data  # noqa: E402

from amct_bridge.mindspore.qat import quantize_aware  # noqa: E402


class StepClock(Callback):
    """perf_counter at every train step end."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_step_end(self, run_context) -> None:
        self.ends.append(time.perf_counter())


class TinyCNN(nn.Cell):
    """The digits CNN of examples/mindspore_qat.py (1 x 8 x 8 inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, pad_mode="valid", has_bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(4, 8, 3, stride=2, pad_mode="valid", has_bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.relu2 = nn.ReLU()
        self.flatten = nn.Flatten()
        self.logits = nn.Dense(32, 10)

    def construct(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        return self.logits(self.flatten(self.relu2(self.bn2(self.conv2(x)))))


def tiny_data(steps: int):
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (32 * steps, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 32 * steps).astype(np.int32)
    return ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(32)


def model_of(net: nn.Cell) -> Model:
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return Model(net, loss, nn.Momentum(net.trainable_params(), 0.01, 0.9))


def intervals(model: Model, dataset) -> list[float]:
    clock = StepClock()
    model.train(1, dataset, callbacks=[clock], dataset_sink_mode=False)
    return list(np.diff(clock.ends))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--tiny", action="store_true", help="the digits CNN (8x8, batch 32)")
    args = parser.parse_args()
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
    pooled: dict[str, list[float]] = {name: [] for name in models}
    for r in range(args.repeat):
        order = list(models) if r % 2 == 0 else list(models)[::-1]
        for name in order:
            pooled[name] += intervals(models[name], datasets[name])
    step = {name: float(np.median(v)) for name, v in pooled.items()}
    print(f"steps per run {args.steps}, rounds {args.repeat}, input {args.size}x{args.size}")
    print(f"plain step  {step['plain'] * 1e3:8.2f} ms")
    print(f"QAT step    {step['qat'] * 1e3:8.2f} ms")
    print(f"QAT step x  {step['qat'] / step['plain']:8.2f}   (goal <= 1.5)")


if __name__ == "__main__":
    main()
