"""The bad-input matrix of docs/errors.md (issue 15): each bad input gives the documented text,
exit code (CLI, run in-process through ``amct_bridge.cli.main``) and exception type (API); no
traceback, ever, unless ``--debug``. One subprocess run checks the guarantee end to end.

Each ``CASES`` entry is one row of the table; its id is the test id the row names.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import mindspore as ms
import nets
import numpy as np
import pytest

from amct_bridge.cli import main
from amct_bridge.commands.common import load_keras_model, load_npy
from amct_bridge.commands.mindspore_net import load_mindspore_net
from amct_bridge.config import load_simple_config
from amct_bridge.errors import AmctBridgeError, CalibrationError, ExportError, RecordError
from amct_bridge.keras import calibrate, export_espdl
from amct_bridge.records import load, validate

ROOT = Path(__file__).resolve().parent
DOC = ROOT.parent / "docs" / "errors.md"
PRUNE = ROOT / "data" / "amct" / "prune_record_single_conv.txt"  # AMCT's sample (README there)


def _net(channels: int = 4, act: str = "relu") -> keras.Model:
    """Input 8x8x3 'img' -> Conv2D 'c1' -> activation 'act' -> GAP -> Dense 'fc'."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 3), name="img")
    y = keras.layers.Conv2D(channels, 3, padding="same", name="c1")(inp)
    y = keras.layers.Activation(act, name="act")(y)
    y = keras.layers.GlobalAveragePooling2D(name="gap")(y)
    return keras.Model(inp, keras.layers.Dense(3, name="fc")(y))


def _record(key: str, value: str) -> str:
    return f'record {{\n  key: "{key}"\n  value {{\n{value}  }}\n}}\n'


@pytest.fixture(scope="module")
def d(tmp_path_factory) -> Path:
    """Every bad (and good) input file of the matrix, in one directory."""
    d = tmp_path_factory.mktemp("matrix")
    x = np.random.default_rng(0).random((4, 8, 8, 3), dtype=np.float32)
    np.save(d / "x.npy", x)
    for name, ch, act in (("m", 4, "relu"), ("m6", 6, "relu"), ("tanh", 4, "tanh")):
        _net(ch, act).save(d / f"{name}.keras")
    calibrate(load_keras_model(str(d / "m.keras")), x, d / "rec.txt", algorithm="minmax")
    good = (d / "rec.txt").read_text()
    (d / "nonfinite_rec.txt").write_text(
        re.sub(r"scale_w: [0-9.e-]+", "scale_w: inf", good, count=1)
    )
    (d / "renamed_rec.txt").write_text(good.replace('key: "c1"', 'key: "c_1"'))
    (d / "other_rec.txt").write_text(good.replace('"c1"', '"conv2d_7"').replace('"fc"', '"dense"'))
    (d / "trunc.txt").write_text('record {\n  key: "c"\n  value {\n    scale_d: 0.5\n')
    (d / "unknown.txt").write_text(_record("c", "    scal_d: 0.5\n"))
    (d / "dup.txt").write_text(_record("c", "    scale_d: 0.5\n") * 2)
    (d / "offset.txt").write_text(_record("c", "    scale_d: 0.5\n    offset_d: 200\n"))
    (d / "nan.txt").write_text(_record("c", "    scale_d: nan\n    offset_d: 0\n"))
    (d / "unknown.cfg").write_text("batch_num: 1\nfoo: 2\n")
    (d / "inf.cfg").write_text(
        "batch_num: 1\ncommon_config {\n  ifmr_quantize {\n    search_range_end: inf\n  }\n}\n"
    )
    np.save(d / "empty.npy", x[:0])
    for name, value in (("nan", np.nan), ("inf", np.inf)):
        bad = x.copy()
        bad[1, 2, 2, 0], bad[0, 0, 0, 0] = value, -1.0  # min -1: a known number in the message
        np.save(d / f"{name}.npy", bad)
    np.save(d / "shape.npy", x[:, :6])
    np.save(d / "strings.npy", np.full(x.shape, "a"))
    np.save(d / "complex.npy", x.astype(np.complex64))
    np.save(d / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (d / "pickle.npy").write_bytes(pickle.dumps({"a": 1}, protocol=4))
    (d / "text.npy").write_text("1, 2, 3\n")
    (d / "cut.npy").write_bytes((d / "x.npy").read_bytes()[:200])  # 128-byte header + 18 floats
    whole = (d / "m.keras").read_bytes()
    (d / "trunc.keras").write_bytes(whole[: len(whole) // 2])
    (d / "set").mkdir()
    tutorial = ROOT / "data" / "espdl_v1_tutorial"  # ESP-DL's tutorial set (README there)
    entry = json.loads((tutorial / "config.json").read_text())["l1"]
    (d / "set" / "config.json").write_text(json.dumps({"conv.1": entry}))
    for part in ("filter", "bias"):
        shutil.copy(tutorial / f"l1_{part}.npy", d / "set" / f"conv.1_{part}.npy")
    (d / "a_dir").mkdir()
    ms.save_checkpoint(nets.group_conv_net(), str(d / "other.ckpt"))
    ms.save_checkpoint(nets.depthwise_net(), str(d / "good.ckpt"))
    (d / "trunc.ckpt").write_bytes((d / "good.ckpt").read_bytes()[:100])
    (d / "raises.py").write_text("def net():\n    return 1 / 0\n")
    (d / "ctrl_c.py").write_text("raise KeyboardInterrupt\n")
    return d


def _calibrate(*extra: str, data: str = "x.npy", model: str = "m.keras") -> list[str]:
    return ["calibrate", f"{{d}}/{model}", "--data", f"{{d}}/{data}", "-o", "{d}/out.txt", *extra]


def _export(record: str, model: str = "m.keras", out: str = "{d}/espdl") -> list[str]:
    return ["export-espdl", "--record", f"{{d}}/{record}", "--model", f"{{d}}/{model}"] + [
        "--out",
        out,
        "--stats",
        "{d}/rec.txt.calib.json",
    ]


_MS = ["prune-groups", "--mindspore", f"{nets.__file__}:depthwise_net", "--input-shape", "1,3,8,8"]
_PARSE = "the record cannot be parsed as an 'inner' record (AMCTTensorflow.InnerScaleOffsetRecord)"
_CUT = (
    "; the error is at the end of the file: it looks truncated (cut short while being written "
    "or copied?)"
)

#: id -> (argv with {d} for the directory, exit code, the exact message, stream).
#: Exit 2 messages are printed as "amct-bridge COMMAND: error: MESSAGE" on stderr.
CASES = {
    # Records and configs
    "malformed-text": (
        ["inspect", "{d}/trunc.txt"],
        2,
        "{d}/trunc.txt:4:14: Expected \"}\". (text: 'scale_d: 0.5'); " + _PARSE + _CUT,
        "err",
    ),
    "unknown-field": (
        ["validate", "{d}/unknown.txt"],
        2,
        '{d}/unknown.txt:4:5: Message type "AMCTTensorflow.InnerSingleLayerRecord" has no field '
        "named \"scal_d\". (text: 'scal_d: 0.5'); " + _PARSE,
        "err",
    ),
    "wrong-flavor": (
        ["validate", str(PRUNE), "--flavor", "tf"],
        1,
        f"{PRUNE}: prune_record is not part of a 'tf' record (AMCT's parser would fail the file)",
        "out",
    ),
    "wrong-flavor-parse": (
        ["inspect", str(PRUNE), "--flavor", "mindspore"],
        2,
        f'{PRUNE}:1:1: Message type "ScaleOffsetRecord" has no field named "prune_record". '
        "(text: 'prune_record {'); the record cannot be parsed as a 'mindspore' record "
        "(ScaleOffsetRecord)",
        "err",
    ),
    "duplicate-key": (
        ["inspect", "{d}/dup.txt"],
        2,
        "{d}/dup.txt: layer 'c' is recorded twice (lines 2 and 8); AMCT would silently keep the "
        "last one. Remove one, or load with on_duplicate='keep_last'.",
        "err",
    ),
    "offset-out-of-range": (
        ["validate", "{d}/offset.txt"],
        1,
        "{d}/offset.txt:5: layer 'c': offset_d: offset_d's value should be in [-128, 127] "
        "(INT8), got 200",
        "out",
    ),
    "non-finite-scale": (
        ["validate", "{d}/nan.txt"],
        1,
        "{d}/nan.txt:4: layer 'c': scale_d: scale_d's value should be in the positive range of "
        "float32, got nan",
        "out",
    ),
    "non-finite-scale-export": (
        _export("nonfinite_rec.txt"),
        2,
        "{d}/nonfinite_rec.txt:6: layer 'c1': scale_w inf: scales must be finite and > 0 "
        "(amct-bridge validate lists every problem)",
        "err",
    ),
    "config-unknown-field": (
        _calibrate("--config", "{d}/unknown.cfg"),
        2,
        '{d}/unknown.cfg:2:1 : Message type "AMCTBridgeConfig.AMCTConfig" has no field named '
        '"foo".: not an AMCT quantization config (see proto/amct_simple_config.proto)',
        "err",
    ),
    "config-non-finite": (
        _calibrate("--config", "{d}/inf.cfg"),
        2,
        "{d}/inf.cfg: common_config: need 0 < search_range_start < search_range_end and "
        "search_step > 0, got 0.7, inf, 0.01",
        "err",
    ),
    # Calibration inputs
    "empty-calibration": (
        _calibrate(data="empty.npy"),
        2,
        "{d}/empty.npy: holds 0 samples; calibration needs at least one",
        "err",
    ),
    "nan-activations": (
        _calibrate("--algorithm", "minmax", data="nan.npy"),
        2,
        "layer 'c1': input of batch 0 contains NaN or Inf (min nan, max nan); no record written",
        "err",
    ),
    "inf-activations": (
        _calibrate("--algorithm", "minmax", data="inf.npy"),
        2,
        "layer 'c1': input of batch 0 contains NaN or Inf (min -1.0, max inf); no record written",
        "err",
    ),
    "wrong-shape": (
        _calibrate(data="shape.npy"),
        2,
        "{d}/shape.npy: array of shape (4, 6, 8, 3) does not fit model input 'img' of shape "
        "(N, 8, 8, 3)",
        "err",
    ),
    "wrong-dtype": (
        _calibrate(data="strings.npy"),
        2,
        "{d}/strings.npy: the array is <U1; expected numbers (float, integer or bool) for the "
        "model input 'img' (float32)",
        "err",
    ),
    "complex-dtype": (
        _calibrate(data="complex.npy"),
        2,
        "{d}/complex.npy: the array is complex64; expected numbers (float, integer or bool) for "
        "the model input 'img' (float32)",
        "err",
    ),
    # Names
    "unknown-layer-name": (
        _calibrate("--skip-layers", "fc1"),
        2,
        "skip_layers: no layer named 'fc1' in the model; did you mean 'fc', 'c1'?",
        "err",
    ),
    "record-key-did-you-mean": (
        _export("renamed_rec.txt"),
        2,
        "record layers not found in the model (is this the model the record was made for?): "
        "'c_1' (did you mean 'c1'?)",
        "err",
    ),
    "coefficient-name-not-identifier": (
        ["espdl-convert", "-t", "esp32", "-i", "{d}/set", "-n", "../evil", "-o", "{d}/cpp"],
        2,
        "coefficient name (-n) '../evil' is not a C identifier ([A-Za-z_][A-Za-z0-9_]*, no C++ "
        "keyword): it becomes part of C++ names and file names",
        "err",
    ),
    "set-layer-name-not-identifier": (
        ["espdl-convert", "-t", "esp32", "-i", "{d}/set", "-n", "m", "-o", "{d}/cpp"],
        2,
        "layer name 'conv.1' is not a C identifier ([A-Za-z_][A-Za-z0-9_]*, no C++ keyword): "
        "it becomes part of C++ names and file names",
        "err",
    ),
    # Mismatches
    "record-of-another-model": (
        _export("other_rec.txt"),
        2,
        "record layers not found in the model (is this the model the record was made for?): "
        "'conv2d_7', 'dense'",
        "err",
    ),
    "channel-mismatch": (  # the sidecar beside the record describes the model (issue 33 §9)
        _export("rec.txt", model="m6.keras"),
        2,
        "{d}/rec.txt.calib.json: calibration sidecar: written for another model: layer 'c1' "
        "(Conv2D): kernel (3, 3, 3, 6) here, 6 output channels and 162 weights; (3, 3, 3, 4) "
        "HWIO when calibrated, 4 output channels and 108 weights; layer 'fc' (Dense): kernel "
        "(6, 3) here, 3 output channels and 18 weights; (4, 3) IO when calibrated, 3 output "
        "channels and 12 weights; calibrate this model (its record and sidecar), or pass the "
        "sidecar its calibration wrote (<record>.calib.json, or --stats / stats=)",
        "err",
    ),
    "espdl-cannot-run": (
        _export("rec.txt", model="tanh.keras"),
        2,
        "ESP-DL v1 cannot take these layers:\n"
        "  layer 'act' (Activation): activation 'tanh': ESP-DL v1 has no such layer\n"
        "to export the rest, pass --skip-unsupported (Python: skip_unsupported=True): the "
        "layers above are left out (listed in export.json) for the host to compute; or export "
        "ESP-DL v3 instead (--format espdl), whose runtime has more layers",
        "err",
    ),
    # Output
    "unwritable-output": (
        _calibrate()[:-1] + ["{d}/x.npy/r.txt"],
        2,
        "cannot write output: {d}/x.npy/r.txt: directory does not exist",
        "err",
    ),
    "output-is-a-directory": (
        ["convert-record", "{d}/rec.txt", "--to", "tf", "-o", "{d}/a_dir"],
        2,
        "{d}/a_dir: is a directory, expected a file path",
        "err",
    ),
    "unwritable-export-dir": (
        _export("rec.txt", out="{d}/x.npy/espdl"),
        2,
        "{d}/x.npy: directory does not exist",
        "err",
    ),
    "existing-output-dir": (
        _export("rec.txt", out="{d}/set"),
        2,
        "{d}/set: directory exists and is not empty; to replace it pass overwrite=True (CLI: "
        "--overwrite)",
        "err",
    ),
    # Model files
    "truncated-keras": (
        _calibrate(model="trunc.keras"),
        2,
        "{d}/trunc.keras: truncated or damaged .keras file: it starts as a zip archive but its "
        "table of contents (at the end) is missing; save the model again",
        "err",
    ),
    "pickled-npy": (
        _calibrate(data="objects.npy"),
        2,
        "{d}/objects.npy: holds pickled Python objects (an object array), which amct-bridge "
        "never loads (unpickling can run code); save calibration data as a numeric array",
        "err",
    ),
    "model-of-another-format": (
        ["prune-groups", "{d}/rec.txt"],
        2,
        "{d}/rec.txt: not a Keras model file: expected a .keras or .h5 file, this one looks like "
        "a text file",
        "err",
    ),
    "data-is-a-directory": (
        _calibrate(data="a_dir"),
        2,
        "{d}/a_dir: cannot read calibration data: is a directory",
        "err",
    ),
    "pickle-as-npy": (
        _calibrate(data="pickle.npy"),
        2,
        "{d}/pickle.npy: cannot read calibration data: not a .npy/.npz file: it looks like a "
        "Python pickle (never loaded: unpickling can run code)",
        "err",
    ),
    "not-npy": (
        _calibrate(data="text.npy"),
        2,
        "{d}/text.npy: cannot read calibration data: not a .npy/.npz file: it looks like a "
        "text file",
        "err",
    ),
    "truncated-npy": (
        _calibrate(data="cut.npy"),
        2,
        "{d}/cut.npy: cannot read calibration data: not a valid .npy/.npz file (cannot reshape "
        "array of size 18 into shape (4,8,8,3))",
        "err",
    ),
    "mindspore-ckpt-mismatch": (
        _MS + ["--ckpt", "{d}/other.ckpt"],
        2,
        # unexpected names and shape conflicts first: they tell which network it is of
        "{d}/other.ckpt: checkpoint does not fit SequentialCell (7 parameter(s)): 2.weight is "
        "not a parameter of the network; 1.weight (16, 2, 3, 3) in the checkpoint, (16, 1, 3, 3) "
        "in the network; 2.moving_mean missing from the checkpoint; 2.moving_variance missing "
        "from the checkpoint; 2.gamma missing from the checkpoint; 2.beta missing from the "
        "checkpoint; 4.weight missing from the checkpoint",
        "err",
    ),
    "mindspore-ckpt-damaged": (
        _MS + ["--ckpt", "{d}/trunc.ckpt"],
        2,
        "{d}/trunc.ckpt: cannot read checkpoint: Failed to read the checkpoint file "
        "{d}/trunc.ckpt. The file may be corrupted, and the content cannot be parsed.",
        "err",
    ),
    "mindspore-factory-raises": (
        ["prune-groups", "--mindspore", "{d}/raises.py:net", "--input-shape", "1,3,8,8"],
        2,
        "--mindspore {d}/raises.py:net: net() raised ZeroDivisionError: division by zero",
        "err",
    ),
}


def _fill(text: str, d: Path) -> str:
    return text.replace("{d}", str(d))


@pytest.mark.parametrize("case", list(CASES))
def test_cli(case, d, capsys):
    argv, code, text, stream = CASES[case]
    argv = [_fill(a, d) for a in argv]
    text = _fill(text, d)
    assert main(argv) == code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if stream == "out":
        assert text in out.splitlines()
    else:
        assert f"amct-bridge {argv[0]}: error: {text}\n" in err, err
    assert not (d / "out.txt").exists() and not (d / "espdl").exists()  # nothing half-written


#: id -> (call(d), exception type, CASES id whose message the exception carries).
API = {
    "malformed-text": (lambda d: load(d / "trunc.txt"), RecordError),
    "unknown-field": (lambda d: load(d / "unknown.txt"), RecordError),
    "wrong-flavor-parse": (lambda d: load(PRUNE, "mindspore"), RecordError),
    "duplicate-key": (lambda d: load(d / "dup.txt"), RecordError),
    "config-unknown-field": (lambda d: load_simple_config(d / "unknown.cfg"), CalibrationError),
    "non-finite-scale-export": (
        lambda d: export_espdl(
            keras.models.load_model(d / "m.keras"),
            d / "nonfinite_rec.txt",
            d / "espdl",
            stats=d / "rec.txt.calib.json",
        ),
        ExportError,
    ),
    "channel-mismatch": (
        lambda d: export_espdl(
            keras.models.load_model(d / "m6.keras"),
            d / "rec.txt",
            None,
            stats=d / "rec.txt.calib.json",
        ),
        ExportError,
    ),
    "espdl-cannot-run": (
        lambda d: export_espdl(
            keras.models.load_model(d / "tanh.keras"),
            d / "rec.txt",
            None,
            stats=d / "rec.txt.calib.json",
        ),
        ExportError,
    ),
    "existing-output-dir": (
        lambda d: export_espdl(
            keras.models.load_model(d / "m.keras"),
            d / "rec.txt",
            d / "set",
            stats=d / "rec.txt.calib.json",
        ),
        ExportError,
    ),
    "pickled-npy": (
        lambda d: load_npy(str(d / "objects.npy"), "calibration data"),
        AmctBridgeError,
    ),
    "mindspore-ckpt-mismatch": (
        lambda d: load_mindspore_net(f"{nets.__file__}:depthwise_net", str(d / "other.ckpt")),
        AmctBridgeError,
    ),
}


@pytest.mark.parametrize("case", list(API))
def test_api(case, d):
    """The API raises the documented type with the message the CLI prints."""
    call, exc = API[case]
    with pytest.raises(exc) as err:
        call(d)
    assert _fill(CASES[case][2], d) == str(err.value)


def test_validate_api_lists_problems_without_raising(d):
    for case, name in (("offset-out-of-range", "offset.txt"), ("non-finite-scale", "nan.txt")):
        problems = [str(p) for p in validate(load(d / name))]
        assert _fill(CASES[case][2], d) in problems


def test_simulate_refuses_non_finite_scales(d, capsys):
    """simulate() (and the report built on it) refuse a scale_w of inf, naming the layer."""
    from amct_bridge.keras import simulate

    text = "record key 'c1' (Conv2D): every scale_w must be finite and > 0"
    with pytest.raises(RecordError) as err:
        simulate(keras.models.load_model(d / "m.keras"), d / "nonfinite_rec.txt")
    assert str(err.value) == text
    argv = ["report", "--record", f"{d}/nonfinite_rec.txt", "--model", f"{d}/m.keras"]
    assert main(argv + ["--data", f"{d}/x.npy"]) == 2
    assert capsys.readouterr().err == f"amct-bridge report: error: {text}\n"


# --- no traceback: internal errors, --debug, Ctrl-C ---------------------------------------------
@pytest.fixture(scope="module")
def unrunnable(tmp_path_factory) -> Path:
    """A model Keras saves but cannot run (a layer name TF refuses as a scope): an error we do
    not anticipate, so it stands for any bug."""
    d = tmp_path_factory.mktemp("bug")
    inp = keras.Input((4,), name="v")
    keras.Model(inp, keras.layers.Dense(2, name="a b")(inp)).save(d / "m.keras")
    np.save(d / "x.npy", np.zeros((2, 4), np.float32))
    return d


def test_internal_error_is_one_line_and_debug_adds_the_traceback(unrunnable, capsys):
    argv = ["calibrate", str(unrunnable / "m.keras"), "--data", str(unrunnable / "x.npy")]
    argv += ["-o", str(unrunnable / "r.txt"), "-q"]
    assert main(argv) == 70
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert re.fullmatch(
        r"amct-bridge calibrate: internal error: ValueError: .*'a b' is not a valid scope name.* "
        r"\(rerun with --debug for the traceback\)\n",
        err,
    ), err
    assert main(argv + ["--debug"]) == 70
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.splitlines()[-1].startswith("amct-bridge calibrate: internal error: ValueError:")
    assert "rerun with --debug" not in err
    assert main(["--debug", "inspect", str(unrunnable / "missing.txt")]) == 2  # global flag too
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith("amct-bridge inspect: error:")
    assert not (unrunnable / "r.txt").exists()


def test_ctrl_c_exits_130_without_traceback(d, capsys):
    argv = ["prune-groups", "--mindspore", f"{d}/ctrl_c.py:net", "--input-shape", "1,3,8,8"]
    assert main(argv) == 130
    assert capsys.readouterr().err == "amct-bridge prune-groups: interrupted\n"
    assert main(argv + ["--debug"]) == 130
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyboardInterrupt" in err


def test_no_traceback_from_the_real_command(unrunnable, d):
    """As a user runs it: a bug and two bad inputs, three processes, not one traceback."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    runs = [
        ["calibrate", f"{unrunnable}/m.keras", "--data", f"{unrunnable}/x.npy", "-o", "r.txt"],
        ["calibrate", f"{d}/m.keras", "--data", f"{d}/objects.npy", "-o", f"{d}/out.txt"],
        ["inspect", f"{d}/dup.txt"],
    ]
    codes = []
    for argv in runs:
        done = subprocess.run(
            [sys.executable, "-m", "amct_bridge", *argv],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=unrunnable,
        )
        assert "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith(f"amct-bridge {argv[0]}: ")
        codes.append(done.returncode)
    assert codes == [70, 2, 2]


# --- docs/errors.md names tests that exist ------------------------------------------------------
def test_every_test_the_doc_names_exists():
    """Each `tests/...py::name[param]` in docs/errors.md is a test function (and parameter id)."""
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)(?:\[([\w.-]+)\])?`", DOC.read_text())
    assert len(named) > 40, "the matrix lost its rows"
    missing = []
    for path, func, param in named:
        source = (ROOT.parent / path).read_text()
        if not re.search(rf"^def {func}\(", source, re.M):
            missing.append(f"{path}::{func}")
        elif param and path.endswith("test_errors_matrix.py"):
            table = API if func == "test_api" else CASES
            if param not in table:
                missing.append(f"{path}::{func}[{param}]")
    assert missing == []


def test_every_case_is_in_the_doc():
    text = DOC.read_text()
    rows = [c for c in CASES if f"test_errors_matrix.py::test_cli[{c}]" not in text]
    assert rows == []
