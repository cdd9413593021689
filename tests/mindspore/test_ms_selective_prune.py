"""SelectivePruneCallback for MindSpore's Model.train, GRAPH_MODE and PyNative: the weights are
2:4 after every optimizer step (checked here with numpy on the OIHW / (out, in) weights, not with
the library's mask code) while training moves them; the record written equals prune_record's
for the final weights; masks that do not fit are refused naming the parameter."""

from __future__ import annotations

import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore import dataset as ds
from mindspore.train import Callback, Model

from amct_bridge.errors import AmctBridgeError
from amct_bridge.mindspore import SelectivePruneCallback, prune_record, selective_masks
from amct_bridge.records import load

SHAPE = (1, 4, 6, 6)


def make_net() -> nn.SequentialCell:
    net = nn.SequentialCell(
        [nn.Conv2d(4, 8, 3, has_bias=True), nn.ReLU(), nn.Flatten(), nn.Dense(8 * 6 * 6, 3)]
    )
    rng = np.random.default_rng(0)
    for _, p in net.parameters_and_names():
        p.set_data(Tensor(rng.normal(0.0, 0.3, p.shape).astype(np.float32)))
    return net


def dataset() -> ds.Dataset:
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (12, *SHAPE[1:])).astype(np.float32)
    y = (np.arange(12) % 3).astype(np.int32)
    return ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(4)


def model(net) -> Model:
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    # momentum and weight decay move pruned weights away from 0 at every step
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9, weight_decay=1e-3)
    return Model(net, loss, opt)


def nonzero_per_run(w: np.ndarray) -> np.ndarray:
    """Non-zero count of every run of 4 consecutive input channels (axis 1: OIHW, (out, in))."""
    nz = np.moveaxis(w != 0, 1, -1)
    return nz.reshape(*nz.shape[:-1], -1, 4).sum(-1)


class Check(Callback):
    """After every step (and after the pruning callback): the weights' runs hold <= 2 non-zeros."""

    def __init__(self, net):
        self.net, self.worst = net, []

    def on_train_step_end(self, run_context):
        self.worst.append(max(int(nonzero_per_run(c.weight.asnumpy()).max()) for c in self.cells()))

    def cells(self):
        return [self.net[0], self.net[3]]


def test_weights_stay_two_four_and_record_equals_prune_record(mode, tmp_path):
    net = make_net()
    before = {n: p.asnumpy().copy() for n, p in net.parameters_and_names()}
    path = tmp_path / "prune.txt"
    cb, check = SelectivePruneCallback(path), Check(net)
    model(net).train(2, dataset(), callbacks=[cb, check], dataset_sink_mode=False)

    assert check.worst == [2] * 6  # 2 epochs x 3 steps, each left 2 of 4
    for name in ("0.weight", "3.weight"):
        w = net.parameters_dict()[name].asnumpy()
        assert (nonzero_per_run(w) == 2).all(), name  # exactly 2 (random weights: no exact 0)
        kept = w != 0
        assert not np.allclose(w[kept], before[name][kept])  # it trained
        # the kept weights are the 2 largest |w| of each run of the initial weights
        first = np.moveaxis(np.abs(before[name]), 1, -1)
        runs = first.reshape(*first.shape[:-1], -1, 4)
        top2 = np.argsort(-runs, axis=-1, kind="stable")[..., :2]
        expect = np.zeros(runs.shape, bool)
        np.put_along_axis(expect, top2, True, axis=-1)
        expect = np.moveaxis(expect.reshape(first.shape), -1, 1)
        np.testing.assert_array_equal(kept, expect)
        np.testing.assert_array_equal(cb.masks[name.split(".")[0]], expect)

    final = prune_record(
        net, SHAPE, channel=False, selective=True, masks=selective_masks(net, SHAPE)
    )
    written = load(path, flavor="inner")
    assert written == final == cb.record
    assert sorted(r.selective_prune.name for r in written.prune_records) == ["0", "3"]


def test_given_masks_and_bad_masks(tmp_path):
    net = make_net()
    masks = selective_masks(net, SHAPE)
    masks["0"] = masks["0"].copy()
    masks["0"][:, :2] = False  # keep only input channels 2 and 3 of the conv
    masks["0"][:, 2:] = True
    cb = SelectivePruneCallback(masks=masks, sample_input=SHAPE)
    model(net).train(1, dataset(), callbacks=[cb], dataset_sink_mode=False)
    w = net[0].weight.asnumpy()
    assert (w[:, :2] == 0).all() and (w[:, 2:] != 0).all()

    weights = {n: p.asnumpy().copy() for n, p in net.parameters_and_names()}
    bad = {"0": np.ones((8, 4, 3), bool)}
    path = tmp_path / "prune.txt"
    with pytest.raises(
        AmctBridgeError,
        match=r"cell '0' has shape \(8, 4, 3\), its parameter "
        r"'0.weight' has shape \(8, 4, 3, 3\); nothing applied",
    ):
        model(net).train(
            1,
            dataset(),
            callbacks=[SelectivePruneCallback(path, masks=bad)],
            dataset_sink_mode=False,
        )
    with pytest.raises(
        AmctBridgeError,
        match=r"mask 'conv9' names no cell with a weight .*"
        r"\['0', '3'\]",
    ):
        model(net).train(
            1,
            dataset(),
            callbacks=[SelectivePruneCallback(masks={"conv9": bad["0"]})],
            dataset_sink_mode=False,
        )
    for n, p in net.parameters_and_names():  # nothing trained, nothing written
        np.testing.assert_array_equal(p.asnumpy(), weights[n])
    assert not path.exists()
