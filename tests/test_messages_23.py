"""Messages a new user met on keras.applications models (issue 23, section 3), on tiny models."""

from __future__ import annotations

import re
from collections import Counter

import keras
import numpy as np
import pytest

from amct_bridge.cli import main
from amct_bridge.errors import ExportError
from amct_bridge.espdl.plan import plan_chains
from amct_bridge.espdl.source import SourceLayer
from amct_bridge.keras import export_espdl
from amct_bridge.keras.espdl_weights import source_layers
from amct_bridge.records import LayerFactors, Record, save
from amct_bridge.records.calibration import (
    CalibrationStats,
    LayerStats,
    TensorRange,
    save_stats,
    sidecar_path,
)


def _stats(model: keras.Model) -> CalibrationStats:
    """A range for every layer: the refusals come before any exponent is needed."""
    r = TensorRange(-1.0, 1.0)
    return CalibrationStats(layers={s.name: LayerStats(s.kind, r, r) for s in source_layers(model)})


def _refusal(model: keras.Model) -> str:
    with pytest.raises(ExportError) as err:
        export_espdl(model, None, None, stats=_stats(model))
    return str(err.value)


def _hard_sigmoid(x, name):
    """MobileNetV3's hard sigmoid, as keras.applications writes it."""
    return keras.layers.ReLU(6.0, name=name)(x + 3.0) * (1.0 / 6.0)


def _mixed_model() -> keras.Model:
    """Many refused layers of several kinds (a small MobileNetV3 / EfficientNet)."""
    x = keras.Input((8, 8, 3), name="img")
    y = keras.layers.Conv2D(4, 3, padding="same", name="c0")(x)
    for i in range(3):
        y = keras.layers.Activation("hard_silu", name=f"hs{i}")(y)
        gate = _hard_sigmoid(keras.layers.Conv2D(4, 1, name=f"se{i}")(y), f"hsig{i}")
        y = keras.layers.Multiply(name=f"mul{i}")([y, gate])
        y = keras.layers.Conv2D(4, 1, name=f"c{i + 1}")(y)
    y = keras.layers.ReLU(6.0, name="plain_r6")(y)
    y = keras.layers.GlobalAveragePooling2D(name="gap")(y)
    return keras.Model(x, keras.layers.Dense(3, name="fc")(y))


# --- refusals: flags, summary, each explanation once, hints ------------------------------------
def test_refusal_names_the_cli_flag_the_python_argument_and_v3(tmp_path, capsys):
    x = keras.Input((4, 4, 2))
    y = keras.layers.Conv2D(2, 1, name="c")(x)
    model = keras.Model(x, keras.layers.Activation("tanh", name="act")(y))
    model.save(tmp_path / "m.keras")
    save_stats(_stats(model), tmp_path / "s.json")
    args = [
        "export-espdl",
        "--model",
        str(tmp_path / "m.keras"),
        "--stats",
        str(tmp_path / "s.json"),
    ]
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--skip-unsupported (Python: skip_unsupported=True)" in err
    assert "--format espdl" in err
    assert "skip_unsupported leaves them out" not in err  # the old text named the argument only
    assert not (tmp_path / "o").exists()


def test_a_long_refusal_starts_with_a_summary_by_kind_that_counts_every_layer():
    model = _mixed_model()
    text = _refusal(model)
    head, *lines = text.splitlines()
    found = re.fullmatch(r"ESP-DL v1 cannot take (\d+) layers: (.*):", head)
    assert found, head
    summary = dict(
        (kind, int(n)) for n, kind in (part.split(" ", 1) for part in found.group(2).split(", "))
    )
    # independent count: the model's operations by class (x + 3 and * (1 / 6) are ops)
    ops = [(type(op).__name__, op.name) for op in model.operations]
    expected = Counter()
    expected["Activation (hard_silu)"] = sum(
        n.startswith("hs") for k, n in ops if k == "Activation"
    )
    expected["ReLU6 in a hard sigmoid"] = sum(n.startswith("hsig") for k, n in ops if k == "ReLU")
    expected["ReLU6"] = sum(n == "plain_r6" for k, n in ops if k == "ReLU")
    expected["Multiply"] = sum(k == "Multiply" for k, _ in ops)
    assert summary == dict(expected)
    assert int(found.group(1)) == sum(expected.values()) == 3 + 3 + 1 + 6
    # every refused layer is named in the body
    for kind_names in (["hs0", "hs1", "hs2"], ["hsig0", "hsig1", "hsig2"], ["plain_r6"]):
        for name in kind_names:
            assert f"'{name}'" in "\n".join(lines)


def test_the_same_explanation_is_printed_once_with_its_layers():
    """ResNet50V2's pre-activation BatchNormalization: one explanation, every layer listed."""
    x = keras.Input((8, 8, 4))
    y = keras.layers.Conv2D(4, 3, padding="same", name="stem")(x)
    for i in range(4):
        pre = keras.layers.ReLU(name=f"pre_relu{i}")(
            keras.layers.BatchNormalization(name=f"preact_bn{i}")(y)
        )
        y = keras.layers.Add(name=f"add{i}")([y, keras.layers.Conv2D(4, 1, name=f"c{i}")(pre)])
    model = keras.Model(x, y)
    text = _refusal(model)
    bn_lines = [line for line in text.splitlines() if "BatchNormalization cannot be folded" in line]
    assert len(bn_lines) == 1, text
    assert bn_lines[0].startswith("  4 layers (BatchNormalization): ")
    assert [f"preact_bn{i}" for i in range(4)] == re.findall(r"'(preact_bn\d)'", bn_lines[0])
    assert text.count("ESP-DL v1 has no BatchNorm layer") == 1


def test_relu6_in_a_hard_sigmoid_gets_no_replace_with_relu_hint():
    model = _mixed_model()
    lines = _refusal(model).splitlines()
    hsig = [line for line in lines if "'hsig0'" in line]
    plain = [line for line in lines if "'plain_r6'" in line]
    assert len(hsig) == 1 and len(plain) == 1
    assert "hard sigmoid" in hsig[0]
    assert "replace it with ReLU" not in hsig[0] and "replace_relu6()" not in hsig[0]
    assert "replace it with ReLU" in plain[0] and "replace_relu6()" in plain[0]


def test_a_relu6_that_is_a_plain_activation_is_not_taken_for_a_hard_sigmoid():
    """Negative control: a ReLU6 after an Add of two tensors (a residual) is plain."""
    x = keras.Input((4, 4, 2))
    a = keras.layers.Conv2D(2, 1, name="a")(x)
    b = keras.layers.Conv2D(2, 1, name="b")(x)
    y = keras.layers.ReLU(6.0, name="r6")(keras.layers.Add(name="add")([a, b]))
    model = keras.Model(x, keras.layers.Conv2D(2, 1, name="c")(y))
    line = next(line for line in _refusal(model).splitlines() if "'r6'" in line)
    assert "replace_relu6()" in line and "hard sigmoid" not in line


def test_a_softmax_at_the_model_output_suggests_classifier_activation_none():
    x = SourceLayer("in", "input")
    fc = SourceLayer("fc", "dense", ["in"], "Dense", {"kernel": np.ones((4, 3), np.float32)})
    reason = "activation 'softmax': ESP-DL v1 has no such layer"
    head = {"reason": reason, "model_output": True}
    pred = SourceLayer("pred", "unsupported", ["fc"], "Activation", attrs=head)
    mid = SourceLayer("mid", "unsupported", ["fc"], "Activation", attrs={"reason": reason})
    _, problems = plan_chains([x, fc, pred, mid])
    by_layer = {p.layer: p.reason for p in problems}
    assert "classifier_activation=None" in by_layer["pred"]
    assert "classifier_activation=None" not in by_layer["mid"]  # not the output: no head


# --- skip-unsupported that leaves no runnable chip graph ---------------------------------------
def _relu6_files(tmp_path, relu6: bool):
    keras.utils.set_random_seed(3)
    x = keras.Input((6, 6, 3))
    y = keras.layers.Conv2D(4, 3, name="c1")(x)
    y = keras.layers.ReLU(6.0 if relu6 else None, name="act")(y)
    y = keras.layers.Conv2D(2, 1, name="c2")(y)
    model = keras.Model(x, y)
    model.save(tmp_path / "m.keras")
    record = tmp_path / "r.txt"
    save(Record({"c1": LayerFactors(scale_d=1 / 255, offset_d=-128)}), record)
    save_stats(_stats(model), sidecar_path(record))
    return ["export-espdl", "--model", str(tmp_path / "m.keras"), "--record", str(record)]


def test_skip_unsupported_without_a_chip_graph_warns_at_the_end(tmp_path, capsys):
    args = _relu6_files(tmp_path, relu6=True)
    assert main([*args, "--out", str(tmp_path / "o"), "--skip-unsupported"]) == 0
    out, err = capsys.readouterr()
    assert "wrote 2 layers" in out
    last = err.strip().splitlines()[-1]
    assert last.startswith("warning: the chip cannot run this export as one network: "), err
    assert "'act'" in last  # why: the skipped ReLU6 sits between the two convs
    assert "espdl-eval cannot simulate it" in last


def test_an_export_with_a_chip_graph_has_no_such_warning(tmp_path, capsys):
    args = _relu6_files(tmp_path, relu6=False)
    assert main([*args, "--out", str(tmp_path / "o")]) == 0
    assert "chip cannot run" not in capsys.readouterr().err


# --- espdl-eval --data x.npy without --labels ----------------------------------------------------
def test_espdl_eval_with_a_npy_and_no_labels_says_labels_are_missing(tmp_path, capsys):
    (tmp_path / "export").mkdir()  # never read: the data is checked first
    np.save(tmp_path / "x.npy", np.zeros((4, 6, 6, 3), np.float32))
    args = ["espdl-eval", "--export", str(tmp_path / "export"), "--model", "m.keras"]
    assert main([*args, "--data", str(tmp_path / "x.npy")]) == 2
    err = capsys.readouterr().err
    assert "--labels is missing" in err and f"{tmp_path / 'x.npy'}:" in err
    assert "expected an .npz" not in err
    np.savez(tmp_path / "d.npz", inputs=np.zeros((4, 3)), labels=np.zeros(4))
    assert main([*args, "--data", str(tmp_path / "d.npz")]) == 2
    err = capsys.readouterr().err
    assert "expected an .npz with arrays 'x' and 'y' (it has 'inputs', 'labels')" in err


# --- a record cut at an entry boundary; a sidecar of another model -------------------------------
@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A 3-layer model calibrated by the CLI (record + sidecar), and a second, other model."""
    d = tmp_path_factory.mktemp("cal")
    keras.utils.set_random_seed(1)
    x = keras.Input((8, 8, 3))
    y = keras.layers.ReLU(name="r1")(keras.layers.Conv2D(4, 3, name="c1")(x))
    y = keras.layers.Flatten(name="f")(keras.layers.Conv2D(4, 3, name="c2")(y))
    keras.Model(x, keras.layers.Dense(3, name="fc")(y)).save(d / "m.keras")
    x = keras.Input((8, 8, 3))
    y = keras.layers.Dense(2, name="other")(keras.layers.Flatten(name="ff")(x))
    keras.Model(x, y).save(d / "other.keras")
    np.save(d / "x.npy", np.random.default_rng(0).uniform(0, 1, (8, 8, 8, 3)).astype("float32"))
    for model, record in (("m", "r.txt"), ("other", "other.txt")):
        args = ["calibrate", str(d / f"{model}.keras"), "--data", str(d / "x.npy")]
        assert main([*args, "-o", str(d / record), "-q", "--algorithm", "minmax"]) == 0
    return d


def _cut_at_entry(d, name: str, keep: int) -> str:
    """The record with its first ``keep`` entries only (cut at an entry boundary), beside a
    copy of its sidecar."""
    text = (d / "r.txt").read_text()
    starts = [m.start() for m in re.finditer(r"^record \{", text, re.M)]
    (d / name).write_text(text[: starts[keep]])
    (d / f"{name}.calib.json").write_text((d / "r.txt.calib.json").read_text())
    return str(d / name)


def test_a_record_cut_at_an_entry_boundary_is_named_truncated_not_skip_layers(
    calibrated, tmp_path, capsys
):
    d = calibrated
    cut = _cut_at_entry(d, "cut.txt", 1)
    from amct_bridge.records import load

    assert list(load(cut).layers) == ["c1"]  # it parses: only the sidecar can tell
    lacks = "the record lacks 2 layers that the sidecar"
    assert main(["validate", cut]) == 1
    out = capsys.readouterr().out
    said = f"{cut}: {lacks} ({cut}.calib.json) says were calibrated (truncated or edited record?)"
    assert said in out
    assert "'c2', 'fc'" in out and "1 problem(s)" in out
    args = ["export-espdl", "--model", str(d / "m.keras"), "--record", cut]
    assert main([*args, "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert f"warning: {cut}: {lacks}" in err and "(truncated or edited record?)" in err
    assert "skip_layers" not in err
    # the full record validates, and exports without the warning
    assert main(["validate", str(d / "r.txt")]) == 0
    assert (
        main(
            [
                "export-espdl",
                "--model",
                str(d / "m.keras"),
                "--record",
                str(d / "r.txt"),
                "--out",
                str(tmp_path / "o2"),
            ]
        )
        == 0
    )
    assert "lacks" not in capsys.readouterr().err


def test_layers_skipped_at_calibration_are_still_blamed_on_skip_layers(calibrated, tmp_path):
    d = calibrated
    args = ["calibrate", str(d / "m.keras"), "--data", str(d / "x.npy"), "-q"]
    assert main([*args, "-o", str(tmp_path / "s.txt"), "--skip-layers", "c2"]) == 0
    res = export_espdl(keras.models.load_model(d / "m.keras"), tmp_path / "s.txt", None)
    notes = [w for w in res.warnings if "record" in w]
    assert len(notes) == 1 and notes[0].startswith("layer 'c2' has no record entry (skip_layers")
    assert "lacks" not in notes[0]


def test_a_sidecar_of_another_model_says_none_of_its_layers_exist(calibrated, capsys):
    d = calibrated
    args = ["export-espdl", "--model", str(d / "m.keras"), "--record", str(d / "r.txt")]
    assert main([*args, "--stats", str(d / "other.txt.calib.json"), "--preview"]) == 2
    err = capsys.readouterr().err
    assert f"error: {d / 'other.txt.calib.json'}: calibration sidecar: " in err
    assert "in this model (is it the sidecar of another model?): 'other'" in err
    assert "cannot choose output_exponent" not in err


# --- a record cut mid-word -----------------------------------------------------------------------
@pytest.mark.parametrize("cut", ["offset_", "off", "scale_d: 0.0", "key:"])
def test_a_parse_error_at_the_end_of_the_file_says_it_looks_truncated(calibrated, tmp_path, cut):
    from amct_bridge.errors import RecordError
    from amct_bridge.records import load

    text = (calibrated / "r.txt").read_text()
    prefix = {"offset_": "offset_d", "off": "offset_d", "scale_d: 0.0": "scale_d", "key:": "key"}
    at = text.rindex(prefix[cut])
    (tmp_path / "c.txt").write_text(text[:at] + cut)
    with pytest.raises(RecordError) as err:
        load(tmp_path / "c.txt")
    assert "it looks truncated" in str(err.value)


def test_a_typo_inside_the_file_is_not_called_truncated(calibrated, tmp_path):
    from amct_bridge.errors import RecordError
    from amct_bridge.records import load

    text = (calibrated / "r.txt").read_text()
    (tmp_path / "t.txt").write_text(text.replace("offset_d", "offset_", 1))
    with pytest.raises(RecordError, match='has no field named "offset_"') as err:
        load(tmp_path / "t.txt")
    assert "truncated" not in str(err.value)


# --- Python calibrate() with a wrong input shape --------------------------------------------------
def test_python_calibrate_with_a_wrong_shape_raises_the_clis_calibration_error(
    calibrated, tmp_path, capsys
):
    from amct_bridge.errors import CalibrationError
    from amct_bridge.keras import calibrate

    model = keras.models.load_model(calibrated / "m.keras")
    bad = np.zeros((4, 6, 8, 3), np.float32)
    np.save(tmp_path / "bad.npy", bad)
    args = ["calibrate", str(calibrated / "m.keras"), "--data", str(tmp_path / "bad.npy")]
    assert main([*args, "-o", str(tmp_path / "cli.txt"), "-q"]) == 2
    cli = capsys.readouterr().err.strip().split(": error: ", 1)[1]
    with pytest.raises(CalibrationError) as err:
        calibrate(model, bad, tmp_path / "api.txt")
    # the same words, the data named as the API got it instead of the file
    assert cli == f"{tmp_path / 'bad.npy'}: array {str(err.value).removeprefix('data ')}"
    assert str(err.value).startswith("data of shape (4, 6, 8, 3) does not fit model input ")
    assert not (tmp_path / "api.txt").exists()
    import tensorflow as tf

    batches = tf.data.Dataset.from_tensor_slices(np.zeros((4, 8, 8), np.float32)).batch(2)
    with pytest.raises(CalibrationError, match=r"dataset element of shape \(N, 8, 8\) does not"):
        calibrate(model, batches, tmp_path / "api.txt")
    with pytest.raises(CalibrationError, match="data holds 2 arrays for a model with 1 input"):
        calibrate(model, [bad, bad], tmp_path / "api.txt")
    good = np.random.default_rng(0).uniform(0, 1, (4, 8, 8, 3)).astype("float32")
    assert list(calibrate(model, good, tmp_path / "api.txt", algorithm="minmax").layers) == [
        "c1",
        "c2",
        "fc",
    ]


# --- a coefficient .npy of the wrong shape in a convert set ---------------------------------------
@pytest.fixture(scope="module")
def exported(calibrated, tmp_path_factory):
    out = tmp_path_factory.mktemp("exp") / "set"
    args = ["export-espdl", "--model", str(calibrated / "m.keras")]
    assert main([*args, "--record", str(calibrated / "r.txt"), "--out", str(out)]) == 0
    return out


def _broken_copy(exported, tmp_path, name, change):
    import shutil

    broken = tmp_path / "set"
    shutil.copytree(exported, broken)
    np.save(broken / name, change(np.load(broken / name)))
    return broken


@pytest.mark.parametrize(
    "argv",
    [
        ["espdl-convert", "-t", "esp32", "-i", "{set}", "-n", "m_coefficient", "-o", "{out}"],
        [
            "espdl-convert",
            "-t",
            "esp32",
            "-i",
            "{set}",
            "-n",
            "m_coefficient",
            "-o",
            "{out}",
            "--model-class",
        ],
        ["export-espdl", "--preview", "--set", "{set}"],
    ],
    ids=["convert", "model-class", "preview"],
)
def test_a_filter_of_another_width_is_named_at_conversion(exported, tmp_path, capsys, argv):
    broken = _broken_copy(exported, tmp_path, "c2_filter.npy", lambda w: w[:, :, :3, :])
    out = tmp_path / "cpp"
    filled = [a.replace("{set}", str(broken)).replace("{out}", str(out)) for a in argv]
    assert main(filled) == 2
    err = capsys.readouterr().err
    assert f"error: {broken / 'c2_filter.npy'}: filter of shape (3, 3, 3, 4) does not fit " in err
    assert "input has 4 channels, filter 3" in err
    assert not out.exists()  # nothing written
    assert main([a.replace("{set}", str(exported)).replace("{out}", str(out)) for a in argv]) == 0


def test_a_widened_filter_is_named_with_the_layer_it_feeds(exported, tmp_path, capsys):
    def widen(w):
        return np.concatenate([w, w[..., :1]], axis=-1)

    broken = _broken_copy(exported, tmp_path, "c1_filter.npy", widen)
    np.save(broken / "c1_bias.npy", widen(np.load(broken / "c1_bias.npy")))
    assert main(["export-espdl", "--preview", "--set", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "c2_filter.npy: filter of shape (3, 3, 4, 4)" in err
    assert "input has 5 channels, filter 4" in err
    assert "'c1' (Conv2D), whose c1_filter.npy has shape (3, 3, 3, 5)" in err


def test_a_bias_of_another_length_is_named_even_without_a_graph(exported, tmp_path, capsys):
    broken = _broken_copy(exported, tmp_path, "fc_bias.npy", lambda b: b[:2])
    (broken / "export.json").unlink()  # a set made by hand: no chip graph
    argv = ["espdl-convert", "-t", "esp32", "-i", str(broken), "-n", "m", "-o", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {broken / 'fc_bias.npy'}: 2 values of shape (2,), but fc_filter.npy" in err
    assert "has 3 output channels: one bias value per channel" in err


# --- warnings that repeat per layer: one line, the full list at -v and in the sidecar ------------
def _vanishing_model(depth: int = 7) -> keras.Model:
    """Dense layers whose activations are ~4e-6 from the second one on (untrained-like)."""
    x = keras.Input((4,), name="x")
    y = keras.layers.Dense(4, name="d0", kernel_initializer=keras.initializers.Constant(1e-6))(x)
    for i in range(1, depth):
        init = keras.initializers.Constant(0.25)  # 4 inputs x 0.25: the range stays put
        y = keras.layers.Dense(4, name=f"d{i}", kernel_initializer=init)(y)
    return keras.Model(x, y)


def test_the_flt_epsilon_warning_is_one_line_with_every_layer_at_debug_and_in_the_sidecar(
    tmp_path, caplog
):
    import logging

    from amct_bridge.keras import calibrate
    from amct_bridge.quant.factors import FLT_EPSILON
    from amct_bridge.records.calibration import load_stats

    model = _vanishing_model()
    data = np.random.default_rng(0).uniform(0, 1, (16, 4)).astype("float32")
    # independent: each layer's input range -> the asymmetric INT8 scale (hi - lo) / 255
    expected, h = [], data
    for layer in model.layers[1:]:
        lo, hi = min(0.0, float(h.min())), max(0.0, float(h.max()))
        scale_sym, scale_asym = max(abs(lo), abs(hi)) / 127, (hi - lo) / 255
        assert (scale_sym < FLT_EPSILON) == (scale_asym < FLT_EPSILON)  # far from the edge
        if 0 < scale_asym < FLT_EPSILON:
            expected.append(layer.name)
        kernel, bias = (np.asarray(w) for w in layer.get_weights())
        h = h @ kernel + bias
    assert expected == [f"d{i}" for i in range(1, 7)]  # six layers, more than the first few
    with caplog.at_level(logging.DEBUG, logger="amct_bridge"):
        calibrate(model, data, tmp_path / "r.txt", algorithm="minmax")
    warns = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    folded = [m for m in warns if "FLT_EPSILON" in m]
    assert len(folded) == 1, warns
    assert folded[0].startswith("6 layers: their input ranges give scale_d below FLT_EPSILON")
    assert re.findall(r"'(d\d)' \(\[", folded[0]) == expected[:5]
    assert "and 1 more" in folded[0] and "-v" in folded[0]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    per_layer = [m for m in debug if "below FLT_EPSILON" in m]
    assert [m.split("'")[1] for m in per_layer] == expected
    assert load_stats(tmp_path / "r.txt.calib.json").warnings == per_layer


def test_one_layer_below_flt_epsilon_keeps_its_own_line(tmp_path, caplog):
    import logging

    from amct_bridge.keras import calibrate

    model = _vanishing_model(depth=2)
    data = np.random.default_rng(0).uniform(0, 1, (16, 4)).astype("float32")
    with caplog.at_level(logging.WARNING, logger="amct_bridge"):
        calibrate(model, data, tmp_path / "r.txt", algorithm="minmax")
    warns = [r.getMessage() for r in caplog.records if "FLT_EPSILON" in r.getMessage()]
    assert len(warns) == 1 and warns[0].startswith("layer 'd1': its input range [")


def test_verbose_cli_shows_the_folded_layers_and_the_default_does_not(calibrated, tmp_path, caplog):
    """-v turns on amct_bridge's DEBUG lines (the full lists); without it they stay off."""
    import logging

    args = ["calibrate", str(calibrated / "m.keras"), "--data", str(calibrated / "x.npy"), "-q"]
    args += ["--joint-quant", "--flavor", "tf", "--algorithm", "minmax"]
    found = {}
    for run, extra in (("default", []), ("verbose", ["-v"])):
        caplog.clear()
        with caplog.at_level(logging.WARNING):  # the root logger at WARNING, as the CLI sets it
            caplog.handler.setLevel(logging.DEBUG)  # but capture whatever gets through
            assert main([*args, "-o", str(tmp_path / f"{run}.txt"), *extra]) == 0
        found[run] = [
            (r.levelno, r.getMessage()) for r in caplog.records if "cannot hold" in r.getMessage()
        ]
    folded = (
        logging.WARNING,
        "record flavor 'tf' cannot hold shift_bit: dropped for 3 layers: 'c1', 'c2', 'fc'",
    )
    assert found["default"] == [folded]
    assert found["verbose"] == [folded] + [
        (
            logging.DEBUG,
            f"record flavor 'tf' cannot hold layer {name!r}: shift_bit ({n} values): dropped",
        )
        for name, n in (("c1", 4), ("c2", 4), ("fc", 1))
    ]


def test_an_export_warning_many_layers_get_is_printed_once(tmp_path, capsys):
    import json

    keras.utils.set_random_seed(2)
    x = keras.Input((6,))
    y = x
    for i in range(4):
        y = keras.layers.Dense(6, name=f"d{i}")(y)
    keras.Model(x, y).save(tmp_path / "m.keras")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).uniform(0, 1, (8, 6)).astype("float32"))
    cal = ["calibrate", str(tmp_path / "m.keras"), "--data", str(tmp_path / "x.npy"), "-q"]
    assert main([*cal, "-o", str(tmp_path / "r.txt"), "--skip-layers", "d1,d2,d3"]) == 0
    exp = [
        "export-espdl",
        "--model",
        str(tmp_path / "m.keras"),
        "--record",
        str(tmp_path / "r.txt"),
    ]
    capsys.readouterr()
    assert main([*exp, "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "has no record entry" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("warning: layer 'd1' has no record entry (skip_layers")
    assert lines[0].endswith("(and 2 more layers alike: 'd2', 'd3')")
    assert "note: -v lists every folded warning; all of them in export.json" in err
    report = json.loads((tmp_path / "o" / "export.json").read_text())
    assert [w.split("'")[1] for w in report["warnings"] if "has no record entry" in w] == [
        "d1",
        "d2",
        "d3",
    ]


def test_skip_layers_of_several_unquantized_layers_is_one_warning(calibrated, tmp_path, caplog):
    import logging

    from amct_bridge.keras import calibrate

    model = keras.models.load_model(calibrated / "m.keras")
    data = np.load(calibrated / "x.npy")
    with caplog.at_level(logging.WARNING, logger="amct_bridge"):
        calibrate(model, data, tmp_path / "r.txt", algorithm="minmax", skip_layers=["r1", "f"])
    warns = [r.getMessage() for r in caplog.records if "skip_layers" in r.getMessage()]
    assert warns == [
        "skip_layers: 'r1' (ReLU), 'f' (Flatten) are not quantizable layers, so skipping them "
        "changes nothing (quantizable types: " + warns[0].split("(quantizable types: ")[1]
    ]
    assert "Conv2D" in warns[0].split("(quantizable types: ")[1]


@pytest.mark.parametrize("key, value", [("record_keys", 5), ("warnings", ["ok", 3])])
def test_a_sidecar_with_a_bad_record_keys_or_warnings_field_is_named(tmp_path, key, value):
    import json

    from amct_bridge.errors import RecordError
    from amct_bridge.records.calibration import FORMAT, load_stats

    path = tmp_path / "r.txt.calib.json"
    path.write_text(json.dumps({"format": FORMAT, "batches": 1, "layers": {}, key: value}))
    with pytest.raises(RecordError, match=f"{re.escape(str(path))}: {key}: expected a list of str"):
        load_stats(path)
    path.write_text(json.dumps({"format": FORMAT, "batches": 1, "layers": {}, key: ["a"]}))
    assert getattr(load_stats(path), key) == ["a"] and load_stats(path).source == str(path)
