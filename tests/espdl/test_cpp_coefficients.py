"""NAME.cpp / NAME.hpp equal the real convert.py's text byte for byte (every golden text)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from amct_bridge.cli import main
from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1.cpp_coefficients import coefficient_files, convert_set
from amct_bridge.espdl.v1.preview import load_set, preview_set

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN = DATA / "espdl_v1_golden"
TEXT = GOLDEN / "text"
SETS = {
    "s8_set": (GOLDEN / "s8_set", "s8_coefficient"),
    "tutorial": (DATA / "espdl_v1_tutorial", "mnist_coefficient"),
}
RUNS = sorted(p.name for p in TEXT.iterdir() if p.is_dir())


def _run(run: str) -> tuple[Path, str, str, bool, Path]:
    set_name, chip, q = run.split(".")
    src, name = SETS[set_name]
    return src, name, chip, q == "q1", TEXT / run


def test_every_golden_text_is_covered():
    assert RUNS == [
        "s8_set.esp32.q0",
        "s8_set.esp32.q1",
        "s8_set.esp32s3.q0",
        "s8_set.esp32s3.q1",
        "tutorial.esp32.q0",
        "tutorial.esp32s3.q0",
    ]


@pytest.mark.parametrize("run", RUNS)
def test_convert_set_writes_the_tools_bytes(run, tmp_path):
    src, name, chip, per_channel, golden = _run(run)
    written = convert_set(src, name, tmp_path, target=chip, per_channel=per_channel)
    assert sorted(p.name for p in written) == [f"{name}.cpp", f"{name}.hpp"]
    for suffix in ("cpp", "hpp"):
        assert (tmp_path / f"{name}.{suffix}").read_bytes() == (
            golden / f"{name}.{suffix}"
        ).read_bytes()


@pytest.mark.parametrize("run", RUNS)
def test_cli_espdl_convert_mirrors_convert_py_flags(run, tmp_path, capsys):
    src, name, chip, per_channel, golden = _run(run)
    # the tool's own spelling: -t -i -n -o -q (and -j for the config name)
    shutil.copytree(src, tmp_path / "in")
    (tmp_path / "in" / "config.json").rename(tmp_path / "in" / "my.json")
    argv = ["espdl-convert", "-t", chip, "-i", str(tmp_path / "in"), "-j", "my.json"]
    argv += ["-n", name, "-o", str(tmp_path / "out"), "-q", "1" if per_channel else "0"]
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    for suffix in ("cpp", "hpp"):
        assert (tmp_path / "out" / f"{name}.{suffix}").read_bytes() == (
            golden / f"{name}.{suffix}"
        ).read_bytes()


_ARRAY = re.compile(r"(?:int8_t|int16_t) (\w+)\[\] = \{([^}]*)\}", re.S)
_CONST = re.compile(r"const static (Filter|Bias|Activation)<(\w+)> (\w+)\((.*)\);")


def _parse_cpp(text: str) -> dict:
    """An independent reading of a .cpp: arrays (values) and constants (kind, ctype, args)."""
    arrays = {m[1]: [int(v) for v in m[2].replace(",", " ").split()] for m in _ARRAY.finditer(text)}
    constants = {m[3]: {"kind": m[1], "ctype": m[2], "args": m[4]} for m in _CONST.finditer(text)}
    return {"arrays": arrays, "constants": constants}


@pytest.mark.parametrize("run", RUNS)
def test_golden_text_holds_the_golden_integers(run):
    # The text fixture and the parsed JSON fixture agree: every integer, exponent, shape.
    _, name, _, _, golden = _run(run)
    parsed = _parse_cpp((golden / f"{name}.cpp").read_text())
    expected = json.loads((GOLDEN / f"{run}.json").read_text())
    assert parsed["arrays"] == {k: v["values"] for k, v in expected["arrays"].items()}
    assert parsed["constants"] == expected["constants"]
    # every constant has a getter declared in the header, with the same type
    hpp = (golden / f"{name}.hpp").read_text()
    decls = re.findall(r"const dl::(\w+)<(\w+)> \*get_(\w+)\(\);", hpp)
    assert decls == [(c["kind"], c["ctype"], n) for n, c in expected["constants"].items()]


@pytest.mark.parametrize("chip", ["esp32s2", "esp32c3"])
@pytest.mark.parametrize("set_name", ["s8_set", "tutorial"])
def test_other_c_path_chips_write_the_esp32_text(chip, set_name, tmp_path):
    # esp32 / esp32s2 / esp32c3 share the NHWC layout (espdl-v1.md); no golden of their own.
    src, name = SETS[set_name]
    convert_set(src, name, tmp_path, target=chip)
    golden = TEXT / f"{set_name}.esp32.q0"
    assert (tmp_path / f"{name}.cpp").read_bytes() == (golden / f"{name}.cpp").read_bytes()


def test_line_wrapping_at_512_values_and_exact_multiple():
    # 1024 values: two full lines, the second closed by "};" (no empty third line)
    w = np.linspace(-1, 1, 1024, dtype=np.float32).reshape(1, 1, 1, 1024)
    config = {"big": {"operation": "conv2d", "feature_type": "s8"}}
    cpp = coefficient_files(preview_set(config, {"big_filter": w}), "m")["m.cpp"].decode()
    lines = cpp.splitlines()
    start = lines.index(
        "    const static __attribute__((aligned(16))) int8_t big_filter_element[] = {"
    )
    first, second, blank = lines[start + 1 : start + 4]
    assert first.endswith(",") and len(first.split(",")) == 513
    assert second.endswith("};") and len(second.split(",")) == 512
    assert blank == ""


def _write_set(d: Path, config: dict, arrays: dict) -> Path:
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    for stem, arr in arrays.items():
        np.save(d / f"{stem}.npy", arr)
    return d


_W = np.ones((1, 1, 2, 2), np.float32)


@pytest.mark.parametrize(
    ("name", "layer", "arrays", "extra", "message"),
    [
        ("bad-name", "c", {"c_filter": _W}, {}, "coefficient name (-n) 'bad-name' is not a C"),
        ("m", "conv.1", {"conv.1_filter": _W}, {}, "layer name 'conv.1' is not a C identifier"),
        ("m", "c", {"c_filter": _W.astype(np.int32)}, {}, "c_filter.npy: dtype int32"),
        ("m", "c", {"c_filter": _W * np.nan}, {}, "c_filter.npy: contains NaN"),
        ("m", "c", {"c_filter": _W}, {"dilation": "(2, 2)"}, "key 'dilation' is undocumented"),
        ("m", "c", {}, {}, "no c_filter.npy"),
    ],
)
def test_bad_sets_are_refused_and_nothing_is_written(tmp_path, name, layer, arrays, extra, message):
    src = _write_set(
        tmp_path / "in", {layer: {"operation": "conv2d", "feature_type": "s8", **extra}}, arrays
    )
    out = tmp_path / "out"
    out.mkdir()
    (out / "m.cpp").write_text("previous")
    with pytest.raises(ExportError, match=re.escape(message)):
        convert_set(src, name, out)
    assert sorted(p.name for p in out.iterdir()) == ["m.cpp"]
    assert (out / "m.cpp").read_text() == "previous"


def test_cli_error_exit_code_and_message(tmp_path, capsys):
    argv = ["espdl-convert", "-t", "esp32", "-i", str(tmp_path / "none"), "-n", "m", "-o", "o"]
    assert main(argv) == 2
    assert "config.json: cannot read" in capsys.readouterr().err


def test_other_files_in_the_output_directory_are_kept(tmp_path):
    src, name = SETS["s8_set"]
    (tmp_path / "app_main.cpp").write_text("mine")
    convert_set(src, name, tmp_path, target="esp32")
    assert (tmp_path / "app_main.cpp").read_text() == "mine"
    convert_set(src, name, tmp_path, target="esp32s3")  # overwrite in place, atomically
    golden = TEXT / "s8_set.esp32s3.q0" / f"{name}.cpp"
    assert (tmp_path / f"{name}.cpp").read_bytes() == golden.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_preview_set_and_files_agree_on_the_golden_sets():
    # coefficient_files renders exactly the preview's integers (same objects, no second path)
    config, arrays = load_set(SETS["tutorial"][0])
    previews = preview_set(config, arrays, target="esp32s3")
    parsed = _parse_cpp(
        coefficient_files(previews, "mnist_coefficient")["mnist_coefficient.cpp"].decode()
    )
    for p in previews:
        assert parsed["arrays"][f"{p.name}_filter_element"] == p.filter.values.tolist()
