"""A MindSpore nn.Dense(activation="softmax" | "sigmoid") as the network's last cell, as Keras'
Dense(activation="softmax") head: ESP-DL v1 exports it linear and lists the function as left to
the host (export.json, its chip graph, the CLI), espdl-eval scores the logits with the function
applied; ESP-DL v3 computes the function on the chip (Gemm + Softmax / Sigmoid node, as for
Keras). The chip's arg max is compared with the network's own output. A Dense with an activation
the format lacks, inside the network, is refused naming that activation.

(Before: the Dense's softmax primitive made the graph call unknown, refused as "MindSpore
nn.Dense has no ESP-DL v1 equivalent"; its sigmoid was refused by v3 as activation 'Sigmoid'.)
"""

from __future__ import annotations

import json
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

import amct_bridge.mindspore as ams
from amct_bridge.cli import main
from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1.chip import simulate_chip
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.mindspore.graph import extract_graph


class Head(nn.Cell):
    """conv-relu, Flatten, Dense(activation=function) (6x6 input)."""

    def __init__(self, function: str = "softmax") -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, has_bias=True, pad_mode="valid")
        self.relu = nn.ReLU()
        self.flat = nn.Flatten()
        self.fc = nn.Dense(4 * 4 * 4, 3, activation=function)

    def construct(self, x):
        return self.fc(self.flat(self.relu(self.conv(x))))


def softmax_head() -> nn.Cell:
    """For the CLI (``--mindspore <this file>:softmax_head``)."""
    return Head("softmax")


def _calibrated(function, tmp_path):
    ms.set_seed(0)
    net = Head(function)
    net.set_train(False)
    x = np.random.default_rng(0).normal(0, 1, (32, 1, 6, 6)).astype(np.float32)
    probs = net(Tensor(x)).asnumpy()
    record = tmp_path / "r.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    return net, x, probs, record


@pytest.mark.parametrize("function", ["softmax", "sigmoid"])
def test_v1_dense_head_exports_linear_with_the_function_left_to_the_host(function, tmp_path):
    net, x, probs, record = _calibrated(function, tmp_path)
    assert extract_graph(net, (1, 1, 6, 6)).node("fc").params["activation"] == function
    out = tmp_path / "espdl"
    res = ams.export_espdl(net, record, out, sample_input=(1, 1, 6, 6), feature_type="s16")
    assert res.skipped == []
    report = json.loads((out / "export.json").read_text())
    (host,) = report["host"]
    assert (host["layer"], host["function"], host["reads"]) == ("fc", function, "fc")
    assert report["graph"]["outputs"] == ["fc"] and report["graph"]["host"][0]["chip"] == "fc"
    assert "activation" not in json.loads((out / "config.json").read_text())["fc"]  # linear
    # the chip computes the logits: the function applied to them gives the net's arg max
    logits = simulate_chip(out, x.transpose(0, 2, 3, 1)).output.to_float()
    want_logits = x_logits(net, x)
    np.testing.assert_allclose(logits, want_logits, atol=0.02 * np.abs(want_logits).max())
    y = probs.argmax(axis=1)
    assert np.array_equal(logits.argmax(axis=1), y)
    ev = ams.evaluate_espdl(out, net, x, y)
    assert ev.chip_acc == ev.float_acc == 1.0
    assert f"the logits of 'fc', its {function} is applied on the host" in ev.chip_note
    (row,) = [e for e in ev.layers if e.name == "fc"]
    assert row.source == f"fc (its {function} on the host)"
    assert row.snr_db > 15  # compared with the function applied: a real SNR


def x_logits(net: Head, x: np.ndarray) -> np.ndarray:
    """The Dense's pre-activation output, recomputed in numpy from the cells' weights."""
    w, b = net.conv.weight.asnumpy(), net.conv.bias.asnumpy()
    a = np.zeros((len(x), 4, 4, 4), np.float64)
    for i in range(4):
        for j in range(4):
            a[:, :, i, j] = np.einsum("nchw,ochw->no", x[:, :, i : i + 3, j : j + 3], w) + b
    a = np.maximum(a, 0).reshape(len(x), -1)
    return a @ net.fc.weight.asnumpy().T.astype(np.float64) + net.fc.bias.asnumpy()


def test_cli_lists_the_dense_head_as_left_to_the_host(tmp_path, capsys):
    net, _, _, record = _calibrated("softmax", tmp_path)
    ckpt = tmp_path / "w.ckpt"
    ms.save_checkpoint(net, str(ckpt))
    out = tmp_path / "espdl"
    argv = ["export-espdl", "--mindspore", f"{Path(__file__)}:softmax_head", "--ckpt", str(ckpt)]
    argv += ["--input-shape", "1,1,6,6", "--record", str(record), "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "left to the host: softmax of layer 'fc'" in printed and "skipped:" not in printed


@pytest.mark.parametrize("function", ["softmax", "sigmoid"])
def test_v3_dense_head_computes_the_function_on_the_chip(function, tmp_path):
    net, x, probs, record = _calibrated(function, tmp_path)
    out = tmp_path / "m.espdl"
    ams.export_espdl(
        net, record, out, sample_input=(1, 1, 6, 6), format="espdl", feature_type="s16",
        target="esp32s3",
    )  # fmt: skip
    back = read_espdl(out)
    nodes = {n.name: n.op_type for n in back.nodes}
    assert nodes["fc"] == "Gemm" and nodes[f"fc/{function}"] == function.capitalize()
    e_in = back.inputs[0].exponent
    q = np.clip(np.floor(x.transpose(0, 2, 3, 1) * 2.0**-e_in + 0.5), -32768, 32767)
    res = simulate_espdl(back, q.astype(np.int16))
    out_name = back.outputs[0].name
    chip = res.values[out_name] * 2.0 ** back.value(out_name).exponent
    if np.issubdtype(res.values[out_name].dtype, np.floating):  # Softmax: float output
        chip = res.values[out_name]
    np.testing.assert_allclose(chip.reshape(probs.shape), probs, atol=0.01)
    assert np.array_equal(chip.reshape(probs.shape).argmax(axis=1), probs.argmax(axis=1))
    ev = ams.evaluate_espdl(out, net, x, probs.argmax(axis=1))
    assert ev.chip_acc == ev.float_acc == 1.0


class Middle(nn.Cell):
    """Dense(activation=act) inside the network, a plain Dense after it."""

    def __init__(self, act: str) -> None:
        super().__init__()
        self.fc1 = nn.Dense(6, 5, activation=act)
        self.fc2 = nn.Dense(5, 3)

    def construct(self, x):
        return self.fc2(self.fc1(x))


@pytest.mark.parametrize(
    "act, v1_reason, v3_reason",
    [
        ("softmax", "activation 'softmax': ESP-DL v1 can fuse only", None),
        ("tanh", "activation 'tanh': ESP-DL v1 can fuse only", None),
        ("mish", "activation 'Mish': ESP-DL v1 can fuse only", "activation 'Mish': no ESP-DL v3"),
        ("prelu", "activation 'prelu' applied by the layer itself", "activation 'prelu': no ESP"),
    ],
)
def test_a_middle_dense_activation_is_refused_naming_it(act, v1_reason, v3_reason, tmp_path):
    ms.set_seed(0)
    net = Middle(act)
    x = np.random.default_rng(1).normal(0, 1, (16, 6)).astype(np.float32)
    record = tmp_path / "r.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    with pytest.raises(ExportError) as v1:
        ams.export_espdl(net, record, tmp_path / "v1", sample_input=(1, 6))
    (line,) = [ln for ln in str(v1.value).splitlines() if "'fc1'" in ln]
    assert line.startswith("  layer 'fc1' (Dense): ") and v1_reason in line, line
    assert "host" not in line  # not the model's output: no head hint
    assert not (tmp_path / "v1").exists()
    v3_out = tmp_path / "m.espdl"
    if v3_reason is None:  # the v3 runtime has it: Gemm, then the activation's node
        res = ams.export_espdl(net, record, v3_out, sample_input=(1, 6), format="espdl")
        ops = [n.op_type for n in res.model.nodes]
        assert ops[:2] == ["Gemm", act.capitalize()], ops
        return
    with pytest.raises(ExportError) as v3:
        ams.export_espdl(net, record, v3_out, sample_input=(1, 6), format="espdl")
    (line,) = [ln for ln in str(v3.value).splitlines() if "'fc1'" in ln]
    assert v3_reason in line and "v1" not in line, line
    assert not v3_out.exists()


def test_two_denses_with_the_same_activation_are_two_calls():
    """MindSpore 2.10 scopes the second Dense's SiLU / GELU / LeakyReLU primitives under the
    first Dense's activation (``0.activation``): they still belong to the second Dense."""
    for act, name in (("silu", "silu"), ("gelu", "gelu"), ("leakyrelu", "leaky_relu")):
        net = nn.SequentialCell([nn.Dense(4, 3, activation=act), nn.Dense(3, 2, activation=act)])
        graph = extract_graph(net, (1, 4))
        nodes = [(n.name, n.kind, n.params.get("activation")) for n in graph]
        assert nodes == [("0", "Dense", name), ("1", "Dense", name)], (act, nodes)
        assert graph.node("1").inputs == graph.node("0").outputs
