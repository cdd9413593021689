"""MindSpore cell registry and weights: kinds, and every stated layout checked by computing the
cell's output from the numpy kernel (brute-force loops) and comparing with MindSpore's own."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from amct_bridge.calibration.weights import fold, input_channels, weight_factors
from amct_bridge.errors import CalibrationError
from amct_bridge.mindspore.cells import (
    BATCH_NORM_KINDS,
    FOLDABLE_KINDS,
    clamp_bounds,
    describe,
    kind_of,
    leaf_cells,
    quant_parts,
)
from amct_bridge.mindspore.weights import MindSporeWeights, batch_norm_params, bn_momentum

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def pynative():
    before = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=before)


class MyConv(nn.Conv2d):
    """A user subclass: quantized like its base."""


@pytest.mark.parametrize(
    ("cell", "kind", "layout", "op_type", "channel_wise"),
    [
        (nn.Conv2d(3, 4, 3), "Conv2D", "OIHW", "Conv2D", True),
        (MyConv(3, 4, 3), "Conv2D", "OIHW", "Conv2D", True),
        (nn.Conv2d(4, 8, 3, group=4), "DepthwiseConv2D", "OIHW", "Conv2D", True),
        (nn.Conv2d(1, 2, 3, group=1), "Conv2D", "OIHW", "Conv2D", True),
        (nn.Conv2dTranspose(4, 2, 3), "Conv2DTranspose", "IOHW", "Conv2DTranspose", True),
        (nn.Dense(4, 2), "Dense", "OI", "MatMul", False),
        (nn.AvgPool2d(2, 2), "AveragePooling2D", None, "AvgPool", False),
    ],
)
def test_quantizable_kinds(cell, kind, layout, op_type, channel_wise):
    d = describe("a.b", cell)
    assert (d.kind, d.key, d.handle, d.channel_axis) == (kind, "a.b", cell, 1)
    (part,) = d.parts
    assert (part.layout, part.op_type, part.channel_wise, part.suffix) == (
        layout,
        op_type,
        channel_wise,
        "",
    )
    assert part.has_weights is (layout is not None)
    assert part.foldable is (kind in FOLDABLE_KINDS)


def test_other_kinds():
    assert kind_of(nn.Conv2d(8, 16, 3, group=4)) == "GroupedConv2D"
    assert quant_parts(nn.Conv2d(8, 16, 3, group=4)) == ()
    bn = describe("bn", nn.BatchNorm2d(4))
    assert bn.kind in BATCH_NORM_KINDS and bn.params["on_channels"] and not bn.quantizable
    for cell, kind in [
        (nn.ReLU(), "ReLU"),
        (nn.ReLU6(), "ReLU6"),
        (nn.LeakyReLU(0.2), "LeakyReLU"),
    ]:
        d = describe("r", cell)
        assert (d.kind, d.activation, d.runtime, d.quantizable) == (kind, True, False, False)
    for cell, kind in [
        (nn.MaxPool2d(2, 2), "MaxPooling2D"),
        (nn.AdaptiveAvgPool2d(1), "AdaptiveAvgPool2d"),
    ]:
        d = describe("p", cell)
        assert (d.kind, d.runtime, d.activation, d.quantizable) == (kind, True, False, False)
    assert describe("p", nn.AvgPool2d(2)).runtime  # quantized, and its output goes to the sidecar
    assert describe("f", nn.Flatten()).kind == "Flatten"
    assert describe("d", nn.Dense(2, 2, activation="relu6")).params["activation"] == "ReLU6"
    assert clamp_bounds(nn.ReLU6()) == (0.0, 6.0) and clamp_bounds(nn.Sigmoid()) is None


class Tree(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.seq = nn.SequentialCell([nn.Dense(4, 4, activation="relu"), self.relu])
        self.blocks = nn.CellList([nn.Conv2d(1, 1, 1)])

    def construct(self, x):
        return self.relu(self.seq(x))


def test_leaf_cells_names_and_shared_cells():
    leaves = leaf_cells(Tree())
    assert list(leaves) == ["relu", "seq.0", "blocks.0"]  # the Dense's activation belongs to it
    assert [kind_of(c) for c in leaves.values()] == ["ReLU", "Dense", "Conv2D"]


def conv_ref(x, w, b=None):
    """Brute-force valid cross-correlation, OIHW kernel."""
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    y = np.zeros((n, o, h - kh + 1, wd - kw + 1), np.float64)
    for i in range(y.shape[2]):
        for j in range(y.shape[3]):
            patch = x[:, :, i : i + kh, j : j + kw]
            y[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return y + (0 if b is None else b[None, :, None, None])


def weights_of(cell):
    d = describe("c", cell)
    return MindSporeWeights().part_weights(d, d.parts[0])


def run(cell, x):
    return cell(ms.Tensor(x)).asnumpy()


def test_conv_oihw():
    cell = nn.Conv2d(3, 4, 3, pad_mode="valid", has_bias=True)
    w = weights_of(cell)
    assert (w.layout, w.kernel.shape, w.bias.shape) == ("OIHW", (4, 3, 3, 3), (4,))
    x = RNG.normal(size=(2, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(run(cell, x), conv_ref(x, w.kernel, w.bias), atol=1e-5)
    assert input_channels(w.kernel, w.layout) == 3
    assert (
        len(weight_factors(w.kernel, w.layout, part_channel_wise=True, channel_wise=True)[0]) == 4
    )


def test_depthwise_channel_order():
    """Output channel c*m + k reads input channel c; scale_w per output channel."""
    c, m = 3, 2
    cell = nn.Conv2d(c, c * m, 3, group=c, pad_mode="valid")
    w = weights_of(cell)
    assert w.kernel.shape == (c * m, 1, 3, 3) and w.bias is None
    x = RNG.normal(size=(2, c, 5, 5)).astype(np.float32)
    ref = np.concatenate(
        [conv_ref(x[:, o // m : o // m + 1], w.kernel[o : o + 1]) for o in range(c * m)], axis=1
    )
    np.testing.assert_allclose(run(cell, x), ref, atol=1e-5)
    scale_w, _ = weight_factors(w.kernel, w.layout, part_channel_wise=True, channel_wise=True)
    # per output channel: each equals the per-tensor factor of that channel's kernel alone
    for o in range(c * m):
        alone = weight_factors(
            w.kernel[o : o + 1], "OIHW", part_channel_wise=False, channel_wise=False
        )
        assert scale_w[o] == alone[0][0]


def test_dense_oi():
    cell = nn.Dense(5, 3)
    w = weights_of(cell)
    assert (w.layout, w.kernel.shape) == ("OI", (3, 5))
    x = RNG.normal(size=(4, 5)).astype(np.float32)
    np.testing.assert_allclose(run(cell, x), x @ w.kernel.T + w.bias, atol=1e-5)
    assert (
        len(weight_factors(w.kernel, w.layout, part_channel_wise=False, channel_wise=True)[0]) == 1
    )


def test_conv_transpose_iohw():
    cell = nn.Conv2dTranspose(3, 2, 3, pad_mode="valid", has_bias=True)
    w = weights_of(cell)
    assert (w.layout, w.kernel.shape) == ("IOHW", (3, 2, 3, 3))
    x = RNG.normal(size=(1, 3, 4, 4)).astype(np.float32)
    ref = np.zeros((1, 2, 6, 6))
    for i in range(4):
        for j in range(4):
            ref[:, :, i : i + 3, j : j + 3] += np.einsum("ni,iohw->nohw", x[:, :, i, j], w.kernel)
    np.testing.assert_allclose(run(cell, x), ref + w.bias[None, :, None, None], atol=1e-5)
    assert input_channels(w.kernel, w.layout) == 3


def make_bn(momentum: float = 0.9):
    bn = nn.BatchNorm2d(3, eps=1e-2, momentum=momentum)
    bn.gamma.set_data(ms.Tensor(RNG.uniform(0.5, 2, 3).astype(np.float32)))
    bn.beta.set_data(ms.Tensor(RNG.normal(size=3).astype(np.float32)))
    bn.moving_mean.set_data(ms.Tensor(RNG.normal(size=3).astype(np.float32)))
    bn.moving_variance.set_data(ms.Tensor(RNG.uniform(0.5, 2, 3).astype(np.float32)))
    return bn


def test_batch_norm_params_and_fold():
    """eps is read, and a folded conv computes conv -> BN (eval)."""
    bn = make_bn()
    bn.set_train(False)
    p = MindSporeWeights().batch_norm(describe("bn", bn))
    assert p.eps == pytest.approx(1e-2)
    x = RNG.normal(size=(2, 3, 4, 4)).astype(np.float32)
    ref = (
        p.gamma[:, None, None] * (x - p.mean[:, None, None]) / np.sqrt(p.var[:, None, None] + p.eps)
        + p.beta[:, None, None]
    )
    np.testing.assert_allclose(run(bn, x), ref, atol=1e-5)
    conv = nn.Conv2d(2, 3, 3, pad_mode="valid", has_bias=True)
    folded = fold(weights_of(conv), p, "c")
    x2 = RNG.normal(size=(2, 2, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(
        conv_ref(x2, folded.kernel, folded.bias), run(bn, run(conv, x2)), atol=1e-4
    )


def test_bn_momentum_is_inverted():
    """MindSpore keeps 1 - momentum; bn_momentum gives the constructor's value, which weighs the
    old moving mean (checked on one training step)."""
    bn = make_bn(momentum=0.8)
    assert bn_momentum(bn) == pytest.approx(0.8) and float(bn.momentum) == pytest.approx(0.2)
    old = bn.moving_mean.asnumpy().copy()
    x = RNG.normal(2.0, 1.0, size=(4, 3, 4, 4)).astype(np.float32)
    bn.set_train(True)
    run(bn, x)
    expect = bn_momentum(bn) * old + (1 - bn_momentum(bn)) * x.mean(axis=(0, 2, 3))
    np.testing.assert_allclose(bn.moving_mean.asnumpy(), expect, rtol=1e-5)


def test_errors_name_the_cell():
    with pytest.raises(CalibrationError, match="'fc'.*AvgPool has no weights"):
        d = describe("fc", nn.AvgPool2d(2))
        MindSporeWeights().part_weights(d, d.parts[0])
    with pytest.raises(CalibrationError, match="'r'.*not a BatchNorm2d"):
        batch_norm_params(nn.ReLU(), "r")
