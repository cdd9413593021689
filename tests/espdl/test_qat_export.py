"""QAT -> ESP-DL v1: quantize_aware, fit, save_qat_record (record + sidecar), strip_qat (BN folded
into plain Conv/Dense), export_espdl, chip simulation close to the stripped float model, preview.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from sklearn.datasets import load_digits

from amct_bridge.cli import main
from amct_bridge.espdl.exponents import ExponentFinder
from amct_bridge.espdl.v1.chip import simulate_chip
from amct_bridge.espdl.v1.preview import load_set, preview_set
from amct_bridge.keras import export_espdl
from amct_bridge.keras.qat import quantize_aware, save_qat_record, strip_qat
from amct_bridge.records import load, validate
from amct_bridge.records.calibration import load_stats, sidecar_path


def residual_cnn() -> keras.Model:
    """Conv+BN+ReLU twice, Add (+ReLU), MaxPool, Flatten, Dense: the usual small CNN."""
    x = keras.Input((8, 8, 1), name="image")
    a = keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name="c1")(x)
    a = keras.layers.ReLU(name="r1")(keras.layers.BatchNormalization(name="bn1")(a))
    b = keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name="c2")(a)
    b = keras.layers.ReLU(name="r2")(keras.layers.BatchNormalization(name="bn2")(b))
    s = keras.layers.ReLU(name="add_relu")(keras.layers.Add(name="add")([a, b]))
    p = keras.layers.MaxPooling2D(2, name="mp")(s)
    y = keras.layers.Dense(10, name="fc")(keras.layers.Flatten(name="flat")(p))
    return keras.Model(x, y, name="res_cnn")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(QAT model, stripped model, record path, test images); INT8 QAT, 2 epochs on digits."""
    keras.utils.set_random_seed(0)
    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    y = data.target
    x_tr, y_tr, x_te = x[:600], y[:600], x[1500:1700]
    model = residual_cnn()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
    model.fit(x_tr, y_tr, epochs=3, batch_size=32, verbose=0)
    qat = quantize_aware(model, "INT8")
    qat.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    qat.fit(x_tr, y_tr, epochs=2, batch_size=32, verbose=0)
    out = tmp_path_factory.mktemp("qat")
    record_path = out / "qat_record.txt"
    save_qat_record(qat, record_path)
    return qat, strip_qat(qat), record_path, x_te


def test_stripped_model_has_no_batchnorm_and_loads_without_the_project(trained, tmp_path):
    qat, stripped, _, x = trained
    kinds = {type(layer).__name__ for layer in stripped.layers}
    assert not kinds & {"BatchNormalization", "FoldedBatchNorm", "QATQuant", "QATObserve"}
    assert [layer.name for layer in stripped.layers] == [
        "image", "c1", "r1", "c2", "r2", "add", "add_relu", "mp", "flat", "fc",
    ]  # fmt: skip
    assert stripped.get_layer("c1").use_bias  # the BN's shift became the conv's bias
    path = tmp_path / "stripped.keras"
    stripped.save(path)
    np.save(tmp_path / "x.npy", x)
    script = (
        "import sys, keras, numpy as np\n"
        f"m = keras.saving.load_model({str(path)!r})\n"
        f"np.save({str(tmp_path / 'y.npy')!r}, m.predict(np.load({str(tmp_path / 'x.npy')!r}),"
        " verbose=0))\n"
        "assert not [n for n in sys.modules if n.startswith('amct_bridge')], 'imported'\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = stripped.predict(x, verbose=0)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-5, atol=1e-5)


def test_record_and_sidecar_hold_what_the_export_needs(trained):
    qat, _, record_path, _ = trained
    record = load(record_path)
    assert validate(record) == [] and list(record.layers) == ["c1", "c2", "fc"]
    stats = load_stats(sidecar_path(record_path))
    assert stats.algorithm == "qat-ema" and stats.batches == 2 * 19  # 600 images / 32, 2 epochs
    assert list(stats.layers) == [
        "c1", "bn1", "r1", "c2", "bn2", "r2", "add", "add_relu", "mp", "fc",
    ]  # fmt: skip
    # ranges are the QAT model's own: c2 reads r1 clipped at its input range (the record's),
    # the Add's output is the EMA of its batches' min/max
    lo, hi, _ = (float(v.numpy()) for v in qat.get_layer("c2").ranges["input"])
    assert (stats.layers["r1"].output.min, stats.layers["r1"].output.max) == (lo, hi)
    assert (stats.layers["c2"].input.min, stats.layers["c2"].input.max) == (lo, hi)
    add_lo, add_hi, _ = (float(v.numpy()) for v in qat.get_layer("add").output_range)
    assert (stats.layers["add"].output.min, stats.layers["add"].output.max) == (add_lo, add_hi)
    assert add_hi > hi  # a sum of two ReLU outputs: wider than either
    assert stats.layers["bn1"].output == stats.layers["c1"].output


@pytest.mark.parametrize("granularity", ["per-tensor", "per-channel"])
def test_export_simulates_on_the_chip_like_the_stripped_model(trained, tmp_path, granularity):
    _, stripped, record_path, x = trained
    out = tmp_path / "espdl"
    res = export_espdl(
        stripped, record_path, out, feature_type="s8", granularity=granularity, target="esp32s3"
    )
    assert sorted(res.config) == ["c1", "c2", "fc"]
    report = json.loads((out / "export.json").read_text())
    assert report["skipped"] == []
    # (a Dense bias far below the logits' step may round to 0: the chip's own limit, warned)
    assert [w for w in report["warnings"] if "bias values" not in w] == []
    sources = {layer["name"]: layer["exponent_sources"] for layer in report["layers"]}
    assert "sidecar" in sources["c1"]["output_exponent"]
    runtime = {r["name"]: r for r in report["runtime_layers"]}
    assert "sidecar" in runtime["add"]["exponent_source"]
    chip = simulate_chip(out, x, target="esp32s3")
    assert chip.warnings == []
    got = chip.output.to_float()
    want = stripped.predict(x, verbose=0)
    agree = float(np.mean(got.argmax(axis=1) == want.argmax(axis=1)))
    assert agree >= 0.95, agree
    # the written set previews to the integers the export computed (what convert.py will write)
    config, arrays = load_set(out)
    disk = preview_set(config, arrays, target="esp32", per_channel=granularity == "per-channel")
    for mine, again in zip(res.layers, disk, strict=True):
        assert mine.preview.filter.values.tolist() == again.filter.values.tolist()
        assert np.array_equal(mine.preview.filter.exponent, again.filter.exponent)


def test_cli_preview_of_the_saved_stripped_model(trained, tmp_path, capsys):
    _, stripped, record_path, _ = trained
    stripped.save(tmp_path / "m.keras")
    argv = ["export-espdl", "--record", str(record_path), "--model", str(tmp_path / "m.keras")]
    assert main([*argv, "--preview"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:4]] == ["c1", "c2", "fc"]


def test_int4_qat_record_exports_without_false_warnings(tmp_path):
    """An INT4 QAT record's scale_w are ARQ on the INT4 grid (max / 7): not a mismatch; without
    a sidecar, its scale_d/offset_d encode an INT4 range, [(-8 - o) s, (7 - o) s]."""
    keras.utils.set_random_seed(1)
    x = np.random.default_rng(0).uniform(0, 1, (64, 8, 8, 1)).astype("float32")
    labels = (x.mean(axis=(1, 2, 3)) * 20).astype("int64") % 10
    qat = quantize_aware(residual_cnn(), "INT4")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    qat.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    qat.fit(x, labels, epochs=1, batch_size=16, verbose=0)
    record = save_qat_record(qat, tmp_path / "r.txt")
    stripped = strip_qat(qat)
    res = export_espdl(stripped, tmp_path / "r.txt", tmp_path / "o")
    assert [w for w in res.warnings if "scale_w" in w] == []
    finder = ExponentFinder([], record, None, bits=8)  # no sidecar: the record's factors
    for key in ("c1", "c2", "fc"):
        f = record.layers[key]
        lo, hi = (-8 - f.offset_d) * f.scale_d, (7 - f.offset_d) * f.scale_d
        want = int(np.ceil(np.log2(max(abs(lo), abs(hi)) / 127)))
        exp, _, found = finder.record_exponent(key)
        assert exp == want and found == pytest.approx((lo, hi))
