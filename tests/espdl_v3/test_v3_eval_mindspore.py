"""`amct-bridge espdl-eval --format espdl --mindspore`: the simulated v3 chip next to the float
and fake-quantized MindSpore network. Each figure is recomputed here independently: the float
accuracy from the network's outputs, the fake-quant one from `simulate`, the chip's from
`simulate_espdl` on the inputs quantized here (NHWC, half up), a row's SNR from the cell's own
output (NCHW -> NHWC)."""

from __future__ import annotations

from pathlib import Path

import mindspore as ms
import nets
import numpy as np
import pytest
from mindspore import Tensor
from nets import SharedRelu

import amct_bridge.mindspore as ams
from amct_bridge.cli import main
from amct_bridge.espdl.evaluation import snr_db
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl

NETS = Path(nets.__file__)  # tests/mindspore/nets.py, for the CLI's --mindspore FILE:FACTORY


def test_espdl_eval_format_espdl_mindspore(tmp_path, capsys):
    ms.set_seed(3)
    net = SharedRelu()  # these weights go to the CLI's network through --ckpt
    net.set_train(False)
    x = np.random.default_rng(0).normal(0, 1, (24, 3, 6, 6)).astype(np.float32)
    y = net(Tensor(x)).asnumpy().argmax(axis=1)  # float accuracy 1 by construction
    y[:3] = (y[:3] + 1) % 3  # ... but for three samples
    record = tmp_path / "r.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    out = tmp_path / "m.espdl"
    ams.export_espdl(
        net, record, out, sample_input=(1, 3, 6, 6), format="espdl", target="esp32s3",
        feature_type="s8",
    )  # fmt: skip
    ckpt = tmp_path / "w.ckpt"
    ms.save_checkpoint(net, str(ckpt))
    np.savez(tmp_path / "d.npz", x=x, y=y)
    argv = ["espdl-eval", "--format", "espdl", "--export", str(out)]
    argv += ["--mindspore", f"{NETS}:shared_relu", "--ckpt", str(ckpt), "--record", str(record)]
    assert main([*argv, "--data", str(tmp_path / "d.npz")]) == 0, capsys.readouterr().err
    lines = capsys.readouterr().out.splitlines()
    figures = {k: float(v.split()[0]) for k, _, v in (ln.partition(":") for ln in lines[1:4])}
    back = read_espdl(out)
    e_in = back.inputs[0].exponent
    nhwc = x.transpose(0, 2, 3, 1)
    q = np.clip(np.floor(nhwc * 2.0**-e_in + 0.5), -128, 127).astype(np.int8)
    res = simulate_espdl(back, q)
    chip = res.values["fc"] * 2.0 ** back.value("fc").exponent
    assert figures["float accuracy"] == float(np.mean(y == net(Tensor(x)).asnumpy().argmax(1)))
    assert figures["fake-quant accuracy"] == ams.simulate(net, record, x, y).accuracy
    assert figures["chip accuracy"] == float(np.mean(chip.argmax(axis=1) == y))
    header = next(ln for ln in lines if ln.startswith("layer "))
    assert header.split()[-1] == "cell"
    end = next(i for i, ln in enumerate(lines) if ln.startswith("lowest SNR"))
    rows = {ln.split()[0]: ln.split() for ln in lines[lines.index(header) + 1 : end]}
    assert {"relu", "relu@1", "fc"} <= set(rows)  # both call sites of the ReLU cell
    # the second site's float output: relu(conv2(relu(conv(x)))), NHWC
    site1 = net.relu(net.conv2(net.relu(net.conv(Tensor(x))))).asnumpy().transpose(0, 2, 3, 1)
    got = res.values["relu@1"] * 2.0 ** back.value("relu@1").exponent
    assert float(rows["relu@1"][3]) == pytest.approx(snr_db(site1, got), abs=0.06)
    ref = net(Tensor(x)).asnumpy()
    assert float(rows["fc"][3]) == pytest.approx(snr_db(ref, chip), abs=0.06)
    # the Flatten of an NCHW map has no NHWC float counterpart, and the report says so
    assert lines[end + 1 :] == [
        "not compared: flatten: a Flatten of an NCHW map (the chip flattens NHWC; the Dense "
        "after it is compared)"
    ]
