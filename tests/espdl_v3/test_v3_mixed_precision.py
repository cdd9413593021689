"""Issue 31, "Mixed s8/s16 per layer": one .espdl file with int8 and int16 layers.

- ``layer_bits={"c2": 16}`` on a Conv -> Conv -> Flatten -> Dense model: the file passes
  ``espdl-run --check``, ``RequantizeLinear`` nodes sit exactly at the two width boundaries,
  their values are the numpy shifts of their inputs (int8 -> int16 exact, int16 -> int8 rounded
  as the target rounds), the int16 conv has an int16 filter and a 64-bit bias, and the chip
  output tracks Keras' float output;
- ``feature_type="auto"`` on a CNN trained on scikit-learn's digits: the drop it reports is
  re-measured here from explicit exports against Keras' own predictions; it is within
  ``max_drop``; all-int8 is not; no chosen layer can go back to int8 without exceeding
  ``max_drop`` (the greedy rule's promise: a minimal set); all-int16 is the ``s16`` export's.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from digits_cnn import trained_digits_cnn

from amct_bridge.cli import main
from amct_bridge.errors import ExportError
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.espdl.v3.evaluation import quantize_input
from amct_bridge.keras import calibrate, export_espdl

L = keras.layers


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 2))
    h = L.Conv2D(4, 3, padding="same", activation="relu", name="c1")(inp)
    h = L.Conv2D(6, 3, padding="same", activation="relu", name="c2")(h)
    model = keras.Model(inp, L.Dense(3, name="fc")(L.Flatten(name="fl")(h)))
    x = np.random.default_rng(0).uniform(-1, 1, (64, 6, 6, 2)).astype("float32")
    tmp = tmp_path_factory.mktemp("tiny")
    calibrate(model, x, tmp / "record.txt")
    return model, x, tmp


def _real(result, name, values):
    info = next(v for v in result.model.value_info if v.name == name)
    return values[name].astype(np.float64) * 2.0 ** info.exponents[0]


@pytest.mark.parametrize("target", ["esp32s3", "esp32p4", "c"])
def test_explicit_layer_bits_writes_one_checked_file_with_boundaries(tiny, target):
    model, x, tmp = tiny
    path = tmp / f"mixed_{target}.espdl"
    res = export_espdl(
        model, tmp / "record.txt", path, format="espdl", target=target, layer_bits={"c2": 16}
    )
    assert main(["espdl-run", str(path), "--check"]) == 0
    nodes = [(n.op_type, n.name, n.attributes["quant_type"]) for n in res.model.nodes]
    assert nodes == [
        ("Conv", "c1", "S8"),
        ("RequantizeLinear", "c1/requantize_s16", "S16"),  # int8 -> int16 before c2
        ("Conv", "c2", "S16"),
        ("Flatten", "fl", "S16"),  # keeps its input's width
        ("RequantizeLinear", "fl/requantize_s8", "S8"),  # int16 -> int8 before fc
        ("Gemm", "fc", "S8"),
    ]
    assert res.layer_bits == {"c2": 16}
    types = {v.name: v.elem_type for v in res.model.value_info}
    assert types["c1"] == 3 and types["c2"] == 5 and types["fc"] == 3  # INT8 / INT16
    assert res.model.inputs[0].elem_type == 3  # the first layer's width
    inits = res.model.initializers
    assert inits["c2/filter"].data.dtype == np.int16 and inits["c2/bias"].data.dtype == np.int64
    assert inits["c1/filter"].data.dtype == np.int8 and inits["c1/bias"].data.dtype == np.int32
    assert read_espdl(path).nodes[1].op_type == "RequantizeLinear"

    sim = simulate_espdl(res.model, quantize_input(res.model, x, target), target)
    v = sim.values
    exps = {i.name: i.exponents[0] for i in res.model.value_info}
    # int8 -> int16: the exponent 8 lower, every value shifted left by 8 (exact)
    assert exps["c1/requantize_s16"] == exps["c1"] - 8
    assert np.array_equal(v["c1/requantize_s16"], v["c1"].astype(np.int64) << 8)
    # int16 -> int8: a right shift rounded as the target rounds, saturated
    k = exps["fl/requantize_s8"] - exps["fl"]
    assert k > 0
    scaled = v["fl"].astype(np.float64) / 2.0**k
    rounded = np.rint(scaled) if target == "esp32p4" else np.floor(scaled + 0.5)
    assert np.array_equal(v["fl/requantize_s8"], np.clip(rounded, -128, 127).astype(np.int8))

    ref = model.predict(x, verbose=0)
    got = _real(res, "fc", v).reshape(ref.shape)
    assert np.abs(got - ref).max() <= 0.05 * np.abs(ref).max(), np.abs(got - ref).max()
    # c2 itself is int16: closer to Keras' c2 than the all-int8 export's c2
    c2 = keras.Model(model.input, model.get_layer("c2").output).predict(x, verbose=0)
    s8 = export_espdl(model, tmp / "record.txt", None, format="espdl", target=target)
    v8 = simulate_espdl(s8.model, quantize_input(s8.model, x, target), target).values
    err16 = np.abs(_real(res, "c2", v).reshape(c2.shape) - c2).mean()
    err8 = np.abs(_real(s8, "c2", v8).reshape(c2.shape) - c2).mean()
    assert err16 < err8, (err16, err8)


def test_layer_bits_names_are_checked(tiny):
    model, _, tmp = tiny
    rec = tmp / "record.txt"
    with pytest.raises(ExportError, match=r"names 'c2x', which is no layer.*did you mean 'c2'"):
        export_espdl(model, rec, None, format="espdl", layer_bits={"c2x": 16})
    with pytest.raises(ExportError, match=r"layer_bits\['c2'\] = 32: expected 8 or 16"):
        export_espdl(model, rec, None, format="espdl", layer_bits={"c2": 32})
    # the file's width s16 with one int8 layer: the input follows c1 (int8)
    res = export_espdl(model, rec, None, format="espdl", feature_type="s16", layer_bits={"c1": 8})
    assert res.model.inputs[0].elem_type == 3
    assert [n.name for n in res.model.nodes if n.op_type == "RequantizeLinear"] == [
        "c1/requantize_s16"
    ]


def test_auto_needs_calibration_data(tiny):
    model, _, tmp = tiny
    with pytest.raises(ExportError, match="feature_type='auto' picks the int16 layers on"):
        export_espdl(model, tmp / "record.txt", None, format="espdl", feature_type="auto")
    with pytest.raises(ExportError, match="max_drop goes with feature_type='auto'"):
        export_espdl(model, tmp / "record.txt", None, format="espdl", max_drop=0.01)


@pytest.fixture(scope="module")
def digits(tmp_path_factory, once):
    """The digits CNN of test_v3_search_keras.py: Conv+BN+ReLU, MaxPool, Conv+ReLU, GAP,
    Dense(softmax); calibrated on 256 training digits, auto judged on 512."""
    return trained_digits_cnn(tmp_path_factory.mktemp("digits"), once)


#: the single-input layers without weights that run at their input's width
FOLLOWERS = {"c1": ["mp"], "c2": ["gap"], "head": []}


def _drop(d, layer_bits=None, feature_type="s8", target="esp32s3"):
    """Share of the calibration digits whose chip arg-max (the head's logits) differs from
    Keras' own prediction: the drop measured here, from an explicit export."""
    res = export_espdl(
        d["model"],
        d["record"],
        None,
        format="espdl",
        target=target,
        feature_type=feature_type,
        layer_bits=layer_bits or {},
    )
    values = simulate_espdl(res.model, quantize_input(res.model, d["calib"], target), target)
    logits = values.values["head/linear"].reshape(len(d["calib"]), -1)
    return float(np.mean(logits.argmax(-1) != d["float_calib"]))


def _accuracy(res, d, target="esp32s3"):
    sim = simulate_espdl(res.model, quantize_input(res.model, d["x"], target), target)
    return float((sim.outputs["head"].reshape(len(d["x"]), -1).argmax(-1) == d["y"]).mean())


def test_auto_picks_a_minimal_int16_set_within_max_drop(digits):
    d = digits
    # half of all-int8's drop: the trained weights, so the drop, vary with the CPU and threads
    all_s8 = _drop(d)
    assert all_s8 > 0, "all-int8 keeps every arg max here: auto has nothing to choose"
    max_drop = all_s8 / 2
    res = export_espdl(
        d["model"],
        d["record"],
        None,
        format="espdl",
        feature_type="auto",
        max_drop=max_drop,
        calibration_data=d["calib"],
        exponents="max",
    )
    mixed = res.mixed
    assert mixed.metric == "argmax" and mixed.samples == 512
    assert mixed.candidates == ["c1", "c2", "head"]
    assert res.warnings[0] == mixed.summary()
    assert mixed.s16, "all-int8 is beyond max_drop here: at least one layer is int16"
    # every figure re-measured from explicit exports against Keras' predictions
    assert mixed.all_s8 == all_s8 > max_drop
    assert mixed.all_s16 == _drop(d, feature_type="s16")
    assert mixed.drop == _drop(d, res.layer_bits) <= max_drop
    assert set(res.layer_bits) == {n for c in mixed.s16 for n in [c, *FOLLOWERS[c]]}
    for name in mixed.s16:  # minimal: none of them can go back to int8
        fewer = {k: 16 for c in mixed.s16 if c != name for k in [c, *FOLLOWERS[c]]}
        assert _drop(d, fewer) > max_drop, name
    s8 = export_espdl(d["model"], d["record"], None, format="espdl")
    s16 = export_espdl(d["model"], d["record"], None, format="espdl", feature_type="s16")
    print(  # the figures of docs/espdl-v3.md, "Mixed precision"
        f"\nheld-out accuracy: all-int8 {_accuracy(s8, d):.4f}, auto {_accuracy(res, d):.4f} "
        f"(int16: {mixed.s16}), all-int16 {_accuracy(s16, d):.4f}; {mixed.summary()}"
    )


def test_cli_feature_type_auto(digits, tmp_path, capsys):
    d = digits
    np.save(tmp_path / "x.npy", d["calib"])
    model_path = tmp_path / "m.keras"
    d["model"].save(model_path)
    out = tmp_path / "auto.espdl"
    args = ["export-espdl", "--model", str(model_path), "--record", str(d["record"])]
    args += ["--format", "espdl", "--out", str(out), "--feature-type", "auto"]

    def api(max_drop):  # what the command should do: the API with the command's defaults
        return export_espdl(
            d["model"], d["record"], None, format="espdl", feature_type="auto",
            max_drop=max_drop, calibration_data=d["calib"],
        )  # fmt: skip

    max_drop = api(0.99).mixed.all_s8 / 2  # some layer must be int16 (the figures vary by CPU)
    want = api(max_drop)
    assert want.mixed.s16
    assert main([*args, "--max-drop", str(max_drop), "--data", str(tmp_path / "x.npy")]) == 0
    printed = capsys.readouterr().out
    assert want.mixed.summary() in printed, printed
    assert f"int16 nodes: {', '.join(want.layer_bits)}" in printed
    assert main(["espdl-run", str(out), "--check"]) == 0
    capsys.readouterr()
    assert main([*args[:-1], "s8", "--max-drop", "0.01"]) != 0
    assert "--max-drop goes with --feature-type auto" in capsys.readouterr().err
    assert main(args) != 0  # no --data
    assert "--feature-type auto picks the int16 layers" in capsys.readouterr().err
