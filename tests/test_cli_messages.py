"""CLI messages and refusals from a new user's run (issue 14, bugs 3-6), on real files."""

import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
from calib_models import images, sequential_model

from amct_bridge.cli import main
from amct_bridge.records import load


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A one-input model, a two-input model and calibration data for it."""
    d = tmp_path_factory.mktemp("cli")
    sequential_model().save(d / "seq.keras")
    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    y = keras.layers.Dense(2, name="fc")(keras.layers.Concatenate(name="cat")([a, b]))
    keras.Model([a, b], y).save(d / "two.keras")
    np.save(d / "x.npy", images(16))
    return d


def calibrate(files, data, out, *extra):
    args = ["calibrate", str(files / "seq.keras"), "--data", str(data), "-o", str(out), "-q"]
    return main(args + list(extra))


def test_npz_with_different_sample_counts_names_file_arrays_and_counts(files, tmp_path, capsys):
    np.savez(tmp_path / "bad.npz", a=np.zeros((10, 4), "float32"), b=np.zeros((7, 3), "float32"))
    args = ["calibrate", str(files / "two.keras"), "--data", str(tmp_path / "bad.npz")]
    assert main(args + ["-o", str(tmp_path / "r.txt")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "cardinality" not in err
    assert f"{tmp_path / 'bad.npz'}: the arrays have different sample counts" in err
    assert "'a': 10, 'b': 7" in err
    assert not (tmp_path / "r.txt").exists()


@pytest.mark.parametrize("option", ["--batch-size", "--batch-num"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_batch_size_and_num_below_one_are_refused(files, tmp_path, capsys, option, value):
    with pytest.raises(SystemExit) as exit_:
        calibrate(files, files / "x.npy", tmp_path / "r.txt", option, value)
    assert exit_.value.code == 2
    assert f"argument {option}: must be a positive integer (>= 1), got {value}" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "r.txt").exists()


def test_int64_data_is_cast_to_float32_with_a_note(files, tmp_path, capsys):
    """The record equals the one of the same values given as float32; stderr says so."""
    values = np.round(images(16) * 20)
    np.save(tmp_path / "i.npy", values.astype("int64"))
    np.save(tmp_path / "f.npy", values.astype("float32"))
    assert calibrate(files, tmp_path / "i.npy", tmp_path / "ri.txt") == 0
    err = capsys.readouterr().err
    assert f"note: {tmp_path / 'i.npy'}: the array is int64; cast to float32" in err
    assert "rounded" not in err  # small integers are exact in float32
    assert calibrate(files, tmp_path / "f.npy", tmp_path / "rf.txt") == 0
    assert "note" not in capsys.readouterr().err
    assert load(tmp_path / "ri.txt") == load(tmp_path / "rf.txt")


def test_int64_values_beyond_float32_say_they_were_rounded(files, tmp_path, capsys):
    odd = np.random.default_rng(0).integers(2**23, 2**24, (4, 12, 12, 3)) * 2 + 1  # > 2**24
    np.save(tmp_path / "big.npy", odd)
    big = calibrate(files, tmp_path / "big.npy", tmp_path / "r.txt", "--algorithm", "minmax")
    assert big == 0
    assert "not exact in float: they were rounded" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, looks",
    [
        (b"hello, not a model\n", "a text file"),
        (b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'", r"a NumPy \.npy file"),
    ],
)
def test_keras_path_that_is_not_an_archive_is_not_file_not_found(
    files, tmp_path, capsys, content, looks
):
    (tmp_path / "m.keras").write_bytes(content)
    args = ["calibrate", str(tmp_path / "m.keras"), "--data", str(files / "x.npy"), "-o", "r.txt"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "not found" not in err.lower()
    assert re.search(f"m.keras: not a Keras model file: it looks like {looks}", err), err


def test_writer_and_inspect_use_the_same_flavor_words(files, tmp_path, capsys):
    """calibrate --flavor inner writes only convert_model's fields; both say so alike, leading
    with the flavor it was written as (issue 33 §8; the sidecar names it for inspect)."""
    out = tmp_path / "r.txt"
    assert calibrate(files, files / "x.npy", out, "--flavor", "inner") == 0
    wrote = capsys.readouterr().out
    assert main(["inspect", str(out)]) == 0
    inspected = capsys.readouterr().out.splitlines()[0]
    phrase = "an 'inner' record (also valid as 'tf')"
    assert f"wrote {out}: {phrase}, 3 layers" in wrote
    assert inspected == f"{out}: {phrase}, 3 layers"
    assert "('inner'" not in wrote


# --- TensorFlow's start-up noise -----------------------------------------------------------------
NOISE = ("cudart_stub", "cuInit", "absl::InitializeLog", "cpu_feature_guard", "oneDNN")


@pytest.mark.parametrize("level", [None, "3"])
def test_keras_commands_print_no_tensorflow_startup_lines(files, tmp_path, level):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    args = ["calibrate", str(files / "seq.keras"), "--data", str(files / "x.npy")]
    result = subprocess.run(
        [sys.executable, "-m", "amct_bridge", *args, "-o", str(tmp_path / "r.txt"), "-q"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if any(n in line for n in NOISE)] == []
    assert "wrote" in result.stdout


def test_level_zero_keeps_tensorflow_logs(files):
    """TF_CPP_MIN_LOG_LEVEL=0 asks for every line: nothing is filtered."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}
    code = "from amct_bridge.commands.common import quiet_tensorflow; quiet_tensorflow()"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "absl::InitializeLog" in result.stderr


def test_act_type_in_lower_case_is_accepted(files, tmp_path):
    out = tmp_path / "r.txt"
    assert calibrate(files, files / "x.npy", out, "--act-type", "int16") == 0
    assert {f.act_type for f in load(out).layers.values()} == {"INT16"}


def test_num_of_bins_without_hfmg_says_so(files, tmp_path, capsys):
    """It listed the IFMR observer's internal option names before."""
    out = tmp_path / "r.txt"
    assert calibrate(files, files / "x.npy", out, "--num-of-bins", "1024") == 2
    err = capsys.readouterr().err
    assert (
        "--num-of-bins applies to --algorithm hfmg (AMCT's hfmg_quantize.num_of_bins), not ifmr"
        in err
    )
    assert not out.exists()
    assert (
        calibrate(files, files / "x.npy", out, "--num-of-bins", "1024", "--algorithm", "hfmg") == 0
    )
