"""Issue 33 §9 on MindSpore: the calibration sidecar describes the network (each cell's kind,
each weighted cell's kernel shape in MindSpore's OIHW / OI layout), and the ESP-DL export
(whose kernels are HWIO) refuses a sidecar of another network by cell name."""

from __future__ import annotations

import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

import amct_bridge.mindspore as ams
from amct_bridge.errors import ExportError


class Net(nn.Cell):
    """conv 3->4, ReLU, conv 4->``width`` (1x1), global mean, Dense ``width``->3."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, pad_mode="same", has_bias=True)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(4, width, 1, has_bias=True)
        self.flatten = nn.Flatten()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Dense(width, 3)

    def construct(self, x):
        y = self.relu(self.conv2(self.relu(self.conv1(x))))
        return self.fc(self.flatten(self.pool(y)))


@pytest.fixture(autouse=True)
def graph_mode():
    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=before)


def test_the_sidecar_of_another_network_is_refused_by_cell_name(tmp_path):
    ms.set_seed(0)
    data = np.random.default_rng(0).uniform(0, 1, (8, 3, 8, 8)).astype(np.float32)
    narrow, wide = Net(4), Net(6)
    ams.calibrate(narrow, data, tmp_path / "n.txt", algorithm="minmax")
    side = json.loads((tmp_path / "n.txt.calib.json").read_text())
    # independent: the sidecar holds the cells' own weight shapes (OIHW, OI)
    assert side["model"]["conv2"] == {
        "kind": side["model"]["conv2"]["kind"],
        "kernel": list(narrow.conv2.weight.shape),
        "layout": "OIHW",
    }
    assert side["model"]["fc"]["kernel"] == list(narrow.fc.weight.shape)
    ams.export_espdl(narrow, tmp_path / "n.txt", None, sample_input=(1, 3, 8, 8))  # its own
    with pytest.raises(ExportError) as err:
        ams.export_espdl(
            wide, None, None, sample_input=(1, 3, 8, 8), stats=tmp_path / "n.txt.calib.json"
        )
    text = str(err.value)
    assert "calibration sidecar: written for another model: layer 'conv2' (Conv2d): kernel " in (
        text
    )
    assert (
        f"{tuple(narrow.conv2.weight.shape)} OIHW when calibrated, 4 output channels and "
        f"{int(np.prod(narrow.conv2.weight.shape))} weights"
    ) in text
    assert "here, 6 output channels and 24 weights" in text  # wide.conv2: (6, 4, 1, 1)
    assert "'conv1'" not in text  # the same in both


def test_call_sites_keep_what_the_export_checks():
    """A shared quantized cell has one sidecar entry (``fc``) for the export's ``fc``, ``fc@1``:
    the sidecar rebuilt for the sites dropped ``model``, ``record_keys`` and ``flavor``, so the
    check above never ran for such a network."""
    from amct_bridge.espdl.source import SourceLayer
    from amct_bridge.mindspore.espdl_weights import _call_sites
    from amct_bridge.records.calibration import CalibrationStats, LayerShape, LayerStats

    fc = LayerStats("Dense")
    stats = CalibrationStats(layers={"fc": fc}, model={"fc": LayerShape("Dense", (3, 4), "OI")})
    stats.record_keys, stats.flavor = ["fc"], "inner"
    layers = [SourceLayer("fc", "dense"), SourceLayer("fc@1", "dense")]
    sited = _call_sites(stats, layers)
    assert set(sited.layers) == {"fc", "fc@1"} and sited.layers["fc@1"] is fc
    assert sited.model == stats.model
    assert (sited.record_keys, sited.flavor) == (["fc"], "inner")
