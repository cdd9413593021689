"""Reading and writing ESP-DL v3 ``.espdl`` files (amct_bridge.espdl.v3.reader / writer).

The fixtures in tests/data/espdl_v3 are Espressif's (MIT, esp-dl 12c0616d; README there).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from espdl_v3_layouts import encode_filter

from amct_bridge.espdl.v3 import (
    EspdlError,
    EspdlModel,
    Node,
    Tensor,
    ValueInfo,
    espdl_bytes,
    filter_nhwc,
    parse_espdl,
    read_espdl,
    read_espdl_pack,
    write_espdl,
)

DATA = Path(__file__).parent.parent / "data" / "espdl_v3"
FIXTURES = sorted(DATA.glob("*.espdl"))
GEMM16 = "test_apps_{}_Gemm_linear_ishap_1_16_kshap_16_16_relu_s8.espdl"
STREAMING = DATA / (
    "tutorial_how_to_deploy_streaming_model_test_streaming_model_main_models_esp32s3_model.espdl"
)
DETECT = DATA / "cat_detect_models_s3_espdet_pico_224_224_cat.espdl"


def test_the_fixtures_are_there():
    assert len(FIXTURES) == 8


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name[:40])
def test_every_fixture_reads(path):
    model = read_espdl(path)
    assert model.nodes and model.initializers and model.inputs and model.outputs
    names = set(model.initializers) | {v.name for v in model.inputs}
    for node in model.nodes:  # a graph in order: every input exists before its node
        assert all(not i or i in names for i in node.inputs), node.name
        names |= set(node.outputs)
    for tensor in model.initializers.values():
        assert len(tensor.exponents) == 1
        assert tensor.data.size == int(np.prod(tensor.dims))
    assert all(len(v.exponents) == 1 for v in (*model.inputs, *model.outputs))


def test_fixture_contents_as_published():
    streaming = read_espdl(STREAMING)
    ops = [n.op_type for n in streaming.nodes]
    assert ops.count("Conv") == 8 and {"Sigmoid", "Mul", "Add", "AveragePool"} <= set(ops)
    assert {"Transpose", "Slice", "Flatten", "Gemm"} <= set(ops)
    dw = streaming.nodes[5]
    assert dw.attributes == {
        "activation": "Relu",
        "dilations": [2],
        "group": 32,
        "kernel_shape": [3],
        "pads": [4, 0],
        "quant_type": "S8",
        "strides": [1],
    }
    lut = streaming.initializers["Sigmoid_lut_0"]
    assert lut.dims == [256] and lut.data.dtype == np.int8 and lut.exponents == [-8]
    assert streaming.inputs[0].shape == [1, 24, 16] and streaming.inputs[0].exponents == [-5]
    gemm = read_espdl(DATA / GEMM16.format("esp32s3"))
    assert gemm.target == "esp32s3" and gemm.ir_version == 7
    bias = gemm.initializers["ops.0.bias"]
    assert bias.data.dtype == np.int32 and bias.exponents == [-14]
    assert gemm.initializers["ops.0.weight"].layout == "(N/16)HWC16"
    detect = read_espdl(DETECT)
    assert len(detect.nodes) == 130 and len(detect.initializers) == 219
    assert {n.op_type for n in detect.nodes} == {
        "Conv",
        "Add",
        "Concat",
        "MaxPool",
        "RequantizeLinear",
        "Resize",
        "Split",
    }


def test_the_three_targets_hold_the_same_gemm():
    """One model exported for c, esp32s3 and esp32p4: its filter decodes to the same weights
    from the plain (c) and the blocked (16 output channels) layouts."""
    weights = []
    for target in ("c", "esp32s3", "esp32p4"):
        model = read_espdl(DATA / GEMM16.format(target))
        weights.append(filter_nhwc(model.initializers["ops.0.weight"], 1, target))
        assert model.target == target
    assert np.array_equal(weights[0], weights[1]) and np.array_equal(weights[1], weights[2])
    stored = [
        read_espdl(DATA / GEMM16.format(t)).initializers["ops.0.weight"] for t in ("c", "esp32s3")
    ]
    assert not np.array_equal(stored[0].data, stored[1].data)  # the byte orders do differ


def _same(a: EspdlModel, b: EspdlModel) -> None:
    assert [n.__dict__ for n in a.nodes] == [n.__dict__ for n in b.nodes]
    assert list(a.initializers) == list(b.initializers)
    for name, tensor in a.initializers.items():
        other = b.initializers[name]
        assert other.data.dtype == tensor.data.dtype and other.dims == tensor.dims
        assert np.array_equal(other.data, tensor.data), name
        assert other.exponents == tensor.exponents and other.doc_string == tensor.doc_string
    assert a.inputs == b.inputs and a.outputs == b.outputs and a.value_info == b.value_info
    for x, y in zip(
        (*a.test_inputs, *a.test_outputs), (*b.test_inputs, *b.test_outputs), strict=True
    ):
        assert x.name == y.name and x.exponents == y.exponents and np.array_equal(x.data, y.data)
    assert a.metadata == b.metadata and a.ir_version == b.ir_version


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name[:40])
def test_round_trip(path, tmp_path):
    model = read_espdl(path)
    out = tmp_path / "copy.espdl"
    write_espdl(model, out)
    again = read_espdl(out)
    _same(model, again)
    data = out.read_bytes()
    assert data[:4] == b"EDL2" and len(data) % 16 == 0
    assert struct.unpack_from("<III", data, 4)[::2] == (0, 0)
    write_espdl(again, out)  # and once more: stable
    assert out.read_bytes() == data


def test_write_is_atomic(tmp_path, monkeypatch):
    """A failing write leaves the old file whole and no temporary file behind."""
    out = tmp_path / "m.espdl"
    write_espdl(read_espdl(DATA / GEMM16.format("c")), out)
    before = out.read_bytes()
    import amct_bridge.espdl.v3.writer as writer

    def broken(model):
        raise OSError("disk full")

    monkeypatch.setattr(writer, "espdl_bytes", broken)
    with pytest.raises(OSError):
        write_espdl(EspdlModel([], {}), out)
    assert out.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["m.espdl"]


def test_attribute_kinds_round_trip():
    t = Tensor("t", np.array([[1, 2]], np.int16), [-3])
    node = Node(
        "n",
        "Custom",
        ["x", ""],
        ["y"],
        {"i": 3, "f": 0.5, "s": "Relu", "ints": [1, -2], "floats": [0.25], "strs": ["a"], "t": t},
    )
    node.attributes["empty"] = []
    model = EspdlModel([node], {}, inputs=[ValueInfo("x", [1, "batch"], 5, [-2])])
    back = parse_espdl(espdl_bytes(model))
    attrs = back.nodes[0].attributes
    assert {k: v for k, v in attrs.items() if k != "t"} == {
        "i": 3,
        "f": 0.5,
        "s": "Relu",
        "ints": [1, -2],
        "floats": [0.25],
        "strs": ["a"],
        "empty": [],
    }
    assert np.array_equal(attrs["t"].data, t.data) and attrs["t"].exponents == [-3]
    assert back.nodes[0].inputs == ["x", ""]
    assert back.inputs[0].shape == [1, "batch"] and back.inputs[0].elem_type == 5


def test_rank0_tensor_is_written_as_one_element():
    model = EspdlModel([], {"s": Tensor("s", np.array(7, np.int64), [0])})
    assert parse_espdl(espdl_bytes(model)).initializers["s"].dims == [1]


def _corrupt(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_bad_magic_mode_and_truncation_are_named(tmp_path):
    good = (DATA / GEMM16.format("c")).read_bytes()
    bad = _corrupt(tmp_path, "magic.espdl", b"ONNX" + good[4:])
    with pytest.raises(EspdlError, match=r"magic.espdl: bad magic b'ONNX', expected b'EDL2'"):
        read_espdl(bad)
    aes = _corrupt(tmp_path, "aes.espdl", good[:4] + struct.pack("<I", 1) + good[8:])
    with pytest.raises(EspdlError, match=r"aes.espdl: mode 1 is encrypted \(AES-128-CTR\)"):
        read_espdl(aes)
    short = _corrupt(tmp_path, "short.espdl", good[:1000])
    with pytest.raises(
        EspdlError, match=r"short.espdl: truncated: header says 1776 bytes of model, only 984"
    ):
        read_espdl(short)
    tiny = _corrupt(tmp_path, "tiny.espdl", b"EDL2\0\0")
    with pytest.raises(EspdlError, match="tiny.espdl: truncated"):
        read_espdl(tiny)
    garbage = _corrupt(tmp_path, "garbage.espdl", good[:16] + bytes([0xFF]) * (len(good) - 16))
    with pytest.raises(EspdlError, match="garbage.espdl: not a valid espdl.Model FlatBuffer"):
        read_espdl(garbage)
    with pytest.raises(EspdlError, match="missing.espdl: cannot read"):
        read_espdl(tmp_path / "missing.espdl")


def test_edl1_framing_reads_the_same_model():
    data = (DATA / GEMM16.format("esp32p4")).read_bytes()
    mode, length = struct.unpack_from("<II", data, 4)
    edl1 = b"EDL1" + struct.pack("<II", mode, length) + data[16 : 16 + length]
    _same(parse_espdl(data), parse_espdl(edl1))


def _pack(models: dict[str, bytes]) -> bytes:
    """A PDL2 pack laid out as fbs_loader.hpp describes: table, names, padding, EDL2 models."""
    count = len(models)
    names = b"".join(n.encode() for n in models)
    head = 8 + 12 * count
    body_start = head + len(names)
    body_start += -body_start % 16
    table, name_at, data_at = b"", head, body_start
    bodies = b""
    for name, data in models.items():
        table += struct.pack("<III", data_at, name_at, len(name))
        name_at += len(name)
        data_at += len(data)
        bodies += data
    pack = b"PDL2" + struct.pack("<I", count) + table + names
    return pack + bytes(body_start - len(pack)) + bodies


def test_pdl2_pack(tmp_path):
    a = (DATA / GEMM16.format("c")).read_bytes()
    b = (DATA / "tutorial_how_to_run_model_main_models_s3_model.espdl").read_bytes()
    path = tmp_path / "pack.espdl"
    path.write_bytes(_pack({"gemm": a, "run": b}))
    models = read_espdl_pack(path)
    assert list(models) == ["gemm", "run"]
    _same(models["gemm"], parse_espdl(a))
    _same(read_espdl(path, "run"), parse_espdl(b))
    with pytest.raises(EspdlError, match=r"pack holds models 'gemm', 'run'; choose one"):
        read_espdl(path)
    path.write_bytes(_pack({"gemm": a})[:20])
    with pytest.raises(EspdlError, match="pack.espdl: truncated pack"):
        read_espdl(path)


@pytest.mark.parametrize("target", ["c", "esp32s3"])
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
@pytest.mark.parametrize("group", [1, "dw"])
@pytest.mark.parametrize("n", [5, 16, 21])
def test_filter_layouts_decode(target, dtype, group, n):
    rng = np.random.default_rng(n)
    c = n if group == "dw" else 3
    g = n if group == "dw" else 1
    w = rng.integers(-100, 100, (n, 2, 3, 1 if group == "dw" else c)).astype(dtype)
    stored = Tensor("w", encode_filter(w, g, target))
    assert np.array_equal(filter_nhwc(stored, g, target), w)
