"""Same-padded AveragePooling2D at the border (issue 23 §1): Keras averages the real cells, the
ESP-DL v1 runtime divides by the full window, and v1 cannot express Keras' rule. The simulator
models the chip (checked against Keras on a constant map, where the chip's value over Keras' is
the real-cell share), and the export warns with the measured figures (recomputed here by
counting cells in plain loops)."""

from __future__ import annotations

import json
import math

import keras
import numpy as np
import pytest
from espdl_stats import layer_activations, sidecar_from

from amct_bridge.cli import main
from amct_bridge.espdl.v1.chip import border_ratios, simulate_chip
from amct_bridge.keras import calibrate, export_espdl
from amct_bridge.keras.espdl_eval import evaluate_espdl

L = keras.layers


def _loop_ratios(h: int, w: int, k: int, s: int) -> np.ndarray:
    """TensorFlow's SAME windows counted cell by cell."""
    out_h, out_w = -(-h // s), -(-w // s)
    top = max((out_h - 1) * s + k - h, 0) // 2
    left = max((out_w - 1) * s + k - w, 0) // 2
    ratio = np.zeros((out_h, out_w))
    for i in range(out_h):
        for j in range(out_w):
            real = 0
            for di in range(k):
                for dj in range(k):
                    r, c = i * s - top + di, j * s - left + dj
                    real += 0 <= r < h and 0 <= c < w
            ratio[i, j] = real / (k * k)
    return ratio


@pytest.mark.parametrize(
    ("h", "w", "k", "s"), [(8, 8, 3, 1), (7, 9, 3, 2), (6, 6, 2, 2), (5, 5, 5, 1)]
)
def test_border_ratios_count_the_real_cells(h, w, k, s):
    attrs = {"pool": [k, k], "strides": [s, s], "padding": "SAME_END"}
    assert np.allclose(border_ratios((h, w), attrs), _loop_ratios(h, w, k, s))


def _pool_model(padding: str = "same", pool: int = 3, strides: int = 1) -> keras.Model:
    x = keras.Input((8, 8, 1), name="img")
    c = L.Conv2D(1, 1, name="c1", kernel_initializer="ones", bias_initializer="zeros")(x)
    a = L.AveragePooling2D(pool, strides=strides, padding=padding, name="ap")(c)
    a = L.Flatten(name="f")(a)
    return keras.Model(x, L.Dense(2, name="fc")(a))


def test_the_chip_divides_by_the_full_window_and_the_export_says_by_how_much(tmp_path, capsys):
    keras.utils.set_random_seed(0)
    model = _pool_model()
    x = np.random.default_rng(0).uniform(0.2, 1.0, (32, 8, 8, 1)).astype("float32")
    record = tmp_path / "r.txt"
    calibrate(model, x, record, algorithm="minmax")
    path = tmp_path / "m.keras"
    model.save(path)
    out = tmp_path / "espdl"
    argv = ["export-espdl", "--model", str(path), "--record", str(record), "--out", str(out)]
    assert main([*argv, "--feature-type", "s16"]) == 0
    err = capsys.readouterr().err
    ratio = _loop_ratios(8, 8, 3, 1)
    border = ratio < 1
    snr = 10 * math.log10(ratio.size / np.sum((1 - ratio) ** 2))
    figures = [
        "layer 'ap' (average pool 3x3, stride 1x1, padding 'same')",
        f"{int(border.sum())} of 64 output positions ({100 * border.mean():.0f}%)",
        f"between {ratio.min():.2f}x and {ratio[border].max():.2f}x the model's value",
        f"up to {1 / ratio.min():.2f}x the chip's",
        f"limits the layer's SNR to {snr:.1f} dB",
    ]
    (warning,) = [
        w for w in json.loads((out / "export.json").read_text())["warnings"] if "'ap'" in w
    ]
    for part in figures:
        assert part in warning and part in err, part

    # a constant map: the chip's average over Keras' is the real-cell share (±2 LSB at s16)
    const = np.full((1, 8, 8, 1), 0.5, np.float32)
    ref = keras.Model(model.inputs, model.get_layer("ap").output).predict(const, verbose=0)
    chip = simulate_chip(out, const)["ap"]
    assert np.allclose(ref[0, ..., 0], 0.5)  # Keras: the real cells only
    lsb = 2.0**chip.exponent
    assert np.abs(chip.to_float()[0, ..., 0] - 0.5 * ratio).max() <= 2 * lsb

    # espdl-eval splits the pool's error: large at the border, small inside
    y = model.predict(x, verbose=0).argmax(axis=1)
    ev = evaluate_espdl(out, model, x, y)
    (line,) = ev.border
    edge = float(line.split("SNR ")[1].split(" dB")[0])
    inside = float(line.split("positions, ")[1].split(" dB")[0])
    assert f"at the {int(border.sum())} border positions" in line
    assert edge < 20 < inside


@pytest.mark.parametrize(("padding", "pool", "strides"), [("valid", 3, 1), ("same", 2, 2)])
def test_no_warning_when_no_window_leaves_the_map(padding, pool, strides):
    model = _pool_model(padding, pool, strides)
    x = np.random.default_rng(1).uniform(0.2, 1.0, (8, 8, 8, 1)).astype("float32")
    res = export_espdl(model, None, None, stats=sidecar_from(layer_activations(model, x)))
    assert not [w for w in res.warnings if "average pool" in w]
