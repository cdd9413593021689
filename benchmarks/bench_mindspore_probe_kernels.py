"""Kernel time of the calibration probes per GRAPH_MODE ``Model.eval`` step (MindSpore profiler).

Run: ``.venv/bin/python benchmarks/bench_mindspore_probe_kernels.py [--algorithms minmax hfmg]``.

The small ResNet of ``bench_mindspore_instrument.py`` (batch 8, 32 x 32) runs ``Model.eval``
with ``QuantCalibration`` (warm-up run first, then ``--steps`` profiled steps) under
``mindspore.profiler.Profiler`` (CPU activity). From its per-kernel timestamps, printed per
algorithm: the number of probe kernels (those under a ``Probe`` cell's scope and not inside the
wrapped cell, plus expanded ``Mul``s), their time per step (the sum over those kernels of each
one's median duration over the steps), the network's own kernels the same way, and the probe
kernel types that cost most.

Why kernel time and not step ratios: on a shared 2-core VM the convolutions (multi-threaded)
slow down far more under load than the probes' small single-threaded kernels, so step ratios
from ``bench_mindspore_callback.py`` hide the probes' share; a kernel's median is close to its
time on an idle machine. Run it from a checkout with ``PYTHONPATH`` pointing at another one to
compare versions.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
import tempfile

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.profiler import Profiler, ProfilerActivity

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mindspore_instrument import SmallResNet, data  # noqa: E402

from amct_bridge.mindspore import QuantCalibration  # noqa: E402


def is_probe(name: str) -> bool:
    """A probe's own kernel: under a Probe scope, not inside the cell it wraps."""
    return ("Probe/" in name and "/cell-" not in name) or name.startswith("Expand/")


def kernel_times(folder: str) -> tuple[dict[str, float], int]:
    """Full kernel name -> median duration (ms) over the steps, and the number of steps."""
    found = glob.glob(os.path.join(folder, "*", "FRAMEWORK", "cpu_op_execute_timestamp_*.txt"))
    if not found:
        raise SystemExit(f"no profiler timestamps under {folder}")
    out, steps = {}, 0
    for line in open(found[0], encoding="utf-8"):
        name, _, rest = line.strip().split(";", 2)
        durations = [float(e.split(",")[1]) for e in rest.split()]
        out[name] = float(np.median(durations))
        steps = max(steps, len(durations))
    return out, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--algorithms", nargs="+", default=["minmax", "hfmg"])
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    print(f"SmallResNet, batch 8, 32x32, GRAPH_MODE Model.eval, {args.steps} profiled steps; "
          "ms per step = sum of kernel medians")  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        for algorithm in args.algorithms:
            ms.set_seed(0)
            net = SmallResNet()
            loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
            model = ms.Model(net, loss_fn=loss, metrics={"loss"})
            record = os.path.join(out, f"{algorithm}.txt")
            model.eval(data(2, 32), callbacks=[QuantCalibration(record, algorithm=algorithm)])
            folder = os.path.join(out, f"profile_{algorithm}")
            profiler = Profiler(output_path=folder, activities=[ProfilerActivity.CPU])
            model.eval(
                data(args.steps, 32), callbacks=[QuantCalibration(record, algorithm=algorithm)]
            )
            profiler.stop()
            profiler.analyse()
            times, _ = kernel_times(folder)
            probe = {k: v for k, v in times.items() if is_probe(k)}
            by_type: collections.Counter = collections.Counter()
            for name, ms_ in probe.items():
                by_type[name.rsplit("/", 1)[-1].split("-op")[0]] += ms_
            own = sum(v for k, v in times.items() if not is_probe(k))
            top = ", ".join(f"{t} {v:.1f}" for t, v in by_type.most_common(4))
            total = sum(probe.values())
            print(f"{algorithm:7} probe kernels {len(probe):4}  {total:6.1f} ms/step  "
                  f"network kernels {own:7.1f} ms/step  | {top}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
