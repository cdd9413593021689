"""Data-parallel QAT under msrun (2 CPU workers, GRAPH_MODE; one start-up for every case: the
runs of tests/mindspore/ms_qat_dp_worker.py inside ms_dp_worker's case ``all``, the msrun that
test_ms_dataparallel.py reads too): ``save_qat_record`` merges the ranks' EMA ranges (the
record equals the core formulas on the steps-weighted mean of both ranks' saved EMA states),
learned ranges are equal on every rank, rank 0 alone writes, both ranks return the same record
text; a rank that saves before any step, or whose weights differ, fails both ranks at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ms_dp_worker import SAMPLES
from msrun import WORLD, read_reports, run_workers

from amct_bridge.quant.arq import arq_scales
from amct_bridge.quant.factors import activation_factors
from amct_bridge.records import load, loads
from amct_bridge.records.calibration import load_stats, sidecar_path

WORKER = Path(__file__).with_name("ms_dp_worker.py")  # case "all" runs ms_qat_dp_worker too
LAYOUTS = {"0": "OIHW", "2": "OIHW", "5": "OI"}  # the quantized cells of ms_dp_worker.make_net


@pytest.fixture(scope="module")
def run(once):
    """The QAT runs of the msrun test_ms_dataparallel.py also reads (the ``once`` fixture)."""
    out = once("dp_all", lambda out: run_workers(WORKER, out, ["all", "-", str(SAMPLES)], 300))
    return out / "qat", [report["runs"] for report in read_reports(out / "qat")]


def _merged(reports: list, mode: str, name: str) -> tuple[float, float, float]:
    """``(min, max, seen)`` of tensor ``name`` ("0.qat.input"): both ranks' values averaged
    weighted by the steps each saw (the EMA is linear: the EMA of the ranks' mean extremes)."""
    got = [reports[r][mode]["ranges"] for r in range(WORLD)]
    seen = np.array([g[f"{name}_seen"] for g in got], np.float64)
    lo = float(np.dot([g[f"{name}_min"] for g in got], seen) / seen.sum())
    hi = float(np.dot([g[f"{name}_max"] for g in got], seen) / seen.sum())
    return lo, hi, float(seen.sum())


def _expected(reports: list, mode: str, key: str):
    lo, hi, _ = _merged(reports, mode, f"{key}.qat.input")
    kernel = np.asarray(reports[0][mode]["kernels"][f"{key}.weight"], np.float32)
    return activation_factors(lo, hi, 8, False), arq_scales(kernel, LAYOUTS[key], True, num_bits=8)


@pytest.mark.parametrize("mode", ["ema", "learned"])
def test_record_merges_both_ranks(run, mode):
    out, reports = run
    for r in range(WORLD):
        assert "error" not in reports[r][mode], reports[r][mode]["error"]
    texts = [reports[r][mode]["text"] for r in range(WORLD)]
    assert texts[0] == texts[1]  # every rank returns the same record
    assert reports[0][mode]["kernels"] == reports[1][mode]["kernels"]
    assert reports[0][mode]["stripped_equal"] and reports[1][mode]["stripped_equal"]  # strip_qat
    path = out / "record0" / f"qat-{mode}.txt"
    record = load(path, flavor="inner")
    assert record == loads(texts[0], flavor="inner")
    assert sorted(record.layers) == sorted(LAYOUTS)
    for key, f in record.layers.items():
        (scale_d, offset_d), scale_w = _expected(reports, mode, key)
        assert f.scale_d == pytest.approx(scale_d, rel=1e-6), key
        assert f.offset_d == offset_d, key
        assert f.scale_w == pytest.approx(scale_w.tolist(), rel=1e-6), key
        assert f.dst_type == "INT8"
    stats = load_stats(sidecar_path(path))
    assert stats.batches == 4 * WORLD  # both ranks' steps
    for key in LAYOUTS:  # the quantized cells' input and output ranges
        lo, hi, _ = _merged(reports, mode, f"{key}.qat.input")
        assert (stats.layers[key].input.min, stats.layers[key].input.max) == pytest.approx(
            (lo, hi), rel=1e-6, abs=1e-7
        )
    for key in ("1", "3"):  # the ReLUs' output EMAs
        lo, hi, _ = _merged(reports, mode, f"{key}.qat.output")
        got = stats.layers[key].output
        assert (got.min, got.max) == pytest.approx((lo, hi), rel=1e-6, abs=1e-7), key


def test_ema_ranges_differ_between_ranks_learned_ones_do_not(run):
    """Each rank's EMA follows its own shard (hence the merge); learned ranges start at the
    min/max of every rank's first batch and the all-reduced gradients move them alike."""
    _, reports = run
    ema = [reports[r]["ema"]["ranges"] for r in range(WORLD)]
    assert ema[0]["2.qat.input_max"] != ema[1]["2.qat.input_max"]
    learned = [reports[r]["learned"]["ranges"] for r in range(WORLD)]
    for name, value in learned[0].items():
        if ".qat.input_m" in name:
            assert learned[1][name] == value, name
    for r in range(WORLD):
        assert (
            "INFO: data-parallel QAT: the learned ranges are equal on every rank"
            in (reports[r]["learned"]["log"])
        )
        assert not reports[r]["ema"]["log"]


def test_per_site_ranges_merge_across_ranks(run):
    """One ReLU cell at two sites: each site's EMA is merged on its own (steps-weighted mean of
    the ranks' per-site values), and the sidecar names the sites as calibration does."""
    out, reports = run
    for r in range(WORLD):
        assert "error" not in reports[r]["sites"], reports[r]["sites"]["error"]
    assert reports[0]["sites"]["text"] == reports[1]["sites"]["text"]
    got = [reports[r]["sites"]["ranges"] for r in range(WORLD)]
    assert len(got[0]["relu.qat.output_max"]) == 2
    assert got[0]["relu.qat.output_max"] != got[1]["relu.qat.output_max"]  # each rank's shard
    stats = load_stats(sidecar_path(out / "record0" / "qat-sites.txt"))
    assert stats.batches == 4 * WORLD
    for k, site in enumerate(["relu", "relu@1"]):
        seen = np.array([g["relu.qat.output_seen"][k] for g in got])
        lo = np.dot([g["relu.qat.output_min"][k] for g in got], seen) / seen.sum()
        hi = np.dot([g["relu.qat.output_max"][k] for g in got], seen) / seen.sum()
        entry = stats.layers[site].output
        # relu is what conv2 reads: clipped there, its own EMA kept as observed
        observed = (entry.observed_min, entry.observed_max) if k == 0 else (entry.min, entry.max)
        assert observed == pytest.approx((lo, hi), rel=1e-6, abs=1e-7), site
    record = load(out / "record0" / "qat-sites.txt", flavor="inner")
    assert sorted(record.layers) == ["conv1", "conv2", "fc"]


def test_only_rank0_writes(run):
    out, _ = run
    expect = ["qat-ema.txt", "qat-ema.txt.calib.json", "qat-learned.txt"]
    expect.append("qat-learned.txt.calib.json")
    expect += ["qat-sites.txt", "qat-sites.txt.calib.json"]
    assert sorted(p.name for p in (out / "record0").iterdir()) == expect
    assert not list((out / "record1").iterdir())


def test_a_rank_saving_before_any_step_fails_both(run):
    out, reports = run
    for r in range(WORLD):
        error = reports[r]["fail"].get("error", "")
        assert error.startswith("CalibrationError: rank 1 of 2 failed in saving the QAT record"), (
            error
        )
        assert "layer '0': its input range was never observed" in error, error
        assert "no record written" in error
        assert reports[r]["fail"]["seconds"] < 10  # no wait for a timeout
    assert not (out / "record0" / "fail.txt").exists()


def test_weights_that_differ_between_ranks_fail_both(run):
    out, reports = run
    for r in range(WORLD):
        error = reports[r]["weights"].get("error", "")
        assert "the weights of '2' differ between the 2 ranks" in error, error
        assert "'0'" not in error and "'5'" not in error
    assert not (out / "record0" / "weights.txt").exists()
