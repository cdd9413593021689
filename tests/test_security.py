"""Security guarantees of docs/errors.md, "Security" (issue 15): no pickles, Keras safe_mode
unless --unsafe-load, config values never evaluated, outputs stay inside the chosen directory,
temp files follow the umask and never outlive a write."""

from __future__ import annotations

import ast
import os
import pathlib
import stat
from pathlib import Path

import keras
import numpy as np
import pytest

from amct_bridge.cli import build_parser, main
from amct_bridge.commands.common import load_npy
from amct_bridge.errors import AmctBridgeError, ExportError
from amct_bridge.espdl.writer import write_directory
from amct_bridge.records import LayerFactors, Record, save
from amct_bridge.records.atomic import atomic_write_bytes

PACKAGE = Path(__file__).resolve().parent.parent / "amct_bridge"


def _calls(predicate) -> list[tuple[str, int, ast.Call]]:
    """Every call in the package's source for which ``predicate(call)`` holds."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_pb" in path.parts:
            continue  # protoc's generated code
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and predicate(node):
                found.append((str(path.relative_to(PACKAGE)), node.lineno, node))
    return found


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return f"{_name(func.value)}.{func.attr}"
    return func.id if isinstance(func, ast.Name) else ""


# --- pickles -------------------------------------------------------------------------------------
class _Touch:
    """Unpickling this creates ``path``: proof that a payload ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def _pickled_npy(path: Path, marker: Path) -> Path:
    np.save(path, np.array([_Touch(marker)], dtype=object), allow_pickle=True)
    return path


def test_every_np_load_says_allow_pickle_false():
    """Found by reading the source: a new np.load without the keyword fails this test."""
    loads = _calls(lambda c: _name(c.func) in ("np.load", "numpy.load"))
    assert loads, "the scan found no np.load at all: it is broken"
    bad = [
        f"{path}:{line}"
        for path, line, call in loads
        if not any(
            k.arg == "allow_pickle" and isinstance(k.value, ast.Constant) and k.value.value is False
            for k in call.keywords
        )
    ]
    assert bad == []


def test_pickled_npy_is_refused_and_never_unpickled(tmp_path, capsys):
    marker = tmp_path / "ran"
    data = _pickled_npy(tmp_path / "x.npy", marker)
    with pytest.raises(AmctBridgeError) as err:
        load_npy(str(data), "calibration data")
    assert str(err.value) == (
        f"{data}: holds pickled Python objects (an object array), which amct-bridge never loads "
        "(unpickling can run code); save calibration data as a numeric array"
    )
    # The same file as report --labels and as espdl-eval data: exit 2, one line, no payload run.
    np.savez(tmp_path / "d.npz", x=np.zeros((2, 3)), y=np.array([_Touch(marker)], dtype=object))
    code = main(
        ["espdl-eval", "--export", str(tmp_path), "--model", "m.keras"]
        + ["--data", str(tmp_path / "d.npz")]
    )
    assert code == 2
    assert capsys.readouterr().err == (
        f"amct-bridge espdl-eval: error: {tmp_path / 'd.npz'}: array 'y': holds pickled Python "
        "objects (an object array), which amct-bridge never loads (unpickling can run code); "
        "save the dataset as a numeric array\n"
    )
    assert not marker.exists()


def test_pickled_npy_in_a_convert_set_is_refused(tmp_path, capsys):
    marker = tmp_path / "ran"
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "config.json").write_text("{}")
    _pickled_npy(tmp_path / "set" / "fc_filter.npy", marker)
    args = ["espdl-convert", "-t", "esp32", "-i", str(tmp_path / "set"), "-n", "m"]
    assert main(args + ["-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"amct-bridge espdl-convert: error: {tmp_path / 'set' / 'fc_filter.npy'}: not a numeric "
        ".npy array: holds pickled Python objects, never loaded\n"
    )
    assert not marker.exists() and not (tmp_path / "out").exists()


# --- Keras safe_mode -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lambda_model(tmp_path_factory) -> Path:
    """A model whose Lambda layer holds Python bytecode (doubling its input)."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((4,))
    y = keras.layers.Lambda(lambda t: t * 2.0, name="double")(inp)
    y = keras.layers.Dense(3, name="fc")(y)
    path = tmp_path_factory.mktemp("lambda") / "lam.keras"
    keras.Model(inp, y).save(path)
    return path


def test_lambda_model_refused_without_the_flag_loaded_with_it(lambda_model, capsys):
    assert main(["prune-groups", str(lambda_model)]) == 2
    assert capsys.readouterr().err == (
        f"amct-bridge prune-groups: error: {lambda_model}: refused to load: the model holds "
        "Python code (a Lambda layer), which could do anything when loaded; if you trust the "
        "file, rerun with --unsafe-load\n"
    )
    assert main(["prune-groups", str(lambda_model), "--unsafe-load", "--json"]) == 0
    assert '"groups"' in capsys.readouterr().out
    # The API leaves loading to the user, whose own keras.models.load_model is safe by default.
    with pytest.raises(ValueError, match="safe_mode"):
        keras.models.load_model(lambda_model)


def test_every_command_taking_a_keras_model_has_unsafe_load():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    takes_model = {
        name: {a.dest for a in p._actions}
        for name, p in sub.choices.items()
        if "model" in {a.dest for a in p._actions}
    }
    assert set(takes_model) >= {"calibrate", "prune-groups", "export-espdl", "report", "espdl-eval"}
    assert [name for name, dests in takes_model.items() if "unsafe_load" not in dests] == []


def test_keras_models_load_only_through_the_safe_loader():
    """One place loads Keras files, and it passes safe_mode explicitly."""
    loads = _calls(lambda c: _name(c.func).endswith("load_model"))
    assert [(p, [k.arg for k in c.keywords]) for p, _, c in loads] == [
        ("commands/common.py", ["compile", "safe_mode"])
    ]


# --- config values are data ----------------------------------------------------------------------
def test_no_eval_exec_or_literal_eval_in_the_package():
    banned = {"eval", "exec", "compile", "ast.literal_eval", "literal_eval", "pickle.loads"}
    assert [f"{p}:{line}" for p, line, c in _calls(lambda c: _name(c.func) in banned)] == []


def test_config_text_is_a_name_not_code(tmp_path, capsys):
    """A skip_layers value that would run code if evaluated is just an unknown layer name."""
    from calib_models import images, sequential_model

    marker = tmp_path / "ran"
    cfg = tmp_path / "c.cfg"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    cfg.write_text('batch_num: 1\nskip_layers: "' + code.replace('"', '\\"') + '"\n')
    sequential_model().save(tmp_path / "m.keras")
    np.save(tmp_path / "x.npy", images(4))
    args = ["calibrate", str(tmp_path / "m.keras"), "--data", str(tmp_path / "x.npy")]
    assert main(args + ["-o", str(tmp_path / "r.txt"), "--config", str(cfg), "-q"]) == 2
    assert f"skip_layers: no layer named {code!r} in the model" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "r.txt").exists()


# --- outputs stay inside the chosen directory ----------------------------------------------------
def test_layers_named_dot_dot_export_inside_the_directory(tmp_path, capsys):
    """Keras names may be '..' or hold '.' and '-' (not '/'): every file lands in --out."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 2))
    y = keras.layers.Conv2D(3, 3, name="..")(inp)
    y = keras.layers.ReLU(name="...")(y)
    y = keras.layers.Flatten(name="flat")(y)
    y = keras.layers.Dense(2, name="-.x")(y)
    keras.Model(inp, y).save(tmp_path / "m.keras")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((4, 6, 6, 2), dtype=np.float32))
    work = tmp_path / "work"
    work.mkdir()
    model, data = str(tmp_path / "m.keras"), str(tmp_path / "x.npy")
    record = str(work / "r.txt")
    assert main(["calibrate", model, "--data", data, "-o", record, "-q"]) == 0
    out = work / "out"
    assert main(["export-espdl", "--record", record, "--model", model, "--out", str(out)]) == 0
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert written == sorted(
        ["config.json", "export.json", "names.json"]
        + [f"{c}_{k}.npy" for c in ("layer", "x") for k in ("filter", "bias")]
    )
    assert sorted(p.name for p in work.iterdir()) == ["out", "r.txt", "r.txt.calib.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.keras", "work", "x.npy"]


@pytest.mark.parametrize("name", ["../evil", "..", "a/b", "a\\b", "", "x\0y"])
def test_writer_refuses_a_file_name_that_is_not_plain(tmp_path, name):
    out = tmp_path / "d" / "out"
    out.parent.mkdir()
    with pytest.raises(ExportError, match="not a plain file name inside the output"):
        write_directory(out, {"config.json": b"{}", name: b"x"})
    assert list(tmp_path.rglob("*")) == [out.parent]


def test_coefficient_name_with_a_path_is_refused(tmp_path, capsys, data_dir):
    src = data_dir / "espdl_v1_tutorial"
    args = ["espdl-convert", "-t", "esp32", "-i", str(src), "-n", "../evil", "-o", str(tmp_path)]
    assert main(args) == 2
    assert "coefficient name (-n) '../evil' is not a C identifier" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [] and not (tmp_path.parent / "evil.cpp").exists()


# --- temp files: the user's umask, removed on every path -----------------------------------------
class _Boom(Exception):
    pass


@pytest.mark.parametrize("error", [_Boom, KeyboardInterrupt])
def test_failed_atomic_write_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch, error):
    path = tmp_path / "record.txt"
    path.write_text("old\n")

    def fail(fd):
        raise error()

    monkeypatch.setattr(os, "fsync", fail)  # after the data went into the temp file
    with pytest.raises(error):
        save(Record({"c": LayerFactors(scale_d=0.5, offset_d=0)}), path)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["record.txt"]


@pytest.mark.parametrize("error", [_Boom, KeyboardInterrupt])
def test_failed_directory_write_keeps_the_previous_export_and_no_temp(tmp_path, monkeypatch, error):
    out = tmp_path / "out"
    write_directory(out, {"config.json": b"old"})
    real_rename = os.rename

    def fail_last(src, dst):
        if Path(dst) == out and str(src).endswith(".tmp"):  # the new directory into place
            raise error()
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", fail_last)
    with pytest.raises(error):
        write_directory(out, {"config.json": b"new", "a.npy": b"1"}, overwrite=True)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in out.iterdir()] == ["config.json"]
    assert (out / "config.json").read_bytes() == b"old"


def test_temp_file_gets_the_umask_mode_before_it_is_renamed(tmp_path, monkeypatch):
    """The file is private (0600) while written, and has 0o666 & ~umask when it appears."""
    modes = []
    real_replace = os.replace

    def spy(src, dst):
        modes.append(stat.S_IMODE(os.stat(src).st_mode))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    old = os.umask(0o027)
    try:
        atomic_write_bytes(tmp_path / "a.txt", b"1")
        write_directory(tmp_path / "d", {"x.npy": b"1"})
    finally:
        os.umask(old)
    assert modes == [0o640, 0o640]
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o750
    assert stat.S_IMODE(os.stat(tmp_path / "d" / "x.npy").st_mode) == 0o640
