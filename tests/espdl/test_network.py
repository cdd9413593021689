"""The chip graph: JSON form and its checks, the tool's integers put back into HWCN, the graph
an export builds per layer kind (ZeroPadding2D -> Pad, standalone activations, pass-through)."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest
from espdl_stats import layer_activations, sidecar_from

from amct_bridge.errors import ExportError
from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v1.chip import simulate_chip
from amct_bridge.espdl.v1.export import export_layers
from amct_bridge.espdl.v1.network import (
    GRAPH_FORMAT,
    _hwcn,
    load_network,
    network_from_parts,
    network_from_result,
)
from amct_bridge.espdl.v1.preview import load_set, preview_layer
from amct_bridge.keras.espdl_weights import source_layers
from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange

DATA = Path(__file__).resolve().parents[1] / "data"


def graph(*layers: dict, ftype: str = "s8", **top) -> dict:
    return {
        "format": GRAPH_FORMAT,
        "feature_type": ftype,
        "input": {"exponent": -7},
        "layers": list(layers),
        **top,
    }


@pytest.mark.parametrize("target", ["esp32", "esp32s3"])
@pytest.mark.parametrize("ftype", ["s8", "s16"])
def test_hwcn_integers_are_the_tools_whatever_the_target(target, ftype):
    """Round to the tool's exponent independently, compare with the HWCN the network holds."""
    config, arrays = load_set(DATA / "espdl_v1_tutorial")
    bits = 8 if ftype == "s8" else 16
    for name, entry in config.items():
        entry = {**entry, "feature_type": ftype}
        p = preview_layer(name, entry, arrays, target=target)
        w = arrays[f"{name}_filter"].astype(np.float64)
        want = np.clip(np.rint(w / 2.0**p.filter.exponent), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        kind = "DepthwiseConv2D" if entry["operation"] == "depthwise_conv2d" else "Conv2D"
        g = graph(
            {"name": name, "class": kind, "inputs": ["input"], "output_exponent": -3}, ftype=ftype
        )
        net = network_from_parts(g, {name: entry}, arrays)
        got = net.layer(name).filter.values
        assert got.shape == w.shape and np.array_equal(got, want)
        assert np.array_equal(_hwcn(p.filter, p.operation, target, ftype), want)


def test_json_checks_name_the_problem(tmp_path):
    fc = {"name": "fc", "class": "FullyConnected", "inputs": ["input"], "output_exponent": -5}
    config = {"fc": {"operation": "fully_connected", "feature_type": "s8"}}
    arrays = {"fc_filter": np.ones((4, 2), np.float32)}
    cases = [
        (graph({**fc, "class": "Softmax"}), "class 'Softmax' is not one of"),
        (graph({**fc, "output_exponent": None}), r"'fc' \(FullyConnected\) needs an output_exp"),
        (graph({**fc, "inputs": ["later"]}), "reads 'later', which is not an earlier layer"),
        (graph(fc, fc), "two layers named 'fc'"),
        (graph({**fc, "coefficients": "zz"}), "no config.json entry 'zz'"),
        (graph({**fc, "class": "Conv2D", "attrs": {"padding": "SAME"}}), "padding 'SAME' not in"),
        (graph({**fc, "class": "Conv2D"}), "config entry 'fc' is a fully_connected"),
        (graph(fc, outputs=["nope"]), "output 'nope' is not a layer"),
        ({**graph(fc), "format": "other/1"}, "format 'other/1'"),
        (graph(fc, ftype="s4"), "feature_type 's4'"),
    ]
    for doc, message in cases:
        with pytest.raises(ExportError, match=message):
            network_from_parts(doc, config, arrays)
    (tmp_path / "config.json").write_text(json.dumps(config))
    np.save(tmp_path / "fc_filter.npy", arrays["fc_filter"])
    with pytest.raises(ExportError, match="export.json: cannot read"):
        load_network(tmp_path)
    (tmp_path / "g.json").write_text(json.dumps(graph(fc)))
    net = load_network(tmp_path, tmp_path / "g.json")
    assert net.outputs == ["fc"] and net.input_exponent == -7 and net.layer("fc").bias is None
    (tmp_path / "bad.json").write_text("{\n  nope")
    with pytest.raises(ExportError, match=r"bad.json:2:3: not JSON"):
        load_network(tmp_path, tmp_path / "bad.json")


def test_keeping_layers_take_their_input_exponent():
    g = graph(
        {"name": "p", "class": "Pad", "inputs": ["input"], "attrs": {"paddings": [1, 1, 0, 0]}},
        {"name": "r", "class": "ReLU", "inputs": ["p"], "output_exponent": None},
    )
    net = network_from_parts(g, {}, {})
    assert [x.output_exponent for x in net.layers] == [-7, -7]


def _stats(layers_out: dict) -> CalibrationStats:
    return CalibrationStats(
        layers={
            k: LayerStats("L", TensorRange(*i), TensorRange(*o)) for k, (i, o) in layers_out.items()
        }
    )


def test_export_graph_of_standalone_layers():
    rng = np.random.default_rng(0)
    layers = [
        SourceLayer("in", "input", attrs={"shape": (5, 5, 2)}),
        SourceLayer(
            "zp",
            "runtime",
            ["in"],
            "ZeroPadding2D",
            attrs={"keeps_exponent": True, "padding": "((0, 1), (2, 0))"},
        ),
        SourceLayer("lr", "leaky_relu", ["zp"], "LeakyReLU", attrs={"alpha": 0.3}),
        SourceLayer(
            "c",
            "conv2d",
            ["lr"],
            "Conv2D",
            {"kernel": rng.normal(0, 1, (3, 3, 2, 3)).astype(np.float32)},
            {"padding": "valid", "strides": (2, 2)},
        ),
        SourceLayer("drop", "runtime", ["c"], "Dropout", attrs={"keeps_exponent": True}),
        SourceLayer("r", "relu", ["drop"], "ReLU"),
        SourceLayer("f", "runtime", ["r"], "Flatten", attrs={"keeps_exponent": True}),
        SourceLayer(
            "fc",
            "dense",
            ["f"],
            "Dense",
            {"kernel": rng.normal(0, 1, (18, 2)).astype(np.float32)},
            {"input_rank": 2, "model_output": True},
        ),
    ]
    stats = _stats({"c": ((-1, 1), (-8, 8)), "fc": ((0, 8), (-30, 30))})
    res = export_layers(layers, None, stats=stats, feature_type="s16")
    g = res.graph
    assert [(n["name"], n["class"], n["inputs"]) for n in g["layers"]] == [
        ("zp", "Pad", ["input"]),
        ("lr", "LeakyReLU", ["zp"]),
        ("c", "Conv2D", ["lr"]),
        ("r", "ReLU", ["c"]),
        ("f", "Flatten", ["r"]),
        ("fc", "FullyConnected", ["f"]),
    ]
    assert g["layers"][0]["attrs"] == {"paddings": [0, 1, 2, 0], "constant": 0}
    # LeakyReLU alpha as convert.py quantizes a fused one: 0.3 -> exponent -16, 19661
    assert g["layers"][1]["attrs"] == {"alpha": 19661, "alpha_exponent": -16}
    assert 19661 * 2.0**-16 == pytest.approx(0.3, abs=2**-16)
    # the conv's input range is [-1, 1]: 32767 * 2^-15 < 1 <= 32767 * 2^-14
    assert g["input"] == {"name": "input", "source": "in", "exponent": -14, "shape": [5, 5, 2]}
    assert g["outputs"] == ["fc"]
    net = network_from_result(res)
    x = rng.integers(-(2**15), 2**15, (2, 5, 5, 2))
    out = simulate_chip(net, x)
    assert out["zp"].values.shape == (2, 6, 7, 2) and out["c"].values.shape == (2, 2, 3, 3)
    assert out["fc"].values.shape == (2, 2) and out["f"].exponent == out["c"].exponent


def test_reshape_without_target_shape_is_a_graph_error():
    layers = [
        SourceLayer("in", "input", attrs={"shape": (4,)}),
        SourceLayer("fc", "dense", ["in"], "Dense", {"kernel": np.ones((4, 4), np.float32)}),
        SourceLayer("rs", "runtime", ["fc"], "Reshape", attrs={"keeps_exponent": True}),
    ]
    res = export_layers(layers, None, stats=_stats({"fc": ((-1, 1), (-4, 4))}))
    assert res.graph is None and "'rs' (Reshape): target shape unknown" in res.graph_error
    layers[2].attrs["target_shape"] = (2, 2)
    res = export_layers(layers, None, stats=_stats({"fc": ((-1, 1), (-4, 4))}))
    assert res.graph["layers"][1]["attrs"] == {"shape": [2, 2]}
    assert simulate_chip(res, np.ones((1, 4))).output.values.shape == (1, 2, 2)


def test_keras_zero_padding_then_valid_stride_two(tmp_path):
    """Keras MobileNet's conv_pad pattern: ZeroPadding2D((0,1),(0,1)) + valid stride-2 conv."""
    keras.utils.set_random_seed(6)
    x = keras.Input((9, 9, 3))
    y = keras.layers.ZeroPadding2D(((0, 1), (0, 1)), name="pad")(x)
    y = keras.layers.DepthwiseConv2D(3, strides=2, name="dw")(y)
    y = keras.layers.ReLU(name="relu")(y)
    y = keras.layers.Conv2D(4, 1, name="pw")(y)
    model = keras.Model(x, y)
    data = np.random.default_rng(2).uniform(-1, 1, (4, 9, 9, 3)).astype("float32")
    stats = sidecar_from(layer_activations(model, data))
    res = export_layers(source_layers(model), tmp_path / "o", stats=stats, feature_type="s16")
    net = load_network(tmp_path / "o")
    # the padding is folded into the conv: PADDING_NOT_SET with explicit {t, b, l, r}
    assert [x.kind for x in net.layers] == ["DepthwiseConv2D", "Conv2D"]
    assert net.layers[0].attrs["padding"] == "NOT_SET" and net.layers[0].attrs["pads"] == [
        0,
        1,
        0,
        1,
    ]
    out = simulate_chip(net, data)
    want = model.predict(data, verbose=0)
    assert out.output.values.shape == want.shape == (4, 4, 4, 4)
    assert np.abs(out.output.to_float() - want).max() < 0.005 * np.abs(want).max()
    assert res.graph_error is None


@pytest.mark.parametrize("axis, chip_axis", [(3, 2), (-1, -1), (2, 1)])
def test_concat_axis_counts_the_batch_axis(axis, chip_axis):
    rng = np.random.default_rng(1)
    conv = {"padding": "same", "strides": (1, 1)}
    layers = [
        SourceLayer("in", "input", attrs={"shape": (4, 4, 2)}),
        SourceLayer(
            "a",
            "conv2d",
            ["in"],
            "Conv2D",
            {"kernel": rng.normal(0, 1, (1, 1, 2, 3)).astype(np.float32)},
            conv,
        ),
        SourceLayer(
            "b",
            "conv2d",
            ["in"],
            "Conv2D",
            {"kernel": rng.normal(0, 1, (1, 1, 2, 3)).astype(np.float32)},
            conv,
        ),
        SourceLayer(
            "cat",
            "runtime",
            ["a", "b"],
            "Concatenate",
            attrs={"keeps_exponent": True, "axis": axis, "model_output": True},
        ),
    ]
    stats = _stats({"a": ((-1, 1), (-4, 4)), "b": ((-1, 1), (-4, 4)), "cat": ((-4, 4), (-4, 4))})
    res = export_layers(layers, None, stats=stats)
    assert res.graph["layers"][2]["attrs"] == {"axis": chip_axis}
    x = rng.integers(-128, 128, (2, 4, 4, 2))
    out = simulate_chip(res, x)
    want = np.concatenate([out["a"].values, out["b"].values], axis=axis)
    assert np.array_equal(out["cat"].values, want)
    layers[3].attrs["axis"] = 0
    assert "batch axis" in export_layers(layers, None, stats=stats).graph_error


def test_add2d_activation_from_json():
    g = graph(
        {"name": "r", "class": "ReLU", "inputs": ["input"]},
        {
            "name": "add",
            "class": "Add2D",
            "inputs": ["input", "r"],
            "output_exponent": -6,
            "activation": "LeakyReLU",
            "attrs": {"alpha": 26, "alpha_exponent": -7},
        },
    )
    net = network_from_parts(g, {}, {})
    x = np.array([[-100, 50, -3]])
    got = simulate_chip(net, x)["add"].values.ravel().tolist()
    sums = [v + max(v, 0) for v in (-100, 50, -3)]  # both at -7: e_hi = -7
    shifted = [s // 2 for s in sums]  # to e_out -6
    assert got == [v if v >= 0 else (v * 26) // 128 for v in shifted]
    bad = graph({**g["layers"][1], "inputs": ["input", "input"], "attrs": {}})
    with pytest.raises(ExportError, match="LeakyReLU needs attrs alpha/alpha_exponent"):
        network_from_parts(bad, {}, {})


def test_skipped_softmax_at_the_end_leaves_the_logits_as_output(tmp_path):
    keras.utils.set_random_seed(8)
    x = keras.Input((4, 4, 1))
    y = keras.layers.Conv2D(2, 3, name="c")(x)
    y = keras.layers.Flatten(name="f")(y)
    y = keras.layers.Dense(3, name="fc")(y)
    y = keras.layers.Softmax(name="sm")(y)
    model = keras.Model(x, y)
    data = np.random.default_rng(4).uniform(-1, 1, (6, 4, 4, 1)).astype("float32")
    stats = sidecar_from(layer_activations(model, data))
    # a final Softmax is no longer refused (nor skipped): it is left to the host (issue 23 §2)
    res = export_layers(source_layers(model), None, stats=stats)
    assert res.graph["outputs"] == ["fc"] and not res.skipped and "notes" not in res.graph
    (host,) = res.graph["host"]
    assert (host["layer"], host["function"], host["reads"], host["chip"]) == (
        "sm",
        "softmax",
        "fc",
        "fc",
    )
    got = simulate_chip(res, data).output.values.argmax(axis=1)
    assert np.mean(got == model.predict(data, verbose=0).argmax(axis=1)) >= 5 / 6
