"""``amct-bridge espdl-run``: exit codes and messages on Espressif's fixtures and damaged copies."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from amct_bridge.cli import main
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl

DATA = Path(__file__).parent.parent / "data" / "espdl_v3"
WITH_TESTS = [p for p in sorted(DATA.glob("*.espdl")) if read_espdl(p).test_inputs]
GEMM_S3 = DATA / "test_apps_esp32s3_Gemm_linear_ishap_1_16_kshap_16_16_relu_s8.espdl"
DETECT = DATA / "cat_detect_models_s3_espdet_pico_224_224_cat.espdl"


@pytest.mark.parametrize("path", WITH_TESTS, ids=lambda p: p.name[:40])
def test_check_passes_on_every_fixture(path, capsys):
    assert main(["espdl-run", str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "test outputs equal: 1/1"


def test_check_as_a_user_runs_it():
    result = subprocess.run(
        [sys.executable, "-m", "amct_bridge", "espdl-run", str(GEMM_S3), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "target esp32s3 (the file's metadata_props target)" in result.stdout
    assert result.stdout.splitlines()[-1] == "test outputs equal: 1/1"


def test_check_reports_the_first_difference(capsys):
    assert main(["espdl-run", str(GEMM_S3), "--check", "--target", "c"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "test outputs equal: 0/1"
    assert out[-1].startswith("first difference: output '4': 11 of 16 values differ; first at ")


def _copy(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_damaged_files_exit_2_with_the_cause(tmp_path, capsys):
    good = GEMM_S3.read_bytes()
    cases = {
        "magic.espdl": (
            b"EDL9" + good[4:],
            "bad magic b'EDL9', expected b'EDL2' (or b'EDL1', b'PDL2')",
        ),
        "aes.espdl": (
            good[:4] + struct.pack("<I", 1) + good[8:],
            "mode 1 is encrypted (AES-128-CTR), cannot be read without the key",
        ),
        "cut.espdl": (good[:500], "truncated: header says 1792 bytes of model, only 484 follow"),
    }
    for name, (data, message) in cases.items():
        path = _copy(tmp_path, name, data)
        assert main(["espdl-run", path, "--check"]) == 2
        err = capsys.readouterr().err
        assert err == f"amct-bridge espdl-run: error: {path}: {message}\n"


def test_check_needs_test_values(capsys):
    assert main(["espdl-run", str(DETECT), "--check"]) == 2
    assert "has no test inputs/outputs to --check against" in capsys.readouterr().err


def test_input_and_output_npz(tmp_path, capsys):
    model = read_espdl(GEMM_S3)
    x = model.test_inputs[0].data
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    assert (
        main(["espdl-run", str(GEMM_S3), "--input", str(tmp_path / "x.npy"), "-o", str(out)]) == 0
    )
    assert f"wrote {out}" in capsys.readouterr().out
    saved = np.load(out)
    assert np.array_equal(saved["4"], model.test_outputs[0].data) and int(saved["4.exponent"]) == -8
    # floats are quantized at the input exponent (-6): x * 2^-6 gives back the same integers
    np.save(tmp_path / "xf.npy", x.astype(np.float32) / 64)
    assert (
        main(
            [
                "espdl-run",
                str(GEMM_S3),
                "--input",
                f"onnx::Gemm_0={tmp_path / 'xf.npy'}",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert np.array_equal(np.load(out)["4"], model.test_outputs[0].data)


def test_detection_model_runs_on_random_input(tmp_path, capsys):
    model = read_espdl(DETECT)
    x = np.random.default_rng(0).integers(-128, 128, model.inputs[0].shape).astype(np.int8)
    np.save(tmp_path / "img.npy", x)
    out = tmp_path / "det.npz"
    assert (
        main(["espdl-run", str(DETECT), "--input", str(tmp_path / "img.npy"), "-o", str(out)]) == 0
    )
    saved = np.load(out)
    direct = simulate_espdl(model, x)
    for info in model.outputs:
        assert list(saved[info.name].shape) == info.shape
        assert np.array_equal(saved[info.name], direct.outputs[info.name])


def test_input_errors(tmp_path, capsys):
    np.save(tmp_path / "big.npy", np.full((1, 16), 300))
    assert main(["espdl-run", str(GEMM_S3), "--input", str(tmp_path / "big.npy")]) == 2
    assert (
        "input 'onnx::Gemm_0': input integers 300..300 do not fit int8" in capsys.readouterr().err
    )
    np.save(tmp_path / "a.npy", np.zeros((1, 16), np.int8))
    args = [
        "espdl-run",
        str(GEMM_S3),
        "--input",
        str(tmp_path / "a.npy"),
        "--input",
        str(tmp_path / "a.npy"),
    ]
    assert main(args) == 2
    assert "2 input arrays for 1 free inputs" in capsys.readouterr().err
    assert main(["espdl-run", str(GEMM_S3), "--check", "--input", str(tmp_path / "a.npy")]) == 2
    assert "drop --input" in capsys.readouterr().err
