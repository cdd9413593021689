"""Framework-free exporter: chains, folding, exponents, refusals, bad input, atomic output."""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest

from amct_bridge.errors import ExportError
from amct_bridge.espdl import SourceLayer, export
from amct_bridge.espdl.v1.export import export_layers
from amct_bridge.espdl.v1.preview import load_set, preview_set
from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
from amct_bridge.records.model import LayerFactors, Record


def _rng(*key) -> np.random.Generator:
    """Weights seeded by the layer they are for, not by a module-wide generator: a test's data
    must not depend on which tests ran before it in the same worker (pytest-xdist)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def ref_exponent(lo: float, hi: float, bits: int = 8) -> int:
    """Independent: smallest e with max(|lo|, |hi|) <= (2^(b-1) - 1) * 2^e."""
    m = max(abs(lo), abs(hi))
    e = math.ceil(math.log2(m / (2 ** (bits - 1) - 1)))
    assert m <= (2 ** (bits - 1) - 1) * 2.0**e and m > (2 ** (bits - 1) - 1) * 2.0 ** (e - 1)
    return e


def conv(name, inputs, cin=3, cout=4, bias=True, **attrs):
    rng = _rng(name, cin, cout)
    w = {"kernel": rng.normal(size=(3, 3, cin, cout)).astype(np.float32)}
    if bias:
        w["bias"] = rng.normal(size=cout).astype(np.float32)
    return SourceLayer(name, "conv2d", inputs, "Conv2D", w, attrs)


def bn(name, inputs, c=4):
    rng = _rng(name, c)
    w = {
        "gamma": rng.uniform(0.5, 2, c).astype(np.float32),
        "beta": rng.normal(size=c).astype(np.float32),
        "mean": rng.normal(size=c).astype(np.float32),
        "variance": rng.uniform(0.1, 3, c).astype(np.float32),
    }
    return SourceLayer(name, "batch_norm", inputs, "BatchNormalization", w, {"epsilon": 1e-3})


def stats_for(**ranges):
    st = CalibrationStats(algorithm="minmax", batches=1)
    for name, (inp, out) in ranges.items():
        st.layers[name] = LayerStats(
            "X", TensorRange(*inp) if inp else None, TensorRange(*out) if out else None
        )
    return st


def simple_model():
    return [
        SourceLayer("in", "input"),
        conv("c1", ["in"]),
        bn("bn1", ["c1"]),
        SourceLayer("r1", "relu", ["bn1"], "ReLU"),
        SourceLayer("pool", "runtime", ["r1"], "MaxPooling2D", attrs={"keeps_exponent": True}),
        conv("c2", ["pool"], cin=4, cout=6, bias=False),
        SourceLayer("lr", "leaky_relu", ["c2"], "LeakyReLU", attrs={"alpha": 0.1}),
    ]


def test_bn_folded_and_activation_fused_matches_numpy():
    layers = simple_model()
    st = stats_for(c1=((0, 1), None), r1=(None, (0, 5.0)), lr=(None, (-0.3, 9.0)))
    res = export_layers(layers, None, stats=st)
    assert [x.name for x in res.layers] == ["c1", "c2"]
    c1 = res.layers[0]
    assert c1.fused == ["c1", "bn1", "r1"]
    k, b = layers[1].weights["kernel"], layers[1].weights["bias"]
    g = layers[2].weights
    s = g["gamma"].astype(np.float64) / np.sqrt(g["variance"].astype(np.float64) + 1e-3)
    np.testing.assert_allclose(c1.coefficients.filter, k * s, rtol=1e-6)
    np.testing.assert_allclose(
        c1.coefficients.bias, (b - g["mean"]) * s + g["beta"], rtol=1e-5, atol=1e-6
    )
    assert c1.entry == {
        "operation": "conv2d",
        "feature_type": "s8",
        "bias": "True",
        "filter_exponent": ref_exponent(0, float(np.abs(k * s).max())),
        "input_exponent": ref_exponent(0, 1),
        "output_exponent": ref_exponent(0, 5.0),
        "activation": {"type": "ReLU"},
    }
    c2 = res.layers[1].entry
    assert "bias" not in c2  # no bias, no BN: the key must be absent
    assert c2["input_exponent"] == c1.entry["output_exponent"]  # through the MaxPool
    assert c2["output_exponent"] == ref_exponent(-0.3, 9.0)
    assert c2["activation"] == {"type": "LeakyReLU"}
    assert res.layers[1].coefficients.alpha.tolist() == [np.float32(0.1)]


def test_written_set_round_trips_through_preview(tmp_path):
    st = stats_for(c1=((0, 1), None), r1=(None, (0, 5.0)), lr=(None, (-0.3, 9.0)))
    res = export_layers(simple_model(), tmp_path / "out", stats=st, target="esp32s3")
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == [
        "c1_bias.npy",
        "c1_filter.npy",
        "c2_activation.npy",
        "c2_filter.npy",
        "config.json",
        "export.json",
        "names.json",
    ]
    config, arrays = load_set(tmp_path / "out")
    assert all(a.dtype == np.float32 for a in arrays.values())
    for entry in config.values():
        for key in ("filter_exponent", "input_exponent", "output_exponent"):
            assert type(entry[key]) is int
    again = preview_set(config, arrays, target="esp32s3")
    for mine, disk in zip(res.layers, again, strict=True):
        assert mine.preview.filter.values.tolist() == disk.filter.values.tolist()
    assert json.loads((tmp_path / "out" / "names.json").read_text()) == {"c1": "c1", "c2": "c2"}
    report = json.loads((tmp_path / "out" / "export.json").read_text())
    assert report["layers"][1]["exponent_sources"]["input_exponent"] == "output exponent of 'r1'"
    assert "-q 0" in report["convert_command"]


def test_record_fallbacks_for_exponents():
    layers = simple_model()
    rec = Record(
        {
            "c1": LayerFactors(scale_d=1 / 255, offset_d=-128),  # [0, 1]
            "c2": LayerFactors(scale_d=6 / 255, offset_d=-128),  # [0, 6]
        }
    )
    st = stats_for(lr=(None, (-1.0, 1.0)))
    res = export_layers(layers, None, record=rec, stats=st)
    c1, c2 = res.layers
    assert c1.entry["input_exponent"] == ref_exponent(0, 1)
    # r1 has no sidecar output: the next layer (through MaxPool) c2's record range is used
    assert c1.entry["output_exponent"] == ref_exponent(0, 6.0)
    assert c1.sources["output_exponent"] == "record scale_d/offset_d of 'c2'"


def test_missing_output_range_fails_clearly():
    with pytest.raises(ExportError, match="cannot choose output_exponent.*'lr'"):
        export_layers(simple_model(), None, stats=stats_for(r1=(None, (0, 1))))


def test_per_channel_needs_input_exponent_for_bias():
    st = stats_for(r1=(None, (0, 5.0)), lr=(None, (-1, 1)))
    with pytest.raises(ExportError, match="per-channel bias needs input_exponent"):
        export_layers(simple_model(), None, stats=st, granularity="per-channel")
    res = export_layers(simple_model(), None, stats=st)  # per-tensor does not need it
    assert "input_exponent" not in res.layers[0].entry


def test_skip_fusion_refuses_bn_then_skip_unsupported():
    rec = Record({"c1": LayerFactors(skip_fusion=True)})
    st = stats_for(c1=((0, 1), (-2, 2)), r1=(None, (0, 5)), lr=(None, (-1, 1)))
    with pytest.raises(ExportError, match="'bn1'.*skip_fusion"):
        export_layers(simple_model(), None, record=rec, stats=st)
    res = export_layers(simple_model(), None, record=rec, stats=st, skip_unsupported=True)
    assert res.layers[0].fused == ["c1"]
    assert res.layers[0].entry["output_exponent"] == ref_exponent(-2, 2)
    assert [p.layer for p in res.skipped] == ["bn1"]


def test_every_refusal_is_listed_at_once():
    layers = [
        SourceLayer("in", "input"),
        conv("c6", ["in"], activation="relu6"),
        conv("c", ["c6"], cin=4),
        SourceLayer("r6", "relu6", ["c"], "ReLU"),
        SourceLayer(
            "dw",
            "depthwise_conv2d",
            ["r6"],
            "DepthwiseConv2D",
            {"kernel": np.ones((3, 3, 4, 2), np.float32)},
            {"depth_multiplier": 2},
        ),
        conv("sig", ["dw"], cin=8, activation="sigmoid"),
        SourceLayer("lstm", "unsupported", ["sig"], "LSTM", attrs={"reason": "no RNN"}),
        SourceLayer("pr", "prelu", ["lstm"], "PReLU", {"alpha": np.zeros(4, np.float32)}),
    ]
    with pytest.raises(ExportError) as info:
        export_layers(layers, None)
    msg = str(info.value)
    for name, why in [
        ("c6", "relu6"),
        ("r6", "ReLU6"),
        ("dw", "depth_multiplier 2"),
        ("sig", "'sigmoid'"),
        ("lstm", "no RNN"),
        ("pr", "PReLU"),
    ]:
        assert f"layer '{name}'" in msg and why in msg, name
    assert "layer 'c' " not in msg


def test_s16_per_channel_and_bad_options_refused():
    for kw, match in [
        ({"feature_type": "s16", "granularity": "per-channel"}, "s16 per-channel"),
        ({"feature_type": "u8"}, "feature_type"),
        ({"granularity": "per-layer"}, "granularity"),
        ({"target": "esp8266"}, "target"),
    ]:
        with pytest.raises(ExportError, match=match):
            export_layers(simple_model(), None, **kw)


def test_record_key_missing_from_model():
    rec = Record({"c1": LayerFactors(scale_d=0.1, offset_d=0), "ghost": LayerFactors()})
    with pytest.raises(ExportError, match="not found in the model.*'ghost'"):
        export_layers(simple_model(), None, record=rec)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda ls: ls[1].weights.__setitem__("kernel", ls[1].weights["kernel"] * np.nan), "NaN"),
        (lambda ls: ls[1].weights.__setitem__("bias", np.full(4, np.inf, np.float32)), "Inf"),
        (
            lambda ls: ls[1].weights.__setitem__("bias", np.full(4, 1e39, np.float64)),
            "beyond float32",
        ),
        (lambda ls: ls[1].weights.__setitem__("kernel", np.ones((3, 3, 3, 4), int)), "dtype"),
        (lambda ls: ls[1].weights.__setitem__("bias", np.ones(5, np.float32)), "bias has shape"),
        (lambda ls: ls[1].weights.__setitem__("kernel", np.ones((3, 3, 4), np.float32)), "HWIO"),
        (
            lambda ls: ls[2].weights.__setitem__("gamma", np.ones(3, np.float32)),
            "gamma has 3 values",
        ),
        (lambda ls: ls[2].weights.pop("variance"), "moving mean/variance"),
    ],
)
def test_bad_arrays_are_refused(mutate, match):
    layers = simple_model()
    mutate(layers)
    st = stats_for(c1=((0, 1), None), r1=(None, (0, 5.0)), lr=(None, (-0.3, 9.0)))
    with pytest.raises(ExportError, match=match):
        export_layers(layers, None, stats=st)


def test_prelu_alpha_length_checked_and_broadcast():
    def model(alpha):
        return [
            SourceLayer("in", "input"),
            conv("c", ["in"]),
            SourceLayer("p", "prelu", ["c"], "PReLU", {"alpha": alpha}),
        ]

    st = stats_for(p=(None, (-1, 1)))
    with pytest.raises(ExportError, match="PReLU alpha has 3 values, expected 4"):
        export_layers(model(np.ones(3, np.float32)), None, stats=st)
    res = export_layers(model(np.full((1, 1, 1), 0.25, np.float32)), None, stats=st)
    assert res.layers[0].coefficients.alpha.tolist() == [0.25] * 4


def test_conv_output_read_twice_is_not_fused():
    layers = [
        SourceLayer("in", "input"),
        conv("c", ["in"]),
        bn("b", ["c"]),
        SourceLayer("add", "runtime", ["c", "b"], "Add", attrs={"keeps_exponent": False}),
    ]
    with pytest.raises(ExportError, match="'b'.*cannot be folded"):
        export_layers(layers, None, stats=stats_for(c=(None, (-1, 1))))


def test_model_output_is_not_fused_past():
    layers = [
        SourceLayer("in", "input"),
        conv("c", ["in"], model_output=True),
        SourceLayer("r", "relu", ["c"], "ReLU", attrs={"model_output": True}),
    ]
    res = export_layers(layers, None, stats=stats_for(c=(None, (-1, 1))))
    assert res.layers[0].fused == ["c"] and "activation" not in res.layers[0].entry


def test_names_become_unique_c_identifiers_inside_out_dir(tmp_path):
    layers = [SourceLayer("in", "input")]
    names = ["../../evil", "block/conv.1", "block_conv_1", "for", "9lives"]
    prev = "in"
    for i, name in enumerate(names):
        layers.append(conv(name, [prev], cin=3 if i == 0 else 4))
        prev = name
    st = stats_for(**{n: (None, (-1, 1)) for n in names})
    out = tmp_path / "deep" / "out"
    out.parent.mkdir()
    res = export(None, layers, out, stats=st)
    assert list(res.names) == ["evil", "block_conv_1", "block_conv_1_2", "l_for", "l_9lives"]
    assert list(res.names.values()) == names
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == sorted(
        [f"{c}_{k}.npy" for c in res.names for k in ("filter", "bias")]
        + ["config.json", "names.json", "export.json"]
    )
    assert all(p.parent == out for p in tmp_path.rglob("*") if p.is_file())


def test_failed_export_leaves_nothing_and_keeps_previous(tmp_path):
    st = stats_for(c1=((0, 1), None), r1=(None, (0, 5.0)), lr=(None, (-0.3, 9.0)))
    out = tmp_path / "out"
    export_layers(simple_model(), out, stats=st)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ExportError, match="not empty"):
        export_layers(simple_model(), out, stats=st)
    bad = simple_model()
    bad[5].weights["kernel"] = bad[5].weights["kernel"] * np.nan
    with pytest.raises(ExportError, match="NaN"):
        export_layers(bad, out, stats=st, overwrite=True)
    with pytest.raises(ExportError, match="NaN"):
        export_layers(bad, tmp_path / "fresh", stats=st)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp dirs, no "fresh"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    st.layers["lr"].output = TensorRange(-0.3, 90.0)
    export_layers(simple_model(), out, stats=st, overwrite=True)
    assert json.loads((out / "config.json").read_text())["c2"]["output_exponent"] == ref_exponent(
        0, 90.0
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_unreadable_inputs_for_export():
    with pytest.raises(ExportError, match="pass a Keras model"):
        export(None, {"not": "a model"}, None)
    with pytest.raises(ExportError, match="nothing to export"):
        export_layers([SourceLayer("in", "input")], None)


def _arq(w: np.ndarray) -> list[float]:
    """Independent ARQ per output channel (last axis): max(|max|, |min|) / (128 if |min|>=|max|)."""
    out = []
    for c in range(w.shape[-1]):
        hi, lo = float(w[..., c].max()), float(w[..., c].min())
        out.append(max(abs(hi), abs(lo)) / (128.0 if abs(lo) >= abs(hi) else 127.0))
    return out


def test_record_scale_w_checked_against_folded_weights(tmp_path):
    layers = simple_model()
    k, g = layers[1].weights["kernel"].astype(np.float64), layers[2].weights
    folded = k * (g["gamma"] / np.sqrt(g["variance"].astype(np.float64) + 1e-3))
    st = stats_for(c1=((0, 1), None), r1=(None, (0, 5.0)), lr=(None, (-0.3, 9.0)))
    good = Record({"c1": LayerFactors(scale_w=_arq(folded), offset_w=[0] * 4)})
    # the record covers c1 only: c2 is exported quantized anyway, and a note says so
    absent = "layer 'c2' has no record entry (skip_layers at calibration?)"
    assert [
        w[: len(absent)] for w in export_layers(layers, None, record=good, stats=st).warnings
    ] == [absent]
    stale = Record({"c1": LayerFactors(scale_w=_arq(k), offset_w=[0] * 4)})  # unfolded weights
    res = export_layers(layers, tmp_path / "o", record=stale, stats=st)
    assert len(res.warnings) == 2 and "scale_w differs" in res.warnings[1]
    report = json.loads((tmp_path / "o" / "export.json").read_text())
    assert report["warnings"] == res.warnings
    wrong = Record({"c1": LayerFactors(scale_w=[0.1] * 3, offset_w=[0] * 3)})
    with pytest.raises(ExportError, match="3 scale_w values but the layer has 4 output channels"):
        export_layers(layers, None, record=wrong, stats=st)


def test_output_range_from_the_reader_of_an_unfused_layer():
    layers = [
        SourceLayer("in", "input"),
        conv("c", ["in"]),
        bn("b", ["c"]),
        SourceLayer("r6", "relu6", ["b"], "ReLU"),
    ]
    st = stats_for(c=((0, 1), (-9, 9)), r6=((-3.0, 40.0), (0, 6)))  # no entry for the BN
    res = export_layers(layers, None, stats=st, skip_unsupported=True)
    assert res.layers[0].fused == ["c", "b"]
    assert res.layers[0].entry["output_exponent"] == ref_exponent(-3.0, 40.0)
    assert res.layers[0].sources["output_exponent"] == "sidecar input range of 'r6'"


def test_bn_end_without_range_is_bounded_through_the_bn_with_a_warning():
    layers = [
        SourceLayer("in", "input"),
        conv("c", ["in"]),
        bn("b", ["c"]),
        SourceLayer("add", "runtime", ["b", "in"], "Add", attrs={"keeps_exponent": False}),
    ]
    st = stats_for(c=((0, 1), (-2.0, 3.0)))
    res = export_layers(layers, None, stats=st)
    g = {k: v.astype(np.float64) for k, v in layers[2].weights.items()}
    s = g["gamma"] / np.sqrt(g["variance"] + 1e-3)
    t = g["beta"] - g["mean"] * s
    ends = np.concatenate([s * -2.0 + t, s * 3.0 + t])
    assert res.layers[0].entry["output_exponent"] == ref_exponent(ends.min(), ends.max())
    assert res.layers[0].sources["output_exponent"].startswith("bound from the sidecar output")
    assert len(res.warnings) == 1 and "no calibrated range for 'b'" in res.warnings[0]


def test_branches_meeting_at_a_concat_share_the_largest_exponent():
    cat = {"keeps_exponent": True}
    layers = [
        SourceLayer("in", "input"),
        conv("a", ["in"]),
        conv("b", ["in"]),
        SourceLayer("rb", "relu", ["b"], "ReLU"),
        SourceLayer("pb", "runtime", ["rb"], "MaxPooling2D", attrs=cat),
        SourceLayer("cat", "runtime", ["a", "pb"], "Concatenate", attrs=cat),
        conv("c", ["cat"], cin=8),
        SourceLayer("cat2", "runtime", ["c", "in"], "Concatenate", attrs=cat),
    ]
    st = stats_for(a=(None, (-1, 1)), rb=(None, (0, 8.0)), c=(None, (-1, 1)))
    res = export_layers(layers, None, stats=st)
    a, b, c = (x.entry for x in res.layers)
    assert a["output_exponent"] == b["output_exponent"] == ref_exponent(0, 8.0)
    assert ref_exponent(-1, 1) < ref_exponent(0, 8.0)
    assert (
        res.layers[0]
        .sources["output_exponent"]
        .endswith(f"raised from {ref_exponent(-1, 1)} to match 'rb'")
    )
    assert c["input_exponent"] == ref_exponent(0, 8.0)  # through the Concat
    assert res.warnings == [
        "layer 'cat2' (Concatenate) needs one exponent on all its inputs, but 'in' is not an "
        "exported layer: give it the exponent of 'c'"
    ]


def test_bias_that_saturates_at_the_output_exponent_is_reported():
    layers = [SourceLayer("in", "input"), conv("c", ["in"])]
    layers[1].weights["bias"] = np.array([0.1, 50.0, -0.2, 0.0], np.float32)
    res = export_layers(layers, None, stats=stats_for(c=(None, (-1, 1))))
    e = ref_exponent(-1, 1)  # int8 bias at e: |50| > 127 * 2^e
    assert res.layers[0].preview.bias.values.tolist()[1] == 127
    assert res.warnings == [
        f"layer 'c': 1 of 4 bias values saturate at exponent {e} (int8_t): the chip will use "
        "clipped values"
    ]


def test_written_files_get_normal_permissions(tmp_path):
    import os

    umask = os.umask(0o022)
    try:
        export_layers(
            [SourceLayer("in", "input"), conv("c", ["in"])],
            tmp_path / "o",
            stats=stats_for(c=(None, (-1, 1))),
        )
    finally:
        os.umask(umask)
    assert (tmp_path / "o").stat().st_mode & 0o777 == 0o755
    assert {p.stat().st_mode & 0o777 for p in (tmp_path / "o").iterdir()} == {0o644}


def test_biases_that_round_to_zero_on_most_channels_are_a_warning(tmp_path):
    """Issue 14: only the preview's bias0 column showed it; now export.json and the CLI do."""
    layers = [SourceLayer("in", "input"), conv("c", ["in"])]
    layers[1].weights["bias"] = np.array([0.001, -0.002, 0.5, 0.0], np.float32)
    e = ref_exponent(-1, 1)
    assert 0.002 < 2.0 ** (e - 1) < 0.5  # 0.001 and -0.002 round to 0 at e, 0.5 does not
    res = export_layers(layers, tmp_path / "o", stats=stats_for(c=(None, (-1, 1))))
    want = (
        f"layer 'c': 2 of 4 bias values are nonzero but round to 0 at exponent {e} (int8_t): "
        "the chip runs those channels without their bias"
    )
    assert res.layers[0].preview.bias.zeroed == 2
    assert res.warnings == []  # 2 of 4 is not most
    layers[1].weights["bias"][3] = 0.003
    res = export_layers(layers, tmp_path / "o2", stats=stats_for(c=(None, (-1, 1))))
    assert res.warnings == [want.replace("2 of 4", "3 of 4")]
    report = json.loads((tmp_path / "o2" / "export.json").read_text())
    assert report["warnings"] == res.warnings


def test_sidecar_entries_of_another_model_are_named():
    """A sidecar of another model (its pool was `reducemean_op0`, this one's is `pool`) gave
    its ranges to nobody and the pool fell back to its input's exponent, silently (found by a
    new-user trial). Folded BatchNorms (strip_qat) are not strangers."""
    w = np.ones((4, 2), np.float32)
    layers = [
        SourceLayer("in", "input"),
        SourceLayer("fc", "dense", ["in"], weights={"kernel": w}),
    ]
    rec = Record({"fc": LayerFactors(scale_d=1 / 255, offset_d=-128)})
    own = {"fc": LayerStats("Dense", output=TensorRange(-4.0, 4.0))}
    folded = {"bn": LayerStats("BatchNormalization", output=TensorRange(-1.0, 1.0))}
    clean = export(rec, layers, None, stats=CalibrationStats(layers={**own, **folded}))
    assert not any("sidecar" in w for w in clean.warnings)
    other = {**own, "fcc": LayerStats("Dense", output=TensorRange(-1.0, 1.0))}
    res = export(rec, layers, None, stats=CalibrationStats(layers=other))
    assert res.warnings == [
        "sidecar entries name no layer of this model: 'fcc' (did you mean 'fc'?); their "
        "ranges are not used (is the sidecar of another model?)"
    ]
    assert res.config == clean.config  # a note only


def test_call_site_entries_are_not_strangers():
    """A cell called twice is exported as ``relu`` and ``relu@1``; an entry of its own for the
    call site (``relu@1``) is used, not 'of another model' (it was, on every MindSpore ResNet)."""
    w = np.ones((4, 4), np.float32)
    layers = [
        SourceLayer("in", "input"),
        SourceLayer("fc", "dense", ["in"], weights={"kernel": w}),
        SourceLayer("relu", "relu", ["fc"]),
        SourceLayer("fc2", "dense", ["relu"], weights={"kernel": w}),
        SourceLayer("relu@1", "relu", ["fc2"]),
    ]
    rec = Record(
        {
            "fc": LayerFactors(scale_d=1 / 255, offset_d=-128),
            "fc2": LayerFactors(scale_d=4 / 255, offset_d=-128),
        }
    )
    stats = CalibrationStats(
        layers={
            "fc": LayerStats("Dense", output=TensorRange(-4.0, 4.0)),
            "relu": LayerStats("ReLU", output=TensorRange(0.0, 4.0)),
            "fc2": LayerStats("Dense", output=TensorRange(-8.0, 16.0)),
            "relu@1": LayerStats("ReLU", output=TensorRange(0.0, 16.0)),
        }
    )
    res = export(rec, layers, None, stats=stats)
    assert not any("sidecar" in w for w in res.warnings), res.warnings
    stats.layers["relu@7"] = LayerStats("ReLU", output=TensorRange(0.0, 16.0))  # no such site
    res = export(rec, layers, None, stats=stats)
    assert any("'relu@7'" in w for w in res.warnings), res.warnings


def test_a_bn_after_a_refused_conv_says_so():
    """The BN of a refused conv (here dilated) got the pre-activation (DenseNet, ResNet v2)
    advice, which sends the user after the wrong cause."""
    layers = [
        SourceLayer("in", "input"),
        SourceLayer("c", "unsupported", ["in"], "Conv2d", attrs={"reason": "dilation (2, 2)"}),
        bn("b", ["c"]),
    ]
    with pytest.raises(ExportError) as err:
        export_layers(layers, None)
    text = str(err.value)
    assert "dilation (2, 2)" in text
    assert "the layer before it, 'c', is refused" in text and "pre-activation" not in text
