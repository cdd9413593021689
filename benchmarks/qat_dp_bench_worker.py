"""One process of ``bench_mindspore_qat_dp.py``: QAT training steps timed, under ``msrun`` (one
rank of a 2-worker data-parallel run) or alone (the single-process baseline).

``python qat_dp_bench_worker.py OUT STEPS REPEAT {dp,single}``: the tiny net and data of
tests/mindspore/ms_dp_worker.py (conv 3->4, conv 4->4, Dense; 3 quantized cells, no BN), batches
of 4 per process (the rank's shard under msrun, the first rank's shard alone). Three models,
each with its own ``Model`` (SGD) and dataset: ``plain`` (the float net), ``ema`` and ``learned``
(``quantize_aware(..., activation_range=...)``; under msrun the learned cells hold the
cross-rank AllReduce of the first-batch range). A warm-up epoch each (compile, the collective's
set-up), then ``REPEAT`` rounds of one epoch of ``STEPS`` batches per model, the model order
turned each round; per model the step-end-to-step-end wall and CPU intervals after each epoch's
first step. Writes ``OUT/<dp|single>/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "mindspore"))
from ms_dp_worker import BATCH, make_data, make_model, make_net  # noqa: E402

MODES = ("plain", "ema", "learned")


def main(out: Path, steps: int, repeat: int, kind: str) -> None:
    import mindspore as ms
    from mindspore import dataset as ds
    from mindspore.train import Callback

    from amct_bridge.mindspore.qat import quantize_aware

    class Clock(Callback):
        def __init__(self) -> None:
            self.wall: list[float] = []
            self.cpu: list[float] = []

        def on_train_step_end(self, run_context) -> None:
            self.wall.append(time.perf_counter())
            self.cpu.append(time.process_time())

    ms.set_context(mode=ms.GRAPH_MODE)
    rank, world = 0, 2
    if kind == "dp":
        from mindspore.communication import get_group_size, get_rank, init
        from mindspore.context import ParallelMode

        init()
        ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
        rank, world = get_rank(), get_group_size()
    x, y = make_data(steps * BATCH * world)
    # alone: the first rank's shard, so each process steps through batches of the same size
    shard = dict(num_shards=world, shard_id=rank) if kind == "dp" else {}
    if kind == "single":
        x, y = x[::world], y[::world]
    models, data = {}, {}
    for mode in MODES:
        net = make_net() if mode == "plain" else quantize_aware(make_net(), activation_range=mode)
        models[mode] = make_model(net, True)
        data[mode] = ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False, **shard).batch(BATCH)

    def epoch(mode: str) -> tuple[list[float], list[float]]:
        clock = Clock()
        models[mode].train(1, data[mode], callbacks=[clock], dataset_sink_mode=False)
        return [float(v) for v in np.diff(clock.wall)], [float(v) for v in np.diff(clock.cpu)]

    report: dict = {"rank": rank, "world": world, "kind": kind, "compile": {}}
    for mode in MODES:
        start = time.perf_counter()
        epoch(mode)
        report["compile"][mode] = time.perf_counter() - start
    wall: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(repeat):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            w, c = epoch(mode)
            wall[mode] += w
            cpu[mode] += c
    report["wall"], report["cpu"] = wall, cpu
    report["load"] = os.getloadavg()[0]
    where = out / kind
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / f".rank{rank}.json"
    tmp.write_text(json.dumps(report))
    tmp.replace(where / f"rank{rank}.json")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
