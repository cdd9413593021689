"""The ESP-DL v3 simulator (amct_bridge.espdl.v3.simulate) against Espressif's test values and,
for ops no fixture covers, against independent loop-by-loop references of the runtime's
integer formulas (each test names the esp-dl source file it follows; esp-dl 12c0616d).
"""

from __future__ import annotations

import math
from fractions import Fraction
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
    infer_target,
    read_espdl,
    simulate_espdl,
    supported_ops,
)
from amct_bridge.espdl.v3.simulate import round_float, shift_round

DATA = Path(__file__).parent.parent / "data" / "espdl_v3"
WITH_TESTS = [p for p in sorted(DATA.glob("*.espdl")) if read_espdl(p).test_inputs]


def test_seven_fixtures_carry_test_values():
    assert len(WITH_TESTS) == 7


@pytest.mark.parametrize("path", WITH_TESTS, ids=lambda p: p.name[:40])
def test_fixture_test_outputs_bit_for_bit(path):
    model = read_espdl(path)
    result = simulate_espdl(model)
    for expected in model.test_outputs:
        got = result.outputs[expected.name]
        assert got.dtype == expected.data.dtype
        assert np.array_equal(got.reshape(expected.dims), expected.data), expected.name
    assert result.notes == []


@pytest.mark.parametrize(
    "path", [p for p in WITH_TESTS if "_c_" not in p.name], ids=lambda p: p.name[:40]
)
def test_fixture_fails_with_the_wrong_layout(path):
    """The check is not vacuous: read as the c target (plain filter order) the blocked files
    give other outputs."""
    model = read_espdl(path)
    result = simulate_espdl(model, target="c")
    assert any(
        not np.array_equal(result.outputs[t.name].reshape(t.dims), t.data)
        for t in model.test_outputs
    )


def test_target_inference():
    by_name = {p.name: infer_target(read_espdl(p)) for p in WITH_TESTS}
    assert by_name["test_apps_c_Gemm_linear_ishap_1_16_kshap_16_16_relu_s8.espdl"][0] == "c"
    s3, p4 = (
        by_name[f"tutorial_how_to_deploy_streaming_model_test_streaming_model_main_models_{c}_model"
                ".espdl"]
        for c in ("esp32s3", "esp32p4")
    )  # fmt: skip
    # no target metadata, the same blocked layouts: only the path tells the chips apart
    assert s3 == ("esp32s3", "no target in the file; its path names esp32s3")
    assert p4 == ("esp32p4", "no target in the file; its path names esp32p4")
    bare = read_espdl(DATA / "tutorial_how_to_deploy_streaming_model_test_streaming_model_main_"
                      "models_esp32p4_model.espdl")  # fmt: skip
    bare.source = "model.espdl"
    assert infer_target(bare) == (
        "esp32s3",
        "no target in the file; blocked filter layouts (esp32s3 or esp32p4): esp32s3 assumed "
        "(pass --target esp32p4 for a PIE-V2 chip)",
    )
    with pytest.raises(EspdlError, match="unknown target 'esp32s9'"):
        infer_target(EspdlModel([], {}), "esp32s9")


# --- rounding: dl_tool.cpp shift_and_round_half_up / shift_and_round_half_even / round


def _ref_shift(x: int, s: int, half_even: bool) -> int:
    if s <= 0:
        return x * 2**-s
    q = Fraction(x, 2**s)
    return round(q) if half_even else (x + 2 ** (s - 1)) // 2**s  # round(): ties to even


def test_shift_round_against_exact_fractions():
    xs = list(range(-70, 71)) + [2**31 - 1, -(2**31), 3 * 2**40 + 2**39]
    for s in (-3, 0, 1, 2, 5, 7, 20):
        for half_even in (False, True):
            got = shift_round(np.array(xs), s, half_even).tolist()
            assert got == [_ref_shift(x, s, half_even) for x in xs], (s, half_even)


def test_round_float():
    """tool::round: floor(x + 0.5) (half up) on esp32s3/c, rne on esp32p4."""
    x = np.float32([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.4999998, -0.50000006])
    assert round_float(x, False).tolist() == [-2, -1, 0, 1, 2, 3, 2, -1]
    assert round_float(x, True).tolist() == [-2, -2, 0, 0, 2, 2, 2, -1]


# --- builders for the op tests


def _model(nodes, inits, inputs, outputs, infos=(), target="esp32s3"):
    return EspdlModel(
        nodes,
        {t.name: t for t in inits},
        inputs=list(inputs),
        outputs=list(outputs),
        value_info=list(infos),
        metadata={"target": target},
    )


def _vi(name, array_or_shape, exponent, dtype=np.int8):
    shape = (
        list(np.shape(array_or_shape)) if not isinstance(array_or_shape, list) else array_or_shape
    )
    return ValueInfo(name, shape, 3 if dtype == np.int8 else 5, [exponent])


def _ref_conv(x, w, bias, pads, strides, dilations, depthwise, shift, relu, half_even, dtype):
    """dl_base_conv2d.cpp conv2d_hwcn / dl_base_depthwise_conv2d.cpp, one output at a time:
    acc = sum x[y*sy - top + ky*dy, x*sx - left + kx*dx, c] * w[n, ky, kx, c] (zero outside),
    + bias, then dl_base_activate_buffer.hpp: shift_and_round(acc, mac_shift), relu, truncate."""
    b, h, wd, c = x.shape
    n, kh, kw, _ = w.shape
    top, left, bottom, right = pads
    sy, sx = strides
    dy, dx = dilations
    ho = (h + top + bottom - dy * (kh - 1) - 1) // sy + 1
    wo = (wd + left + right - dx * (kw - 1) - 1) // sx + 1
    info = np.iinfo(dtype)
    out = np.zeros((b, ho, wo, n), dtype)
    for bi in range(b):
        for oy in range(ho):
            for ox in range(wo):
                for o in range(n):
                    acc = 0
                    for ky in range(kh):
                        for kx in range(kw):
                            iy, ix = oy * sy - top + ky * dy, ox * sx - left + kx * dx
                            if not (0 <= iy < h and 0 <= ix < wd):
                                continue
                            if depthwise:
                                acc += int(x[bi, iy, ix, o]) * int(w[o, ky, kx, 0])
                            else:
                                acc += sum(
                                    int(x[bi, iy, ix, ci]) * int(w[o, ky, kx, ci])
                                    for ci in range(c)
                                )
                    if bias is not None:
                        acc += int(bias[o])
                    v = _ref_shift(acc, shift, half_even)
                    if relu:
                        v = max(v, 0)
                    out[bi, oy, ox, o] = min(max(v, info.min), info.max)
    return out


CONV_CASES = {
    # name: (target, dtype, cin, cout, kernel, pads [t, l, b, r], strides, dilations, depthwise)
    "s3_s8_stride2_pads": ("esp32s3", np.int8, 5, 21, (3, 3), (1, 1, 1, 0), (2, 2), (1, 1), False),
    "p4_s8_dilated_relu": ("esp32p4", np.int8, 4, 16, (3, 2), (2, 0, 2, 1), (1, 2), (2, 1), False),
    "c_s8_plain": ("c", np.int8, 3, 7, (2, 2), (0, 0, 1, 1), (1, 1), (1, 1), False),
    "s3_s16_unaligned": ("esp32s3", np.int16, 3, 12, (3, 3), (1, 1, 1, 1), (1, 1), (1, 1), False),
    "s3_dw_s8_dilated": ("esp32s3", np.int8, 20, 20, (3, 3), (2, 2, 2, 2), (1, 1), (2, 2), True),
    "p4_dw_s16": ("esp32p4", np.int16, 10, 10, (3, 3), (1, 0, 1, 0), (2, 1), (1, 1), True),
    "c_dw_s8_stride": ("c", np.int8, 6, 6, (3, 3), (1, 1, 1, 1), (2, 2), (1, 1), True),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
@pytest.mark.parametrize("relu", [False, True])
def test_conv2d_against_loop_reference(case, relu):
    target, dtype, cin, cout, kernel, pads, strides, dilations, depthwise = CONV_CASES[case]
    rng = np.random.default_rng(len(case) + relu)
    hi = 127 if dtype == np.int8 else 2000
    x = rng.integers(-hi, hi, (1, 9, 8, cin)).astype(dtype)
    w = rng.integers(-hi, hi, (cout, *kernel, 1 if depthwise else cin)).astype(dtype)
    bias = rng.integers(-5000, 5000, cout).astype(np.int32 if dtype == np.int8 else np.int64)
    e_in, e_w, e_out = -5, -7, -4 if dtype == np.int8 else -2
    group = cin if depthwise else 1
    attrs = {
        "activation": "Relu" if relu else "Linear",
        "group": group,
        "kernel_shape": list(kernel),
        "pads": [pads[0], pads[1], pads[2], pads[3]],  # ONNX order [top, left, bottom, right]
        "strides": list(strides),
        "dilations": list(dilations),
        "quant_type": "S8" if dtype == np.int8 else "S16",
    }
    filt = Tensor("w", encode_filter(w, group, target), [e_w])
    model = _model(
        [Node("conv", "Conv", ["x", "w", "b"], ["y"], attrs)],
        [filt, Tensor("b", bias, [e_in + e_w])],
        [_vi("x", x, e_in, dtype)],
        [_vi("y", [1], e_out, dtype)],
        target=target,
    )
    got = simulate_espdl(model, {"x": x}).outputs["y"]
    shift = e_out - e_w - e_in
    want = _ref_conv(
        x, w, bias, pads, strides, dilations, depthwise, shift, relu, target == "esp32p4", dtype
    )
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_conv_half_even_differs_from_half_up_on_ties():
    """One 1x1 conv whose accumulators land on .5 exactly: esp32p4 rounds to even."""
    x = np.array([[[[1], [3], [5], [-1], [-3]]]], np.int8)  # times weight 1, shift 1
    w = np.ones((1, 1, 1, 1), np.int8)
    outs = {}
    for target in ("esp32s3", "esp32p4", "c"):
        model = _model(
            [Node("c", "Conv", ["x", "w"], ["y"], {"group": 1, "quant_type": "S8"})],
            [Tensor("w", encode_filter(w, 1, target), [0])],
            [_vi("x", x, 0)],
            [_vi("y", [1], 1)],
            target=target,
        )
        outs[target] = simulate_espdl(model, {"x": x}).outputs["y"].reshape(-1).tolist()
    assert outs["esp32s3"] == outs["c"] == [1, 2, 3, 0, -1]  # (x + 1) >> 1
    assert outs["esp32p4"] == [0, 2, 2, 0, -2]


def test_conv_refuses_grouped_and_other_activations():
    x = np.zeros((1, 2, 2, 4), np.int8)
    w = Tensor("w", np.zeros((1, 1, 4, 1), np.int8), [0])  # [kh, kw, C, N]
    for attrs, match in (
        ({"group": 2}, "group 2"),
        ({"group": 1, "activation": "LeakyRelu"}, "fused activation 'LeakyRelu'"),
    ):
        model = _model(
            [Node("/c/Conv", "Conv", ["x", "w"], ["y"], attrs)],
            [w],
            [_vi("x", x, 0)],
            [_vi("y", [1], 0)],
            target="c",
        )
        with pytest.raises(EspdlError, match=rf"node '/c/Conv' \(Conv\): {match}"):
            simulate_espdl(model, {"x": x})


def test_unknown_op_is_refused_by_name():
    model = _model(
        [Node("/m/Foo", "Einsum", ["x"], ["y"])], [], [_vi("x", [1], 0)], [_vi("y", [1], 0)]
    )
    with pytest.raises(EspdlError, match=r"node '/m/Foo': op 'Einsum' is not simulated"):
        simulate_espdl(model, {"x": np.zeros(1, np.int8)})
    assert "Einsum" not in supported_ops()


def test_esp32s3_int8_bias_keeps_20_bits():
    """dl_tensor_base.cpp reset_bias_layout on esp32s3: the aligned channels' int32 biases are
    packed as 20-bit lanes (src & 0xfffff) for the QACC registers; the rest stays 64-bit."""
    n = 17
    x = np.zeros((1, 1, 1, 1), np.int8)
    w = np.zeros((n, 1, 1, 1), np.int8)
    bias = np.full(n, (1 << 19) + 5, np.int32)  # beyond 20 signed bits
    outs = {}
    for target in ("esp32s3", "c"):
        model = _model(
            [Node("c", "Conv", ["x", "w", "b"], ["y"], {"group": 1, "quant_type": "S8"})],
            [Tensor("w", encode_filter(w, 1, target), [0]), Tensor("b", bias, [0])],
            [_vi("x", x, 0)],
            [_vi("y", [1], 20)],
            target=target,
        )
        outs[target] = simulate_espdl(model, {"x": x}).outputs["y"].reshape(-1)
    # (2^19 + 5) wraps to -2^19 + 5 on the 16 aligned esp32s3 channels: >> 20 rounds to 0
    assert outs["esp32s3"][:16].tolist() == [0] * 16 and outs["esp32s3"][16] == 1
    assert outs["c"].tolist() == [1] * n


# --- element-wise: dl_base_mul.cpp, dl_base_add.cpp, dl_base_sub.cpp


def test_mul_add_sub_with_broadcast():
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (1, 3, 16)).astype(np.int8)
    b = rng.integers(-128, 128, (1, 1, 16)).astype(np.int8)
    model = _model(
        [
            Node("mul", "Mul", ["a", "b"], ["m"], {"quant_type": "S8"}),
            Node("add", "Add", ["m", "c"], ["s"], {"quant_type": "S8"}),
            Node("sub", "Sub", ["s", "c"], ["d"], {"quant_type": "S8"}),
        ],
        [],
        [_vi("a", a, -4), _vi("b", b, -5), _vi("c", a, -6)],
        [_vi("d", a, -6)],
        [_vi("m", a, -6), _vi("s", a, -6)],
        target="esp32p4",
    )
    c = rng.integers(-128, 128, a.shape).astype(np.int8)
    r = simulate_espdl(model, {"a": a, "b": b, "c": c})
    # mul: round_half_even(a*b * 2^(-4-5+6)) = shift by 3; add/sub: saturating integer sums
    prod = a.astype(int) * b.astype(int)
    m = np.array([_ref_shift(int(v), 3, True) for v in prod.reshape(-1)]).reshape(a.shape)
    m = np.clip(m, -128, 127)
    assert np.array_equal(r.values["m"], m)
    s = np.clip(m + c.astype(int), -128, 127)
    assert np.array_equal(r.values["s"], s)
    assert np.array_equal(r.outputs["d"], np.clip(s - c.astype(int), -128, 127))
    assert r.notes == []


def test_add_with_different_exponents_is_noted():
    """The v3 elementwise Add (dl_base_add.cpp c_impl_add_n_n, dl_tie728_s8_add2d_11c) adds
    the integers without any rescaling: simulated the same, with a note."""
    model = _model(
        [Node("/add", "Add", ["a", "b"], ["y"], {"quant_type": "S8"})],
        [],
        [_vi("a", [2], -4), _vi("b", [2], -5)],
        [_vi("y", [2], -4)],
    )
    r = simulate_espdl(model, {"a": np.int8([100, 1]), "b": np.int8([100, 2])})
    assert r.outputs["y"].tolist() == [127, 3]
    assert "exponents -4, -5 -> -4 differ" in r.notes[0]


# --- LUT: dl_module_lut.hpp (int8: table[x + 128]; int16: nearest step, dl_base_lut.cpp)


def test_lut_int8_and_int16():
    table8 = np.arange(256, dtype=np.int16).astype(np.int8)[::-1].copy()
    model = _model(
        [Node("s", "Sigmoid", ["x"], ["y"], {"lut": "t", "quant_type": "S8"})],
        [Tensor("t", table8, [-7])],
        [_vi("x", [4], -4)],
        [_vi("y", [4], -7)],
    )
    x = np.int8([-128, -1, 0, 127])
    assert simulate_espdl(model, {"x": x}).outputs["y"].tolist() == [
        table8[0],
        table8[127],
        table8[128],
        table8[255],
    ]
    table16 = np.arange(0, 65536 // 256 + 1, dtype=np.int16) * 3  # step 256
    model16 = _model(
        [Node("t", "LUT", ["x", "t"], ["y"], {"quant_type": "S16"})],
        [Tensor("t", table16, [-7])],
        [_vi("x", [4], -4, np.int16)],
        [_vi("y", [4], -7, np.int16)],
        target="esp32s3",
    )
    x16 = np.int16([-32768, -32768 + 128, -32768 + 127, 32767])
    # index = (x + 32768) / 256 rounded half up on esp32s3 (remainder >= half)
    got = simulate_espdl(model16, {"x": x16}).outputs["y"].tolist()
    assert got == [table16[0], table16[1], table16[0], table16[256]]


# --- pooling: dl_base_max_pool2d.cpp, dl_base_avg_pool2d.cpp (CONFIG_ACCURATE_INFER path)


def test_maxpool_2d_with_pads():
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (1, 6, 5, 3)).astype(np.int8)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2], "quant_type": "S8"}
    model = _model(
        [Node("p", "MaxPool", ["x"], ["y"], attrs)], [], [_vi("x", x, -3)], [_vi("y", [1], -3)]
    )
    got = simulate_espdl(model, {"x": x}).outputs["y"]
    want = np.zeros((1, 3, 3, 3), np.int8)
    for oy in range(3):
        for ox in range(3):
            ys = range(max(0, 2 * oy - 1), min(6, 2 * oy + 2))
            xs = range(max(0, 2 * ox - 1), min(5, 2 * ox + 2))
            want[0, oy, ox] = np.max(x[0][np.ix_(list(ys), list(xs))], axis=(0, 1))
    assert np.array_equal(got, want)


@pytest.mark.parametrize("target", ["esp32s3", "esp32p4"])
def test_average_pool_2d_full_area_float_scale(target):
    """avgpool2d_hwc: round(float32(sum) * (2^e_in * (1/area) * 2^-e_out)), area the whole
    kernel even at padded borders (avg_pool_area is not updated on the C path)."""
    rng = np.random.default_rng(6)
    x = rng.integers(-128, 128, (1, 5, 4, 2)).astype(np.int8)
    attrs = {"kernel_shape": [2, 3], "pads": [1, 1, 0, 1], "strides": [1, 1], "quant_type": "S8"}
    model = _model(
        [Node("a", "AveragePool", ["x"], ["y"], attrs)],
        [],
        [_vi("x", x, -4)],
        [_vi("y", [1], -5)],
        target=target,
    )
    got = simulate_espdl(model, {"x": x}).outputs["y"]
    xp = np.pad(x.astype(np.int64), ((0, 0), (1, 0), (1, 1), (0, 0)))
    scale = np.float32(2.0**-4) * np.float32(1 / np.float32(6)) * np.float32(2.0**5)
    want = np.zeros((1, 5, 4, 2), np.int64)
    for oy in range(5):
        for ox in range(4):
            total = xp[0, oy : oy + 2, ox : ox + 3].sum(axis=(0, 1)).astype(np.float32)
            v = total * scale
            want[0, oy, ox] = np.rint(v) if target == "esp32p4" else np.floor(np.float32(v + 0.5))
    assert np.array_equal(got, np.clip(want, -128, 127))


def test_global_average_pool():
    x = np.arange(-8, 8, dtype=np.int8).reshape(1, 2, 2, 4)
    model = _model(
        [Node("g", "GlobalAveragePool", ["x"], ["y"], {"quant_type": "S8"})],
        [],
        [_vi("x", x, -2)],
        [_vi("y", [1, 1, 1, 4], -2)],
    )
    # per channel: (c-8 + c-4 + c + c+4) / 4 = c - 2, c = 0..3; half up
    assert simulate_espdl(model, {"x": x}).outputs["y"].reshape(-1).tolist() == [-2, -1, 0, 1]


# --- shape ops and requantization


def test_concat_split_reshape_squeeze_transpose():
    x = np.arange(24, dtype=np.int8).reshape(1, 2, 3, 4)
    nodes = [
        Node("split", "Split", ["x", "sizes"], ["a", "b"], {"axis": 3}),
        Node("cat", "Concat", ["b", "a"], ["c"], {"axis": 3}),
        Node("rs", "Reshape", ["c", "shape"], ["r"]),
        Node("un", "Unsqueeze", ["r", "axes"], ["u"]),
        Node("sq", "Squeeze", ["u", "axes"], ["s"]),
        Node("tr", "Transpose", ["s"], ["t"], {"perm": [0, 2, 1]}),
        Node("fl", "Flatten", ["t"], ["f"], {"axis": 1}),
    ]
    inits = [
        Tensor("sizes", np.array([1, 3], np.int64), [0]),
        Tensor("shape", np.array([0, -1, 4], np.int64), [0]),
        Tensor("axes", np.array([1], np.int64), [0]),
    ]
    infos = [_vi(n, [1], 0) for n in "abcrust"]
    model = _model(nodes, inits, [_vi("x", x, 0)], [_vi("f", [1], 0)], infos)
    r = simulate_espdl(model, {"x": x})
    c = np.concatenate([x[..., 1:], x[..., :1]], axis=3)
    assert np.array_equal(r.values["c"], c)
    assert r.values["u"].shape == (1, 1, 6, 4) and r.values["s"].shape == (1, 6, 4)
    assert np.array_equal(r.outputs["f"], c.reshape(1, 6, 4).transpose(0, 2, 1).reshape(1, 24))


def test_slice_with_steps_and_large_end():
    x = np.arange(30, dtype=np.int8).reshape(1, 5, 6)
    inits = [
        Tensor("st", np.array([1, -1], np.int64), [0]),
        Tensor("en", np.array([2**63 - 1, -7], np.int64), [0]),
        Tensor("ax", np.array([1, 2], np.int64), [0]),
        Tensor("sp", np.array([2, -2], np.int64), [0]),
    ]
    model = _model(
        [Node("s", "Slice", ["x", "st", "en", "ax", "sp"], ["y"])],
        inits,
        [_vi("x", x, 0)],
        [_vi("y", [1], 0)],
    )
    assert np.array_equal(simulate_espdl(model, {"x": x}).outputs["y"], x[:, 1::2, ::-2])


def test_resize_nearest_uses_nchw_scales():
    """dl_module_resize.hpp: the data is NHWC but scales keep ONNX's NCHW order; nearest is
    asymmetric/floor (dl_base_resize.cpp)."""
    x = np.arange(12, dtype=np.int8).reshape(1, 2, 3, 2)
    model = _model(
        [Node("r", "Resize", ["x", "", "sc"], ["y"], {"mode": "nearest", "quant_type": "S8"})],
        [Tensor("sc", np.array([1, 1, 2, 2], np.float32), [0])],
        [_vi("x", x, -3)],
        [_vi("y", [1], -3)],
    )
    got = simulate_espdl(model, {"x": x}).outputs["y"]
    assert np.array_equal(got, x.repeat(2, axis=1).repeat(2, axis=2))


@pytest.mark.parametrize("target", ["esp32s3", "esp32p4"])
def test_requantize_linear(target):
    """dl_base_requantize_linear.cpp: shift = e_out - e_in, rounded (ties: target), saturated."""
    x = np.int8([-128, -3, -2, -1, 1, 2, 3, 5, 127])
    model = _model(
        [Node("q", "RequantizeLinear", ["x", "s", "z"], ["y"], {"quant_type": "S8"})],
        [],
        [_vi("x", x, -6)],
        [_vi("y", [1], -5)],
        target=target,
    )
    got = simulate_espdl(model, {"x": x}).outputs["y"].tolist()
    assert got == [_ref_shift(int(v), 1, target == "esp32p4") for v in x]
    up = _model(
        [Node("q", "RequantizeLinear", ["x"], ["y"], {"quant_type": "S16"})],
        [],
        [_vi("x", x, -6)],
        [_vi("y", [1], -8, np.int16)],
        target=target,
    )
    assert simulate_espdl(up, {"x": x}).outputs["y"].tolist() == [4 * int(v) for v in x]


def test_inputs_are_checked():
    model = _model([Node("r", "Relu", ["x"], ["y"])], [], [_vi("x", [2], 0)], [_vi("y", [2], 0)])
    with pytest.raises(EspdlError, match="must hold integers"):
        simulate_espdl(model, {"x": np.zeros(2)})
    with pytest.raises(EspdlError, match="no value for input"):
        simulate_espdl(model, {"z": np.zeros(2, np.int8)})
    with pytest.raises(EspdlError, match="no inputs given and the file has no test inputs"):
        simulate_espdl(model)
    with pytest.raises(EspdlError, match=r"input 'x' holds -200..0, beyond int8"):
        simulate_espdl(model, {"x": np.array([-200, 0])})
    assert simulate_espdl(model, [np.array([-3, 4])]).outputs["y"].dtype == np.int8


# --- float-path activations (no LUT), Clip, MatMul


def _ref_float_act(op: str, v: int, e_in: int, e_out: int, half_even: bool, attrs: dict) -> int:
    """One element as the module's forward_template writes it (dl_module_sigmoid.hpp,
    _tanh.hpp, _swish.hpp, _hard_sigmoid.hpp, _hard_swish.hpp, _leaky_relu.hpp; dl_math.hpp's
    sigmoid = 1.0 / (1.0 + expf(-x))), scalar by scalar in float32 / double as the C does."""
    f32 = np.float32
    temp = f32(v) * f32(2.0**e_in)
    out_scale = f32(2.0**-e_out)

    def sigmoid(t):
        return f32(1.0 / (1.0 + float(np.exp(f32(-t)))))

    if op == "Sigmoid":
        y = sigmoid(temp) * out_scale
    elif op == "Tanh":
        y = (f32(2) * sigmoid(f32(2) * temp) - f32(1)) * out_scale
    elif op == "Swish":
        y = (sigmoid(temp) * temp) * out_scale
    elif op == "HardSwish":
        y = f32(max(0.0, min(1.0, 0.166667 * float(temp) + 0.5)) * float(temp)) * out_scale
    elif op == "HardSigmoid":
        alpha, beta = f32(attrs.get("alpha", 0.2)), f32(attrs.get("beta", 0.5))
        y = max(f32(0), min(f32(1), alpha * temp + beta)) * out_scale
    else:  # LeakyRelu
        y = temp * out_scale if temp >= 0 else temp * out_scale * f32(attrs.get("alpha", 0.01))
    y = f32(y)
    r = int(np.rint(y)) if half_even else int(np.floor(f32(float(y) + 0.5)))
    return min(max(r, -128), 127)


@pytest.mark.parametrize(
    "op", ["Sigmoid", "Tanh", "Swish", "HardSwish", "HardSigmoid", "LeakyRelu"]
)
@pytest.mark.parametrize("target", ["esp32s3", "esp32p4"])
def test_float_activations_without_lut(op, target):
    attrs = {"quant_type": "S8", **({"alpha": 0.25, "beta": 0.4} if op == "HardSigmoid" else {})}
    if op == "LeakyRelu":
        attrs["alpha"] = 0.1
    x = np.arange(-128, 128, dtype=np.int8)
    model = _model(
        [Node("a", op, ["x"], ["y"], attrs)],
        [],
        [_vi("x", x, -4)],
        [_vi("y", x, -6)],
        target=target,
    )
    got = simulate_espdl(model, {"x": x}).outputs["y"].tolist()
    want = [_ref_float_act(op, int(v), -4, -6, target == "esp32p4", attrs) for v in x]
    assert got == want


def test_float_activations_hand_worked():
    cases = [
        ("Sigmoid", 0, -4, -7, {}, 64),  # sigmoid(0) = 0.5 -> 0.5 * 2^7
        ("HardSigmoid", 16, -4, -7, {}, 90),  # 0.2 * 1.0 + 0.5 = 0.7 -> 89.6
        ("HardSwish", 48, -4, -4, {}, 48),  # 3.0 * min(1, 3 * 0.166667 + 0.5) = 3.0 -> 48
        ("LeakyRelu", -100, -4, -4, {"alpha": 0.01}, -1),  # -100 * 0.01 (float: -0.99999998)
    ]
    for op, v, e_in, e_out, attrs, want in cases:
        model = _model(
            [Node("a", op, ["x"], ["y"], {"quant_type": "S8", **attrs})],
            [],
            [_vi("x", [1], e_in)],
            [_vi("y", [1], e_out)],
        )
        assert int(simulate_espdl(model, {"x": np.int8([v])}).outputs["y"][0]) == want, op


@pytest.mark.parametrize("target", ["esp32s3", "esp32p4"])
def test_clip(target):
    """dl_module_clip.hpp: DL_CLIP on the integers, then round(temp * 2^e_in * 2^-e_out)."""
    x = np.arange(-40, 80, 3, dtype=np.int8)
    model = _model(
        [Node("c", "Clip", ["x", "lo", "hi"], ["y"], {"quant_type": "S8"})],
        [Tensor("lo", np.int8([-21]), [-4]), Tensor("hi", np.int8([61]), [-4])],
        [_vi("x", x, -4)],
        [_vi("y", x, -3)],
        target=target,
    )
    got = simulate_espdl(model, {"x": x}).outputs["y"].tolist()
    want = [_ref_shift(min(max(int(v), -21), 61), 1, target == "esp32p4") for v in x]
    assert got == want


@pytest.mark.parametrize("target", ["esp32s3", "c"])
def test_matmul_with_a_constant_matrix(target):
    """dl_module_matmul.hpp rank <= 2: a 1x1 conv with input 1 as the filter (no bias)."""
    rng = np.random.default_rng(9)
    x = rng.integers(-128, 128, (3, 20)).astype(np.int8)
    b = rng.integers(-128, 128, (20, 18)).astype(np.int8)  # [C, N]
    stored = encode_filter(b.T.reshape(18, 1, 1, 20), 1, target).reshape(20, 18)
    model = _model(
        [Node("mm", "MatMul", ["x", "b"], ["y"], {"quant_type": "S8"})],
        [Tensor("b", stored, [-7])],
        [_vi("x", x, -5)],
        [_vi("y", [3, 18], -4)],
        target=target,
    )
    got = simulate_espdl(model, {"x": x}).outputs["y"]
    acc = x.astype(np.int64) @ b.astype(np.int64)
    want = [[min(max(_ref_shift(int(v), 8, False), -128), 127) for v in row] for row in acc]
    assert got.tolist() == want


def test_quantize_and_dequantize_linear():
    """The runtime maps QuantizeLinear/DequantizeLinear onto RequantizeLinear, whose
    TensorBase::assign (dl_tensor_base.cpp) quantizes a float input as round(x * 2^-e) and
    dequantizes to float as x * 2^e."""
    x = np.float32([0.1, -0.3125, 0.15625, 7.9, -9.0])
    model = _model(
        [
            Node("q", "QuantizeLinear", ["x", "s", "z"], ["xq"], {"quant_type": "S8"}),
            Node("dq", "DequantizeLinear", ["xq", "s", "z"], ["y"], {"quant_type": "S8"}),
        ],
        [],
        [ValueInfo("x", [5], 1, [])],
        [ValueInfo("y", [5], 1, [-4])],
        [_vi("xq", [5], -4)],
        target="esp32p4",
    )
    r = simulate_espdl(model, {"x": x})
    # x * 16 = 1.6, -5.0, 2.5 (ties to even: 2), 126.4, -144 (saturates)
    assert r.values["xq"].tolist() == [2, -5, 2, 126, -128]
    assert r.outputs["y"].dtype == np.float32
    assert r.outputs["y"].tolist() == [0.125, -0.3125, 0.125, 7.875, -8.0]


@pytest.mark.parametrize("target", ["c", "esp32s3"])
def test_prelu(target):
    """c: dl_base_prelu.cpp prelu_11c (x >= 0 copied, else DL_RIGHT_SHIFT(x * alpha, shift));
    esp32s3: dl_tie728_s8_prelu.S (tie728_s8_vector_round_result on both sides, x > 0 rescaled
    by output_shift/output_scale)."""
    x = np.int8([[[[-128, -7, -1, 0, 1, 6, 7, 127] * 2]]])  # 16 channels
    alpha = np.int8(list(range(-8, 8)))
    model = _model(
        [Node("p", "PRelu", ["x", "a"], ["y"], {"quant_type": "S8"})],
        [Tensor("a", alpha, [-5])],
        [_vi("x", x, -4)],
        [_vi("y", x, -5)],
        target=target,
    )
    got = simulate_espdl(model, {"x": x}).outputs["y"].reshape(-1).tolist()
    shift = -5 - -4 - -5  # e_out - e_in - e_alpha = 4
    want = []
    for v, a in zip(x.reshape(-1).tolist(), alpha.tolist(), strict=True):
        if target == "c":
            r = v if v >= 0 else (v * a) >> shift
        elif v < 0:
            r = _ref_shift(v * a, shift, False)
        else:
            r = _ref_shift(v, -1, False)  # e_out - e_in = -1: doubled
        want.append(min(max(r, -128), 127))
    assert got == want
    with pytest.raises(EspdlError, match=r"node 'p' \(PRelu\): PRelu on esp32p4"):
        simulate_espdl(model, {"x": x}, "esp32p4")


def test_pad_modes():
    x = np.arange(6, dtype=np.int8).reshape(1, 2, 3)
    pads = Tensor("pads", np.array([0, 1, 2, 0, 0, 1], np.int64), [0])
    for mode, extra, want in (
        (
            "constant",
            [Tensor("v", np.int8([-3]), [0])],
            np.pad(x, ((0, 0), (1, 0), (2, 1)), constant_values=-3),
        ),
        ("edge", [], np.pad(x, ((0, 0), (1, 0), (2, 1)), mode="edge")),
        ("reflect", [], np.pad(x, ((0, 0), (1, 0), (2, 1)), mode="reflect")),
    ):
        inputs = ["x", "pads", "v"] if extra else ["x", "pads"]
        model = _model(
            [Node("p", "Pad", inputs, ["y"], {"mode": mode})],
            [pads, *extra],
            [_vi("x", x, 0)],
            [_vi("y", [1], 0)],
        )
        assert np.array_equal(simulate_espdl(model, {"x": x}).outputs["y"], want), mode
    # reflect by hand on the row [0, 1, 2] with 2 before and 1 after: [2, 1, 0, 1, 2, 1]
    assert np.pad(np.arange(3), (2, 1), mode="reflect").tolist() == [2, 1, 0, 1, 2, 1]


def test_reduce_mean():
    """dl_module_reduce_mean.hpp: round(float(sum) * 2^e_in / count * 2^-e_out)."""
    x = np.arange(-12, 12, dtype=np.int8).reshape(1, 2, 3, 4)
    model = _model(
        [Node("m", "ReduceMean", ["x", "axes"], ["y"], {"keepdims": 0, "quant_type": "S8"})],
        [Tensor("axes", np.array([1, 2], np.int64), [0])],
        [_vi("x", x, -3)],
        [_vi("y", [1, 4], -3)],
    )
    got = simulate_espdl(model, {"x": x}).outputs["y"]
    # channel c: mean of c-12, c-8, c-4, c, c+4, c+8 = c - 2 (exact), same exponent
    assert got.tolist() == [[-2, -1, 0, 1]]
    model.nodes[0].attributes["keepdims"] = 1
    model.outputs[0].exponents = [-2]  # (c - 2) / 2 = -1, -0.5, 0, 0.5: half up
    got = simulate_espdl(model, {"x": x}).outputs["y"]
    assert got.shape == (1, 1, 1, 4) and got.reshape(-1).tolist() == [-1, 0, 0, 1]


def test_softmax_float_output():
    """dl_module_softmax.hpp forward_lut: float32 exp_table[x + 128] (gen_lut_8bit:
    expf(2^e * (i - 128))), summed in order along the axis, then divided; no max subtracted."""
    x = np.int8([[[3, -2, 0], [127, -128, 5]]])  # softmax over axis 1 (length 2)
    model = _model(
        [Node("s", "Softmax", ["x"], ["y"], {"axis": 1, "quant_type": "S8"})],
        [],
        [_vi("x", x, -3)],
        [ValueInfo("y", [1, 2, 3], 1, [])],
    )
    got = simulate_espdl(model, {"x": x}).outputs["y"]
    assert got.dtype == np.float32
    for c in range(3):
        # expf as the correctly rounded float32 of exp (math.exp in double, then rounded)
        a, b = (np.float32(math.exp(0.125 * int(v))) for v in x[0, :, c])
        total = np.float32(0) + a + b
        assert got[0, :, c].tolist() == [a / total, b / total]
    assert np.allclose(got.sum(axis=1), 1, atol=1e-6)


def test_esp32s3_notes_accumulators_beyond_20_bits():
    """The TIE728 int8 conv kernels accumulate in 20-bit QACC lanes (dl_tie728_s8_conv2d.S);
    an exact sum beyond +-2^19 there is reported, not silently trusted."""
    x = np.full((1, 1, 1, 64), 127, np.int8)
    w = np.full((16, 1, 1, 64), 127, np.int8)  # 64 * 127 * 127 = 1032256 > 2^19
    for target, notes in (("esp32s3", 1), ("c", 0)):
        model = _model(
            [Node("/big", "Conv", ["x", "w"], ["y"], {"group": 1, "quant_type": "S8"})],
            [Tensor("w", encode_filter(w, 1, target), [0])],
            [_vi("x", x, 0)],
            [_vi("y", [1], 14)],
            target=target,
        )
        r = simulate_espdl(model, {"x": x})
        assert r.outputs["y"].reshape(-1).tolist() == [63] * 16  # 1032256 / 2^14 = 63.0
        assert len(r.notes) == notes
        if notes:
            assert "an accumulator reaches 1032256, beyond the 20-bit QACC lanes" in r.notes[0]
