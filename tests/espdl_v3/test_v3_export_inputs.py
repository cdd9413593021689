"""Export inputs checked up front (issue 32): an output name the file system cannot take is
refused before any work (it was an internal OSError, and with --data only after the search),
and a NaN test input is refused (it was embedded as zeros)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from amct_bridge.errors import ExportError
from amct_bridge.keras import calibrate, export_espdl


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    keras.utils.set_random_seed(0)
    x_in = keras.Input((8, 8, 3))
    y = keras.layers.Conv2D(4, 3, activation="relu", name="c1")(x_in)
    y = keras.layers.GlobalAveragePooling2D(name="gap")(y)
    model = keras.Model(x_in, keras.layers.Dense(3, name="fc")(y))
    x = np.random.default_rng(0).uniform(0, 1, (64, 8, 8, 3)).astype("float32")
    record = tmp_path_factory.mktemp("rec") / "r.txt"
    calibrate(model, x[:16], record, algorithm="minmax")
    return model, x, record


@pytest.mark.parametrize("fmt", ["v1", "espdl"])
def test_an_output_name_too_long_is_refused_before_any_work(small, tmp_path, fmt):
    model, x, record = small
    out = tmp_path / ("m" * 300)
    with pytest.raises(ExportError, match="is 300 bytes long, at most 255 expected"):
        export_espdl(model, record, out, format=fmt, calibration_data=x if fmt == "v1" else None)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_parent_is_refused_before_the_search(small, tmp_path):
    model, x, record = small
    with pytest.raises(ExportError, match="nope: directory does not exist"):
        export_espdl(model, record, tmp_path / "nope" / "out", calibration_data=x)


def test_a_nan_test_input_is_refused(small, tmp_path):
    model, x, record = small
    bad = x[:1].copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ExportError, match="test input: 1 of 192 values .* are NaN or infinite"):
        export_espdl(model, record, tmp_path / "m.espdl", format="espdl", test_input=bad)
    assert not (tmp_path / "m.espdl").exists()


@pytest.mark.parametrize("fmt", ["v1", "espdl"])
def test_an_absurd_sidecar_range_is_refused_by_layer(small, tmp_path, fmt):
    """A sidecar range of +-1e300 exported output_exponent 990 with exit 0 (issue 32)."""
    from amct_bridge.records.calibration import TensorRange, load_stats, save_stats

    model, _, record = small
    stats = load_stats(str(record) + ".calib.json")
    stats.layers["c1"].output = TensorRange(-1e300, 1e300)
    side = tmp_path / "broken.calib.json"
    save_stats(stats, side)
    with pytest.raises(ExportError, match=r"layer 'c1', output: range .* needs exponent 990"):
        export_espdl(model, record, tmp_path / "out", format=fmt, stats=side)
    assert not (tmp_path / "out").exists()
