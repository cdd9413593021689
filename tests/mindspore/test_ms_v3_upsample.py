"""Issue 30, MindSpore: upsampling by integer factors (``nn.Upsample``, ``ops.interpolate``,
``ops.ResizeNearestNeighbor``; nearest, and bilinear with ``align_corners=False``) exports to
ESP-DL v3 as the core's UpSampling2D (s8: ``Resize``; s16: ``Concat`` + ``Reshape``, bilinear
then an edge ``Pad`` and a depthwise ``Conv``), prune-groups passes its channels through (no
UNKNOWN_OP), and what the exporter cannot write is refused by name: a scale that is no integer,
``align_corners=True``. nn.Conv2dTranspose (pad_mode "same" / "valid") exports as the v3 runtime
runs it, InsertZeros + Conv (a following BatchNorm2d folded, ReLU fused); explicit pads beyond
kernel - 1 are refused by name.

Each net is calibrated by MindSpore and exported for esp32s3 and esp32p4 at s8 and s16; the
written file passes ``espdl-run --check`` and at s16 the simulated chip follows the net's own
float output within 1 % of its range.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops
from ms_v3_helpers import COMBOS, chip_error, export_checked

import amct_bridge.mindspore as ams
from amct_bridge.errors import ExportError
from amct_bridge.mindspore import prune_discovery

SPELLINGS = ("nn.Upsample", "ops.interpolate", "ops.ResizeNearestNeighbor", "bilinear")


class Up(nn.Cell):
    """conv-relu, an upsampling (``how``: one of SPELLINGS, or a refused variant), conv."""

    def __init__(self, how: str = "nn.Upsample") -> None:
        super().__init__()
        self.how = how
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.relu = nn.ReLU()
        size = (12, 12) if how == "fractional" else (16, 16)
        mode = "bilinear" if how in ("bilinear", "align_corners") else "nearest"
        corners = True if how == "align_corners" else None
        self.up = nn.Upsample(size=size, mode=mode, align_corners=corners)
        self.resize = ops.ResizeNearestNeighbor((16, 24))
        self.conv2 = nn.Conv2d(4, 4, 3, pad_mode="pad", padding=1, has_bias=True)

    def construct(self, x):
        y = self.relu(self.conv(x))
        if self.how == "ops.interpolate":
            y = ops.interpolate(y, size=(24, 16), mode="nearest")
        elif self.how == "ops.ResizeNearestNeighbor":
            y = self.resize(y)
        else:
            y = self.up(y)
        return self.conv2(y)


def _net(how: str) -> Up:
    ms.set_seed(5)
    net = Up(how)
    net.set_train(False)
    return net


def _x(n: int = 16) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (n, 3, 8, 8)).astype(np.float32)


@pytest.fixture(scope="module", params=SPELLINGS)
def calibrated(request, tmp_path_factory):
    net = _net(request.param)
    record = tmp_path_factory.mktemp("up") / "record.txt"
    ams.calibrate(net, _x(), record, algorithm="minmax")
    return request.param, net, record


@pytest.mark.parametrize(("target", "feature_type"), COMBOS)
def test_nearest_upsampling_exports_and_follows_the_net(calibrated, tmp_path, target, feature_type):
    how, net, record = calibrated
    x = _x()
    res, model = export_checked(net, record, tmp_path / "up.espdl", x, target, feature_type)
    assert {r.status for r in res.layers} <= {"exported", "fused"}, res.skipped
    kinds = {r.name: r.kind for r in res.layers}
    name = next(n for n, k in kinds.items() if k == "UpSampling2D")
    assert name == "up" if how in ("nn.Upsample", "bilinear") else name.endswith("_op0")
    out = list(net(ms.Tensor(x[:1])).shape)
    assert list(model.outputs[0].shape) == [1, out[2], out[3], out[1]]
    written = {n.op_type for n in model.nodes}
    assert ("Resize" in written) == (feature_type == "s8")  # the int16 Resize computes nothing
    if feature_type == "s16":
        err, span = chip_error(model, net, x, target)
        assert err <= 0.01 * span, (err, span)


@pytest.mark.parametrize("how", SPELLINGS)
def test_prune_groups_pass_channels_through_the_upsampling(how):
    found = prune_discovery(_net(how), (1, 3, 8, 8))
    assert not [r for r in found.refusals if r.reason.name == "UNKNOWN_OP"], found.refusals
    (group,) = found.groups  # conv's 4 channels, through the resize, into conv2
    assert [m.name for m in group.producers] == ["conv"]
    assert "conv2" in [m.name for m in group.consumers]
    resize = "ResizeBilinear" if how == "bilinear" else "ResizeNearestNeighbor"
    assert resize in [m.op_type for m in group.consumers]


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("fractional", r"'up' \(Upsample\): nn.Upsample from 8x8 to 12x12: not an integer scale"),
        ("align_corners", r"'up' \(Upsample\): nn.Upsample bilinear with align_corners=True"),
    ],
)
def test_what_is_not_written_is_refused_by_name(how, why, tmp_path):
    net = _net(how)
    record = tmp_path / "record.txt"
    ams.calibrate(net, _x(4), record, algorithm="minmax")
    with pytest.raises(ExportError, match=why):
        ams.export_espdl(net, record, tmp_path / "m.espdl", sample_input=(1, 3, 8, 8),
                         format="espdl", target="esp32s3")  # fmt: skip
    assert not (tmp_path / "m.espdl").exists()


class Transposed(nn.Cell):
    """conv, nn.Conv2dTranspose (+ BatchNorm2d folded, ReLU fused)."""

    def __init__(self, pad_mode: str = "same", kernel: int = 3, padding: int = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, has_bias=True)
        self.up = nn.Conv2dTranspose(
            4, 5, kernel, stride=2, pad_mode=pad_mode, padding=padding, has_bias=True
        )
        self.bn = nn.BatchNorm2d(5)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.bn(self.up(self.conv(x))))


def _transposed(pad_mode: str, kernel: int = 3, padding: int = 0) -> Transposed:
    ms.set_seed(6)
    net = Transposed(pad_mode, kernel, padding)
    rng = np.random.default_rng(4)
    for name in ("moving_mean", "moving_variance", "gamma", "beta"):
        low = 0.5 if name in ("moving_variance", "gamma") else -0.3
        getattr(net.bn, name).set_data(ms.Tensor(rng.uniform(low, low + 1, 5).astype(np.float32)))
    net.set_train(False)
    return net


@pytest.mark.parametrize(("pad_mode", "kernel"), [("same", 3), ("valid", 2), ("same", 4)])
def test_conv2d_transpose_exports_as_insert_zeros_and_conv(tmp_path, pad_mode, kernel):
    net = _transposed(pad_mode, kernel)
    x = _x()
    record = tmp_path / "record.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    for target, feature_type in COMBOS:
        out = tmp_path / f"{target}_{feature_type}.espdl"
        res, model = export_checked(net, record, out, x, target, feature_type)
        status = {r.name: r.status for r in res.layers}
        assert status == {"input0": "exported", "conv": "exported", "up": "exported",
                          "bn": "fused", "relu": "fused"}  # fmt: skip
        assert [n.op_type for n in model.nodes] == ["Conv", "InsertZeros", "Conv"]
        if feature_type == "s16":
            err, span = chip_error(model, net, x, target)
            assert err <= 0.01 * span, (err, span)


def test_conv2d_transpose_with_pads_beyond_the_kernel_is_refused_by_name(tmp_path):
    """pad_mode 'pad' exports (test_ms_v3_twins_conv.py) while each pad is at most kernel - 1."""
    net = _transposed("pad", padding=3)
    record = tmp_path / "record.txt"
    ams.calibrate(net, _x(4), record, algorithm="minmax")
    why = r"'up' \(Conv2DTranspose\): Conv2DTranspose with pads \[3, 3, 3, 3\] for a 3x3 kernel"
    with pytest.raises(ExportError, match=why) as err:
        ams.export_espdl(net, record, tmp_path / "m.espdl", sample_input=(1, 3, 8, 8),
                         format="espdl", target="esp32p4")  # fmt: skip
    assert "InsertZeros + Conv" in str(err.value)
