"""`amct-bridge espdl-eval --mindspore` / `amct_bridge.mindspore.evaluate_espdl`: the simulated
chip next to the float and fake-quantized MindSpore network. Each figure is recomputed here
independently: the float accuracy from the network's own outputs, the fake-quant one from
`simulate`, the chip's from `simulate_chip` on NHWC data, a layer's SNR from the cell called on
its own input."""

from __future__ import annotations

from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor
from nets import flatten_dense

import amct_bridge.mindspore as ams
from amct_bridge.cli import main
from amct_bridge.errors import ExportError
from amct_bridge.espdl.chip import simulate_chip
from amct_bridge.espdl.evaluation import snr_db

NETS = Path(__file__).with_name("nets.py")


def _exported(tmp_path):
    net = flatten_dense()
    x = np.random.default_rng(0).normal(0, 1, (48, 3, 6, 6)).astype(np.float32)
    y = net(Tensor(x)).asnumpy().argmax(axis=1)  # float accuracy 1 by construction
    record = tmp_path / "r.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    out = tmp_path / "espdl"
    ams.export_espdl(net, record, out, sample_input=(1, 3, 6, 6), feature_type="s8")
    return net, x, y, record, out


def test_cli_figures_match_independent_runs(tmp_path, capsys):
    net, x, y, record, out = _exported(tmp_path)
    ckpt = tmp_path / "w.ckpt"
    ms.save_checkpoint(net, str(ckpt))
    np.save(tmp_path / "x.npy", x.astype(np.float64))  # cast to float32, as calibrate does
    np.save(tmp_path / "y.npy", y)
    argv = ["espdl-eval", "--export", str(out), "--mindspore", f"{NETS}:flatten_dense"]
    argv += ["--ckpt", str(ckpt), "--record", str(record)]
    argv += ["--data", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy")]
    assert main(argv) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    lines = text.splitlines()
    figures = {k: float(v.split()[0]) for k, _, v in (ln.partition(":") for ln in lines[1:4])}
    chip = simulate_chip(out, x.transpose(0, 2, 3, 1)).output.to_float()
    assert figures["float accuracy"] == 1.0
    assert figures["fake-quant accuracy"] == ams.simulate(net, record, x, y).accuracy
    assert figures["chip accuracy"] == float(np.mean(chip.argmax(axis=1) == y))
    header = next(ln for ln in lines if ln.startswith("layer "))
    assert header.split()[-1] == "cell"  # MindSpore's names, under their own heading
    rows = {ln.split()[0]: ln.split() for ln in lines[lines.index(header) + 1 : -1]}
    assert set(rows) == {"conv", "pool", "fc1", "fc2"}  # flatten: NCHW order, not compared
    assert rows["fc1"][-1] == "fc1" and rows["fc2"][1] == "FullyConnected"


def test_api_layer_snr_is_the_cells_own(tmp_path):
    net, x, y, record, out = _exported(tmp_path)
    ev = ams.evaluate_espdl(out, net, x, y)  # no record: no fake-quant figure
    assert ev.fake_quant_acc is None and ev.source_label == "cell"
    conv = next(e for e in ev.layers if e.source == "conv")
    ref = net.conv(Tensor(x)).asnumpy().transpose(0, 2, 3, 1)
    got = simulate_chip(out, x.transpose(0, 2, 3, 1)).layers["conv"].to_float()
    assert conv.snr_db == snr_db(ref, got)
    values = simulate_chip(out, x.transpose(0, 2, 3, 1)).layers["conv"].values
    assert conv.saturated == float(np.mean((values == 127) | (values == -128)))
    # data of the wrong shape: refused before the network runs, naming the export
    with pytest.raises(ExportError, match=r"takes inputs of shape \(6, 6, 3\)"):
        ams.evaluate_espdl(out, net, x[:, :, :5, :5], y)


def test_cli_needs_exactly_one_model(tmp_path, capsys):
    np.savez(tmp_path / "d.npz", x=np.zeros((2, 3, 6, 6), np.float32), y=np.zeros(2, int))
    (tmp_path / "e").mkdir()
    base = ["espdl-eval", "--export", str(tmp_path / "e"), "--data", str(tmp_path / "d.npz")]
    assert main(base) == 2
    assert "give either --model (a Keras file) or --mindspore" in capsys.readouterr().err
    assert main([*base, "--model", "m.keras", "--ckpt", "w.ckpt"]) == 2
    assert "--ckpt goes with --mindspore" in capsys.readouterr().err
