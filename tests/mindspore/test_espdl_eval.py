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
from isolate import in_fresh_process
from mindspore import Tensor
from nets import flatten_dense

import amct_bridge.mindspore as ams
from amct_bridge.cli import main
from amct_bridge.errors import ExportError
from amct_bridge.espdl.evaluation import snr_db
from amct_bridge.espdl.v1.chip import simulate_chip

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
    end = next(i for i, ln in enumerate(lines) if ln.startswith("lowest SNR"))
    rows = {ln.split()[0]: ln.split() for ln in lines[lines.index(header) + 1 : end]}
    assert set(rows) == {"conv", "pool", "fc1", "fc2"}
    # flatten: NCHW order, not compared, and said so
    assert lines[end + 1 :] == [
        "not compared: flatten (flatten): a Flatten of an NCHW map (the chip flattens NHWC; the "
        "Dense after it is compared)"
    ]
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


@pytest.mark.parametrize("factory", ["lenet5", "resnet_user"])
def test_every_chip_layer_of_shared_cells_and_adds_gets_a_row(factory, tmp_path, request):
    """LeNet5 (one relu at four sites) compared 1 of its 5 chip layers and a ResNet 13 of 32:
    chains ending in a shared ReLU and every Add2D were left out without a word. Each site is
    compared now, an Add through the input of the ReLU site reading it; the rows' SNRs are
    recomputed here from the chip simulator and the network's own cells."""
    if factory == "resnet_user" and in_fresh_process(request):  # out += y: see isolate.py
        return
    import nets

    from amct_bridge.espdl.evaluation import format_evaluation
    from amct_bridge.mindspore import calibrate

    net = getattr(nets, factory)()
    shape = nets.INPUT_SHAPES[factory][1:]
    x = np.random.default_rng(4).normal(0, 1, (6, *shape)).astype(np.float32)
    y = np.zeros(6, np.int64)
    record = tmp_path / "r.txt"
    calibrate(net, x, record, algorithm="minmax")
    res = ams.export_espdl(net, record, tmp_path / "e", sample_input=x[:1], feature_type="s16")
    ev = ams.evaluate_espdl(tmp_path / "e", net, x, y)
    chip_layers = simulate_chip(tmp_path / "e", x.transpose(0, 2, 3, 1)).layers
    assert {e.name for e in ev.layers} | {n.split()[0] for n in ev.not_compared} == set(chip_layers)
    compared = {e.source: e for e in ev.layers}
    if factory == "lenet5":
        assert [n.split(":")[0] for n in ev.not_compared] == ["flatten (flatten)"]
        assert {"relu", "relu@1", "relu@2", "relu@3"} <= set(compared)
        t = Tensor(x)
        a2 = net.relu(net.conv2(net.max_pool2d(net.relu(net.conv1(t)))))  # site 1
        row = compared["relu@1"]
        got = chip_layers[row.name].to_float()
        assert row.snr_db == snr_db(a2.asnumpy().transpose(0, 2, 3, 1), got)
    else:
        adds = [e for e in ev.layers if e.kind == "Add2D"]
        assert len(adds) == 4 and all(e.snr_db > 30 for e in adds), format_evaluation(ev)
        assert not ev.not_compared, ev.not_compared
    assert len(res.layers) + len(res.runtime) >= len(chip_layers) - 1


def test_float_outputs_docstring_examples_run():
    """The examples of amct_bridge.mindspore.float_outputs (what espdl-eval and the export's
    exponent search read) run: the call site names, the functional op through its reader."""
    import doctest

    import amct_bridge.mindspore.float_outputs as module

    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0 and tried > 0
