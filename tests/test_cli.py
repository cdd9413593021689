"""The `amct-bridge` command on the real fixture records, run as a user would (subprocess)."""

import subprocess
import sys
from pathlib import Path

import pytest

from amct_bridge.records import load

DATA = Path(__file__).parent / "data" / "amct"
MOBILENET = DATA / "tf_mobilenet_v2_record_quantized.txt"
PRUNE = DATA / "prune_record_single_conv.txt"


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "amct_bridge", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_inspect_mobilenet_table():
    result = run("inspect", MOBILENET)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith("a 'tf' record (also valid as 'inner'), 54 layers")
    assert lines[1].split() == [
        "layer",
        "scale_d",
        "offset_d",
        "channels",
        "scale_w",
        "range",
        "types",
        "extra",
    ]
    row = next(line for line in lines if line.startswith("MobilenetV2/expanded_conv_2/depthwise/"))
    record = load(MOBILENET)
    factors = record.layers["MobilenetV2/expanded_conv_2/depthwise/depthwise"]
    assert row.split()[1:4] == [f"{factors.scale_d:.6g}", "-128", str(len(factors.scale_w))]
    assert f"{min(factors.scale_w):.6g} .. {max(factors.scale_w):.6g}" in row
    assert len(lines) == 2 + 54


def test_inspect_prune_summary():
    result = run("inspect", PRUNE)
    assert result.returncode == 0, result.stderr
    assert "1 channel-pruning group(s), 0 selective node(s)" in result.stdout
    assert (
        "group 0: layer1.0(Conv)[0, 64) -> layer1.1(BatchNormalization)[0, 64), "
        "layer2.0(Conv)[0, 64)"
    ) in result.stdout


def test_validate_ok_and_problems(tmp_path):
    ok = run("validate", MOBILENET)
    assert ok.returncode == 0 and "ok (a 'tf' record, 54 layers" in ok.stdout
    bad = tmp_path / "bad.txt"
    bad.write_text(
        'record {\n  key: "c"\n  value {\n    scale_d: 0.5\n    offset_d: 200\n'
        "    offset_w: 1\n  }\n}\n"
    )
    result = run("validate", bad)
    assert result.returncode == 1
    assert result.stdout.splitlines()[:2] == [
        f"{bad}:5: layer 'c': offset_d: offset_d's value should be in [-128, 127] (INT8), got 200",
        f"{bad}:6: layer 'c': offset_w: offset_w's value should be 0",
    ]


def test_validate_as_other_flavor():
    result = run("validate", PRUNE, "--flavor", "tf")
    assert result.returncode == 1 and "prune_record is not part of a 'tf' record" in result.stdout


def test_validate_unparsable_file_exit_2(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("record {\n  kee: 1\n}\n")
    result = run("validate", bad)
    assert result.returncode == 2
    assert f"{bad}:2:" in result.stderr and "Traceback" not in result.stderr


def test_convert_record_reports_drops(tmp_path):
    out = tmp_path / "ms.txt"
    result = run("convert-record", PRUNE, "--to", "mindspore", "-o", out)
    assert result.returncode == 0, result.stderr
    assert "dropped: 1 prune_record entries" in result.stdout
    assert load(out, "mindspore").prune_records == []
    out_tf = tmp_path / "tf.txt"
    assert run("convert-record", MOBILENET, "--to", "tf", "-o", out_tf).returncode == 0
    assert out_tf.read_bytes() == MOBILENET.read_bytes()


@pytest.mark.parametrize("command", ["inspect", "validate", "convert-record"])
def test_every_command_has_useful_help(command):
    result = run(command, "--help")
    assert result.returncode == 0
    assert len(result.stdout) > 300 and "usage: amct-bridge " + command in result.stdout


def test_top_level_help_and_module_entry():
    result = run("--help")
    assert result.returncode == 0
    for command in ("inspect", "validate", "convert-record"):
        assert command in result.stdout


@pytest.mark.parametrize("where", ["before", "after", "none"])
def test_verbose_works_before_and_after_the_command(where):
    """`amct-bridge calibrate ... -v` was refused ("unrecognized arguments: -v") though
    `--debug` worked there (found by a new-user trial)."""
    from amct_bridge.cli import build_parser

    argv = {"before": ["-v", "validate", "r.txt"], "after": ["validate", "r.txt", "-v"]}
    args = build_parser().parse_args(argv.get(where, ["validate", "r.txt"]))
    assert args.verbose is (where != "none")
    long = build_parser().parse_args(["export-espdl", "--verbose", "--record", "r"])
    assert long.verbose is True


def test_convert_record_copies_the_sidecar(tmp_path, capsys):
    """The converted record keeps its ranges: `export-espdl` of it failed with "no calibrated
    output range ... pass the sidecar" (found by a new-user trial)."""
    from amct_bridge.cli import main
    from amct_bridge.records.calibration import (
        CalibrationStats,
        LayerStats,
        TensorRange,
        load_stats,
        save_stats,
        sidecar_path,
    )

    src = tmp_path / "r.txt"
    src.write_bytes(MOBILENET.read_bytes())
    stats = CalibrationStats(layers={"relu": LayerStats("ReLU", output=TensorRange(0.0, 6.0))})
    save_stats(stats, sidecar_path(src))
    out = tmp_path / "r_tf.txt"
    assert main(["convert-record", str(src), "--to", "tf", "-o", str(out)]) == 0
    assert f"and {sidecar_path(out)}" in capsys.readouterr().out
    assert sidecar_path(out).read_bytes() == sidecar_path(src).read_bytes()
    assert load_stats(sidecar_path(out)).layers["relu"].output.max == 6.0
    sidecar_path(src).write_text("{not json")  # damaged: refused, nothing (new) written
    other = tmp_path / "other.txt"
    assert main(["convert-record", str(src), "--to", "tf", "-o", str(other)]) == 2
    assert not other.exists() and not sidecar_path(other).exists()
