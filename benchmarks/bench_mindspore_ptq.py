"""MindSpore post-training ``calibrate()`` in GRAPH_MODE against ``Model.eval`` of the same data.

Run: ``.venv/bin/python benchmarks/bench_mindspore_ptq.py [--images 32] [--size 16] [--repeat 3]``.

Network: the small ResNet of ``bench_mindspore_instrument.py`` (stem, two stages of two basic
blocks, one with a downsample branch; 15 convs, BN, Dense), random weights, ``--images``
images of ``--size`` x ``--size``, batch 8, one ``mindspore.dataset`` of (x, y) used by both.
Per algorithm (issue 23 §4):

- ``first``: ``calibrate()`` of a network made just now divided by ``Model.eval`` of another
  network made just now (both compile their graph: the eval network, or the network with the
  probes in);
- ``again``: a second ``calibrate()`` of the same network and settings divided by a warm
  ``Model.eval`` (compiled by an earlier run) timed just before it.

Ratios are medians of per-run ratios (``--repeat`` runs, each against its own baseline): the
machine is shared and its speed drifts over seconds.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from functools import partial

import mindspore as ms
import numpy as np
from mindspore import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mindspore_instrument import SmallResNet  # noqa: E402

from amct_bridge.mindspore import calibrate  # noqa: E402

ALGORITHMS = ("minmax", "ifmr", "hfmg")


def dataset(images: int, size: int):
    """(x, y) batches of 8, the same for eval and calibration."""
    import mindspore.dataset as ds

    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (images, 3, size, size)).astype(np.float32)
    y = rng.integers(0, 10, images).astype(np.int32)
    return ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(8)


def evaluator(net) -> ms.Model:
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return ms.Model(net, loss_fn=loss, metrics={"loss"})


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def fresh_net() -> nn.Cell:
    ms.set_seed(0)
    return SmallResNet()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    args = parser.parse_args()
    logging.getLogger("amct_bridge").setLevel(logging.ERROR)
    ms.set_context(mode=ms.GRAPH_MODE)
    data = dataset(args.images, args.size)
    out = tempfile.mkdtemp()
    warm = evaluator(fresh_net())
    warm.eval(data, dataset_sink_mode=False)  # compiles its eval network
    print(
        f"MindSpore GRAPH_MODE, small ResNet, {args.images} images {args.size}x{args.size}, "
        f"batch 8, {args.repeat} runs each"
    )
    print(f"{'':<8} {'first s':>8} {'x eval':>7} {'again s':>8} {'x eval':>7}")
    evals, first_evals = [], []
    for algo in args.algorithms.split(","):
        firsts, agains = [], []
        for i in range(args.repeat):
            path = os.path.join(out, f"{algo}{i}.txt")
            first_evals.append(
                timed(lambda: evaluator(fresh_net()).eval(data, dataset_sink_mode=False))
            )
            run = partial(calibrate, fresh_net(), data, path, algorithm=algo)
            firsts.append((timed(run), first_evals[-1]))
            evals.append(timed(lambda: warm.eval(data, dataset_sink_mode=False)))
            agains.append((timed(run), evals[-1]))
        first_ratio = float(np.median([t / b for t, b in firsts]))
        again_ratio = float(np.median([t / b for t, b in agains]))
        print(
            f"{algo:<8} {min(t for t, _ in firsts):>8.3f} {first_ratio:>7.2f} "
            f"{min(t for t, _ in agains):>8.3f} {again_ratio:>7.2f}"
        )
    print(
        f"Model.eval: first (fresh network) best {min(first_evals):.3f} s, median "
        f"{np.median(first_evals):.3f} s; warm best {min(evals):.3f} s, median "
        f"{np.median(evals):.3f} s\n(x eval: median of per-run ratios; first against a fresh "
        "network's first Model.eval, again against a warm one timed just before)"
    )


if __name__ == "__main__":
    main()
