"""One rank of a data-parallel calibration run, started by ``msrun`` (tests/mindspore/
test_ms_dataparallel.py, benchmarks/bench_mindspore_dp.py). Also the tiny net and the data the
single-process references use (importable without MindSpore's communication).

``python ms_dp_worker.py OUT CASE ALGORITHM SAMPLES`` under msrun. CASE:

* ``eval``: ``Model.eval`` with QuantCalibration(ALGORITHM);
* ``train``: ``Model.train`` (SGD, 1 epoch) with QuantCalibration(ALGORITHM);
* ``all``: the runs of :data:`ALL` one after the other (eval minmax, eval hfmg, train minmax,
  eval minmax with ``merge_ranks=False``, train with SelectivePruneCallback), the QAT runs of
  tests/mindspore/ms_qat_dp_worker.py (into ``OUT/qat``), then the two that must fail: ``nan``
  (as the case below) and ``odd`` (eval on one sample more than the ranks can share);
* ``nan``: ``eval`` where rank 1's second batch holds a NaN;
* ``bench`` / ``bench-train``: ``eval`` / ``train``, timing the cross-rank merge at the end and
  the per-step agreement.

Each rank writes ``OUT/ranks/rank<r>.json``: per run (``"<task>-<algorithm>"``) the record it got
(``cb.written``: per layer scale_d, offset_d, scale_w), the error if any, the final weights
(train); timings. The records go to ``OUT/record/<task>-<algorithm>.txt`` (rank 0 only).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

BATCH = 4  # per rank


def make_net():
    """conv(3->4, bias) + ReLU + conv(4->4) + ReLU + Flatten + Dense: no BatchNorm, so a
    data-parallel step equals a single-process step on the union batch (BN in training would
    normalise over each rank's batch)."""
    import mindspore as ms
    from mindspore import Tensor, nn

    ms.set_seed(0)
    net = nn.SequentialCell(
        [
            nn.Conv2d(3, 4, 3, has_bias=True),
            nn.ReLU(),
            nn.Conv2d(4, 4, 3),
            nn.ReLU(),
            nn.Flatten(),
            nn.Dense(4 * 6 * 6, 3),
        ]
    )
    rng = np.random.default_rng(0)
    for _, p in net.parameters_and_names():
        p.set_data(Tensor(rng.normal(0.0, 0.4, p.shape).astype(np.float32)))
    return net


def make_data(samples: int) -> tuple[np.ndarray, np.ndarray]:
    """``samples`` inputs (N, 3, 6, 6) whose range grows with the index, and labels."""
    rng = np.random.default_rng(7)
    x = (
        rng.standard_t(4, (samples, 3, 6, 6))
        * (1 + np.arange(samples) / samples)[:, None, None, None]
    )
    return x.astype(np.float32), (np.arange(samples) % 3).astype(np.int32)


def shard_batches(x: np.ndarray, world: int, rank: int, batch: int = BATCH) -> list[np.ndarray]:
    """What MindSpore's DistributedSampler gives rank ``rank`` (samples rank, rank + world, ...;
    measured with NumpySlicesDataset(shuffle=False)), in batches."""
    mine = x[rank::world]
    return [mine[i : i + batch] for i in range(0, len(mine), batch)]


def make_model(net, train: bool):
    from mindspore import nn
    from mindspore.train import Model

    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05) if train else None
    return Model(net, loss, opt, metrics=None if train else {"acc"})


#: case "all": the runs of one msrun (one start-up of the workers for all of them; each start-up
#: costs about 15 s of the suite). The last two fail on purpose and end with the ranks agreeing.
ALL = (
    ("eval", "minmax"),
    ("eval", "hfmg"),
    ("train", "minmax"),
    ("local", "minmax"),
    ("prune", "-"),
    ("nan", "minmax"),
    ("odd", "minmax"),
)
FAIL = ("nan", "odd")
QAT = ("qat", "-")
#: the samples of case "all" (4 batches per rank)
SAMPLES = 4 * 2 * BATCH


def start_rank() -> tuple[int, int]:
    """GRAPH_MODE, the communication set up, data parallel: ``(rank, world)``."""
    import mindspore as ms
    from mindspore.communication import get_group_size, get_rank, init
    from mindspore.context import ParallelMode

    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
    return get_rank(), get_group_size()


def main(out: Path, case: str, algorithm: str, samples: int) -> None:
    start = time.perf_counter()
    rank, world = start_rank()
    (out / "record").mkdir(parents=True, exist_ok=True)
    timing = {"merge": 0.0, "steps_agree": 0.0}
    agree_each: list[float] = []
    if case.startswith("bench"):  # time the cross-rank work (what data parallelism adds to a run)
        _time_collectives(timing, agree_each)
    if case == "all":  # and ms_qat_dp_worker's runs (OUT/qat), before the two failing ones
        runs = [*(r for r in ALL if r[0] not in FAIL), QAT, *(r for r in ALL if r[0] in FAIL)]
    else:
        runs = (("train" if case in ("train", "bench-train") else "eval", algorithm),)
    report: dict = {"rank": rank, "world": world, "runs": {}}
    for task, alg in runs:
        if (task, alg) == QAT:
            from ms_qat_dp_worker import run_all

            run_all(out / "qat", samples, rank, world)
            continue
        one = _run(out, case, task, alg, samples, rank, world)
        report["runs"][f"{task}-{alg}"] = one
        if "error" in one and task not in FAIL:
            break
    report.update({f"{k}_seconds": v for k, v in timing.items()})
    report["agree_each"] = agree_each
    report["process_seconds"] = time.perf_counter() - start
    _dump(out, rank, report)


def _run(out: Path, case: str, task: str, algorithm: str, samples: int, rank: int, world: int):
    """One Model.eval / train with QuantCalibration writing ``record/<task>-<algorithm>.txt``;
    task "local": Model.eval with ``merge_ranks=False`` writing ``local/rank<r>.txt``; tasks "nan"
    and "odd": Model.eval on rank 1's NaN batch / on ``samples + 1`` samples."""
    from mindspore import dataset as ds

    from amct_bridge.mindspore import QuantCalibration, SelectivePruneCallback

    x, y = make_data(samples + (task == "odd"))
    if "nan" in (case, task) and rank == 1:
        x[1 + world * BATCH, 0, 0, 0] = np.nan  # rank 1's second batch
    data = ds.NumpySlicesDataset(
        (x, y), ["x", "y"], shuffle=False, num_shards=world, shard_id=rank
    ).batch(BATCH)
    net = make_net()
    train = task in ("train", "prune")  # nan, odd: eval
    model = make_model(net, train)
    if task == "prune":  # SelectivePruneCallback: 2:4 on every rank, rank 0 writes the record
        cb = SelectivePruneCallback(out / "record" / "prune.txt")
        model.train(1, data, callbacks=[cb], dataset_sink_mode=False)
        return {"weights": {n: p.asnumpy().tolist() for n, p in net.parameters_and_names()}}
    options = {"num_of_bins": 1024} if algorithm == "hfmg" else None
    path = out / "record" / f"{task}-{algorithm}.txt"
    if task == "local":
        path = out / "local" / f"rank{rank}.txt"
        path.parent.mkdir(exist_ok=True)
    cb = QuantCalibration(
        path, algorithm=algorithm, algorithm_options=options, merge_ranks=task != "local"
    )
    report: dict = {}
    run_start = time.perf_counter()
    try:
        if train:
            model.train(1, data, callbacks=[cb], dataset_sink_mode=False)
        else:
            model.eval(data, callbacks=[cb])
    except Exception as err:
        # recorded, and the process ends normally: msrun waits about a minute for ranks that
        # end with an exception (measured), the test needs only the messages and the step
        report["error"] = f"{type(err).__name__}: {err}"
        report["error_after_seconds"] = time.perf_counter() - run_start
        return report
    report["run_seconds"] = time.perf_counter() - run_start
    report["layers"] = {
        k: {"scale_d": f.scale_d, "offset_d": f.offset_d, "scale_w": list(f.scale_w)}
        for k, f in cb.written.layers.items()
    }
    if train:
        report["weights"] = {n: p.asnumpy().tolist() for n, p in net.parameters_and_names()}
    return report


def _time_collectives(timing: dict, agree_each: list) -> None:
    from amct_bridge.mindspore import callback as callback_module
    from amct_bridge.mindspore import session as session_module

    def timed(fn, key):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                timing[key] += time.perf_counter() - t0
                if key == "steps_agree":
                    agree_each.append(time.perf_counter() - t0)

        return run

    # the end-of-run merge: the agreement before it, the merge, the agreement after writing
    session_module.agree = timed(session_module.agree, "merge")
    session_module.merge_observed = timed(session_module.merge_observed, "merge")
    callback_module.agree = timed(callback_module.agree, "steps_agree")  # once per step


def _dump(out: Path, rank: int, report: dict) -> None:
    ranks = out / "ranks"
    ranks.mkdir(parents=True, exist_ok=True)
    tmp = ranks / f".rank{rank}.json"
    tmp.write_text(json.dumps(report))
    tmp.replace(ranks / f"rank{rank}.json")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]))
