"""MindSpore data-parallel calibration with ``msrun``: every rank runs this script on its shard
of the data; ``QuantCalibration`` merges the ranks' statistics, rank 0 writes one record for all
of the data, and every rank gets the same record back.

The CLI (``amct-bridge calibrate --mindspore``) runs one process: to calibrate over several
devices, add the callback to your own training or evaluation script and start it with msrun, as
here. The data is synthetic (no download); the net is a small conv net; GRAPH_MODE on the CPU.

Run (2 workers on this machine; msrun starts ``python`` from PATH, so the venv's ``bin`` first)::

    PATH=$PWD/.venv/bin:$PATH msrun --worker_num=2 --local_worker_num=2 --master_port=8118 \\
        --log_dir=msrun_log --join=True examples/mindspore_msrun_calibrate.py --out out_dp

Each worker's output is in ``msrun_log/worker_<rank>.log``; the record is
``out_dp/record.txt`` (+ ``record.txt.calib.json``). ``--train`` calibrates on the training
batches of ``Model.train`` (gradients averaged across ranks) instead of ``Model.eval``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.context import ParallelMode
from mindspore.train import Model

from amct_bridge.mindspore import QuantCalibration

SAMPLES = 64  # the rank count must divide it (else the sampler repeats samples: refused)


def make_net() -> nn.Cell:
    ms.set_seed(0)  # the same initial weights on every rank
    return nn.SequentialCell(
        [
            nn.Conv2d(3, 8, 3, has_bias=True),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, stride=2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Dense(8 * 4 * 4, 3),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out_dp"))
    parser.add_argument("--train", action="store_true", help="calibrate in Model.train")
    args = parser.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE)
    init()  # msrun gives each process its rank
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, world = get_rank(), get_group_size()

    rng = np.random.default_rng(0)  # the same full dataset on every rank, sharded below
    x = rng.normal(size=(SAMPLES, 3, 8, 8)).astype(np.float32)
    y = (np.arange(SAMPLES) % 3).astype(np.int32)
    data = ds.NumpySlicesDataset(
        (x, y), ["x", "y"], shuffle=False, num_shards=world, shard_id=rank
    ).batch(8)

    net = make_net()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    # every rank gets the same arguments; only rank 0 writes the record (the others write
    # nothing), so a path that only rank 0 can write is fine
    args.out.mkdir(parents=True, exist_ok=True)
    cb = QuantCalibration(args.out / "record.txt", algorithm="hfmg")
    if args.train:
        model = Model(net, loss, nn.Momentum(net.trainable_params(), 0.01, 0.9))
        model.train(1, data, callbacks=[cb], dataset_sink_mode=False)
    else:
        model = Model(net, loss, metrics={"acc"})
        model.eval(data, callbacks=[cb])
    first = sorted(cb.written.layers)[0]
    layer = cb.written.layers[first]
    print(
        f"rank {rank}/{world}: record of all {SAMPLES} samples, layer {first!r} scale_d "
        f"{layer.scale_d:.6g} offset_d {layer.offset_d}"
        + (f"; written to {args.out / 'record.txt'}" if rank == 0 else " (rank 0 wrote it)")
    )


if __name__ == "__main__":
    main()
