"""What new users met in issue 33: help texts naming both ESP-DL formats, the exponent search's
sample rule, the flavor a record was written as, and a calibration sidecar of another network.
Tiny Keras models, real files, the CLI in process."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from amct_bridge.cli import main
from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1.search import MAX_INPUT_VALUES, MAX_SAMPLES, MIN_SAMPLES
from amct_bridge.keras import calibrate, export_espdl
from amct_bridge.records import load
from amct_bridge.records.calibration import load_stats, sidecar_path


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse's line breaks: one space


def _option_help(text: str, option: str, following: str) -> str:
    """The help of ``option`` (metavar and text), up to the next option ``following``."""
    start = text.index(f" {option} ")
    return text[start : text.index(f" {following}", start + 1)]


# --- §2: the help texts name both formats; --data / --exponents serve both ---------------------
def test_help_names_both_formats_and_what_data_searches(capsys):
    top = _help(capsys)
    assert "ESP-DL v1" in top and "ESP-DL v3" in top and ".espdl" in top, top
    assert "export ESP-DL v1 coefficients (C++ files, chip simulation)" not in top
    listed = top[top.index("export-espdl") :]
    assert listed.startswith("export-espdl export for ESP-DL: a v1 config.json") and (
        "or a v3 .espdl file" in listed
    ), listed[:160]
    assert "accuracy of the simulated ESP-DL chip (v1 or v3)" in top

    export = _help(capsys, "export-espdl")
    assert "--format espdl: one ESP-DL v3 .espdl file" in export, export
    data = _option_help(export, "--data", "--exponents")
    exponents = _option_help(export, "--exponents", "--skip-unsupported")
    for text in (data, exponents):  # issue 31: --format espdl searches too
        assert "v1 only" not in text and "--format espdl" in text, text
    # §6: the sample rule, with the numbers the search uses (not "at most 512 samples")
    assert "(at most 512 samples)" not in export
    rule = f"min({MAX_SAMPLES}, max({MIN_SAMPLES}, 2**21 // values per sample))"
    assert MAX_INPUT_VALUES == 2**21 and rule in data, data
    assert f"a 96x96x3 input uses the first {(2**21) // (96 * 96 * 3)}" in data


# --- §6: the search's warning says the rule ----------------------------------------------------
def test_the_search_warning_says_how_many_samples_and_why(tmp_path):
    keras.utils.set_random_seed(0)
    x_in = keras.Input((96, 96, 3))
    y = keras.layers.Conv2D(4, 4, strides=4, activation="relu", name="c1")(x_in)
    y = keras.layers.GlobalAveragePooling2D(name="gap")(y)
    model = keras.Model(x_in, keras.layers.Dense(3, name="fc")(y))
    x = np.random.default_rng(0).uniform(0, 1, (80, 96, 96, 3)).astype("float32")
    calibrate(model, x[:8], tmp_path / "r.txt", algorithm="minmax")
    result = export_espdl(model, tmp_path / "r.txt", None, calibration_data=x)
    used = min(512, max(32, 2**21 // (96 * 96 * 3)))  # independent: the documented rule
    assert used == 75
    note = next(w for w in result.warnings if "exponents searched on" in w)
    assert note.startswith(
        f"exponents searched on {used} of 80 calibration samples (the search takes the first "
        f"min(512, max(32, 2**21 // values per sample)) samples given: {used} at "
        f"{96 * 96 * 3} values per sample; "
    ), note


# --- §8: inspect / validate lead with the flavor the record was written as -------------------
def _small(filters: int = 8, se: bool = False) -> keras.Model:
    """Conv + (optional squeeze-excite) + 1x1 conv + GAP + Dense, on 8x8x3."""
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3), name="img")
    y = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="c1")(x)
    if se:
        g = keras.layers.GlobalAveragePooling2D(keepdims=True, name="se_pool")(y)
        g = keras.layers.Conv2D(4, 1, activation="relu", name="se_fc1")(g)
        g = keras.layers.Conv2D(8, 1, activation="sigmoid", name="se_fc2")(g)
        y = keras.layers.Multiply(name="se_mul")([y, g])
    y = keras.layers.Conv2D(filters, 1, activation="relu", name="c2")(y)
    y = keras.layers.GlobalAveragePooling2D(name="gap")(y)
    return keras.Model(x, keras.layers.Dense(4, name="fc")(y))


DATA = np.random.default_rng(1).uniform(0, 1, (16, 8, 8, 3)).astype("float32")


def test_inspect_and_validate_lead_with_the_written_flavor(tmp_path, capsys):
    path = tmp_path / "r.txt"
    calibrate(_small(), DATA, path, algorithm="minmax")  # the default flavor: inner
    # independent: the sidecar says inner, and the text is a valid 'tf' record as well
    assert json.loads(sidecar_path(path).read_text())["flavor"] == "inner"
    assert load(path, "tf").layers.keys() == load(path, "inner").layers.keys()
    assert main(["inspect", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"{path}: an 'inner' record (also valid as 'tf'), 3 layers"
    )
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"{path}: ok (an 'inner' record, 3 layers, 0 prune records)"
    )
    # converted to tf: the copied sidecar says tf
    out = tmp_path / "r_tf.txt"
    assert main(["convert-record", str(path), "--to", "tf", "-o", str(out)]) == 0
    capsys.readouterr()
    assert load_stats(sidecar_path(out)).flavor == "tf"
    assert main(["inspect", str(out)]) == 0
    assert "a 'tf' record (also valid as 'inner'), 3 layers" in capsys.readouterr().out
    # no sidecar (or one written before it named the flavor): the text's flavor, as before
    sidecar_path(path).unlink()
    assert main(["inspect", str(path)]) == 0
    assert "a 'tf' record (also valid as 'inner'), 3 layers" in capsys.readouterr().out


# --- §9: a sidecar of another network whose layer names overlap --------------------------------
def test_a_sidecar_of_another_network_is_refused_by_layer_name(tmp_path):
    with_se, plain = _small(se=True), _small()
    calibrate(with_se, DATA, tmp_path / "se.txt", algorithm="minmax")
    calibrate(plain, DATA, tmp_path / "plain.txt", algorithm="minmax")
    export_espdl(plain, tmp_path / "plain.txt", None)  # its own sidecar: exported
    with pytest.raises(ExportError) as err:
        export_espdl(plain, tmp_path / "plain.txt", None, stats=tmp_path / "se.txt.calib.json")
    text = str(err.value)
    # independent: the layers the SE model has and this one lacks, with their kernels
    for name in ("se_fc1", "se_fc2"):
        kernel = tuple(with_se.get_layer(name).kernel.shape)
        assert f"layer {name!r} (Conv2D, kernel {kernel} HWIO) of the calibrated model is " in text
    assert text.startswith(f"{tmp_path / 'se.txt.calib.json'}: calibration sidecar: written ")
    assert "'c1'" not in text and "'c2'" not in text  # the layers that agree are not named
    # a layer of the same name with other weights: named, with both kernels
    wider = _small(filters=16)
    with pytest.raises(ExportError) as err:
        export_espdl(wider, None, None, stats=tmp_path / "plain.txt.calib.json")
    here, there = wider.get_layer("c2").kernel, plain.get_layer("c2").kernel
    assert (
        f"layer 'c2' (Conv2D): kernel {tuple(here.shape)} here, 16 output channels and "
        f"{int(np.prod(here.shape))} weights; {tuple(there.shape)} HWIO when calibrated, 8 "
        f"output channels and {int(np.prod(there.shape))} weights"
    ) in str(err.value)
    assert "layer 'fc' (Dense): kernel (16, 4) here" in str(err.value)


def test_another_networks_sidecar_is_refused_by_the_cli_in_both_formats(tmp_path, capsys):
    with_se, plain = _small(se=True), _small()
    calibrate(with_se, DATA, tmp_path / "se.txt", algorithm="minmax")
    calibrate(plain, DATA, tmp_path / "plain.txt", algorithm="minmax")
    plain.save(tmp_path / "plain.keras")
    base = ["export-espdl", "--record", str(tmp_path / "plain.txt"), "--model"]
    base += [str(tmp_path / "plain.keras"), "--stats", str(tmp_path / "se.txt.calib.json")]
    for fmt, out in (("v1", tmp_path / "v1"), ("espdl", tmp_path / "m.espdl")):
        assert main([*base, "--format", fmt, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "calibration sidecar: written for another model: layer 'se_fc1'" in err, err
        assert not out.exists()


def test_an_older_sidecar_without_the_model_still_only_warns(tmp_path):
    with_se, plain = _small(se=True), _small()
    calibrate(with_se, DATA, tmp_path / "se.txt", algorithm="minmax")
    side = tmp_path / "se.txt.calib.json"
    doc = json.loads(side.read_text())
    del doc["model"], doc["flavor"]  # as written before issue 33
    side.write_text(json.dumps(doc))
    result = export_espdl(plain, None, None, stats=side)
    assert any("sidecar entries name no layer of this model" in w for w in result.warnings)
