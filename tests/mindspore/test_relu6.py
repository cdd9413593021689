"""`amct_bridge.mindspore.replace_relu6`: ReLU6 is refused by the ESP-DL export with a path that
exists for MindSpore too; the copy computes ReLU (checked against numpy), keeps the names, leaves
the network untouched, and exports; a functional ops.relu6 stays refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from mindspore import Tensor, nn, ops

import amct_bridge.mindspore as ams
from amct_bridge.errors import ExportError


class Relu6Net(nn.Cell):
    """conv 1x1 (1 -> 2) -> ReLU6 cell -> spatial mean -> Dense(activation="relu6")."""

    def __init__(self, functional: bool = False) -> None:
        super().__init__()
        self.functional = functional
        self.conv = nn.Conv2d(1, 2, 1, has_bias=True)
        self.act = nn.ReLU6()
        self.fc = nn.Dense(2, 2, activation="relu6")

    def construct(self, x):
        y = self.conv(x)
        y = ops.relu6(y) if self.functional else self.act(y)
        return self.fc(y.mean((2, 3)))


def numpy_forward(net, x, clip):
    w = net.conv.weight.asnumpy().reshape(2, 1)
    y = np.einsum("oc,nchw->nohw", w, x) + net.conv.bias.asnumpy()[None, :, None, None]
    act = (lambda v: np.clip(v, 0, 6)) if clip else (lambda v: np.maximum(v, 0))
    z = act(y).mean(axis=(2, 3)) @ net.fc.weight.asnumpy().T + net.fc.bias.asnumpy()
    return act(z)


def test_copy_computes_relu_keeps_names_and_exports(tmp_path):
    net = Relu6Net()
    x = np.random.default_rng(0).normal(0, 20, (8, 1, 4, 4)).astype(np.float32)  # past 6
    before = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
    record = tmp_path / "r.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    with pytest.raises(ExportError) as err:
        ams.export_espdl(net, record, None, sample_input=(1, 1, 4, 4))
    assert "'act' (ReLU6)" in str(err.value) and "amct_bridge.mindspore" in str(err.value)

    relu = ams.replace_relu6(net)
    assert [n for n, _ in relu.cells_and_names()] == [n for n, _ in net.cells_and_names()]
    assert isinstance(relu.act, nn.ReLU) and isinstance(relu.fc.activation, nn.ReLU)
    assert isinstance(net.act, nn.ReLU6) and isinstance(net.fc.activation, nn.ReLU6)
    got = relu(Tensor(x)).asnumpy()
    np.testing.assert_allclose(got, numpy_forward(net, x, clip=False), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
        net(Tensor(x)).asnumpy(), numpy_forward(net, x, clip=True), rtol=1e-5, atol=1e-4
    )
    assert not np.allclose(got, net(Tensor(x)).asnumpy())  # the clip mattered on this data
    relu.conv.weight.set_data(relu.conv.weight * 0)  # a copy: the network's weights stay
    for p in net.get_parameters():
        np.testing.assert_array_equal(p.asnumpy(), before[p.name])

    relu = ams.replace_relu6(net)
    relu_record = tmp_path / "relu.txt"
    ams.calibrate(relu, x, relu_record, algorithm="minmax")
    result = ams.export_espdl(relu, relu_record, tmp_path / "espdl", sample_input=(1, 1, 4, 4))
    assert [layer.name for layer in result.layers] == ["conv", "fc"]


def test_functional_relu6_stays_refused_by_name(tmp_path):
    net = Relu6Net(functional=True)
    x = np.random.default_rng(1).normal(0, 1, (4, 1, 4, 4)).astype(np.float32)
    relu = ams.replace_relu6(net)
    record = tmp_path / "r.txt"
    ams.calibrate(relu, x, record, algorithm="minmax")
    with pytest.raises(ExportError, match=r"ReLU6: ESP-DL v1 has no ReLU6"):
        ams.export_espdl(relu, record, None, sample_input=(1, 1, 4, 4))
    with pytest.raises(Exception, match="expected a mindspore.nn.Cell"):
        ams.replace_relu6("net")


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_relu6_inside_a_sequential_cell_is_replaced(mode):
    """SequentialCell runs its cell_list, not _cells: a swap that left cell_list stale still
    clipped at 6 although cells_and_names() said ReLU (a MobileNetV2 trial)."""
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    try:
        net = nn.SequentialCell([nn.Dense(3, 4), nn.SequentialCell([nn.ReLU6(), nn.Dense(4, 2)])])
        x = np.random.default_rng(2).normal(0, 30, (6, 3)).astype(np.float32)
        relu = ams.replace_relu6(net)
        w1, b1 = net[0].weight.asnumpy(), net[0].bias.asnumpy()
        w2, b2 = net[1][1].weight.asnumpy(), net[1][1].bias.asnumpy()
        h = x @ w1.T + b1
        assert (h > 6).any()  # the clip would matter
        expected = np.maximum(h, 0) @ w2.T + b2
        np.testing.assert_allclose(relu(Tensor(x)).asnumpy(), expected, rtol=1e-5, atol=1e-4)
        clipped = np.clip(h, 0, 6) @ w2.T + b2
        np.testing.assert_allclose(net(Tensor(x)).asnumpy(), clipped, rtol=1e-5, atol=1e-4)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
