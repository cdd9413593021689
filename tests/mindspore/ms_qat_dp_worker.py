"""One rank of a data-parallel QAT run, started by ``msrun`` (tests/mindspore/
test_ms_qat_dataparallel.py), on the tiny net and data of ms_dp_worker.py.

``python ms_qat_dp_worker.py OUT SAMPLES`` under msrun (or ``ms_dp_worker.py OUT all - SAMPLES``,
which runs these after its own into ``OUT/qat``) runs, one after the other:

* ``ema`` / ``learned``: ``quantize_aware(net, "INT8", activation_range=...)``, ``Model.train``
  (SGD, 1 epoch, sharded data), then ``save_qat_record`` to ``OUT/record<rank>/qat-<mode>.txt``
  (a directory per rank, so the test sees which rank wrote);
* ``fail``: rank 0 saves the trained ``ema`` network, rank 1 a fresh QAT network that never
  trained (``fail.txt``);
* ``weights``: rank 1 changes one kernel of the ``ema`` network first (``weights.txt``);
* ``sites``: the ``ema`` run on :func:`shared_relu_net`, whose one ReLU cell is called at two
  sites (per-site ranges, ``qat-sites.txt``).

Each rank writes ``OUT/ranks/rank<r>.json``: per run the record text it got (or the error), its
QAT range Parameters and kernels before the save, the warnings logged, the seconds taken.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
from ms_dp_worker import BATCH, make_data, make_model, make_net, start_rank


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname}: {record.getMessage()}")


def shared_relu_net():
    """ms_dp_worker.make_net's layers with one ReLU cell called at two sites (input 3x6x6)."""
    from mindspore import nn

    class SharedRelu(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            seq = make_net()
            self.conv1, self.conv2, self.flatten, self.fc = seq[0], seq[2], seq[4], seq[5]
            self.relu = nn.ReLU()

        def construct(self, x):
            return self.fc(self.flatten(self.relu(self.conv2(self.relu(self.conv1(x))))))

    return SharedRelu()


def _state(qat) -> dict:
    params = {p.name: p.asnumpy() for p in qat.get_parameters()}  # the record's names
    ranges = {n: v.tolist() for n, v in params.items() if ".qat." in n}  # per-site: lists
    kernels = {n: v.tolist() for n, v in params.items() if n.endswith(".weight")}
    return {"ranges": ranges, "kernels": kernels}


def _save(qat, path: Path, keep: _Keep) -> dict:
    from amct_bridge.mindspore.qat import save_qat_record
    from amct_bridge.records import dumps

    keep.messages.clear()
    start = time.perf_counter()
    out: dict = {}
    try:
        out["text"] = dumps(save_qat_record(qat, path), "inner")
    except Exception as err:  # recorded; the process ends normally (msrun waits on exceptions)
        out["error"] = f"{type(err).__name__}: {err}"
    out["seconds"] = time.perf_counter() - start
    out["log"] = list(keep.messages)
    return out


def main(out: Path, samples: int) -> None:
    run_all(out, samples, *start_rank())


def run_all(out: Path, samples: int, rank: int, world: int) -> None:
    """Every run above, on a rank already started (ms_dp_worker.start_rank); also called from
    ms_dp_worker's case ``all``, so that one msrun serves both test modules."""
    from mindspore import Tensor
    from mindspore import dataset as ds

    from amct_bridge.mindspore.qat import quantize_aware, strip_qat

    records = out / f"record{rank}"  # each rank names its own directory: rank 1's stays empty
    records.mkdir(parents=True, exist_ok=True)
    keep = _Keep()
    logger = logging.getLogger("amct_bridge.mindspore.qat.model")
    logger.addHandler(keep)
    logger.setLevel(logging.INFO)
    x, y = make_data(samples)
    report: dict = {"rank": rank, "world": world, "runs": {}}
    trained = {}
    for mode in ("ema", "learned"):
        data = ds.NumpySlicesDataset(
            (x, y), ["x", "y"], shuffle=False, num_shards=world, shard_id=rank
        ).batch(BATCH)
        qat = quantize_aware(make_net(), "INT8", activation_range=mode)
        make_model(qat, True).train(1, data, dataset_sink_mode=False)
        run = _state(qat)
        run.update(_save(qat, records / f"qat-{mode}.txt", keep))
        plain = strip_qat(qat)  # a deep copy: the learned cells hold an AllReduce
        run["stripped_equal"] = all(
            np.array_equal(p.asnumpy(), np.asarray(run["kernels"][p.name], np.float32))
            for p in plain.get_parameters()
            if p.name.endswith(".weight")
        )
        report["runs"][mode] = run
        trained[mode] = qat
    data = ds.NumpySlicesDataset(
        (x, y), ["x", "y"], shuffle=False, num_shards=world, shard_id=rank
    ).batch(BATCH)
    qat = quantize_aware(shared_relu_net(), "INT8", sample_input=(1, 3, 6, 6))
    make_model(qat, True).train(1, data, dataset_sink_mode=False)
    run = _state(qat)
    run.update(_save(qat, records / "qat-sites.txt", keep))
    report["runs"]["sites"] = run
    qat = trained["ema"] if rank == 0 else quantize_aware(make_net(), "INT8")
    report["runs"]["fail"] = _save(qat, records / "fail.txt", keep)
    qat = trained["ema"]
    if rank == 1:
        w = qat.parameters_dict()["2.weight"]
        w.set_data(Tensor(w.asnumpy() * np.float32(1.001)))
    report["runs"]["weights"] = _save(qat, records / "weights.txt", keep)
    ranks = out / "ranks"
    ranks.mkdir(parents=True, exist_ok=True)
    tmp = ranks / f".rank{rank}.json"
    tmp.write_text(json.dumps(report))
    tmp.replace(ranks / f"rank{rank}.json")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
