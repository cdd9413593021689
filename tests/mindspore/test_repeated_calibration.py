"""Repeated calibrations of one MindSpore network reuse the graph export and the probes' compiled
graph (amct_bridge.mindspore.instrument keeps them per cell tree and points), and give the bytes
a fresh network with the same weights gives; a changed network is exported and compiled again.

Reference: the same calibration of a second network built with the same weights (nothing to
reuse there), record and sidecar compared byte for byte. GRAPH_MODE, where compiling is the cost.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore import dataset as ds

import amct_bridge.mindspore.graph as ms_graph
from amct_bridge.mindspore import QuantCalibration, calibrate
from amct_bridge.records.calibration import sidecar_path


def make_net(seed: int = 0) -> nn.SequentialCell:
    """conv + BN, ReLU, pool, Flatten, Dense; weights from ``seed``."""
    net = nn.SequentialCell(
        [
            nn.Conv2d(3, 4, 3, has_bias=True),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.AvgPool2d(2, 2),
            nn.Flatten(),
            nn.Dense(4 * 4 * 4, 3),
        ]
    )
    rng = np.random.default_rng(seed)
    for name, p in net.parameters_and_names():
        low = 0.5 if name.endswith(("moving_variance", "gamma")) else -1.0
        p.set_data(Tensor(rng.uniform(low, 2.0, p.shape).astype(np.float32)))
    return net


def data(seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(0, 1, (6, 3, 8, 8)) * scale).astype(np.float32)


def probed_phases(cell) -> set[str]:
    """Compiled graphs of ``cell`` named with another creation time than its own: those the
    probes compiled (MindSpore names a graph phase.creation_time.id.arguments)."""
    return {p for p in cell.compile_cache if f".{cell.create_time}." not in p}


def outputs(path) -> tuple[bytes, bytes]:
    return path.read_bytes(), sidecar_path(path).read_bytes()


@pytest.fixture
def graph_mode():
    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=before)


@pytest.fixture
def exports(monkeypatch):
    """Counts the graph exports (the session imports extract_graph from its module)."""
    made = []
    real = ms_graph.extract_graph

    def counted(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ms_graph, "extract_graph", counted)
    return made


def test_second_calibrate_compiles_nothing_and_equals_a_fresh_run(graph_mode, tmp_path, exports):
    """The second call (other data: its histograms, grids and counters must start afresh)
    neither exports nor compiles, and writes what a fresh network writes on that data."""
    net = make_net()
    first, second = data(1), data(2, scale=3.0)
    calibrate(net, first, tmp_path / "a.txt", batch_size=2, algorithm="hfmg")
    cache = set(net.compile_cache)
    assert len(exports) == 1 and len(probed_phases(net)) == 1
    calibrate(net, second, tmp_path / "b.txt", batch_size=2, algorithm="hfmg")
    assert len(exports) == 1 and set(net.compile_cache) == cache  # no export, no new graph
    calibrate(make_net(), second, tmp_path / "fresh.txt", batch_size=2, algorithm="hfmg")
    assert outputs(tmp_path / "b.txt") == outputs(tmp_path / "fresh.txt")
    assert outputs(tmp_path / "a.txt") != outputs(tmp_path / "b.txt")


def test_a_changed_network_is_exported_and_compiled_again(graph_mode, tmp_path, exports):
    """A child swapped between calls (MindSpore would keep its compiled graph): the next call
    exports and compiles the new tree and gives what a fresh network of that tree gives."""
    net, x = make_net(), data(1)
    calibrate(net, x, tmp_path / "a.txt", batch_size=2, algorithm="minmax")
    probed = probed_phases(net)
    net.insert_child_to_cell("5", make_net(seed=7)[5])  # another Dense, other weights
    net.cell_list = list(net._cells.values())
    calibrate(net, x, tmp_path / "b.txt", batch_size=2, algorithm="minmax")
    assert len(exports) == 2 and len(probed_phases(net)) == 1
    assert not probed & probed_phases(net)  # the old probed graph is freed, a new one compiled
    fresh = make_net()
    fresh.insert_child_to_cell("5", make_net(seed=7)[5])
    fresh.cell_list = list(fresh._cells.values())
    calibrate(fresh, x, tmp_path / "fresh.txt", batch_size=2, algorithm="minmax")
    assert outputs(tmp_path / "b.txt") == outputs(tmp_path / "fresh.txt")
    assert outputs(tmp_path / "a.txt") != outputs(tmp_path / "b.txt")


def test_model_train_second_callback_reuses_the_probed_train_graph(graph_mode, tmp_path):
    """Two calibrated Model.train epochs with fresh callbacks: the second compiles no new train
    graph and writes what a fresh network and Model write (learning rate 0: same weights)."""

    def model_of(net):
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        return ms.Model(net, loss, nn.Momentum(net.trainable_params(), 0.0, 0.9))

    x = data(1)
    y = np.zeros(len(x), np.int32)

    def epoch(model, path):
        dataset = ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(2)
        model.train(1, dataset, callbacks=[QuantCalibration(path, algorithm="minmax")])

    net = make_net()
    model = model_of(net)
    epoch(model, tmp_path / "a.txt")
    train_cache = set(model._train_network.compile_cache)
    epoch(model, tmp_path / "b.txt")
    assert set(model._train_network.compile_cache) == train_cache
    assert len(probed_phases(model._train_network)) == 1
    fresh = model_of(make_net())  # a plain epoch moves the BN statistics as a calibrated one
    fresh.train(1, ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(2))
    epoch(fresh, tmp_path / "fresh.txt")
    assert outputs(tmp_path / "b.txt") == outputs(tmp_path / "fresh.txt")
