"""Refusals of the MindSpore ESP-DL exports name the format being exported: the v3 export said
"no ESP-DL v3 export for StridedSlice: functional StridedSlice has no ESP-DL v1 equivalent".
Each case is refused by both formats; the v1 text is kept, the v3 text names v3 and never v1."""

from __future__ import annotations

from collections import OrderedDict

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from nets import SharedDense

import amct_bridge.mindspore as ams
from amct_bridge.errors import ExportError


class Sliced(nn.Cell):
    """conv, a channel slice (StridedSlice in MindIR), Flatten, Dense."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, pad_mode="valid", has_bias=True)
        self.flat = nn.Flatten()
        self.fc = nn.Dense(2 * 4 * 4, 3)

    def construct(self, x):
        return self.fc(self.flat(self.conv(x)[:, :2]))


class Scale(nn.Cell):
    """A custom leaf cell (no ESP-DL translation)."""

    def construct(self, x):
        return x * 2.0 + 1.0


def _grouped():
    return nn.SequentialCell(
        OrderedDict(
            first=nn.Conv2d(4, 4, 1),
            conv=nn.Conv2d(4, 4, 3, group=2, pad_mode="valid"),
            flat=nn.Flatten(),
            fc=nn.Dense(4 * 6 * 6, 2),
        )
    )


def _custom():
    return nn.SequentialCell(OrderedDict(fc=nn.Dense(6, 4), scale=Scale()))


CASES = {
    # name: (net factory, sample input shape, refused layer, v1 text, v3 text)
    "strided_slice": (
        Sliced, (1, 1, 6, 6), "stridedslice_op0",
        "functional StridedSlice has no ESP-DL v1 equivalent here",
        "functional StridedSlice is not translated by the ESP-DL v3 exporter here",
    ),
    "shared_dense": (
        SharedDense, (1, 6), "fc",
        "give each call its own cell: not supported by the ESP-DL v1 exporter",
        "give each call its own cell: not supported by the ESP-DL v3 exporter",
    ),
    "grouped": (  # a dilated conv is refused by v1 only (test_ms_v3_twins_conv.py)
        _grouped, (1, 4, 8, 8), "conv",
        "group 2 (grouped convolution; only 1 and in_channels): not supported by the ESP-DL v1",
        "group 2 (grouped convolution; only 1 and in_channels): not supported by the ESP-DL v3",
    ),
    "custom_cell": (
        _custom, (1, 6), "scale",
        "cell class Scale has no ESP-DL v1 equivalent",
        "cell class Scale is not translated by the ESP-DL v3 exporter",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_refusal_names_the_format_exported(case, tmp_path):
    factory, shape, layer, v1_text, v3_text = CASES[case]
    ms.set_seed(0)
    net = factory()
    x = np.random.default_rng(0).normal(0, 1, (8, *shape[1:])).astype(np.float32)
    record = tmp_path / "r.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    with pytest.raises(ExportError) as v1:
        ams.export_espdl(net, record, tmp_path / "v1", sample_input=shape)
    line = next(ln for ln in str(v1.value).splitlines() if repr(layer) in ln)
    assert v1_text in line, line
    with pytest.raises(ExportError) as v3:
        ams.export_espdl(net, record, tmp_path / "m.espdl", sample_input=shape, format="espdl")
    text = str(v3.value)
    assert text.startswith("ESP-DL v3 export cannot take")
    line = next(ln for ln in text.splitlines() if repr(layer) in ln)
    assert v3_text in line and "v1" not in text, text
    assert not (tmp_path / "v1").exists() and not (tmp_path / "m.espdl").exists()


def test_unknown_format_is_refused_before_anything(tmp_path):
    net = nn.SequentialCell([nn.Dense(4, 2)])
    with pytest.raises(ExportError, match="format 'v2': expected 'v1'.*or 'espdl'"):
        ams.export_espdl(net, None, tmp_path / "o", sample_input=(1, 4), format="v2")
    assert not (tmp_path / "o").exists()
