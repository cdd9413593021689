"""`amct-bridge export-espdl` on a saved Keras model, record and sidecar."""

from __future__ import annotations

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
from espdl_stats import layer_activations, sidecar_from

from amct_bridge.cli import main
from amct_bridge.records import LayerFactors, Record, save
from amct_bridge.records.calibration import save_stats, sidecar_path


def _model(relu6: bool = False) -> keras.Model:
    keras.utils.set_random_seed(5)
    x = keras.Input((8, 8, 3))
    y = keras.layers.Conv2D(4, 3, name="c1")(x)
    y = keras.layers.BatchNormalization(name="bn1")(y)
    y = keras.layers.ReLU(6.0 if relu6 else None, name="act1")(y)
    y = keras.layers.DepthwiseConv2D(3, name="dw")(y)
    y = keras.layers.Flatten(name="flat")(y)
    y = keras.layers.Dense(3, name="fc")(y)
    return keras.Model(x, y)


def _files(tmp_path, relu6=False, sidecar=True):
    model = _model(relu6)
    path = tmp_path / ("m6.keras" if relu6 else "m.keras")
    model.save(path)
    data = np.random.default_rng(0).uniform(0, 1, (4, 8, 8, 3)).astype("float32")
    acts = layer_activations(model, data)
    record = tmp_path / "record.txt"
    save(Record({"c1": LayerFactors(scale_d=1 / 255, offset_d=-128)}), record)
    if sidecar:
        save_stats(sidecar_from(acts), sidecar_path(record))
    return path, record, acts


def test_export_with_auto_sidecar(tmp_path, capsys):
    model, record, acts = _files(tmp_path)
    out = tmp_path / "espdl"
    code = main(["export-espdl", "--record", str(record), "--model", str(model), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert "wrote 3 layers" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert list(config) == ["c1", "dw", "fc"]
    top = float(np.abs(acts["fc"][1]).max())
    assert (
        127 * 2.0 ** (config["fc"]["output_exponent"] - 1)
        < top
        <= 127 * 2.0 ** config["fc"]["output_exponent"]
    )


def test_preview_prints_exponents_and_writes_nothing(tmp_path, capsys):
    model, record, _ = _files(tmp_path)
    argv = ["export-espdl", "--record", str(record), "--model", str(model), "--preview"]
    code = main([*argv, "--granularity", "per-channel", "--target", "esp32s3"])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["layer", "operation", "in", "out"]
    assert [line.split()[0] for line in lines[1:4]] == ["c1", "dw", "fc"]
    assert "%" in lines[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "m.keras",
        "record.txt",
        "record.txt.calib.json",
    ]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--feature-type", "s16", "--granularity", "per-channel"], "s16 per-channel"),
        (["--model", "missing.keras"], "model file not found"),
        (["--record", "missing.txt"], "record file not found"),
    ],
)
def test_cli_errors(tmp_path, capsys, extra, message):
    model, record, _ = _files(tmp_path)
    argv = ["export-espdl", "--record", str(record), "--model", str(model), "--out", "x", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_needs_out_and_ranges(tmp_path, capsys):
    model, record, _ = _files(tmp_path, sidecar=False)
    assert main(["export-espdl", "--model", str(model), "--out", str(tmp_path / "o")]) == 2
    assert "--record and/or --stats" in capsys.readouterr().err
    assert main(["export-espdl", "--record", str(record), "--model", str(model)]) == 2
    assert "--out is required" in capsys.readouterr().err
    argv = ["export-espdl", "--record", str(record), "--model", str(model), "--out", "o"]
    assert main(argv) == 2  # the record alone says nothing about the outputs
    assert "cannot choose output_exponent" in capsys.readouterr().err


def test_relu6_refused_and_skipped_as_a_user_runs_it(tmp_path, capsys):
    model, record, _ = _files(tmp_path, relu6=True)
    out = tmp_path / "o"
    args = ["export-espdl", "--record", str(record), "--model", str(model), "--out", str(out)]
    assert main(args) == 2
    assert "layer 'act1' (ReLU): ReLU6" in capsys.readouterr().err
    assert not out.exists()
    argv = [sys.executable, "-m", "amct_bridge", *args, "--skip-unsupported"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "skipped: layer 'act1' (ReLU)" in done.stdout
    assert json.loads((out / "names.json").read_text()) == {"c1": "c1", "dw": "dw", "fc": "fc"}


def test_preview_existing_set_matches_golden_exponents(capsys):
    from pathlib import Path

    s8_set = Path(__file__).resolve().parents[1] / "data" / "espdl_v1_golden" / "s8_set"
    golden = json.loads((s8_set.parent / "s8_set.esp32.q0.json").read_text())["constants"]
    assert main(["export-espdl", "--preview", "--set", str(s8_set)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    for layer in ("conv", "dw", "fc"):
        exp = golden[f"{layer}_filter"]["args"].split(", ")[1]
        assert rows[layer][4] == exp
    assert rows["fc"][6] == "LeakyReLU:" + golden["fc_activation"]["args"].split(", ")[2]
    assert main(["export-espdl", "--set", str(s8_set)]) == 2
    assert "use it with --preview" in capsys.readouterr().err


def test_overwrite_message_names_the_cli_flag(tmp_path, capsys):
    model, record, _ = _files(tmp_path)
    out = tmp_path / "o"
    argv = ["export-espdl", "--record", str(record), "--model", str(model), "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{out}: directory exists and is not empty" in err
    assert "--overwrite" in err and "(use overwrite)" not in err
    assert main([*argv, "--overwrite"]) == 0


def test_preview_of_a_per_channel_set_reads_its_granularity(tmp_path, capsys):
    """--preview --set DIR previews the set as exported (export.json), not per-tensor."""
    model, record, _ = _files(tmp_path)
    keras_model = keras.models.load_model(model)
    kernel, bias = keras_model.get_layer("c1").get_weights()
    kernel[..., 0] *= 40  # channel 0 needs a far smaller filter exponent than the others
    keras_model.get_layer("c1").set_weights([kernel, bias])
    keras_model.save(model)
    out = tmp_path / "o"
    argv = ["export-espdl", "--record", str(record), "--model", str(model), "--out", str(out)]
    assert main([*argv, "--granularity", "per-channel"]) == 0
    capsys.readouterr()

    def preview(*extra):
        assert main(["export-espdl", "--preview", "--set", str(out), *extra]) == 0
        return capsys.readouterr()

    default = preview()
    assert default.out == preview("--granularity", "per-channel").out
    assert default.err == ""
    per_tensor = preview("--granularity", "per-tensor")
    assert per_tensor.out != default.out
    assert "export.json says the set was exported per-channel" in per_tensor.err


def test_biases_rounding_to_zero_are_a_cli_warning(tmp_path, capsys):
    model, record, _ = _files(tmp_path)
    keras_model = keras.models.load_model(model)
    kernel, _ = keras_model.get_layer("c1").get_weights()
    keras_model.get_layer("c1").set_weights([kernel, np.float32([1e-6, -2e-6, 3e-6, 0.0])])
    keras_model.save(model)
    out = tmp_path / "o"
    argv = ["export-espdl", "--record", str(record), "--model", str(model)]
    assert main([*argv, "--preview"]) == 0
    assert "warning: layer 'c1': 3 of 4 bias values are nonzero but round to 0" in (
        capsys.readouterr().err
    )
    assert main([*argv, "--out", str(out)]) == 0
    assert "warning: layer 'c1': 3 of 4 bias values" in capsys.readouterr().err
    warnings = json.loads((out / "export.json").read_text())["warnings"]
    assert [w for w in warnings if w.startswith("layer 'c1': 3 of 4 bias values")]
