"""Data-parallel calibration under msrun (2 CPU workers, GRAPH_MODE): the merged record equals a
single-process calibration over the union of the ranks' batches (minmax exactly, HFMG within the
0.5 % of scale_d docs/keras.md states for merged histograms), rank 0 alone writes, every rank
gets the same record; ``merge_ranks=False`` calibrates each rank alone; SelectivePruneCallback
keeps the ranks' weights 2:4 and writes once; a NaN on one rank stops both at the same step
naming the rank; a rank count that does not divide the data is refused before any step.

Every run is in one ``msrun --worker_num=2`` of tests/mindspore/ms_dp_worker.py (case ``all``),
with the venv's ``bin`` first on PATH (msrun starts ``python`` from PATH), under a timeout as a
backstop: a rank left waiting after a failed run would hang the runs after it. The reference
runs here, single process, on the same net, data and batches (rank 0's batch k and rank 1's
batch k together: the same samples a data-parallel step sees).
"""

from __future__ import annotations

from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from ms_dp_worker import (
    ALL,
    BATCH,
    FAIL,
    SAMPLES,
    make_data,
    make_model,
    make_net,
    shard_batches,
)
from msrun import WORLD, read_reports, run_workers

from amct_bridge.mindspore import QuantCalibration
from amct_bridge.records import load
from amct_bridge.records.calibration import load_stats, sidecar_path

WORKER = Path(__file__).with_name("ms_dp_worker.py")


def _union_dataset(x: np.ndarray, y: np.ndarray) -> ds.Dataset:
    """Single process: batch k = rank 0's batch k + rank 1's batch k (2 * BATCH samples)."""

    def union(a):
        shards = [shard_batches(a, WORLD, r) for r in range(WORLD)]
        return np.concatenate([np.concatenate(b) for b in zip(*shards, strict=True)])

    return ds.NumpySlicesDataset((union(x), union(y)), ["x", "y"], shuffle=False).batch(
        WORLD * BATCH
    )


def _reference(tmp: Path, case: str, algorithm: str, samples: int):
    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        x, y = make_data(samples)
        net = make_net()
        model = make_model(net, case == "train")
        options = {"num_of_bins": 1024} if algorithm == "hfmg" else None
        path = tmp / "single.txt"
        cb = QuantCalibration(path, algorithm=algorithm, algorithm_options=options)
        if case == "train":
            model.train(1, _union_dataset(x, y), callbacks=[cb], dataset_sink_mode=False)
        else:
            model.eval(_union_dataset(x, y), callbacks=[cb])
        weights = {n: p.asnumpy() for n, p in net.parameters_and_names()}
        return load(path), load_stats(sidecar_path(path)), weights
    finally:
        ms.set_context(mode=before)


@pytest.fixture(scope="module")
def all_runs(once):
    """One msrun, every run in turn (ms_dp_worker.ALL, the two failing ones last), shared with
    test_ms_qat_dataparallel.py: one start-up of the workers instead of eight."""
    out = once("dp_all", lambda out: run_workers(WORKER, out, ["all", "-", str(SAMPLES)], 300))
    return out, dict(enumerate(read_reports(out)))


def _check_ranks_agree(reports: dict, run: str) -> None:
    for r in range(WORLD):
        assert "error" not in reports[r]["runs"][run], reports[r]["runs"][run]["error"]
    # every rank returns the same factors
    assert reports[0]["runs"][run]["layers"] == reports[1]["runs"][run]["layers"]


def test_only_rank0_writes(all_runs):
    out, reports = all_runs
    assert sorted(reports[0]["runs"]) == sorted(f"{t}-{a}" for t, a in ALL)
    # the only files besides the test's own (ranks/, log/) are rank 0's records and sidecars; the
    # failed runs (nan, odd) wrote nothing, not even a temporary file
    runs = [f"{t}-{a}.txt" for t, a in ALL if t not in ("local", "prune", *FAIL)]
    expect = sorted([*runs, *(f"{r}.calib.json" for r in runs), "prune.txt"])
    assert sorted(p.name for p in (out / "record").iterdir()) == expect
    allowed = ("record", "local", "ranks", "log", "qat")  # qat: test_ms_qat_dataparallel.py's
    assert not [p for p in out.iterdir() if p.name not in allowed]


@pytest.mark.parametrize("algorithm", ["minmax", "hfmg"])
def test_eval_calibration_merges_ranks(all_runs, tmp_path, algorithm):
    out, reports = all_runs
    _check_ranks_agree(reports, f"eval-{algorithm}")
    path = out / "record" / f"eval-{algorithm}.txt"
    merged, stats = load(path), load_stats(sidecar_path(path))
    single, single_stats, _ = _reference(tmp_path, "eval", algorithm, SAMPLES)
    assert stats.batches == 4 * WORLD  # every rank's batches (the reference counts 4 doubles)
    assert sorted(merged.layers) == sorted(single.layers)
    for key, ref in single.layers.items():
        got = merged.layers[key]
        assert got.scale_w == pytest.approx(ref.scale_w, rel=1e-6), key
        if algorithm == "minmax":
            assert (got.scale_d, got.offset_d) == (ref.scale_d, ref.offset_d), key
        else:
            assert got.scale_d == pytest.approx(ref.scale_d, rel=0.005), key
            assert abs(got.offset_d - ref.offset_d) <= 1, key
    # sidecar ranges: the min/max of what the kernels computed; a worker's matmul and the
    # single process's may sum in another order (threads, batch size): within 1e-6 relative
    # (a few float32 ulps), the same extreme element
    for key, ref in single_stats.layers.items():
        got = stats.layers[key]
        assert got.output.min == pytest.approx(ref.output.min, rel=1e-6, abs=1e-12), key
        assert got.output.max == pytest.approx(ref.output.max, rel=1e-6, abs=1e-12), key


def test_train_calibration_merges_ranks(all_runs, tmp_path):
    out, reports = all_runs
    _check_ranks_agree(reports, "train-minmax")
    merged = load(out / "record" / "train-minmax.txt")
    single, _, weights = _reference(tmp_path, "train", "minmax", SAMPLES)
    mine = [reports[r]["runs"]["train-minmax"]["weights"] for r in range(WORLD)]
    for name, value in weights.items():  # the data-parallel steps are the single-process ones
        np.testing.assert_allclose(mine[0][name], value, rtol=1e-4, atol=1e-6)
        assert mine[0][name] == mine[1][name]
    for key, ref in single.layers.items():
        got = merged.layers[key]
        # float tolerance: the union steps' activations equal up to the gradient sum's order
        assert got.scale_d == pytest.approx(ref.scale_d, rel=1e-5), key
        assert got.offset_d == ref.offset_d, key
        assert got.scale_w == pytest.approx(ref.scale_w, rel=1e-5), key


def test_merge_ranks_false_calibrates_each_rank_alone(all_runs, tmp_path):
    """merge_ranks=False: each rank's record is a single-process calibration of its own shard."""
    out, reports = all_runs
    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        x, y = make_data(SAMPLES)
        for r in range(WORLD):
            assert "error" not in reports[r]["runs"]["local-minmax"]
            shard = ds.NumpySlicesDataset(
                (x[r::WORLD], y[r::WORLD]), ["x", "y"], shuffle=False
            ).batch(BATCH)
            path = tmp_path / f"single{r}.txt"
            make_model(make_net(), False).eval(
                shard, callbacks=[QuantCalibration(path, algorithm="minmax")]
            )
            assert load(out / "local" / f"rank{r}.txt") == load(path)
        assert load(out / "local" / "rank0.txt") != load(out / "local" / "rank1.txt")
    finally:
        ms.set_context(mode=before)


def test_selective_prune_under_msrun(all_runs):
    """SelectivePruneCallback in a data-parallel Model.train: both ranks keep the same 2:4
    weights; rank 0's record (the only one written) is prune_record's for them."""
    from amct_bridge.mindspore import prune_record, selective_masks

    out, reports = all_runs
    weights = [reports[r]["runs"]["prune--"]["weights"] for r in range(WORLD)]
    assert weights[0] == weights[1]
    net = make_net()
    for name, p in net.parameters_and_names():
        p.set_data(ms.Tensor(np.asarray(weights[0][name], np.float32)))
    for cell in (net[0], net[2], net[5]):
        w = np.moveaxis(cell.weight.asnumpy() != 0, 1, -1)  # input channels last
        w = np.pad(w, [(0, 0)] * (w.ndim - 1) + [(0, -w.shape[-1] % 4)])  # 3 -> a run of 4
        assert (w.reshape(*w.shape[:-1], -1, 4).sum(-1) == 2).all()
    shape = (1, 3, 6, 6)
    expect = prune_record(
        net, shape, channel=False, selective=True, masks=selective_masks(net, shape)
    )
    assert load(out / "record" / "prune.txt", flavor="inner") == expect


def test_a_nan_on_one_rank_stops_every_rank_at_that_step(all_runs):
    _, reports = all_runs  # test_only_rank0_writes: no record file of this run
    for r in range(WORLD):
        run = reports[r]["runs"]["nan-minmax"]
        error = run.get("error", "")
        assert "rank 1 of 2 failed in calibration step 2" in error, error
        assert "contains NaN or Inf" in error and "batch 1" in error, error
        assert error.count("no record written") == 1, error  # issue 33 §5: said twice before
        assert run["error_after_seconds"] < 60  # at that step, not after a timeout


def test_a_rank_count_that_does_not_divide_the_data_is_refused(all_runs):
    _, reports = all_runs  # test_only_rank0_writes: no record file of this run
    for r in range(WORLD):
        error = reports[r]["runs"]["odd-minmax"].get("error", "")
        assert "all 2 ranks failed in the dataset check" in error, error
        assert "NumpySlicesDataset has 33 samples, which 2 ranks cannot share evenly" in error
        assert "drop 1 or add 1" in error


def test_dataset_check_without_msrun(caplog):
    """The dataset rules themselves (no collective: the rank-local part of check_dataset)."""
    from amct_bridge.errors import CalibrationError
    from amct_bridge.mindspore.distributed import Group, _check_dataset

    x, y = make_data(8)
    group = Group(0, 2)

    def data(**shards):
        return ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False, **shards).batch(2)

    _check_dataset(data(num_shards=2, shard_id=0), group)  # 8 samples, 2 ranks: fine
    with pytest.raises(CalibrationError, match=r"num_shards=4, but the run has 2 ranks"):
        _check_dataset(data(num_shards=4, shard_id=0), group)
    with caplog.at_level("WARNING", logger="amct_bridge.mindspore.distributed"):
        _check_dataset(data(), group)
    assert "the dataset is not sharded" in caplog.text and "counts 2 times" in caplog.text
