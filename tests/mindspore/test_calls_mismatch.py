"""A shared cell whose calls per step in the probed run differ from the graph's call sites.

MindSpore's compiler merges identical calls (CSE): in ``fc(x) + fc(fc(x))`` the MindIR export
computes ``fc(x)`` once (2 sites), while the probes' side effects make all 3 calls run. The
probe writes one row per call and the k-th row of a step is site k, so the sidecar used to give
``fc@1`` the range of ``x``, silently. Now the first read refuses, naming the cell, the sites and
the calls counted. Shared cells the compiler does not merge still get each site's range,
checked against a numpy forward, also under ``Model.fit`` with validation data. Real MindSpore
2.10 on CPU, GRAPH_MODE and PyNative.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Model
from nets import DenseBackToBack, SharedDense

from amct_bridge.errors import CalibrationError
from amct_bridge.mindspore import QuantCalibration, calibrate
from amct_bridge.records.calibration import load_stats, sidecar_path


class Merged(nn.Cell):
    """``fc(x)`` written twice: the export computes it once (2 sites, 3 calls run)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(6, 6)

    def construct(self, x):
        return self.fc(x) + self.fc(self.fc(x))


class MergedOnce(nn.Cell):
    """``fc(x) + fc(x)``: 1 site in the export, 2 calls run."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(6, 6)

    def construct(self, x):
        return self.fc(x) + self.fc(x)


def inputs(seed: int = 0, n: int = 8, scale: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, scale, (n, 6)).astype(np.float32)


def dense(net, x: np.ndarray) -> np.ndarray:
    """``net.fc`` by hand, float64."""
    w = net.fc.weight.asnumpy().astype(np.float64)
    return x.astype(np.float64) @ w.T + net.fc.bias.asnumpy().astype(np.float64)


def site_inputs(net, x: np.ndarray) -> dict[str, np.ndarray]:
    """Each call site's input, numpy (site order = call order in ``construct``)."""
    if isinstance(net, SharedDense):
        return {"fc": x, "fc@1": np.maximum(x, 0)}
    return {"fc": x, "fc@1": dense(net, x)}


def check_sites(path, net, x: np.ndarray) -> None:
    layers = load_stats(sidecar_path(path)).layers
    assert {"fc", "fc@1"} <= set(layers)
    for key, inp in site_inputs(net, x).items():
        out = dense(net, inp)
        got = layers[key]
        have = (got.input.min, got.input.max, got.output.min, got.output.max)
        want = (inp.min(), inp.max(), out.min(), out.max())
        assert have == pytest.approx(want, rel=1e-5, abs=1e-5), key


@pytest.mark.parametrize(
    "cls, sites, made",
    [
        (Merged, "'fc', 'fc@1'", "called it 3 time(s) in 1 step(s) (3 per step)"),
        (MergedOnce, "('fc')", "called it 2 time(s) in 1 step(s) (2 per step)"),
    ],
)
def test_compiler_merged_calls_are_refused_naming_cell_sites_and_calls(
    mode, cls, sites, made, tmp_path
):
    ms.set_seed(1)
    net = cls()
    path = tmp_path / "r.txt"
    with pytest.raises(CalibrationError) as err:
        calibrate(net, inputs(), path, algorithm="minmax", batch_size=4)
    text = str(err.value)
    assert "layer 'fc' (cell Dense)" in text and sites in text and made in text, text
    assert "its own cell" in text and "no record written" in text
    assert not path.exists() and not sidecar_path(path).exists()
    # the probes are out: the network runs as before
    assert type(net.fc) is nn.Dense


@pytest.mark.parametrize("cls", [SharedDense, DenseBackToBack])
def test_shared_cells_without_merging_get_each_sites_range(mode, cls, tmp_path):
    ms.set_seed(2)
    net, x = cls(), inputs()
    path = tmp_path / "r.txt"
    calibrate(net, x, path, algorithm="minmax", batch_size=4, batch_num=2)
    check_sites(path, net, x)
    assert load_stats(sidecar_path(path)).batches == 2


def dataset(x: np.ndarray, batch: int = 4) -> ds.Dataset:
    y = np.zeros(len(x), np.int32)
    return ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(batch)


def test_fit_with_validation_data_and_a_shared_cell(tmp_path):
    """Model.fit with valid_dataset (GRAPH_MODE): the training pass pauses while the eval
    network runs, the validation-only pass sees the eval batches only; neither trips the
    calls-per-step check, each gets its own data's per-site ranges (lr 0: weights unchanged)."""
    ms.set_seed(3)
    net = SharedDense()
    x, v = inputs(4, n=12), inputs(5, n=8, scale=10.0)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss, nn.Momentum(net.trainable_params(), 0.0, 0.9), metrics={"acc"})
    auto, val = tmp_path / "auto.txt", tmp_path / "val.txt"
    model.fit(
        2,
        dataset(x),
        dataset(v),
        callbacks=[
            QuantCalibration(auto, algorithm="minmax"),
            QuantCalibration(val, algorithm="minmax", on="validation"),
        ],
    )
    check_sites(auto, net, x)
    check_sites(val, net, v)
    assert load_stats(sidecar_path(auto)).batches == 6


def test_model_train_refuses_merged_calls_at_the_first_step(tmp_path):
    """Under Model.train (GRAPH_MODE) the refusal comes at the first step's end; the probes go
    out and no record is written."""
    ms.set_seed(4)
    net = Merged()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss, nn.Momentum(net.trainable_params(), 0.0, 0.9))
    path = tmp_path / "r.txt"
    with pytest.raises(CalibrationError, match=r"3 time\(s\) in 1 step\(s\)"):
        model.train(1, dataset(inputs(6, n=12)), callbacks=[QuantCalibration(path)])
    assert not path.exists() and type(net.fc) is nn.Dense
