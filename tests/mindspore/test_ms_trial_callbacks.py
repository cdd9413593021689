"""Callbacks together, as a user combines them (issue 21 trial): 2:4 pruning and calibration in
the same ``Model.train``."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Model
from nets import INPUT_SHAPES, sequential_net

from amct_bridge.mindspore import QuantCalibration, SelectivePruneCallback, prune_record
from amct_bridge.mindspore.prune import selective_masks
from amct_bridge.records import load


def test_selective_pruning_and_calibration_in_one_train_run(tmp_path):
    """``callbacks=[QuantCalibration(...), SelectivePruneCallback(...)]``: the calibration's
    probes went in at the first step_begin, then the pruning callback's MindIR export of the
    probed network failed ('a mindspore.Parameter that wasn't created in nn.Cell ...
    amct_bridge.0.health'). The pruning callback now reads the graph at train_begin (the
    dataset's first batch shape): both records are written, the weights are 2:4, and the
    prune record is prune_record's for the final weights."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net = sequential_net()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, *INPUT_SHAPES["sequential_net"][1:])).astype(np.float32)
    y = rng.integers(0, 2, 16).astype(np.int32)
    data = ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(4)
    cal = QuantCalibration(str(tmp_path / "q.txt"), algorithm="minmax")
    prune = SelectivePruneCallback(str(tmp_path / "p.txt"))
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss, nn.Momentum(net.trainable_params(), 1e-2, 0.9))
    model.train(1, data, callbacks=[cal, prune], dataset_sink_mode=False)
    assert sorted(load(tmp_path / "q.txt").layers) == ["0", "4", "7"]
    for name, mask in prune.masks.items():
        w = dict(net.cells_and_names())[name].weight.asnumpy()
        assert np.all(w[~mask] == 0), name
        runs = np.moveaxis(w, 1, -1)  # input channels (OIHW / OI axis 1) in runs of 4
        runs = np.pad(runs, [(0, 0)] * (runs.ndim - 1) + [(0, (-runs.shape[-1]) % 4)])
        assert np.all((runs.reshape(*runs.shape[:-1], -1, 4) != 0).sum(-1) <= 2), name
    shape = (1, *INPUT_SHAPES["sequential_net"][1:])
    want = prune_record(
        net, shape, channel=False, selective=True, masks=selective_masks(net, shape)
    )
    assert load(tmp_path / "p.txt", flavor="inner").prune_records == want.prune_records


def test_selective_pruning_of_a_qat_network_keeps_2_4_through_qat(tmp_path):
    """2:4 during QAT (``Model.train`` of a ``quantize_aware`` network): the QAT cells hid the
    convolutions from the graph, so the callback found no eligible cell and pruned nothing,
    without a word. It now reads the graph of the ``strip_qat`` view (same names and weights):
    the trained QAT weights are 2:4 and the record is prune_record's for the stripped net."""
    from amct_bridge.mindspore.qat import quantize_aware, strip_qat

    ms.set_context(mode=ms.GRAPH_MODE)
    shape = (1, *INPUT_SHAPES["sequential_net"][1:])
    qat = quantize_aware(sequential_net(), sample_input=shape)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, *shape[1:])).astype(np.float32)
    y = rng.integers(0, 2, 16).astype(np.int32)
    data = ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(4)
    prune = SelectivePruneCallback(str(tmp_path / "p.txt"))
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(qat, loss, nn.Momentum(qat.trainable_params(), 1e-2, 0.9))
    model.train(1, data, callbacks=[prune], dataset_sink_mode=False)
    plain = strip_qat(qat)
    assert sorted(prune.masks) == ["0", "4", "7"]
    for name, mask in prune.masks.items():
        w = dict(plain.cells_and_names())[name].weight.asnumpy()
        assert np.all(w[~mask] == 0) and mask.mean() <= 0.75, name  # 4 in-channels: 2 kept
    want = prune_record(
        plain, shape, channel=False, selective=True, masks=selective_masks(plain, shape)
    )
    assert load(tmp_path / "p.txt", flavor="inner").prune_records == want.prune_records
