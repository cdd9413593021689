"""Issue 30, MindSpore: the conv kinds the ESP-DL v3 export lowers, each with a Keras twin.

- dilated nn.Conv2d (``dilation=2``; pad_mode "same", and "pad" with the padding that keeps the
  size), which the v3 export writes as the runtime's dilated Conv (ESP-DL v1 refuses it);
- a small FPN: nn.Upsample (nearest) of the coarse level, the lateral Add, a concat;
- a small UNet: nn.Conv2dTranspose with pad_mode "pad" (kernel 4, stride 2, padding 1: the
  full output cropped by 1 on each side, which is Keras' ``padding="same"``), a skip concat;
- nn.Conv2dTranspose with pad_mode "valid" (kernel 2) and "same" (kernel 3);
- nn.Conv1d and a depthwise, dilated nn.Conv1d (``group = channels``) on NCW maps, the chip's
  NWC ones.

Each net is calibrated by MindSpore, exported for esp32s3 and esp32p4 at s8 and s16, the written
file passes ``espdl-run --check``, and at s16 the simulated chip follows the net's own float
output within 1 % of its range. Each Keras twin (weights converted here element by element)
computes the same function, and both exports of one record hold the same integers.

PyTorch's transposed conv (kernel 3, stride 2, padding 1: output 2n - 1) has no Keras twin
(Keras crops as "same" or not at all): it is checked against MindSpore's float output alone;
a padding beyond ``kernel - 1`` is refused naming why.
"""

from __future__ import annotations

import keras
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops
from ms_v3_helpers import COMBOS, chip_error, export_checked, twin_exports_equal
from twin_weights import conv_hwio, depthwise_hwc1

import amct_bridge.keras as akeras
import amct_bridge.mindspore as ams
from amct_bridge.errors import ExportError

L = keras.layers


def _conv(cin: int, cout: int, k: int, **kw) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, has_bias=True, **kw)


class Dilated(nn.Cell):
    """Two dilated 3x3 convs (pad_mode "same", then "pad" with padding 2), ReLU between."""

    def __init__(self) -> None:
        super().__init__()
        self.d1 = _conv(3, 6, 3, dilation=2, pad_mode="same")
        self.relu = nn.ReLU()
        self.d2 = _conv(6, 4, 3, dilation=2, pad_mode="pad", padding=2)

    def construct(self, x):
        return self.d2(self.relu(self.d1(x)))


class UNet(nn.Cell):
    """conv-relu, pool, conv-relu, nn.Conv2dTranspose(4, stride 2, pad 1)-relu, concat, 1x1."""

    def __init__(self) -> None:
        super().__init__()
        self.e1 = _conv(3, 6, 3, pad_mode="same")
        self.relu1 = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.e2 = _conv(6, 8, 3, pad_mode="same")
        self.relu2 = nn.ReLU()
        self.up = nn.Conv2dTranspose(8, 6, 4, stride=2, pad_mode="pad", padding=1, has_bias=True)
        self.relu3 = nn.ReLU()
        self.seg = _conv(12, 2, 1)

    def construct(self, x):
        e1 = self.relu1(self.e1(x))
        u = self.relu3(self.up(self.relu2(self.e2(self.pool(e1)))))
        return self.seg(ops.concat((u, e1), 1))


class FPN(nn.Cell):
    """Two pyramid levels: conv-relu (the fine level), pool, conv-relu (the coarse one),
    nn.Upsample nearest x2 of the coarse level + the fine level's 1x1 lateral, concat with the
    fine level, a 1x1 head."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = _conv(3, 6, 3, pad_mode="same")
        self.relu1 = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.c2 = _conv(6, 8, 3, pad_mode="same")
        self.relu2 = nn.ReLU()
        self.up = nn.Upsample(size=(16, 16), mode="nearest")
        self.lat = _conv(6, 8, 1)
        self.head = _conv(14, 4, 1)

    def construct(self, x):
        e1 = self.relu1(self.c1(x))
        top = self.up(self.relu2(self.c2(self.pool(e1))))
        return self.head(ops.concat((top + self.lat(e1), e1), 1))


class Transposes(nn.Cell):
    """nn.Conv2dTranspose pad_mode "valid" (kernel 2), then "same" (kernel 3), then 1x1."""

    def __init__(self) -> None:
        super().__init__()
        self.t1 = nn.Conv2dTranspose(3, 6, 2, stride=2, pad_mode="valid", has_bias=True)
        self.t2 = nn.Conv2dTranspose(6, 4, 3, stride=2, pad_mode="same", has_bias=True)
        self.head = _conv(4, 3, 1)

    def construct(self, x):
        return self.head(self.t2(self.t1(x)))


class Conv1dNet(nn.Cell):
    """nn.Conv1d-relu, a depthwise dilated nn.Conv1d-relu, a 1x1 nn.Conv1d, mean over W,
    nn.Dense: NCW maps (N, 6, 16)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(6, 8, 3, pad_mode="same", has_bias=True)
        self.relu1 = nn.ReLU()
        self.dw = nn.Conv1d(8, 8, 3, pad_mode="same", group=8, dilation=2, has_bias=True)
        self.relu2 = nn.ReLU()
        self.pw = nn.Conv1d(8, 6, 1, has_bias=True)
        self.fc = nn.Dense(6, 4)

    def construct(self, x):
        y = self.pw(self.relu2(self.dw(self.relu1(self.c1(x)))))
        return self.fc(ops.mean(y, 2))


def _transpose_kernel(w: np.ndarray) -> np.ndarray:
    """nn.Conv2dTranspose (in, out, kH, kW) -> Keras Conv2DTranspose (kH, kW, out, in)."""
    i, o, kh, kw = w.shape
    out = np.empty((kh, kw, o, i), np.float32)
    for a in range(i):
        for b in range(o):
            out[:, :, b, a] = w[a, b]
    return out


def _kernel(cell: nn.Cell) -> np.ndarray:
    """A MindSpore cell's weight in the Keras layout of its twin, element by element."""
    w = cell.weight.asnumpy()
    if isinstance(cell, nn.Conv2dTranspose):
        return _transpose_kernel(w)
    if isinstance(cell, nn.Dense):
        return w.T.copy()
    out = depthwise_hwc1(w) if int(cell.group) != 1 else conv_hwio(w)
    return out[0] if isinstance(cell, nn.Conv1d) else out  # 1-D: (k, ...) without the height


def _dilated_twin() -> keras.Model:
    x = keras.Input((12, 12, 3), name="input0")
    y = L.Conv2D(6, 3, dilation_rate=2, padding="same", name="d1")(x)
    y = L.ReLU(name="relu")(y)
    return keras.Model(x, L.Conv2D(4, 3, dilation_rate=2, padding="same", name="d2")(y))


def _unet_twin() -> keras.Model:
    x = keras.Input((16, 16, 3), name="input0")
    e1 = L.ReLU(name="relu1")(L.Conv2D(6, 3, padding="same", name="e1")(x))
    p = L.MaxPooling2D(2, name="pool")(e1)
    e2 = L.ReLU(name="relu2")(L.Conv2D(8, 3, padding="same", name="e2")(p))
    u = L.ReLU(name="relu3")(L.Conv2DTranspose(6, 4, strides=2, padding="same", name="up")(e2))
    y = L.Concatenate(name="concat_op0")([u, e1])
    return keras.Model(x, L.Conv2D(2, 1, name="seg")(y))


def _fpn_twin() -> keras.Model:
    x = keras.Input((16, 16, 3), name="input0")
    e1 = L.ReLU(name="relu1")(L.Conv2D(6, 3, padding="same", name="c1")(x))
    p = L.MaxPooling2D(2, name="pool")(e1)
    top = L.UpSampling2D(2, name="up")(
        L.ReLU(name="relu2")(L.Conv2D(8, 3, padding="same", name="c2")(p))
    )
    f = L.Add(name="add_op0")([top, L.Conv2D(8, 1, name="lat")(e1)])
    y = L.Concatenate(name="concat_op0")([f, e1])
    return keras.Model(x, L.Conv2D(4, 1, name="head")(y))


def _transposes_twin() -> keras.Model:
    x = keras.Input((6, 6, 3), name="input0")
    y = L.Conv2DTranspose(6, 2, strides=2, padding="valid", name="t1")(x)
    y = L.Conv2DTranspose(4, 3, strides=2, padding="same", name="t2")(y)
    return keras.Model(x, L.Conv2D(3, 1, name="head")(y))


def _conv1d_twin() -> keras.Model:
    x = keras.Input((16, 6), name="input0")
    y = L.ReLU(name="relu1")(L.Conv1D(8, 3, padding="same", name="c1")(x))
    y = L.DepthwiseConv1D(3, padding="same", dilation_rate=2, name="dw")(y)
    y = L.Conv1D(6, 1, name="pw")(L.ReLU(name="relu2")(y))
    y = L.GlobalAveragePooling1D(name="reducemean_op0")(y)
    return keras.Model(x, L.Dense(4, name="fc")(y))


#: name -> (net class, Keras twin, NCHW / NCW input shape of one sample)
NETS = {
    "dilated": (Dilated, _dilated_twin, (3, 12, 12)),
    "unet": (UNet, _unet_twin, (3, 16, 16)),
    "fpn": (FPN, _fpn_twin, (3, 16, 16)),
    "transposes": (Transposes, _transposes_twin, (3, 6, 6)),
    "conv1d": (Conv1dNet, _conv1d_twin, (6, 16)),
}


def _net(name: str) -> nn.Cell:
    ms.set_seed(4)
    net = NETS[name][0]()
    net.set_train(False)
    return net


def _x(name: str, n: int = 16, seed: int = 0) -> np.ndarray:
    shape = (n, *NETS[name][2])
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def _chw_last(a: np.ndarray) -> np.ndarray:
    """NCHW / NCW -> NHWC / NWC (the chip's layout; (N, C) stays)."""
    return np.moveaxis(a, 1, -1) if a.ndim > 2 else a


@pytest.fixture(scope="module", params=list(NETS))
def calibrated(request, tmp_path_factory):
    net = _net(request.param)
    record = tmp_path_factory.mktemp(request.param) / "record.txt"
    ams.calibrate(net, _x(request.param), record, algorithm="minmax")
    return request.param, net, record


@pytest.mark.parametrize(("target", "feature_type"), COMBOS)
def test_conv_net_exports_and_follows_the_net(calibrated, tmp_path, target, feature_type):
    name, net, record = calibrated
    x = _x(name)
    res, model = export_checked(net, record, tmp_path / "m.espdl", x, target, feature_type)
    assert {r.status for r in res.layers} <= {"exported", "fused"}, res.layers
    written = [n.op_type for n in model.nodes]
    if name == "dilated":
        assert [n.attributes["dilations"] for n in model.nodes] == [[2, 2], [2, 2]]
    if name in ("unet", "transposes"):
        assert written.count("InsertZeros") == (1 if name == "unet" else 2)
    if feature_type == "s16":
        err, span = chip_error(model, net, x, target, channels_first=True)
        assert err <= 0.01 * span, (err, span)


@pytest.mark.parametrize("name", list(NETS))
def test_keras_twin_exports_equal_integers(name, tmp_path):
    net = _net(name)
    model = NETS[name][1]()
    cells = dict(net.cells_and_names())
    for layer in model.layers:
        cell = cells.get(layer.name)
        if cell is not None and layer.weights:
            layer.set_weights([_kernel(cell), cell.bias.asnumpy()])
    x = _x(name, seed=1)
    want = net(ms.Tensor(x)).asnumpy()
    got = model.predict(_chw_last(x), verbose=0)
    np.testing.assert_allclose(got, _chw_last(want), atol=1e-5)
    record = tmp_path / "record.txt"
    akeras.calibrate(model, _chw_last(x), record, algorithm="minmax")
    twin_exports_equal(model, net, record, tmp_path, _chw_last(x), x, (1, *x.shape[1:]))


class TorchStyle(nn.Cell):
    """conv, nn.Conv2dTranspose(kernel 3, stride 2, pad_mode "pad", ``padding``), ReLU."""

    def __init__(self, padding: int) -> None:
        super().__init__()
        self.conv = _conv(3, 4, 3, pad_mode="same")
        self.up = nn.Conv2dTranspose(4, 5, 3, stride=2, pad_mode="pad", padding=padding,
                                     has_bias=True)  # fmt: skip
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.up(self.conv(x)))


def test_pytorch_style_transposed_conv_follows_the_net(tmp_path):
    ms.set_seed(6)
    net = TorchStyle(1)
    net.set_train(False)
    x = np.random.default_rng(2).uniform(-1, 1, (16, 3, 8, 8)).astype(np.float32)
    assert net(ms.Tensor(x[:1])).shape == (1, 5, 15, 15)  # 2n - 1
    record = tmp_path / "record.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    for target, feature_type in COMBOS:
        out = tmp_path / f"{target}_{feature_type}.espdl"
        res, model = export_checked(net, record, out, x, target, feature_type)
        assert {r.name: r.status for r in res.layers}["relu"] == "fused"
        assert [n.op_type for n in model.nodes] == ["Conv", "InsertZeros", "Conv"]
        if feature_type == "s16":
            err, span = chip_error(model, net, x, target, channels_first=True)
            assert err <= 0.01 * span, (err, span)


def test_a_padding_beyond_the_kernel_is_refused_by_name(tmp_path):
    ms.set_seed(6)
    net = TorchStyle(3)
    net.set_train(False)
    x = np.random.default_rng(2).uniform(-1, 1, (4, 3, 8, 8)).astype(np.float32)
    record = tmp_path / "record.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    why = (
        r"'up' \(Conv2DTranspose\): Conv2DTranspose with pads \[3, 3, 3, 3\] for a 3x3 kernel, "
        r"stride 2x2: the ESP-DL v3 runtime's InsertZeros \+ Conv form pads the zero-inserted "
        r"input by kernel - 1 - pad, so each pad must be at most kernel - 1"
    )
    with pytest.raises(ExportError, match=why):
        ams.export_espdl(net, record, tmp_path / "m.espdl", sample_input=(1, 3, 8, 8),
                         format="espdl", target="esp32p4")  # fmt: skip
    assert not (tmp_path / "m.espdl").exists()
