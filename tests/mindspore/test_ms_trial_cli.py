"""CLI regressions found by trying the MindSpore side as a new user (issue 21)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from nets import INPUT_SHAPES, sequential_net

import amct_bridge.mindspore as ams
from amct_bridge.cli import main

SPEC = f"{Path(__file__).with_name('nets.py')}:sequential_net"


def test_report_takes_the_npz_with_x_and_y_that_espdl_eval_takes(tmp_path, capsys):
    """One val.npz (x, y) serves espdl-eval; ``report --mindspore --data val.npz`` passed both
    arrays to ``construct`` ('takes 2 positional arguments but 3 were given'). Now x is the
    input and y the labels: the same JSON as x.npy + --labels y.npy."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, *INPUT_SHAPES["sequential_net"][1:])).astype(np.float32)
    y = rng.integers(0, 2, 12)
    ams.calibrate(sequential_net(), x, tmp_path / "r.txt", algorithm="minmax")
    np.savez(tmp_path / "val.npz", x=x, y=y)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    base = ["report", "--record", str(tmp_path / "r.txt"), "--mindspore", SPEC]
    code = main([*base, "--data", str(tmp_path / "val.npz"), "--json", str(tmp_path / "a.json")])
    assert code == 0, capsys.readouterr().err
    data = ["--data", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy")]
    assert main([*base, *data, "--json", str(tmp_path / "b.json")]) == 0
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    assert a["float_accuracy"] is not None and a == b
    capsys.readouterr()
    # inputs, labels and one more array: which is what cannot be guessed
    np.savez(tmp_path / "three.npz", x=x, y=y, z=y)
    assert main([*base, "--data", str(tmp_path / "three.npz")]) == 2
    err = capsys.readouterr().err
    assert "three.npz: holds 3 arrays, but SequentialCell.construct takes 1 input(s)" in err, err


def test_espdl_eval_takes_the_espdl_file_export_espdl_wrote(tmp_path, capsys):
    """``export-espdl --format espdl --out m.espdl`` then ``espdl-eval --export m.espdl`` said
    'm.espdl: export directory not found' (the file exists; --format espdl was needed). An
    existing .espdl file is now evaluated as one: the same output as with --format espdl."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(12, *INPUT_SHAPES["sequential_net"][1:])).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", rng.integers(0, 2, 12))
    ams.calibrate(sequential_net(), x, tmp_path / "r.txt", algorithm="minmax")
    model = tmp_path / "m.espdl"
    argv = ["export-espdl", "--format", "espdl", "--mindspore", SPEC, "--input-shape", "1,3,8,8"]
    assert main([*argv, "--record", str(tmp_path / "r.txt"), "--out", str(model)]) == 0
    capsys.readouterr()
    base = ["espdl-eval", "--export", str(model), "--mindspore", SPEC]
    base += ["--data", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy")]
    assert main(base) == 0, capsys.readouterr().err
    inferred = capsys.readouterr().out
    assert main([*base, "--format", "espdl"]) == 0
    assert inferred == capsys.readouterr().out and "chip accuracy:" in inferred
    # a directory that does not exist is still named as such
    assert main(["espdl-eval", "--export", str(tmp_path / "none"), *base[3:]]) == 2
    assert "none: export directory not found" in capsys.readouterr().err
