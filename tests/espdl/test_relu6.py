"""The ReLU6 path of docs/espdl-export.md: replace_relu6 -> short fine-tune with the calibration
callback -> a complete ESP-DL v1 export that previews and runs on the simulated chip.

ESP-DL v1 has no clip, so ReLU6 is refused; ``amct_bridge.keras.replace_relu6`` returns a copy
with plain ReLUs (same names and weights). Checked on keras.applications.MobileNetV2 (alpha
0.35, 32x32: ZeroPadding2D before every stride-2 depthwise, ReLU6 after BN, residual Adds).
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from amct_bridge.cli import main
from amct_bridge.errors import AmctBridgeError, ExportError
from amct_bridge.espdl import simulate_chip
from amct_bridge.keras import QuantCalibration, export_espdl, replace_relu6
from amct_bridge.keras.relu6 import relu6_layers

L = keras.layers


def _three_forms() -> keras.Model:
    """ReLU(6), Activation('relu6'), a conv's own activation='relu6', one inside a nested model."""
    inner_in = keras.Input((6, 6, 4), name="inner_in")
    inner = keras.Model(
        inner_in, L.ReLU(6.0, name="r6")(L.Conv2D(4, 1, name="c2")(inner_in)), name="inner"
    )
    x = keras.Input((6, 6, 3), name="img")
    a = L.Conv2D(4, 3, padding="same", activation="relu6", name="c1")(x)
    b = inner(a)
    c = L.Conv2D(5, 1, name="c3")(b)
    c = L.Activation("relu6", name="a6")(c)
    keep = L.ReLU(max_value=2.0, name="r2")(c)  # a clip other than 6: not a ReLU6, left alone
    return keras.Model(x, keep, name="forms")


def test_replace_relu6_keeps_names_and_weights_and_only_drops_the_clip():
    keras.utils.set_random_seed(0)
    model = _three_forms()
    for layer in model.layers:  # large weights: every ReLU6 clips somewhere
        layer.set_weights([w * 8 for w in layer.get_weights()])
    assert relu6_layers(model) == ["c1", "inner/r6", "a6"]
    copy = replace_relu6(model)
    assert relu6_layers(copy) == [] and relu6_layers(model) == ["c1", "inner/r6", "a6"]
    assert [x.name for x in copy.layers] == [x.name for x in model.layers]
    assert [x.name for x in copy.get_layer("inner").layers] == ["inner_in", "c2", "r6"]
    assert copy.get_layer("r2").max_value == 2.0
    for old, new in zip(model.weights, copy.weights, strict=True):
        assert np.array_equal(old.numpy(), new.numpy())

    # independent numpy forward pass of the copy: the same convolutions, ReLU without the clip
    x = np.random.default_rng(1).uniform(-1, 1, (2, 6, 6, 3)).astype("float32")
    k1, b1 = model.get_layer("c1").get_weights()
    k2, b2 = model.get_layer("inner").get_layer("c2").get_weights()
    k3, b3 = model.get_layer("c3").get_weights()
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))
    a = np.einsum("nhwcij,ijco->nhwo", windows, k1) + b1

    def tail(a, clip):
        a = np.minimum(np.maximum(a, 0), clip)
        b = np.minimum(np.maximum(a @ k2[0, 0] + b2, 0), clip)
        c = np.minimum(np.maximum(b @ k3[0, 0] + b3, 0), clip)
        return np.minimum(c, 2.0)

    assert np.abs(np.maximum(a, 0)).max() > 6  # the clip matters for this input
    np.testing.assert_allclose(copy.predict(x, verbose=0), tail(a, np.inf), atol=1e-3, rtol=1e-4)
    np.testing.assert_allclose(model.predict(x, verbose=0), tail(a, 6.0), atol=1e-3, rtol=1e-4)


def test_replace_relu6_refuses_what_it_cannot_copy():
    class Sub(keras.Model):
        def call(self, x):
            return keras.ops.relu6(x)

    with pytest.raises(AmctBridgeError, match="cannot copy model"):
        replace_relu6(Sub())
    with pytest.raises(AmctBridgeError, match="expected a keras.Model"):
        replace_relu6("model.keras")


@pytest.fixture(scope="module")
def mobilenet_v2():
    keras.utils.set_random_seed(0)
    return keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10, classifier_activation=None
    )


def test_mobilenet_v2_is_refused_with_the_path_to_follow(mobilenet_v2):
    with pytest.raises(ExportError, match=r"replace_relu6") as err:
        export_espdl(mobilenet_v2, None, None)
    # one explanation for all of them (issue 23: it was repeated per layer), every layer named
    names = relu6_layers(mobilenet_v2)
    assert f"cannot take {len(names)} layers: {len(names)} ReLU6:" in str(err.value)
    assert f"  {len(names)} layers (ReLU): 'Conv1_relu', " in str(err.value)
    assert all(f"'{name}'" in str(err.value) for name in names)
    assert str(err.value).count("replace_relu6()") == 1


def test_mobilenet_v2_relu6_path_exports_completely_and_runs_on_the_chip(
    mobilenet_v2, tmp_path, capsys
):
    model = replace_relu6(mobilenet_v2)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,  # XLA compiles longer than this tiny fine-tune runs
    )
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (40, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, 40)
    record = tmp_path / "record.txt"
    # the documented path: a short fine-tune, calibrated on the validation pass (final weights,
    # inference-mode BatchNorm)
    callback = QuantCalibration(record, algorithm="minmax", on="validation")
    model.fit(
        x[:24],
        y[:24],
        validation_data=(x[24:], y[24:]),
        epochs=1,
        batch_size=8,
        verbose=0,
        callbacks=[callback],
    )
    out = tmp_path / "espdl"
    result = export_espdl(model, record, out, target="esp32s3", cpp="mnv2_coefficient")
    assert result.skipped == [] and result.graph is not None

    # every Keras layer is accounted for in export.json (nothing silently missing)
    report = json.loads((out / "export.json").read_text())
    seen = set(report["inputs"]) | {p["layer"] for p in report["passthrough"]}
    for entry in report["layers"] + report["runtime_layers"]:
        seen |= {entry["source"], *entry.get("fused", [])}
    assert seen == {layer.name for layer in model.layers}
    assert report["skipped"] == []
    folded = [e for e in report["layers"] if "pads" in e]  # every block_k_pad folded (k=1,3,6,13)
    assert sorted(e["fused"][0] for e in folded) == sorted(f"block_{k}_pad" for k in (1, 3, 6, 13))
    assert {e["class"] for e in report["runtime_layers"]} == {"Add2D", "GlobalAveragePool2D"}
    assert (out / "mnv2_model.hpp").is_file() and (out / "app_main.cpp").is_file()

    # the preview of the written set runs (convert.py's integers, bit for bit)
    assert main(["export-espdl", "--preview", "--set", str(out), "--target", "esp32s3"]) == 0
    assert "block_16_project" in capsys.readouterr().out

    # the chip runs it; its logits follow the float model's (s8: a few % of the range)
    chip = simulate_chip(out, x[24:], target="esp32s3")
    want = model.predict(x[24:], verbose=0)
    got = chip.output.to_float()
    assert got.shape == want.shape == (16, 10)
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()
    # docs: ±1 LSB; Keras numbers auto-named layers per process, so read the name from the model
    pools = [x.name for x in model.layers if isinstance(x, L.GlobalAveragePooling2D)]
    assert len(pools) == 1 and chip.approximate_layers == pools
