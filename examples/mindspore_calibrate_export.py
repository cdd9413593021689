"""MindSpore end to end: train a tiny ResNet-block network, calibrate it inside ``Model.eval``
with the ``QuantCalibration`` callback, check the fake-quantized accuracy with ``simulate``,
find its pruning groups and export it to ESP-DL v1 (then run the export on the chip simulator).

The data is synthetic (no download): 8x8 RGB images of 3 classes, class ``k`` brighter in
channel ``k`` and in one quadrant. Runs in GRAPH_MODE (``--pynative`` for PyNative) on the CPU in
well under a minute; outputs go to a temporary directory (or ``--out DIR``).

Run: ``.venv/bin/python examples/mindspore_calibrate_export.py [--out DIR] [--pynative]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn, ops
from mindspore.train import Model

from amct_bridge.espdl.v1.chip import simulate_chip
from amct_bridge.mindspore import (
    QuantCalibration,
    export_espdl,
    prune_discovery,
    prune_record,
    simulate,
)
from amct_bridge.records import load, save, validate


class Block(nn.Cell):
    """ResNet basic block: conv-bn-relu-conv-bn, + identity (functional add), relu."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, 3)
        self.bn2 = nn.BatchNorm2d(c)
        self.relu2 = nn.ReLU()

    def construct(self, x):
        y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(y + x)


class TinyResNet(nn.Cell):
    """Stem conv + BN + ReLU, one residual block, global average pool, Dense."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.block = Block(8)
        self.fc = nn.Dense(8, classes)

    def construct(self, x):
        x = self.block(self.relu(self.bn(self.stem(x))))
        return self.fc(ops.mean(x, (2, 3)))


def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """NCHW float32 images and int32 labels."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n).astype(np.int32)
    x = rng.normal(0.0, 1.0, (n, 3, 8, 8)).astype(np.float32)
    for i, k in enumerate(y):
        x[i, k] += 0.25
        x[i, :, (k % 2) * 4 : (k % 2) * 4 + 4, (k // 2) * 4 : (k // 2) * 4 + 4] += 0.25
    return x, y


def batches(x: np.ndarray, y: np.ndarray, size: int, shuffle: bool = False):
    return ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=shuffle).batch(size)


def run(out: Path, mode: int) -> dict:
    """The whole chain; returns the printed figures."""
    start = time.perf_counter()
    ms.set_context(mode=mode)
    ms.set_seed(0)
    x_train, y_train = synthetic(512, 0)
    x_val, y_val = synthetic(192, 1)
    net = TinyResNet()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Adam(net.trainable_params(), learning_rate=0.01)
    model = Model(net, loss, opt, metrics={"acc"})
    model.train(3, batches(x_train, y_train, 32, shuffle=True))
    figures = {"float accuracy": model.eval(batches(x_val, y_val, 64))["acc"]}

    # 1. calibrate inside Model.eval: 4 batches of the training data
    record = out / "record.txt"
    cb = QuantCalibration(record, algorithm="hfmg", batch_num=4, flavor="inner")
    model.eval(batches(x_train, y_train, 32), callbacks=[cb])
    rec = load(record)
    assert validate(rec) == []
    figures["quantized cells"] = len(rec.layers)

    # 2. simulated (fake-quantized) accuracy before deploying
    figures["simulated accuracy"] = simulate(net, record, x_val, y_val).accuracy

    # 3. pruning groups from the graph (MindIR), written into the inner-flavor record
    found = prune_discovery(net, x_val[:1])
    figures["prune groups"] = len(found.groups)
    save(prune_record(net, x_val[:1], record=rec), out / "record_pruned.txt", flavor="inner")

    # 4. ESP-DL v1 export (NHWC coefficients), then the chip simulator on NHWC data
    res = export_espdl(net, record, out / "espdl", sample_input=x_val[:1], feature_type="s8")
    figures["ESP-DL layers"] = len(res.layers)
    chip = simulate_chip(out / "espdl", x_val.transpose(0, 2, 3, 1))
    logits = chip.output.to_float()
    figures["chip (int8) accuracy"] = float(np.mean(logits.argmax(axis=1) == y_val))
    figures["seconds"] = time.perf_counter() - start
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="output directory (default: a temporary one)")
    parser.add_argument("--pynative", action="store_true", help="run in PyNative mode")
    args = parser.parse_args()
    mode = ms.PYNATIVE_MODE if args.pynative else ms.GRAPH_MODE
    if args.out is None:
        with tempfile.TemporaryDirectory() as tmp:
            figures = run(Path(tmp), mode)
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        figures = run(args.out, mode)
        print(f"outputs in {args.out}: record.txt (+ .calib.json), record_pruned.txt, espdl/")
    for name, value in figures.items():
        print(f"{name:22} {value:.3f}" if isinstance(value, float) else f"{name:22} {value}")


if __name__ == "__main__":
    main()
