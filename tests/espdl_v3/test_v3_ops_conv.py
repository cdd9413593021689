"""The conv family of the ESP-DL v3 simulator against loop-by-loop references of the runtime.

- per-channel Conv / Gemm (esp32p4 and esp32s31: ``ConvOpArgs`` in ``dl_base.hpp`` fills
  ``tie_filter_channel_factor[c] = e_out - e_w[c] - e_in``, the esp32p4 kernels shift each
  output channel by its own factor, rounding half to even): plain, depthwise, dilated, 1-D,
  unaligned channel counts, int8 and int16;
- MatMul (``dl_module_matmul.hpp``): two activations (``input1_layout`` ``native_kn``, and the
  older ``packed`` order), batched with broadcast batch dims, vectors;
- InsertZeros (``dl_module_insert_zeros.hpp``);
- the streaming tutorial's esp32p4 model (``tests/data/espdl_v3``), whose outputs need the
  esp32p4 rounding.

The references are written from the C sources (``dl_base_conv2d.cpp``: one accumulator per
output pixel and channel, bias first), with Python integers; they share no code with the
simulator, and the filters are laid out element by element (``espdl_v3_layouts.encode_filter``).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from espdl_v3_layouts import encode_filter

from amct_bridge.espdl.v3 import EspdlError, read_espdl, simulate_espdl
from amct_bridge.espdl.v3.model import EspdlModel, Node, Tensor, ValueInfo

DATA = Path(__file__).parent.parent / "data" / "espdl_v3"
STREAMING_P4 = (
    DATA / "tutorial_how_to_deploy_streaming_model_test_streaming_model_main_models_esp32p4_"
    "model.espdl"
)
INT = {np.int8: 3, np.int16: 5}
QUANT = {np.int8: "S8", np.int16: "S16"}


def ref_round(value: int, shift: int, half_even: bool) -> int:
    """value · 2^-shift rounded to an integer (shift <= 0: exact), with Python integers."""
    if shift <= 0:
        return value << -shift
    q, r = divmod(value, 1 << shift)  # floor quotient, remainder in [0, 2^shift)
    half = 1 << (shift - 1)
    if r > half or (r == half and (not half_even or q % 2 == 1)):
        q += 1
    return q


def is_tie(value: int, shift: int) -> bool:
    """True when value · 2^-shift is exactly half-way between two integers."""
    return shift > 0 and value % (1 << shift) == 1 << (shift - 1)


def ref_conv(x, w, bias, strides, dilations, pads, depthwise):
    """Accumulators [B, Ho, Wo, N] of a 2-D conv, one output pixel and channel at a time."""
    b, h, wd, c = x.shape
    n, kh, kw, _ = w.shape
    top, left, bottom, right = pads
    sh, sw = strides
    dh, dw = dilations
    ho = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + left + right - dw * (kw - 1) - 1) // sw + 1
    acc = np.zeros((b, ho, wo, n), object)
    for bi, oy, ox, o in itertools.product(range(b), range(ho), range(wo), range(n)):
        total = int(bias[o]) if bias is not None else 0
        for ky, kx in itertools.product(range(kh), range(kw)):
            iy, ix = oy * sh + ky * dh - top, ox * sw + kx * dw - left
            if not (0 <= iy < h and 0 <= ix < wd):
                continue  # padding: zeros
            if depthwise:
                total += int(x[bi, iy, ix, o]) * int(w[o, ky, kx, 0])
            else:
                for ci in range(c):
                    total += int(x[bi, iy, ix, ci]) * int(w[o, ky, kx, ci])
        acc[bi, oy, ox, o] = total
    return acc


def ref_output(acc, shifts, relu, half_even, dtype):
    """The output stage: each channel's shift, ReLU, saturation."""
    info = np.iinfo(dtype)
    out = np.zeros(acc.shape, np.int64)
    for idx in itertools.product(*(range(d) for d in acc.shape)):
        v = ref_round(int(acc[idx]), int(shifts[idx[-1]]), half_even)
        v = max(v, 0) if relu else v
        out[idx] = min(max(v, info.min), info.max)
    return out.astype(dtype)


def conv_model(x_shape, w, w_exps, bias, e_in, e_out, attrs, target, depthwise, rank=2):
    """A one-Conv model: ``w`` logical [N, *kernel, C], stored as esp-ppq stores it."""
    dtype = w.dtype.type
    group = x_shape[-1] if depthwise else 1
    kernel = w.shape[1:-1] if rank == 2 else w.shape[2:-1]
    logical = w if rank == 2 else w[:, 0]
    stored = encode_filter(logical, group, target)
    inits = {"w": Tensor("w", stored, list(w_exps), "layout ==> test")}
    inputs = ["x", "w"]
    if bias is not None:
        bdtype = np.int32 if dtype == np.int8 else np.int64
        inits["b"] = Tensor("b", np.asarray(bias, bdtype), [e_in + int(e) for e in w_exps])
        inputs.append("b")
    attributes = {"quant_type": QUANT[dtype], "group": group}
    attributes["kernel_shape"] = list(kernel)
    attributes.update(attrs)
    return EspdlModel(
        [Node("conv", "Conv", inputs, ["y"], attributes)],
        inits,
        inputs=[ValueInfo("x", list(x_shape), INT[dtype], [e_in])],
        outputs=[ValueInfo("y", None, INT[dtype], [e_out])],
        metadata={"target": target},
    )


CASES = {
    # name: (x shape, N, kernel, depthwise, strides, dilations, pads (t, l, b, r), relu)
    "3x3 s2 pad, 20 out (16 + 4)": (
        (2, 6, 7, 5),
        20,
        (3, 3),
        False,
        (2, 2),
        (1, 1),
        (1, 1, 0, 1),
        0,
    ),
    "1x1, 16 out, relu": ((1, 4, 3, 24), 16, (1, 1), False, (1, 1), (1, 1), (0, 0, 0, 0), 1),
    "depthwise 3x3 dilated, 18 ch": (
        (1, 7, 6, 18),
        18,
        (3, 3),
        True,
        (1, 1),
        (2, 2),
        (2, 2, 2, 2),
        0,
    ),
    "depthwise 5x5 s2, 7 ch relu": ((2, 8, 8, 7), 7, (5, 5), True, (2, 2), (1, 1), (2, 2, 2, 2), 1),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("target", ["esp32p4", "esp32s31"])
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_per_channel_conv_equals_the_loop_reference(name, target, dtype):
    x_shape, n, kernel, depthwise, strides, dilations, pads, relu = CASES[name]
    rng = np.random.default_rng(len(name) + (dtype == np.int16))
    c = x_shape[-1]
    w = rng.integers(-9, 10, (n, *kernel, 1 if depthwise else c)).astype(dtype)
    x = rng.integers(-40, 41, x_shape).astype(dtype)
    bias = rng.integers(-60, 61, n)
    e_in, e_out = -3, -3
    w_exps = [-1 - (o % 4) for o in range(n)]  # shifts 1, 2, 3, 4
    w_exps[0] = -3  # the first block starts with shift 3
    shifts = [e_out - e - e_in for e in w_exps]
    attrs = {"strides": list(strides), "dilations": list(dilations)}
    attrs["pads"] = [pads[0], pads[1], pads[2], pads[3]]
    attrs["activation"] = "Relu" if relu else "Linear"
    model = conv_model(x_shape, w, w_exps, bias, e_in, e_out, attrs, target, depthwise)
    got = simulate_espdl(model, x).outputs["y"]
    acc = ref_conv(x, w, bias, strides, dilations, pads, depthwise)
    want = ref_output(acc, shifts, relu, True, dtype)
    assert got.dtype == dtype and np.array_equal(got, want)
    # not vacuous: ties where half up and half to even part, and the half-up output differs
    ties = sum(is_tie(int(a), shifts[i[-1]]) for i, a in np.ndenumerate(acc))
    assert ties > 0
    if not relu:
        assert not np.array_equal(got, ref_output(acc, shifts, relu, False, dtype))


def test_per_channel_conv1d_dilated_depthwise_and_unaligned_plain():
    """1-D (NWC) convs: a dilated depthwise one (the streaming model's kind) and a plain one
    with 21 output channels (16 in a block, 5 after), int8, esp32p4."""
    rng = np.random.default_rng(7)
    for depthwise, n, c in ((True, 12, 12), (False, 21, 6)):
        w = rng.integers(-20, 21, (n, 1, 3, 1 if depthwise else c)).astype(np.int8)
        x = rng.integers(-60, 61, (2, 1, 15, c)).astype(np.int8)
        w_exps = [-2 - (o % 3) for o in range(n)]
        e_in, e_out = -4, -3
        attrs = {"dilations": [2], "pads": [4, 1], "strides": [1], "kernel_shape": [3]}
        model = conv_model(
            (2, 15, c), w, w_exps, None, e_in, e_out, attrs, "esp32p4", depthwise, rank=1
        )
        got = simulate_espdl(model, x[:, 0]).outputs["y"]
        acc = ref_conv(x, w, None, (1, 1), (1, 2), (0, 4, 0, 1), depthwise)
        shifts = [e_out - e - e_in for e in w_exps]
        assert np.array_equal(got, ref_output(acc, shifts, False, True, np.int8)[:, 0])


def test_per_channel_int16_gemm_saturates_and_rounds_half_even():
    """A Gemm (``dl_module_gemm.hpp``: a 1x1 conv) with 12 outputs (one int16 block of 8 and
    4 after), large values: saturation at ±32767/-32768, and hand-made ties."""
    n, c = 12, 3
    w = np.zeros((n, c), np.int16)
    w[:, 0] = [3, 5, -3, -5, 1, 1, 30000, -30000, 7, 1, 1, 3]
    w[:, 1] = 1
    x = np.array([[1, 0, 5], [2, 0, 9], [3, 1, 0], [30000, 30000, 0]], np.int16)
    w_exps = [-1, -1, -1, -1, -2, -2, -1, -1, -3, -3, -2, -1]  # e_in = 0, e_out = 0
    stored = encode_filter(w.reshape(n, 1, 1, c), 1, "esp32p4")
    model = EspdlModel(
        [Node("fc", "Gemm", ["x", "w"], ["y"], {"quant_type": "S16"})],
        {"w": Tensor("w", stored, w_exps)},
        inputs=[ValueInfo("x", [4, c], 5, [0])],
        outputs=[ValueInfo("y", [4, n], 5, [0])],
        metadata={"target": "esp32p4"},
    )
    got = simulate_espdl(model, x).outputs["y"]
    acc = x.astype(object) @ w.T.astype(object)
    shifts = [-e for e in w_exps]
    assert np.array_equal(got, ref_output(acc, shifts, False, True, np.int16))
    # hand-worked: x[0] = [1, 0, 5]: channel 0 is 3 / 2 = 1.5 -> 2, channel 2 -3 / 2 -> -2,
    # channel 4 is 1 / 4 -> 0; x[3]: channel 6 is 30000 * 30001 / 2, saturated
    assert got[0, 0] == 2 and got[0, 2] == -2 and got[0, 4] == 0
    assert got[3, 6] == 32767 and got[3, 7] == -32768


def test_per_channel_filter_refused_where_the_runtime_has_no_kernel():
    """esp32s3 and the C targets: ``ConvOpArgs`` leaves ``tie_filter_channel_factor`` NULL
    ("Don't support per-channel quantization")."""
    w = np.ones((2, 1, 1, 1), np.int8)
    for target in ("esp32s3", "c", "esp32"):
        model = conv_model((1, 1, 1, 1), w, [-1, -2], None, 0, 0, {}, "c", False)
        with pytest.raises(EspdlError, match=r"node 'conv' \(Conv\): filter 'w' has 2 per-chan"):
            simulate_espdl(model, np.ones((1, 1, 1, 1), np.int8), target)


def test_per_channel_shift_at_or_below_zero_is_exact_and_noted():
    w = np.array([3, 3], np.int8).reshape(2, 1, 1, 1)
    model = conv_model((1, 1, 1, 1), w, [1, -2], None, 0, 0, {}, "esp32p4", False)
    result = simulate_espdl(model, np.array([5], np.int8).reshape(1, 1, 1, 1))
    # channel 0: shift -1, 15 * 2 = 30; channel 1: shift 2, 15 / 4 = 3.75 -> 4
    assert result.outputs["y"].reshape(-1).tolist() == [30, 4]
    assert any("per-channel shift <= 0 (-1)" in note for note in result.notes)


def test_per_channel_with_one_exponent_value_equals_per_tensor():
    rng = np.random.default_rng(3)
    w = rng.integers(-9, 10, (17, 1, 1, 4)).astype(np.int8)
    x = rng.integers(-50, 51, (1, 3, 3, 4)).astype(np.int8)
    per_channel = conv_model((1, 3, 3, 4), w, [-4] * 17, None, -2, -3, {}, "esp32p4", False)
    per_tensor = conv_model((1, 3, 3, 4), w, [-4], None, -2, -3, {}, "esp32p4", False)
    a = simulate_espdl(per_channel, x).outputs["y"]
    assert np.array_equal(a, simulate_espdl(per_tensor, x).outputs["y"])


@pytest.mark.parametrize("target,half_even", [("esp32s3", False), ("c", False), ("esp32p4", True)])
def test_per_tensor_conv_rounds_as_the_target(target, half_even):
    rng = np.random.default_rng(11)
    w = rng.integers(-9, 10, (5, 3, 3, 3)).astype(np.int8)
    x = rng.integers(-30, 31, (1, 5, 5, 3)).astype(np.int8)
    attrs = {"pads": [1, 1, 1, 1]}
    model = conv_model((1, 5, 5, 3), w, [-1], None, 0, 0, attrs, target, False)
    acc = ref_conv(x, w, None, (1, 1), (1, 1), (1, 1, 1, 1), False)
    got = simulate_espdl(model, x).outputs["y"]
    assert np.array_equal(got, ref_output(acc, [1] * 5, False, half_even, np.int8))
    assert any(is_tie(int(a), 1) and (int(a) >> 1) % 2 == 0 for a in acc.reshape(-1))


# ---------------------------------------------------------------------------------- MatMul


def ref_matmul(a, b):
    """torch.matmul of integer arrays as dl_module_matmul.hpp loops: batch dims of 1 broadcast
    (``input0_batch == 1 ? 0 : i``), a vector operand multiplies every matrix of the other."""
    a2 = a.reshape(1, -1) if a.ndim == 1 else a
    b2 = b.reshape(-1, 1) if b.ndim == 1 else b
    rank = max(a2.ndim, b2.ndim)
    a4 = a2.reshape((1,) * (rank - a2.ndim) + a2.shape)
    b4 = b2.reshape((1,) * (rank - b2.ndim) + b2.shape)
    batch = [max(p, q) for p, q in zip(a4.shape[:-2], b4.shape[:-2], strict=True)]
    m, k, n = a4.shape[-2], a4.shape[-1], b4.shape[-1]
    out = np.zeros((*batch, m, n), object)
    for idx in itertools.product(*(range(d) for d in batch)):
        ia = tuple(0 if a4.shape[i] == 1 else j for i, j in enumerate(idx))
        ib = tuple(0 if b4.shape[i] == 1 else j for i, j in enumerate(idx))
        for r, col in itertools.product(range(m), range(n)):
            out[(*idx, r, col)] = sum(
                int(a4[(*ia, r, t)]) * int(b4[(*ib, t, col)]) for t in range(k)
            )
    if a.ndim == 1 and b.ndim == 1:
        return out.reshape(1)
    if a.ndim == 1:
        return out.reshape(*out.shape[:-2], n)
    if b.ndim == 1:
        return out.reshape(*out.shape[:-1])
    return out


def matmul_model(a_shape, b_shape, dtype, e_a, e_b, e_out, target, attrs, b_const=None):
    code = INT[dtype]
    inits = {}
    inputs = [ValueInfo("a", list(a_shape), code, [e_a])]
    if b_const is None:
        inputs.append(ValueInfo("b", list(b_shape), code, [e_b]))
    else:
        inits["b"] = b_const
    attributes = {"quant_type": QUANT[dtype], **attrs}
    return EspdlModel(
        [Node("mm", "MatMul", ["a", "b"], ["y"], attributes)],
        inits,
        inputs=inputs,
        outputs=[ValueInfo("y", None, code, [e_out])],
        metadata={"target": target},
    )


def pack_b(b: np.ndarray, target: str) -> np.ndarray:
    """B [..., K, N] in the conv filter order of ``target``, matrix by matrix."""
    k, n = b.shape[-2:]
    mats = [
        encode_filter(m.T.reshape(n, 1, 1, k), 1, target).reshape(k, n) for m in b.reshape(-1, k, n)
    ]
    return np.stack(mats).reshape(b.shape)


SHAPES = [
    ((3, 10), (10, 9)),
    ((10,), (5, 10, 32)),
    ((2, 1, 3, 6), (4, 6, 18)),  # rank 4 and 3: both batch dims broadcast
    ((5, 4, 6), (1, 6, 17)),
    ((4, 3, 6), (6,)),
    ((6,), (6,)),
]


@pytest.mark.parametrize("a_shape,b_shape", SHAPES, ids=str)
@pytest.mark.parametrize("target,half_even", [("esp32s3", False), ("esp32p4", True), ("c", False)])
def test_matmul_of_two_activations_equals_the_loop_reference(a_shape, b_shape, target, half_even):
    rng = np.random.default_rng(len(a_shape) * 10 + len(b_shape))
    a = rng.integers(-100, 101, a_shape).astype(np.int8)
    b = rng.integers(-100, 101, b_shape).astype(np.int8)
    acc = ref_matmul(a, b)
    for layout in ("native_kn", "packed"):
        stored = b if layout == "native_kn" or b.ndim == 1 else pack_b(b, target)
        model = matmul_model(
            a_shape,
            b_shape,
            np.int8,
            -4,
            -3,
            -2,
            target,
            {"input1_layout": layout, "activation": "Relu"},
        )
        got = simulate_espdl(model, {"a": a, "b": stored}).outputs["y"]
        want = ref_output(acc, [5] * acc.shape[-1], True, half_even, np.int8)
        assert got.shape == want.shape and np.array_equal(got, want), layout
    if acc.size > 100:  # not vacuous: ties, where the two roundings part
        assert any(is_tie(int(v), 5) for v in acc.reshape(-1))


def test_matmul_without_layout_attribute_reads_b_packed():
    """Files older than ``input1_layout`` carry B in the filter order (esp-ppq inserted
    Reshape/Transpose nodes to pack it): read as packed, not as row-major."""
    rng = np.random.default_rng(5)
    a = rng.integers(-50, 51, (3, 8)).astype(np.int8)
    b = rng.integers(-50, 51, (8, 20)).astype(np.int8)
    model = matmul_model((3, 8), (8, 20), np.int8, 0, 0, 3, "esp32s3", {})
    got = simulate_espdl(model, {"a": a, "b": pack_b(b, "esp32s3")}).outputs["y"]
    want = ref_output(ref_matmul(a, b), [3] * 20, False, False, np.int8)
    assert np.array_equal(got, want)
    assert not np.array_equal(simulate_espdl(model, {"a": a, "b": b}).outputs["y"], want)


def test_matmul_int16_saturates():
    a = np.array([[30000, 30000], [-30000, 1]], np.int16)
    b = np.array([[2, -2], [2, 1]], np.int16)
    model = matmul_model(
        (2, 2), (2, 2), np.int16, 0, 0, 1, "esp32p4", {"input1_layout": "native_kn"}
    )
    got = simulate_espdl(model, {"a": a, "b": b}).outputs["y"]
    # [[120000, -30000], [-59998, 60001]] / 2 = [[60000, -15000], [-29999, 30000.5 -> 30000]]
    assert got.tolist() == [[32767, -15000], [-29999, 30000]]


def test_matmul_constant_b_per_channel_on_esp32p4():
    rng = np.random.default_rng(9)
    a = rng.integers(-60, 61, (4, 5)).astype(np.int8)
    b = rng.integers(-60, 61, (5, 18)).astype(np.int8)
    exps = [-1 - (j % 3) for j in range(18)]
    const = Tensor("b", pack_b(b, "esp32p4"), exps, "layout ==> (N/16)HWC16_UNALIGNED")
    model = matmul_model(
        (4, 5), None, np.int8, 0, None, 0, "esp32p4", {"input1_layout": "packed"}, const
    )
    got = simulate_espdl(model, {"a": a}).outputs["y"]
    assert np.array_equal(
        got, ref_output(ref_matmul(a, b), [-e for e in exps], False, True, np.int8)
    )
    batched = Tensor("b", np.stack([b, b]), exps)
    model = matmul_model((4, 5), None, np.int8, 0, None, 0, "esp32p4", {}, batched)
    with pytest.raises(EspdlError, match="batched B with per-channel"):
        simulate_espdl(model, {"a": a})


def test_matmul_refusals():
    a = np.zeros((2, 3), np.int8)
    model = matmul_model((2, 3), (4, 2), np.int8, 0, 0, 0, "c", {"input1_layout": "native_kn"})
    with pytest.raises(EspdlError, match="do not chain"):
        simulate_espdl(model, {"a": a, "b": np.zeros((4, 2), np.int8)})
    model = matmul_model((2, 2, 3), (3, 3, 2), np.int8, 0, 0, 0, "c", {})
    with pytest.raises(EspdlError, match="batch dims"):
        simulate_espdl(
            model, {"a": np.zeros((2, 2, 3), np.int8), "b": np.zeros((3, 3, 2), np.int8)}
        )
    model = matmul_model((2, 3), (3, 2), np.int8, 0, 0, 0, "c", {"input1_layout": "nk"})
    with pytest.raises(EspdlError, match="input1_layout 'nk'"):
        simulate_espdl(model, {"a": a, "b": np.zeros((3, 2), np.int8)})


# ------------------------------------------------------------------------------ InsertZeros


def ref_insert_zeros(x, stride, output_padding):
    """dl_module_insert_zeros.hpp's loops: input (h, w) goes to (h·s_h, w·s_w), zeros around."""
    spatial = x.shape[1:-1]
    shape = [
        d + (s - 1) * (d - 1) + p for d, s, p in zip(spatial, stride, output_padding, strict=True)
    ]
    out = np.zeros((x.shape[0], *shape, x.shape[-1]), x.dtype)
    for idx in itertools.product(*(range(d) for d in spatial)):
        for n in range(x.shape[0]):
            target = tuple(i * s for i, s in zip(idx, stride, strict=True))
            out[(n, *target)] = x[(n, *idx)]
    return out


@pytest.mark.parametrize(
    "shape,stride,padding",
    [
        ((2, 5, 3), [3], [2]),
        ((1, 4, 3, 2), [2, 2], [1, 1]),
        ((1, 3, 4, 5), [2], [0]),
        ((1, 3, 2, 1), [1, 3], [0, 2]),
    ],
)
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_insert_zeros_equals_the_loop_reference(shape, stride, padding, dtype):
    x = np.random.default_rng(1).integers(-128, 128, shape).astype(dtype)
    model = EspdlModel(
        [
            Node(
                "z",
                "InsertZeros",
                ["x"],
                ["y"],
                {"stride": stride, "output_padding": padding, "quant_type": QUANT[dtype]},
            )
        ],
        {},
        inputs=[ValueInfo("x", list(shape), INT[dtype], [-5])],
        outputs=[ValueInfo("y", None, INT[dtype], [-5])],
        metadata={"target": "esp32s3"},
    )
    got = simulate_espdl(model, x).outputs["y"]
    axes = len(shape) - 2
    stride, padding = (v * axes if len(v) == 1 else v for v in (stride, padding))  # one: all
    want = ref_insert_zeros(x, stride, padding)
    assert got.dtype == dtype and np.array_equal(got, want)


def test_insert_zeros_refuses_three_spatial_axes():
    model = EspdlModel(
        [Node("z", "InsertZeros", ["x"], ["y"], {"stride": [2]})],
        {},
        inputs=[ValueInfo("x", [1, 2, 2, 2, 1], 3, [0])],
        outputs=[ValueInfo("y", None, 3, [0])],
    )
    with pytest.raises(EspdlError, match=r"node 'z' \(InsertZeros\): input of rank 5"):
        simulate_espdl(model, np.zeros((1, 2, 2, 2, 1), np.int8), "c")


# ------------------------------------------------------------- the streaming tutorial, esp32p4


def test_streaming_tutorial_esp32p4_model_needs_the_esp32p4_rounding():
    """Espressif's published esp32p4 streaming model (no target in the file) is exact with
    the esp32p4 kernels; the esp32s3 rounding (half up) gives 5 of its 16 outputs one off.
    The first node that differs is the first Conv (a 1-D per-tensor conv), on ties."""
    model = read_espdl(STREAMING_P4)
    assert model.target is None
    expected = model.test_outputs[0]
    p4 = simulate_espdl(model, target="esp32p4")
    assert np.array_equal(p4.outputs[expected.name].reshape(expected.dims), expected.data)
    s3 = simulate_espdl(model, target="esp32s3")
    diff = s3.outputs[expected.name].reshape(expected.dims).astype(int) - expected.data
    assert np.count_nonzero(diff) == 5 and np.abs(diff).max() == 1
    first = next(
        n
        for n in model.nodes
        if not np.array_equal(p4.values[n.outputs[0]], s3.values[n.outputs[0]])
    )
    assert first.name == "/prev_conv/Conv"
