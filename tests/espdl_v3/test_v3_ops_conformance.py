"""Espressif's own operator test suite (``tests/data/espdl_v3/ops_test``, a subset copied from
esp-dl's ``tools/ops_test`` output, see its README): every file passes ``espdl-run --check``
under the chip's rule (int8 exact, int16 within ±1, float32 within 2e-5), on its own target."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from amct_bridge.cli import main
from amct_bridge.espdl.v3 import EspdlError, espdl_bytes, read_espdl, simulate_espdl
from amct_bridge.espdl.v3.check import check_outputs

SUITE = Path(__file__).parent.parent / "data" / "espdl_v3" / "ops_test"
FILES = sorted(SUITE.rglob("*.espdl"))
SOFTMAX = SUITE / "esp32s3_8" / "Softmax" / "02_softmax_ishape_1_33_dim_-1_s8.espdl"


def _id(path: Path) -> str:
    return "/".join(path.relative_to(SUITE).parts)


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_suite_file_equal_under_the_chips_rule(path):
    model = read_espdl(path)
    result = simulate_espdl(model)  # the target in the file's metadata
    expected = {t.name: t.data for t in model.test_outputs}
    exponents = {t.name: t.exponent for t in model.test_outputs if len(t.exponents) == 1}
    checks = check_outputs(result.outputs, expected, result.exponents, exponents)
    assert checks and all(c.ok for c in checks), [c.first for c in checks if not c.ok]


def test_the_suite_covers_every_target_folder():
    folders = {p.relative_to(SUITE).parts[0] for p in FILES}
    assert {"c_8", "esp32_8", "esp32s3_8", "esp32p4_8", "esp32s31_8"} <= folders


def _with_outputs(path: Path, tmp_path: Path, change) -> Path:
    model = read_espdl(path)
    for tensor in model.test_outputs:
        tensor.data = change(tensor.data)
    out = tmp_path / path.name
    out.write_bytes(espdl_bytes(model))
    return out


def test_float_outputs_are_compared_as_floats(tmp_path, capsys):
    """A Softmax output in [0, 1) cast to integers 'matched' any expected values: probabilities
    replaced by 0.1 must fail, and the real ones pass with every value counted."""
    assert main(["espdl-run", str(SOFTMAX), "--check"]) == 0
    out = capsys.readouterr().out
    assert "output '1' (float32, within 2e-05): " in out and ", 33/33 within 2e-05" in out
    assert out.splitlines()[-1] == "test outputs equal: 1/1"
    wrong = _with_outputs(SOFTMAX, tmp_path, lambda d: np.full_like(d, 0.1))
    assert main(["espdl-run", str(wrong), "--check"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "test outputs equal: 0/1"
    assert "values differ" in out[-1] and "expected 0.1" in out[-1]


def test_float_outputs_within_the_chips_tolerance_pass(tmp_path, capsys):
    """dl::Model::test() accepts float32 within 2e-5 (dl_model_base.cpp): 1e-5 off passes,
    1e-4 off fails."""
    near = _with_outputs(SOFTMAX, tmp_path, lambda d: (d + np.float32(1e-5)).astype(d.dtype))
    assert main(["espdl-run", str(near), "--check"]) == 0
    capsys.readouterr()
    far = _with_outputs(SOFTMAX, tmp_path, lambda d: (d + np.float32(1e-4)).astype(d.dtype))
    assert main(["espdl-run", str(far), "--check"]) == 1


MUL_P4 = SUITE / "esp32p4_8" / "Mul" / "10_mul_ishap_3_4_5_to_2_1_1_1_s8.espdl"


def test_a_file_without_target_names_the_target_that_passes(tmp_path, capsys):
    """esp-ppq 1.3.12 writes no target: an esp32p4 file then runs as esp32s3 (half up) and
    fails; --check says which target's rounding passes and names --target."""
    model = read_espdl(MUL_P4)
    assert model.target == "esp32p4"
    model.metadata.pop("target")
    bare = tmp_path / "bare.espdl"
    bare.write_bytes(espdl_bytes(model))
    assert main(["espdl-run", str(bare), "--check"]) == 1
    out = capsys.readouterr().out
    assert "esp32s3 assumed" in out
    assert out.splitlines()[-1] == (
        "the file names no target and esp32s3 was assumed; it passes as esp32p4: run with "
        "--target esp32p4"
    )
    assert main(["espdl-run", str(bare), "--check", "--target", "esp32s31"]) == 0
    assert "given by the caller esp32s31 (the esp32p4 kernels)" in capsys.readouterr().out


@pytest.mark.parametrize("chip", ["esp32s31", "esp32", "esp32c6"])
def test_every_chip_name_in_the_metadata_is_read(chip, tmp_path):
    model = read_espdl(MUL_P4)
    model.metadata["target"] = chip
    path = tmp_path / f"{chip}.espdl"
    path.write_bytes(espdl_bytes(model))
    result = simulate_espdl(read_espdl(path))
    assert result.target == ("esp32p4" if chip == "esp32s31" else "c")
    assert chip in result.target_reason


def _damaged(tmp_path, change) -> Path:
    model = read_espdl(MUL_P4)
    change(model)
    path = tmp_path / "damaged.espdl"
    path.write_bytes(espdl_bytes(model))
    return path


@pytest.mark.parametrize(
    ("change", "where", "message"),
    [
        (
            lambda m: setattr(m.outputs[0], "exponents", []),
            "node",
            "has no exponent in its value_info",
        ),
        (
            lambda m: setattr(m.outputs[0], "exponents", [1, 2]),
            "node",
            "has 2 exponents in its value_info",
        ),
        (
            lambda m: setattr(m.outputs[0], "exponents", [100]),
            "output",
            "exponent 100, expected -64..64",
        ),
        (lambda m: setattr(m.outputs[0], "exponents", [2**40]), "output", "expected -64..64"),
    ],
)
def test_bad_exponents_are_refused_naming_file_node_and_tensor(tmp_path, change, where, message):
    """An exponent of 100 overflowed shift_round, 2^33 grew a 2 KB file to 1.1 GB (issue 32).
    A count the op cannot use is refused at the node reading it; a value beyond the runtime's
    shifts, before anything runs, at the tensor."""
    path = _damaged(tmp_path, change)
    model = read_espdl(path)
    with pytest.raises(EspdlError) as err:
        simulate_espdl(model)
    text = str(err.value)
    name = model.outputs[0].name
    assert text.startswith(f"{path}: {where} ") and message in text
    assert where == "node" or text.startswith(f"{path}: output {name!r}: ")
