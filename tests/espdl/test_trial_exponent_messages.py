"""The 'no calibrated output range' error tells a missing sidecar from a sidecar without the
layer (issue 21 trial: a QAT skip_layers classifier got 'pass the sidecar ...', though the
sidecar had been read)."""

from __future__ import annotations

import numpy as np
import pytest

from amct_bridge.errors import ExportError
from amct_bridge.espdl import SourceLayer
from amct_bridge.espdl.v1.export import export_layers
from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange


def simple_model():
    """input -> conv 'c1' (3 -> 4, 3x3) -> ReLU 'r1' -> Dense-like 1x1 conv 'lr'."""
    rng = np.random.default_rng(0)
    return [
        SourceLayer("in", "input"),
        SourceLayer(
            "c1", "conv2d", ["in"], "Conv2D",
            {"kernel": rng.normal(size=(3, 3, 3, 4)).astype(np.float32)},
            {"strides": (1, 1), "padding": "same"},
        ),
        SourceLayer("r1", "relu", ["c1"], "ReLU"),
        SourceLayer(
            "lr", "conv2d", ["r1"], "Conv2D",
            {"kernel": rng.normal(size=(1, 1, 4, 2)).astype(np.float32)},
            {"strides": (1, 1), "padding": "valid"},
        ),
    ]  # fmt: skip


def stats_for(**ranges):
    st = CalibrationStats(algorithm="minmax", batches=1)
    for name, (inp, out) in ranges.items():
        st.layers[name] = LayerStats(
            "X", TensorRange(*inp) if inp else None, TensorRange(*out) if out else None
        )
    return st


def test_a_read_sidecar_without_the_layer_is_not_told_to_pass_a_sidecar():
    with pytest.raises(ExportError) as err:
        export_layers(simple_model(), None, stats=stats_for(r1=(None, (0, 1))))
    text = str(err.value)
    assert "no calibrated output range for 'lr'" in text
    assert "the sidecar has 1 entries but none for 'lr'" in text and "pass the" not in text


def test_no_sidecar_at_all_says_to_pass_it():
    with pytest.raises(ExportError, match="pass the sidecar the calibration wrote beside"):
        export_layers(simple_model(), None, stats=CalibrationStats())
