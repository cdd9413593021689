"""The chip simulator against Espressif's published on-chip outputs (ESP-DL v1 tutorial).

Data: tests/data/espdl_v1_tutorial (convert.py input set) and tests/data/espdl_v1_tutorial_app
(the tutorial's app_main.cpp with its int16 input and the logits printed on four chips, its
mnist_model.hpp, and mnist_graph.json, our transcription of that header) and
tests/data/espdl_v1_golden (the arrays convert.py wrote for that set), see their READMEs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from amct_bridge.espdl.v1 import chip_ops, layout
from amct_bridge.espdl.v1.chip import simulate_chip
from amct_bridge.espdl.v1.network import IntTensor, graph_from_json, load_network

DATA = Path(__file__).resolve().parents[1] / "data"
APP = DATA / "espdl_v1_tutorial_app"


def app_input() -> np.ndarray:
    """``example_element`` of app_main.cpp (HWC 28x28x3 int16, exponent 0 in the app)."""
    text = (APP / "app_main.cpp").read_text()
    body = text.split("example_element[] = {", 1)[1].split("}", 1)[0]
    return np.array([int(v) for v in re.findall(r"-?\d+", body)], np.int16).reshape(28, 28, 3)


def chip_logits() -> dict[str, list[int]]:
    """The logits in app_main.cpp's comments, per chip (``// esp32`` then the numbers)."""
    lines = (APP / "app_main.cpp").read_text().splitlines()
    found = {}
    for i, line in enumerate(lines):
        m = re.fullmatch(r"\s*//\s*(esp32\w*)\s*", line)
        if m:
            found[m[1]] = [int(v) for v in re.findall(r"-?\d+", lines[i + 1])]
    return found


def test_fixture_has_four_chips_and_ten_logits():
    logits = chip_logits()
    assert sorted(logits) == ["esp32", "esp32c3", "esp32s2", "esp32s3"]
    assert all(len(v) == 10 for v in logits.values())
    assert app_input().max() == 255 and app_input().min() == 0


def test_graph_json_transcribes_mnist_model_hpp():
    """Independent parse of the header: constructors (exponent, padding, strides) and build()."""
    hpp = (APP / "mnist_model.hpp").read_text()
    ctor = re.findall(
        r'(\w+)\((Conv2D|DepthwiseConv2D)<int16_t>\((-?\d+), [^"]*?(PADDING_\w+), \{\}, '
        r'(\d+), (\d+), "\w+"\)\)',
        hpp,
    )
    builds = re.findall(r"this->(\w+)\.build\((.*?)\);", hpp)
    graph = graph_from_json(APP / "mnist_graph.json")
    by_name = {x["name"]: x for x in graph["layers"]}
    assert len(ctor) == 17 and len(by_name) == 18
    for name, cls, exp, pad, sy, sx in ctor:
        node = by_name[name]
        assert (node["class"], node["output_exponent"]) == (cls, int(exp))
        assert node["attrs"] == {"padding": pad[len("PADDING_") :], "strides": [int(sy), int(sx)]}
    assert [b[0] for b in builds] == [x["name"] for x in graph["layers"]]
    for name, arg in builds:
        want = re.findall(r"this->(\w+)\.get_output\(\)", arg) or ["input"]
        assert by_name[name]["inputs"] == want
    assert re.search(r"l3_concat\(-1, \"l3_concat\"\)", hpp)
    assert by_name["l3_concat"]["attrs"] == {"axis": -1}


@pytest.mark.parametrize("target", ["esp32", "esp32s2", "esp32s3", "esp32c3"])
def test_tutorial_logits_bit_exact(target):
    net = load_network(DATA / "espdl_v1_tutorial", APP / "mnist_graph.json")
    result = simulate_chip(net, app_input(), target=target, input_exponent=0)
    out = result.output
    assert out.exponent == -9 and out.values.shape == (1, 1, 10)
    assert out.values.ravel().tolist() == chip_logits()[target]
    assert not out.approximate and result.approximate_layers == [] and result.warnings == []


def test_tutorial_batch_equals_single_and_rounding_breaks_it(monkeypatch):
    """A batch gives each image's own result; half-up rounding shifts break the match."""
    net = load_network(DATA / "espdl_v1_tutorial", APP / "mnist_graph.json")
    x = app_input()
    batch = np.stack([x, x[::-1], x])
    out = simulate_chip(net, batch).output.values
    assert out.shape == (3, 1, 1, 10)
    assert out[0].ravel().tolist() == chip_logits()["esp32"]
    assert np.array_equal(out[0], out[2])
    assert np.array_equal(out[1], simulate_chip(net, x[::-1]).output.values)

    def rounding_shift(v, s, inplace=False):
        v, s = np.asarray(v, np.int64), int(s)
        return (v + (1 << (s - 1))) >> s if s > 0 else v << -s

    monkeypatch.setattr(chip_ops, "floor_shift", rounding_shift)
    rounded = simulate_chip(net, x).output.values.ravel().tolist()
    wrong = sum(a != b for a, b in zip(rounded, chip_logits()["esp32"], strict=True))
    assert wrong >= 5


def _golden_network(target: str):
    """The tutorial graph with the integers convert.py itself wrote (golden .cpp arrays, chip
    element order put back to HWCN here), not our preview's."""
    golden = json.loads((DATA / "espdl_v1_golden" / f"tutorial.{target}.q0.json").read_text())
    arrays, consts = golden["arrays"], golden["constants"]
    net = load_network(DATA / "espdl_v1_tutorial", APP / "mnist_graph.json")
    for layer in net.layers:
        if layer.filter is None:
            continue
        args = [a.strip() for a in consts[f"{layer.name}_filter"]["args"].split(",")]
        shape = tuple(int(re.sub(r"\D", "", a)) for a in args[2:6])
        values = np.array(arrays[f"{layer.name}_filter_element"]["values"], np.int64)
        op = "depthwise_conv2d" if layer.kind == "DepthwiseConv2D" else "conv2d"
        index = np.arange(values.size).reshape(shape)
        hwcn = np.empty(values.size, np.int64)
        hwcn[layout.element_order(index, op, target, "s16")] = values
        layer.filter = IntTensor(hwcn.reshape(shape), int(args[1]))
        if layer.bias is not None:
            b_args = consts[f"{layer.name}_bias"]["args"].split(",")
            b = np.array(arrays[f"{layer.name}_bias_element"]["values"], np.int64)
            layer.bias = IntTensor(b, int(b_args[1]))
        act = consts[f"{layer.name}_activation"]["args"].split(",") if layer.activation else []
        if len(act) > 1:
            a = np.array(arrays[f"{layer.name}_activation_element"]["values"], np.int64)
            layer.alpha = IntTensor(a, int(act[2]))
    return net


@pytest.mark.parametrize("target", ["esp32", "esp32s3"])
def test_tutorial_logits_from_convert_tool_output(target):
    """Checklist item: the tool's own golden arrays + the app input give the chip's logits."""
    net = _golden_network(target)
    ours = load_network(DATA / "espdl_v1_tutorial", APP / "mnist_graph.json")
    for mine, tool in zip(ours.layers, net.layers, strict=True):
        if mine.filter is not None:
            assert np.array_equal(mine.filter.values, tool.filter.values)
            assert mine.filter.exponent == tool.filter.exponent
    out = simulate_chip(net, app_input(), target=target).output.values.ravel().tolist()
    assert out == chip_logits()[target]
