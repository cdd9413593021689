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


def test_espdl_run_prints_a_float_output_range_as_floats(tmp_path, capsys):
    """A network ending in nn.Softmax: the v3 file's output is float32 probabilities, and
    ``espdl-run --check`` printed their range as 'range 0..0' (int() of each end)."""
    import mindspore as ms
    from mindspore import nn

    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(6, 4), nn.Softmax()])
    x = np.random.default_rng(4).normal(size=(8, 6)).astype(np.float32)
    ams.calibrate(net, x, tmp_path / "r.txt", algorithm="minmax")
    ams.export_espdl(net, tmp_path / "r.txt", tmp_path / "m.espdl", sample_input=x[:1],
                     format="espdl", test_input=x[:1])  # fmt: skip
    assert main(["espdl-run", str(tmp_path / "m.espdl"), "--check"]) == 0
    out = capsys.readouterr().out
    line = next(t for t in out.splitlines() if t.startswith("output "))
    assert "float32" in line and "range 0..0" not in line, out
    lo, hi = (float(v) for v in line.rsplit("range ", 1)[1].split(".."))
    assert 0 < lo < hi < 1, line
