"""Exports of real Keras models: file set, shapes, layouts, JSON types, exponents, refusals."""

from __future__ import annotations

import json
import math

import keras
import numpy as np
import pytest
from espdl_stats import layer_activations, sidecar_from

from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1.preview import load_set, preview_set
from amct_bridge.keras import export_espdl
from amct_bridge.keras.espdl_weights import source_layers


def ref_exponent(arr: np.ndarray, bits: int = 8) -> int:
    """Independent numpy: smallest e with max|x| <= (2^(b-1) - 1) * 2^e."""
    m = float(np.max(np.abs(arr)))
    e = math.ceil(math.log2(m / (2 ** (bits - 1) - 1)))
    return e + 1 if m > (2 ** (bits - 1) - 1) * 2.0**e else e


def _randomize_bn_and_prelu(model: keras.Model, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.set_weights(
                [
                    rng.uniform(0.5, 1.5, c),
                    rng.normal(0, 0.2, c),
                    rng.normal(0, 0.3, c),
                    rng.uniform(0.5, 2.0, c),
                ]
            )
        if isinstance(layer, keras.layers.PReLU):
            layer.set_weights([rng.uniform(0.05, 0.3, layer.alpha.shape)])


def small_cnn() -> keras.Model:
    keras.utils.set_random_seed(3)
    x = keras.Input((12, 12, 3), name="img")
    y = keras.layers.Conv2D(8, 3, name="c1")(x)
    y = keras.layers.BatchNormalization(name="bn1")(y)
    y = keras.layers.ReLU(name="r1")(y)
    y = keras.layers.DepthwiseConv2D(3, padding="same", name="dw")(y)
    y = keras.layers.BatchNormalization(name="bn2")(y)
    y = keras.layers.PReLU(shared_axes=[1, 2], name="p2")(y)
    y = keras.layers.Conv2D(8, 1, activation="relu", name="c3")(y)
    y = keras.layers.Conv2D(6, 1, use_bias=False, name="c4")(y)
    y = keras.layers.LeakyReLU(0.1, name="lr4")(y)
    y = keras.layers.Conv2D(6, 1, activation="leaky_relu", name="c5")(y)
    y = keras.layers.MaxPooling2D(name="pool")(y)
    y = keras.layers.Flatten(name="flat")(y)
    y = keras.layers.Dense(10, name="fc")(y)
    y = keras.layers.Activation("relu", name="fa")(y)
    model = keras.Model(x, y, name="small")
    _randomize_bn_and_prelu(model)
    return model


@pytest.fixture(scope="module")
def cnn():
    model = small_cnn()
    data = np.random.default_rng(0).uniform(0, 1, (16, 12, 12, 3)).astype("float32")
    acts = layer_activations(model, data)
    return model, acts, sidecar_from(acts)


EXPECTED = {  # chain head -> (fused layers, activation type, has bias, last layer)
    "c1": (["c1", "bn1", "r1"], "ReLU", True, "r1"),
    "dw": (["dw", "bn2", "p2"], "PReLU", True, "p2"),
    "c3": (["c3"], "ReLU", True, "c3"),
    "c4": (["c4", "lr4"], "LeakyReLU", False, "lr4"),
    "c5": (["c5"], "LeakyReLU", True, "c5"),
    "fc": (["fc", "fa"], "ReLU", True, "fa"),
}


def test_small_cnn_export_files_json_and_exponents(cnn, tmp_path):
    model, acts, stats = cnn
    res = export_espdl(model, None, tmp_path / "out", stats=stats)
    assert [layer.name for layer in res.layers] == list(EXPECTED)
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    want = ["config.json", "export.json", "names.json"]
    for name, (_, act, has_bias, _) in EXPECTED.items():
        want.append(f"{name}_filter.npy")
        want += [f"{name}_bias.npy"] if has_bias else []
        want += [f"{name}_activation.npy"] if act in ("LeakyReLU", "PReLU") else []
    assert files == sorted(want)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert list(config) == list(EXPECTED)
    for name, (fused, act, has_bias, last) in EXPECTED.items():
        entry = config[name]
        assert entry["activation"] == {"type": act}
        assert ("bias" in entry) == has_bias
        for key in ("filter_exponent", "input_exponent", "output_exponent"):
            assert type(entry[key]) is int, (name, key)
        assert entry["output_exponent"] == ref_exponent(acts[last][1]), name
        assert res.layers[list(EXPECTED).index(name)].fused == fused
    assert config["c1"]["input_exponent"] == ref_exponent(acts["c1"][0])
    assert config["dw"]["input_exponent"] == config["c1"]["output_exponent"]
    assert config["fc"]["input_exponent"] == config["c5"]["output_exponent"]  # pool + flatten
    ops = {n: e["operation"] for n, e in config.items()}
    assert ops == {
        "c1": "conv2d",
        "dw": "depthwise_conv2d",
        "c3": "conv2d",
        "c4": "conv2d",
        "c5": "conv2d",
        "fc": "fully_connected",
    }


def _keras_layer_output(layer_cls, filt, bias, x, **kw):
    """Run a fresh Keras layer with the exported (HWCN) weights: checks layout + folding."""
    layer = layer_cls(**kw)
    layer.build(x.shape)
    layer.set_weights([filt] + ([bias] if bias is not None else []))
    return keras.ops.convert_to_numpy(layer(x))


def test_exported_weights_reproduce_keras_outputs(cnn, tmp_path):
    model, acts, stats = cnn
    export_espdl(model, None, tmp_path / "o", stats=stats)
    _, arrays = load_set(tmp_path / "o")
    assert arrays["c1_filter"].shape == (3, 3, 3, 8) and arrays["c1_bias"].shape == (8,)
    assert arrays["dw_filter"].shape == (3, 3, 8, 1) and arrays["dw_activation"].shape == (8,)
    assert arrays["c4_activation"].shape == (1,) and arrays["c5_activation"].shape == (1,)
    assert arrays["fc_filter"].shape == (1, 1, 5 * 5 * 6, 10)
    # conv + folded BN == Keras BN output (before the ReLU)
    got = _keras_layer_output(
        keras.layers.Conv2D,
        arrays["c1_filter"],
        arrays["c1_bias"],
        acts["c1"][0],
        filters=8,
        kernel_size=3,
    )
    np.testing.assert_allclose(got, acts["bn1"][1], rtol=1e-4, atol=1e-4)
    got = _keras_layer_output(
        keras.layers.DepthwiseConv2D,
        arrays["dw_filter"],
        arrays["dw_bias"],
        acts["dw"][0],
        kernel_size=3,
        padding="same",
    )
    np.testing.assert_allclose(got, acts["bn2"][1], rtol=1e-4, atol=1e-4)
    fc_w = arrays["fc_filter"].reshape(5 * 5 * 6, 10)
    np.testing.assert_allclose(acts["fc"][0] @ fc_w + arrays["fc_bias"], acts["fc"][1], atol=1e-4)
    np.testing.assert_allclose(arrays["dw_activation"], model.get_layer("p2").alpha.numpy().ravel())
    assert arrays["c4_activation"].tolist() == [np.float32(0.1)]
    assert arrays["c5_activation"].tolist() == [np.float32(0.2)]  # keras leaky_relu default


def test_preview_of_exported_set_per_channel_s3(cnn, tmp_path):
    model, acts, stats = cnn
    res = export_espdl(
        model, None, tmp_path / "o", stats=stats, granularity="per-channel", target="esp32s3"
    )
    config, arrays = load_set(tmp_path / "o")
    assert "filter_exponent" not in config["c1"]
    again = preview_set(config, arrays, target="esp32s3", per_channel=True)
    for mine, disk in zip(res.layers, again, strict=True):
        assert mine.preview.filter.values.tolist() == disk.filter.values.tolist()
        if disk.bias is not None:
            f_exp = disk.filter.exponent
            assert (
                disk.bias.exponent.tolist()
                == (config[disk.name]["input_exponent"] + f_exp + 4).tolist()
            )


def test_relu6_refused_then_skipped(tmp_path):
    x = keras.Input((8, 8, 3))
    y = keras.layers.Conv2D(4, 3, name="c")(x)
    y = keras.layers.ReLU(6.0, name="r6")(y)
    y = keras.layers.Conv2D(4, 1, activation="relu6", name="c6")(y)
    y = keras.layers.Conv2D(2, 1, name="tail")(y)
    model = keras.Model(x, y)
    data = np.random.default_rng(0).uniform(0, 1, (4, 8, 8, 3)).astype("float32")
    stats = sidecar_from(layer_activations(model, data))
    with pytest.raises(ExportError) as info:
        export_espdl(model, None, tmp_path / "o", stats=stats)
    assert "layer 'r6' (ReLU): ReLU6" in str(info.value)
    assert "layer 'c6' (Conv2D): activation relu6" in str(info.value)
    assert not (tmp_path / "o").exists()
    res = export_espdl(model, None, tmp_path / "o", stats=stats, skip_unsupported=True)
    assert [x.name for x in res.layers] == ["c", "tail"]
    assert [p.layer for p in res.skipped] == ["r6", "c6"]
    report = json.loads((tmp_path / "o" / "export.json").read_text())
    assert [s["layer"] for s in report["skipped"]] == ["r6", "c6"]


def test_keras_refusals():
    x = keras.Input((8, 8, 4))
    a = keras.layers.DepthwiseConv2D(3, depth_multiplier=2, name="dm2")(x)
    b = keras.layers.Conv2D(4, 3, dilation_rate=2, name="dil")(x)
    c = keras.layers.Conv2DTranspose(4, 3, name="tr")(x)
    d = keras.layers.ReLU(max_value=3.0, name="clip3")(x)
    e = keras.layers.BatchNormalization(name="lonely_bn")(x)
    f = keras.layers.Dense(4, activation="sigmoid", name="sig")(x)
    f = keras.layers.ReLU(name="after_sig")(f)  # not the model's head: refused
    g = keras.layers.PReLU(name="pp")(keras.layers.Conv2D(4, 1, name="before_pp")(x))
    model = keras.Model(x, [a, b, c, d, e, f, g])
    _randomize_bn_and_prelu(model)  # alpha differs per position
    with pytest.raises(ExportError) as info:
        export_espdl(model, None, None)
    msg = str(info.value)
    for part in [
        "'dm2' (DepthwiseConv2D): depth_multiplier 2",
        "'dil' (Conv2D): dilation (2, 2)",
        "'tr' (Conv2DTranspose): Keras Conv2DTranspose has no ESP-DL v1 equivalent",
        "'clip3' (ReLU): ReLU max_value 3.0",
        "'lonely_bn' (BatchNormalization): BatchNormalization cannot be folded",
        "pre-activation blocks: DenseNet, ResNet v2) needs that BN moved or removed",
        "'sig' (Dense): activation 'sigmoid'",
        "'pp' (PReLU): PReLU alpha varies over positions",
    ]:
        assert part in msg


def test_nested_model_names(tmp_path):
    inner = keras.Sequential(
        [
            keras.Input((6, 6, 3)),
            keras.layers.Conv2D(4, 3, name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.ReLU(name="relu"),
        ],
        name="block.1",
    )
    x = keras.Input((6, 6, 3))
    y = keras.layers.Flatten(name="flat")(inner(x))
    y = keras.layers.Dense(3, name="head")(y)
    model = keras.Model(x, y)
    data = np.random.default_rng(0).uniform(0, 1, (4, 6, 6, 3)).astype("float32")
    acts = layer_activations(model, data)
    res = export_espdl(model, None, tmp_path / "o", stats=sidecar_from(acts))
    assert res.names == {"block_1_conv": "block.1/conv", "head": "head"}
    assert res.layers[0].fused == ["block.1/conv", "block.1/bn", "block.1/relu"]
    names = json.loads((tmp_path / "o" / "names.json").read_text())
    assert names == res.names
    assert res.config["block_1_conv"]["output_exponent"] == ref_exponent(acts["block.1/relu"][1])


def test_source_layers_translation_table():
    x = keras.Input((8, 8, 3))
    y = keras.layers.Conv2D(4, 3, name="c")(x)
    y = keras.layers.ZeroPadding2D(name="pad")(y)
    z = keras.layers.AveragePooling2D(2, name="avg")(y)
    w = keras.layers.MaxPooling2D(2, name="mx")(y)
    y = keras.layers.Add(name="add")([z, w])
    y = keras.layers.Activation("linear", name="lin")(y)
    y = keras.layers.Activation("tanh", name="tanh")(y)
    layers = {s.name: s for s in source_layers(keras.Model(x, y))}
    assert layers["pad"].op == "runtime" and layers["pad"].attrs["keeps_exponent"] is True
    assert layers["avg"].attrs["keeps_exponent"] is False
    assert layers["add"].inputs == ["avg", "mx"] and layers["add"].attrs["keeps_exponent"] is False
    assert layers["lin"].op == "runtime"
    assert layers["tanh"].op == "unsupported" and layers["tanh"].attrs["model_output"] is True
    assert layers["c"].weights["kernel"].shape == (3, 3, 3, 4)


def test_mobilenet_v2_relu6_refused_listing_each(mobilenet):
    model, _, _, stats = mobilenet
    relu6 = [
        layer.name
        for layer in model.layers
        if isinstance(layer, keras.layers.ReLU) and layer.max_value == 6
    ]
    assert len(relu6) == 35
    with pytest.raises(ExportError) as info:
        export_espdl(model, None, None, stats=stats)
    # one line for the 35 (issue 23: the explanation was repeated per layer), each named in order
    (listed,) = [line for line in str(info.value).splitlines() if line.startswith("  35 layers")]
    names, reason = listed.removeprefix("  35 layers (ReLU): ").split(": ReLU6: ", 1)
    assert names.replace("'", "").split(", ") == relu6
    assert "replace_relu6()" in reason


def test_mobilenet_v2_skip_unsupported_exports_every_conv(mobilenet, tmp_path):
    model, _, acts, stats = mobilenet
    res = export_espdl(
        model, None, tmp_path / "mnv2", stats=stats, skip_unsupported=True, target="esp32s3"
    )
    weight_layers = [
        layer.name
        for layer in model.layers
        if type(layer).__name__ in ("Conv2D", "DepthwiseConv2D", "Dense")
    ]
    assert [x.source for x in res.layers] == weight_layers
    assert all(p.kind == "ReLU" for p in res.skipped) and len(res.skipped) == 35
    by_source = {x.source: x for x in res.layers}
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):  # every BN follows a conv
            producer = layer.input._keras_history.operation.name
            pad_name = producer.replace("depthwise", "pad") if "depthwise" in producer else None
            pad = [p.name for p in model.layers if p.name == pad_name]
            assert by_source[producer].fused == [*pad, producer, layer.name]  # ZeroPadding folded
            # ReLU6 is skipped: the output exponent covers the BN output (pre-clip)
            assert by_source[producer].entry["output_exponent"] == ref_exponent(acts[layer.name][1])
    assert by_source["predictions"].entry["output_exponent"] == ref_exponent(acts["predictions"][1])
    config, arrays = load_set(tmp_path / "mnv2")
    assert len(config) == len(weight_layers) == 53
    for name, entry in config.items():
        assert arrays[f"{name}_filter"].dtype == np.float32
        assert arrays[f"{name}_filter"].ndim == 4
        n = arrays[f"{name}_filter"].shape[2 if entry["operation"] == "depthwise_conv2d" else 3]
        assert arrays[f"{name}_bias"].shape == (n,)  # BN folding gives every layer a bias
    # block_1_depthwise reads pad <- skipped ReLU6: the sidecar input range, not a chain
    dw = by_source["block_1_depthwise"]
    assert dw.sources["input_exponent"] == "sidecar input range of 'block_1_depthwise'"
    assert dw.entry["input_exponent"] == ref_exponent(acts["block_1_depthwise"][0])
    # block_1_expand reads the projection directly: the exponent it was given
    exp = by_source["block_1_expand"]
    assert (
        exp.entry["input_exponent"] == by_source["expanded_conv_project"].entry["output_exponent"]
    )
    # the conv after a residual Add reads the Add2D's output exponent (the tensor the chip has)
    add = next(r for r in res.runtime if r.source == "block_2_add")
    assert (
        by_source["block_3_expand"].sources["input_exponent"] == "output exponent of 'block_2_add'"
    )
    assert by_source["block_3_expand"].entry["input_exponent"] == add.output_exponent
    assert add.output_exponent >= ref_exponent(acts["block_2_add"][1])


def test_cpp_constructors_in_report(cnn, tmp_path):
    model, _, stats = cnn
    res = export_espdl(model, None, tmp_path / "o", stats=stats, granularity="per-channel")
    cpp = {
        x["name"]: x["cpp"]
        for x in json.loads((tmp_path / "o" / "export.json").read_text())["layers"]
    }
    e = res.config
    assert cpp["c1"] == (
        f"dl::layer::Conv2D<int8_t, int16_t>({e['c1']['output_exponent']}, get_c1_filter(), "
        'get_c1_bias(), get_c1_activation(), dl::PADDING_VALID, {}, 1, 1, "c1")'
    )
    assert cpp["dw"].startswith("dl::layer::DepthwiseConv2D<int8_t, int16_t>(")
    assert "dl::PADDING_SAME_END, {}, 1, 1" in cpp["dw"]
    assert cpp["c4"] == (
        f"dl::layer::Conv2D<int8_t>({e['c4']['output_exponent']}, get_c4_filter(), NULL, "
        'get_c4_activation(), dl::PADDING_VALID, {}, 1, 1, "c4")'
    )
    assert cpp["fc"].endswith(', get_fc_activation(), true, "fc")')


def test_concatenated_branches_share_an_exponent():
    keras.utils.set_random_seed(2)
    x = keras.Input((6, 6, 3))
    a = keras.layers.Conv2D(4, 1, activation="relu", name="a")(x)
    b = keras.layers.Conv2D(4, 1, name="b")(x)
    b = keras.layers.Rescaling(10.0, name="big")(keras.layers.ReLU(name="rb")(b))
    b = keras.layers.Conv2D(4, 1, name="b2")(b)
    y = keras.layers.Concatenate(name="cat")([a, b])
    y = keras.layers.Conv2D(2, 1, name="c")(y)
    model = keras.Model(x, y)
    data = np.random.default_rng(0).uniform(0, 1, (4, 6, 6, 3)).astype("float32")
    acts = layer_activations(model, data)
    with pytest.raises(ExportError, match="'big' \\(Rescaling\\)"):
        export_espdl(model, None, None, stats=sidecar_from(acts))
    res = export_espdl(model, None, None, stats=sidecar_from(acts), skip_unsupported=True)
    cfg = res.config
    shared = max(ref_exponent(acts["a"][1]), ref_exponent(acts["b2"][1]))
    assert ref_exponent(acts["a"][1]) != ref_exponent(acts["b2"][1])  # the test means something
    assert cfg["a"]["output_exponent"] == cfg["b2"]["output_exponent"] == shared
    assert cfg["c"]["input_exponent"] == shared


def test_skipped_layers_still_export_with_their_calibrated_exponents(tmp_path):
    """skip_layers at calibration, then the export: the skipped layers' sidecar ranges give the
    full calibration's config.json (the last layer's output exponent was missing before)."""
    from amct_bridge.keras import calibrate

    keras.utils.set_random_seed(3)
    x = inp = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, name="c1")(x)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.ReLU(name="r")(keras.layers.Conv2D(4, 3, name="c2")(x))
    model = keras.Model(inp, keras.layers.Dense(3, name="fc")(keras.layers.Flatten(name="f")(x)))
    data = np.random.default_rng(0).uniform(0, 1, (16, 8, 8, 3)).astype("float32")
    calibrate(model, data, tmp_path / "full.txt", algorithm="minmax")
    export_espdl(model, tmp_path / "full.txt", tmp_path / "ef")
    want = json.loads((tmp_path / "ef" / "config.json").read_text())
    for skip in (["fc"], ["c1"], ["c2", "fc"]):
        rec, out = tmp_path / f"{skip[0]}.txt", tmp_path / f"e_{'_'.join(skip)}"
        calibrate(model, data, rec, algorithm="minmax", skip_layers=skip)
        res = export_espdl(model, rec, out)
        assert json.loads((out / "config.json").read_text()) == want, skip
        notes = [w.split("'")[1] for w in res.warnings if "has no record entry" in w]
        assert notes == skip


def test_a_branch_that_was_zero_takes_its_input_exponent(tmp_path):
    """Zero-init residual (the last BN's gamma = 0): the branch is exactly 0 on the calibration
    data. Its output exponent was 0, so the Add2D after it (the sum takes the larger exponent)
    floor-shifted the identity path to whole numbers: chip SNR 0.2 dB against float. Now it
    takes its input's exponent, with a warning, and the chip follows the float model."""
    from amct_bridge.espdl import simulate_chip
    from amct_bridge.keras import calibrate

    keras.utils.set_random_seed(0)
    L = keras.layers
    inp = keras.Input((16, 16, 3), name="img")
    x = L.Conv2D(8, 3, padding="same", activation="relu", name="stem")(inp)
    b = L.Conv2D(8, 3, padding="same", use_bias=False, name="branch")(x)
    b = L.BatchNormalization(gamma_initializer="zeros", name="branch_bn")(b)
    s = L.ReLU(name="res_relu")(L.Add(name="res")([x, b]))
    model = keras.Model(inp, L.Dense(4, name="fc")(L.GlobalAveragePooling2D(name="gap")(s)))
    xs = np.random.default_rng(0).random((32, 16, 16, 3), dtype=np.float32)
    calibrate(model, xs, tmp_path / "r.txt", algorithm="minmax")
    res = export_espdl(model, tmp_path / "r.txt", tmp_path / "e", target="esp32s3")
    outs = {c.name: c.entry["output_exponent"] for c in res.layers}
    assert outs["branch"] == outs["stem"]
    assert [r.output_exponent for r in res.runtime if r.name == "res"] == [outs["stem"]]
    assert any("'branch_bn' was 0 on every calibration batch" in w for w in res.warnings)
    got = simulate_chip(tmp_path / "e", xs, target="esp32s3").output.to_float()
    want = model.predict(xs, verbose=0)
    snr = 10 * np.log10((want**2).sum() / ((want - got) ** 2).sum())
    assert snr > 20


def test_a_tf_op_keyed_record_exports_like_the_keras_keyed_one(tmp_path):
    """keys="tf_op" records (for convert_model) are re-keyed by layer name, as simulate and
    report do; the export blamed the record on another model before."""
    from amct_bridge.keras import calibrate

    keras.utils.set_random_seed(4)
    L = keras.layers
    x = inp = keras.Input((8, 8, 3))
    x = L.ReLU(name="r")(L.BatchNormalization(name="bn")(L.Conv2D(4, 3, name="c1")(x)))
    x = L.SeparableConv2D(6, 3, name="sep")(x)
    model = keras.Model(inp, L.Dense(3, name="fc")(L.Flatten(name="f")(x)))
    data = np.random.default_rng(1).uniform(0, 1, (16, 8, 8, 3)).astype("float32")
    calibrate(model, data, tmp_path / "k.txt", algorithm="minmax")
    calibrate(model, data, tmp_path / "t.txt", algorithm="minmax", keys="tf_op", flavor="tf")
    assert any("/" in k for k in (tmp_path / "t.txt").read_text().split('key: "')[1:])
    export_espdl(model, tmp_path / "k.txt", tmp_path / "ek")
    export_espdl(model, tmp_path / "t.txt", tmp_path / "et")
    configs = [json.loads((tmp_path / d / "config.json").read_text()) for d in ("ek", "et")]
    assert configs[0] == configs[1]


def test_preview_lists_a_folded_zero_padding_as_fused(tmp_path):
    """The preview's fused column dropped the first fused layer (a ZeroPadding2D folded into
    the next conv comes before the conv itself in ``fused``)."""
    from amct_bridge.espdl.v1.report import format_preview
    from amct_bridge.keras import calibrate

    L = keras.layers
    inp = keras.Input((9, 9, 3))
    x = L.Conv2D(4, 3, strides=2, name="c")(L.ZeroPadding2D(((0, 1), (0, 1)), name="pad")(inp))
    model = keras.Model(inp, L.Dense(2, name="fc")(L.Flatten(name="f")(L.ReLU(name="r")(x))))
    data = np.random.default_rng(1).uniform(0, 1, (8, 9, 9, 3)).astype("float32")
    calibrate(model, data, tmp_path / "r.txt", algorithm="minmax")
    res = export_espdl(model, tmp_path / "r.txt", None)
    assert [x.fused for x in res.layers if x.name == "c"] == [["pad", "c", "r"]]
    row = next(line for line in format_preview(res).splitlines() if line.startswith("c "))
    assert row.split()[-1] == "pad+r"


def test_the_record_calibrate_returns_exports_with_its_sidecar(tmp_path):
    """calibrate()'s Record (and load()'s) knows its file, so the export finds the sidecar:
    it stopped on 'no calibrated output range ... pass the sidecar' before."""
    from amct_bridge.keras import calibrate
    from amct_bridge.records import load

    L = keras.layers
    inp = keras.Input((6, 6, 2))
    model = keras.Model(
        inp, L.Dense(2, name="fc")(L.Flatten()(L.ReLU(name="r")(L.Conv2D(3, 3, name="c")(inp))))
    )
    data = np.random.default_rng(0).uniform(0, 1, (8, 6, 6, 2)).astype("float32")
    rec = calibrate(model, data, tmp_path / "r.txt", algorithm="minmax")
    assert rec.source == str(tmp_path / "r.txt")
    configs = []
    for i, given in enumerate((rec, load(tmp_path / "r.txt"), tmp_path / "r.txt")):
        export_espdl(model, given, tmp_path / f"e{i}")
        configs.append(json.loads((tmp_path / f"e{i}" / "config.json").read_text()))
    assert configs[0] == configs[1] == configs[2]


def test_skipped_input_rescaling_leaves_a_chip_graph_fed_by_the_host(tmp_path):
    """Input -> Rescaling -> ...: with skip_unsupported the chip's input is the Rescaling's
    output (the refusal tells to scale on the host); there was no chip graph, model class or
    simulator before ("its input 'rescale' was skipped")."""
    from amct_bridge.espdl import simulate_chip
    from amct_bridge.keras import calibrate

    keras.utils.set_random_seed(2)
    L = keras.layers
    inp = keras.Input((8, 8, 3))
    x = L.Conv2D(6, 3, activation="relu", name="c")(L.Rescaling(1 / 255.0, name="rescale")(inp))
    model = keras.Model(inp, L.Dense(4, name="fc")(L.GlobalAveragePooling2D(name="gap")(x)))
    raw = np.random.default_rng(0).integers(0, 256, (16, 8, 8, 3)).astype("float32")
    calibrate(model, raw, tmp_path / "r.txt", algorithm="minmax")
    res = export_espdl(model, tmp_path / "r.txt", tmp_path / "e", skip_unsupported=True, cpp="m")
    assert [p.layer for p in res.skipped] == ["rescale"] and res.graph is not None
    assert any(
        "input preprocessing 'rescale' (Rescaling) was skipped" in n for n in res.graph["notes"]
    )
    assert (tmp_path / "e" / "m_model.hpp").is_file()
    got = simulate_chip(tmp_path / "e", raw / 255.0).output.to_float()  # the host rescales
    want = model.predict(raw, verbose=0)
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()
