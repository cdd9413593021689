"""Element-wise math ops of the ESP-DL v3 simulator (Div, Pow, Mod, Neg, Exp, Log, Sqrt, Relu,
PRelu, Mul, the lookup tables) against independent references: element-by-element loops
written from esp-dl's C sources (esp-dl 12c0616d; each test names the file it follows) and
hand-worked values, on both rounding modes (half up: c / esp32s3, half to even: esp32p4).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from amct_bridge.espdl.v3 import (
    EspdlError,
    EspdlModel,
    Node,
    Tensor,
    ValueInfo,
    read_espdl,
    simulate_espdl,
)
from amct_bridge.espdl.v3.ops.div import elemwise_rows
from amct_bridge.espdl.v3.ops.lut import round_saturate

F32 = np.float32
SUITE = Path(__file__).parent.parent / "data" / "espdl_v3" / "ops_test"
ELEM = {np.int8: 3, np.int16: 5, np.float32: 1}
QUANT = {np.int8: "S8", np.int16: "S16", np.float32: "F32"}


def run(op, inputs, exps, out_exp, dtype, target, attrs=None, inits=None):
    """Simulate one node ``op`` on ``inputs`` (name -> array) for ``target``; its output."""
    infos = [
        ValueInfo(name, list(a.shape), ELEM[a.dtype.type], [exps[name]])
        for name, a in inputs.items()
    ]
    inits = inits or {}
    node = Node("n", op, [*inputs, *inits], ["y"], {"quant_type": QUANT[dtype], **(attrs or {})})
    model = EspdlModel(
        [node],
        inits,
        inputs=infos,
        outputs=[ValueInfo("y", [], ELEM[dtype], [out_exp])],
    )
    result = simulate_espdl(model, dict(inputs), target)
    return result.outputs["y"], result.notes


def c_round(value, half_even):
    """tool::round (dl_tool.cpp) of one float32: rne on esp32p4, (int)floorf(v + 0.5) else;
    the int saturates (RISC-V fcvt / Xtensa trunc), NaN -> INT_MAX."""
    v = float(F32(value))
    if math.isnan(v):
        return 2**31 - 1
    if math.isinf(v):
        return 2**31 - 1 if v > 0 else -(2**31)
    r = round(v) if half_even else math.floor(float(F32(v + 0.5)))  # the sum in double
    return max(-(2**31), min(2**31 - 1, r))


def truncate(value, dtype):
    info = np.iinfo(dtype)
    return max(info.min, min(info.max, value))


# --- get_elemwise_operation_args (dl_base_elemwise.cpp): merged rows and their pointers -----


def pointer_walk(shape0, shape1):
    """Every (index into input0, index into input1) the runtime's loops visit, in output order,
    and (input0_d0, input1_d0): the merge and the 1-4 D loops of dl_base_elemwise.cpp."""
    out = list(np.broadcast_shapes(shape0, shape1))
    n = len(out)
    s0 = [1] * (n - len(shape0)) + list(shape0)
    s1 = [1] * (n - len(shape1)) + list(shape1)
    dims = n
    for i in range(n):
        j = i + 1
        while j < n:
            if s0[i] == s1[i] and s0[j] == s1[j]:
                s0[i] *= s0[j]
                s1[i] *= s1[j]
                out[i] *= out[j]
                s0[j] = s1[j] = out[j] = 1
            elif s0[i] == 1 and s0[j] == 1:
                s1[i] *= s1[j]
                out[i] *= out[j]
                s1[j] = out[j] = 1
            elif s1[i] == 1 and s1[j] == 1:
                s0[i] *= s0[j]
                out[i] *= out[j]
                s0[j] = out[j] = 1
            else:
                break
            j += 1
        if j == n:
            dims = i + 1
            break

    def stride(shape, dim):  # calculate_elemwise_stride
        rest = 1
        for k in range(dim + 1, len(shape)):
            rest *= shape[k]
        if shape[dim] > 1:
            return 0 if shape[dim + 1] > 1 else rest
        return -rest if shape[dim + 1] > 1 else 0

    d0 = out[dims - 1]
    a_d0, b_d0 = s0[dims - 1], s1[dims - 1]
    rows = []
    p0 = p1 = 0
    if dims == 1:
        rows = [(0, 0)]
    elif dims == 2:
        st0 = 0 if s0[0] == 1 else s0[1]
        st1 = 0 if s1[0] == 1 else s1[1]
        for _ in range(out[0]):
            rows.append((p0, p1))
            p0, p1 = p0 + st0, p1 + st1
    elif dims == 3:
        a1, b1 = (0 if s0[1] == 1 else s0[2]), (0 if s1[1] == 1 else s1[2])
        a2, b2 = stride(s0, 0), stride(s1, 0)
        for _ in range(out[0]):
            for _ in range(out[1]):
                rows.append((p0, p1))
                p0, p1 = p0 + a1, p1 + b1
            p0, p1 = p0 + a2, p1 + b2
    else:
        a1, b1 = (0 if s0[2] == 1 else s0[3]), (0 if s1[2] == 1 else s1[3])
        a2, b2 = stride(s0, 1), stride(s1, 1)
        a3, b3 = stride(s0, 0), stride(s1, 0)
        for _ in range(out[0]):
            for _ in range(out[1]):
                for _ in range(out[2]):
                    rows.append((p0, p1))
                    p0, p1 = p0 + a1, p1 + b1
                p0, p1 = p0 + a2, p1 + b2
            p0, p1 = p0 + a3, p1 + b3
    return rows, d0, a_d0, b_d0, dims


SHAPES = [
    ((1, 96, 5, 16), (1, 96, 5, 1)),
    ((2, 3, 4, 5), (1,)),
    ((1,), (2, 3, 4, 5)),
    ((3, 1), (3, 4)),
    ((4, 5), (2, 3, 4, 5)),
    ((1, 3, 4, 5), (2, 1, 1, 1)),
    ((8, 2, 5), (2, 1)),
    ((2, 1, 3), (1, 4, 1)),
    ((5, 1, 2, 1), (1, 3, 1, 4)),
]


@pytest.mark.parametrize("shape0,shape1", SHAPES)
def test_elementwise_rows_and_numpy_broadcasting(shape0, shape1):
    """elemwise_rows gives the runtime's row lengths, and its loops visit the elements numpy
    broadcasting pairs (so the ops may broadcast with numpy)."""
    rows, d0, a_d0, b_d0, dims = pointer_walk(shape0, shape1)
    assert elemwise_rows(shape0, shape1) == (a_d0, b_d0, d0, dims)
    a = np.arange(int(np.prod(shape0))).reshape(shape0)
    b = np.arange(int(np.prod(shape1))).reshape(shape1)
    pairs = [
        (a.reshape(-1)[r0 + (0 if a_d0 == 1 else k)], b.reshape(-1)[r1 + (0 if b_d0 == 1 else k)])
        for r0, r1 in rows
        for k in range(d0)
    ]
    wa, wb = np.broadcast_arrays(a, b)
    assert pairs == list(zip(wa.reshape(-1), wb.reshape(-1), strict=True))


# --- Div: dl_base_div.cpp -------------------------------------------------------------------


def div_reference(a, b, e0, e1, eo, dtype, half_even):
    """elemwise_div, row by row, as dl_base_div.cpp's kernels compute each element."""
    rows, d0, a_d0, b_d0, _ = pointer_walk(a.shape, b.shape)
    info = np.iinfo(dtype)
    rescale = F32(F32(2.0**-eo) * F32(2.0**e0) / F32(2.0**e1))  # output_rescale * s0 / s1
    A, B = a.reshape(-1).tolist(), b.reshape(-1).tolist()
    table = None
    if dtype == np.int8 and (a.size == 1 or b.size == 1):  # create_div_lut
        table = {}
        if a_d0 == 1:
            a_float = F32(A[0]) * rescale
            for i in range(-128, 128):
                if i == 0:
                    table[i] = 127 if a_float > 0 else -128
                else:
                    table[i] = truncate(c_round(a_float / F32(i), half_even), dtype)
        else:
            scale = rescale / F32(B[0]) if B[0] else F32(np.inf)
            for i in range(-128, 128):
                table[i] = 0 if i == 0 else truncate(c_round(F32(i) * scale, half_even), dtype)
    out = []
    for r0, r1 in rows:
        for k in range(d0):
            x = A[r0 + (0 if a_d0 == 1 else k)]
            y = B[r1 + (0 if b_d0 == 1 else k)]
            if table is not None:
                out.append(table[y] if a_d0 == 1 else table[x])
                continue
            n_1 = b_d0 == 1 and not (dtype == np.int8 and a_d0 == 1)
            if x == 0:
                out.append(0)
            elif y == 0:
                out.append(info.max if x > 0 else info.min)
            elif n_1:  # c_impl_div_n_1: rescale / b first, then a * that
                out.append(truncate(c_round(F32(x) * F32(rescale / F32(y)), half_even), dtype))
            else:  # c_impl_div_n_n / 1_n: a * rescale, then / b
                out.append(truncate(c_round(F32(x) * rescale / F32(y), half_even), dtype))
    return np.array(out).reshape(np.broadcast_shapes(a.shape, b.shape))


@pytest.mark.parametrize("target", ["c", "esp32p4"])
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
@pytest.mark.parametrize(
    "shape0,shape1",
    [((4, 6), (4, 6)), ((4, 6), (4, 1)), ((4, 1), (4, 6)), ((3, 5), (1,)), ((1,), (3, 5))],
)
def test_div_matches_the_c_loop(target, dtype, shape0, shape1):
    rng = np.random.default_rng(7)
    info = np.iinfo(dtype)
    for trial in range(20):
        a = rng.integers(info.min, info.max + 1, shape0).astype(dtype)
        b = rng.integers(-40, 41, shape1).astype(dtype)
        if trial % 5 == 0:  # zeros on both sides
            a.reshape(-1)[0] = 0
            b.reshape(-1)[-1] = 0
        e0, e1, eo = -7, -5, int(rng.integers(-6, 1))
        got, _ = run("Div", {"a": a, "b": b}, {"a": e0, "b": e1}, eo, dtype, target)
        want = div_reference(a, b, e0, e1, eo, dtype, target == "esp32p4")
        np.testing.assert_array_equal(got, want)


def test_div_half_steps_and_zeros_hand_worked():
    """(a * 2^0) / b at exact half steps: half up on c, half to even on esp32p4."""
    a = np.array([5, -5, 3, 0, 7, -7], np.int16)
    b = np.array([2, 2, 2, 0, 0, 0], np.int16)
    exps = {"a": 0, "b": 0}
    got_c, _ = run("Div", {"a": a, "b": b}, exps, 0, np.int16, "c")
    got_p4, _ = run("Div", {"a": a, "b": b}, exps, 0, np.int16, "esp32p4")
    # 2.5, -2.5, 1.5, 0/0, 7/0, -7/0
    assert got_c.tolist() == [3, -2, 2, 0, 32767, -32768]
    assert got_p4.tolist() == [2, -2, 2, 0, 32767, -32768]


def test_div_n_1_rounds_twice():
    """c_impl_div_n_1 computes a * (rescale / b): -30675 * (1/30)f = -1022.50006, so half up
    gives -1023, where n_n's (-30675 / 30)f = -1022.5 exactly gives -1022."""
    a = np.array([[-30675, 30], [-30675, 30]], np.int16)
    exps = {"a": 0, "b": 0}
    per_row, _ = run("Div", {"a": a, "b": np.full((2, 1), 30, np.int16)}, exps, 0, np.int16, "c")
    per_value, _ = run("Div", {"a": a, "b": np.full((2, 2), 30, np.int16)}, exps, 0, np.int16, "c")
    assert per_row[:, 0].tolist() == [-1023, -1023]
    assert per_value[:, 0].tolist() == [-1022, -1022]


def test_div_int8_tables():
    """create_div_lut: with a single b, table[i] = round(i * (rescale / b)); with a single a,
    round((a * rescale) / i) and, at i = 0, 127 if a * rescale > 0 else -128 (a = 0 too)."""
    a = np.array([75, -75, 0, 1], np.int8)
    got, _ = run(
        "Div", {"a": a, "b": np.array([30], np.int8)}, {"a": 0, "b": 0}, 0, np.int8, "esp32p4"
    )
    assert got.tolist() == [3, -3, 0, 0]  # 75 * (1/30)f = 2.5000002 -> 3 even on esp32p4
    b = np.array([0, 4, -4, 0], np.int8)
    got, _ = run("Div", {"a": np.array([0], np.int8), "b": b}, {"a": 0, "b": 0}, 0, np.int8, "c")
    assert got.tolist() == [-128, 0, 0, -128]  # the table's i = 0 entry for a = 0
    got, _ = run("Div", {"a": np.array([10], np.int8), "b": b}, {"a": 0, "b": 0}, 0, np.int8, "c")
    assert got.tolist() == [127, 3, -2, 127]  # 2.5 -> 3, -2.5 -> -2 (half up)


def test_div_float32():
    a = np.float32([1.0, -3.0, 2.0])
    got, _ = run(
        "Div", {"a": a, "b": np.float32([4.0, 2.0, 0.5])}, {"a": 0, "b": 0}, 0, np.float32, "c"
    )
    assert got.tolist() == [0.25, -1.5, 4.0]


def test_div_refuses_more_than_four_merged_dimensions():
    a = np.ones((2, 1, 2, 1, 2), np.int8)
    b = np.ones((1, 2, 1, 2, 1), np.int8)
    with pytest.raises(EspdlError, match="merge into 5 dimensions"):
        run("Div", {"a": a, "b": b}, {"a": 0, "b": 0}, 0, np.int8, "c")


# --- Pow, Mod: dl_base_pow.cpp, dl_base_mod.cpp ---------------------------------------------


@pytest.mark.parametrize("target,half", [("c", 3), ("esp32s3", 3), ("esp32p4", 2)])
def test_pow_hand_worked(target, half):
    """powf(a * 2^e0, b * 2^e1) * 2^-e_out: 2.25^0.5 = 1.5, 2.5^1 = 2.5 (a half step),
    4^4 = 256 (saturates), (-1)^0.5 = NaN (INT_MAX -> 127)."""
    a = np.array([9, 10, 16, -4], np.int8)  # 2.25, 2.5, 4, -1
    b = np.array([2, 4, 16, 2], np.int8)  # 0.5, 1, 4, 0.5
    got, _ = run("Pow", {"a": a, "b": b}, {"a": -2, "b": -2}, 0, np.int8, target)
    assert got.tolist() == [2, half, 127, 127]


def test_pow_matches_the_c_loop():
    rng = np.random.default_rng(3)
    a = rng.integers(1, 32767, (5, 8)).astype(np.int16)
    b = rng.integers(-3000, 3000, (1, 8)).astype(np.int16)
    for target in ("c", "esp32p4"):
        got, _ = run("Pow", {"a": a, "b": b}, {"a": -12, "b": -11}, -9, np.int16, target)
        want = [
            [
                truncate(
                    c_round(
                        F32(math.pow(float(F32(x) * F32(2**-12)), float(F32(y) * F32(2**-11))))
                        * F32(2**9),
                        target == "esp32p4",
                    ),
                    np.int16,
                )
                for x, y in zip(row, b[0], strict=True)
            ]
            for row in a.tolist()
        ]
        assert got.tolist() == want


@pytest.mark.parametrize("target,half", [("c", 3), ("esp32p4", 2)])
def test_mod_hand_worked(target, half):
    """C fmodf: the dividend's sign; b = 0 gives 0; 2.5 is a half step at e_out = 0."""
    a = np.array([7, -7, 7, 5, 10], np.int8)  # 1.75, -1.75, 1.75, 1.25, 2.5
    b = np.array([2, 2, -2, 0, 12], np.int8)  # 0.5, 0.5, -0.5, 0, 3
    got, _ = run("Mod", {"a": a, "b": b}, {"a": -2, "b": -2}, -2, np.int8, target)
    assert got.tolist() == [1, -1, 1, 0, 10]
    got, _ = run("Mod", {"a": a, "b": b}, {"a": -2, "b": -2}, 0, np.int8, target)
    assert got.tolist()[4] == half


def test_mod_matches_the_c_loop_and_notes_fmod_0():
    rng = np.random.default_rng(5)
    a = rng.integers(-32768, 32768, (6, 7)).astype(np.int16)
    b = rng.integers(-32768, 32768, (6, 1)).astype(np.int16)
    b[0, 0] = 0
    got, notes = run("Mod", {"a": a, "b": b}, {"a": -9, "b": -11}, -12, np.int16, "c", {"fmod": 0})
    want = [
        [
            0
            if y == 0
            else truncate(
                c_round(F32(math.fmod(x * 2.0**-9, y * 2.0**-11)) * F32(2**12), False), np.int16
            )
            for x in row
        ]
        for row, (y,) in zip(a.tolist(), b.tolist(), strict=True)
    ]
    assert got.tolist() == want
    assert any("fmod=0" in n for n in notes)


# --- Neg: dl_module_neg.hpp -----------------------------------------------------------------


def test_neg_ignores_table_and_exponents():
    table = Tensor("t", np.zeros(256, np.int8), [-3])  # a wrong table: the runtime never reads it
    x = np.array([-128, -5, 0, 127], np.int8)
    got, notes = run("Neg", {"x": x}, {"x": -3}, -2, np.int8, "c", {"lut": "t"}, {"t": table})
    assert got.tolist() == [127, 5, 0, -127]
    assert any("negates the integers without rescaling" in n for n in notes)
    got, _ = run("Neg", {"x": np.array([-32768, 3], np.int16)}, {"x": 0}, 0, np.int16, "esp32p4")
    assert got.tolist() == [32767, -3]


# --- Exp, Log, Sqrt: dl_module_exp.hpp, _log, _sqrt ----------------------------------------


def unary_reference(fn, x, e_in, e_out, dtype, half_even):
    """truncate(round(f(x * 2^e_in) * 2^-e_out)), f correctly rounded to float32."""
    out = []
    for v in x.tolist():
        t = float(F32(v) * F32(2.0**e_in))
        try:
            f = F32(fn(t))
        except ValueError:  # log(0), log / sqrt of a negative
            f = F32(-np.inf) if t == 0 else F32(np.nan)
        out.append(truncate(c_round(f * F32(2.0**-e_out), half_even), dtype))
    return out


@pytest.mark.parametrize("target", ["c", "esp32p4"])
@pytest.mark.parametrize(
    "op,fn,e_in,e_out,lo",
    [
        ("Exp", math.exp, -12, -11, -32768),
        ("Log", math.log, -8, -12, -50),
        ("Sqrt", math.sqrt, -6, -9, -50),
    ],
)
def test_int16_unary_matches_libm(target, op, fn, e_in, e_out, lo):
    x = np.arange(lo, 32768, 37).astype(np.int16)
    got, _ = run(op, {"x": x}, {"x": e_in}, e_out, np.int16, target)
    assert got.tolist() == unary_reference(fn, x, e_in, e_out, np.int16, target == "esp32p4")


@pytest.mark.parametrize("target,half", [("c", 3), ("esp32s3", 3), ("esp32p4", 2)])
def test_unary_half_steps_and_saturation(target, half):
    """sqrt(6.25) = 2.5 is a half step; exp(1) * 2^7 saturates; log(0) = -inf gives the minimum;
    log(-1) = NaN gives the maximum (RISC-V's conversion)."""
    sq, _ = run("Sqrt", {"x": np.array([25, 9], np.int8)}, {"x": -2}, 0, np.int8, target)
    assert sq.tolist() == [half, 2]  # 2.5, 1.5
    ex, _ = run("Exp", {"x": np.array([4, -128], np.int8)}, {"x": -2}, -7, np.int8, target)
    assert ex.tolist() == [127, 0]
    lg, _ = run("Log", {"x": np.array([0, -1, 4], np.int16)}, {"x": -2}, -4, np.int16, target)
    assert lg.tolist() == [-32768, 32767, 0]


@pytest.mark.parametrize("op", ["Exp", "Log", "Sqrt", "Relu"])
def test_int8_table_is_read_and_int16_table_is_not(op):
    """deserialize(): an int8 node with a 'lut' runs as the LUT module; an int16 node keeps its
    module (the table esp-ppq writes is never read)."""
    table8 = Tensor("t", np.full(256, 42, np.int8), [-4])
    got, _ = run(
        op,
        {"x": np.array([1, 4, 9], np.int8)},
        {"x": -4},
        -4,
        np.int8,
        "c",
        {"lut": "t"},
        {"t": table8},
    )
    assert got.tolist() == [42, 42, 42]
    table16 = Tensor("t", np.full(65536, 42, np.int16), [-4])
    got, _ = run(
        op,
        {"x": np.array([16, 64], np.int16)},
        {"x": -4},
        -4,
        np.int16,
        "c",
        {"lut": "t"},
        {"t": table16},
    )
    assert 42 not in got.tolist()


def test_float32_unary():
    x = np.float32([0.25, 4.0, -1.0])
    for op, want in (
        ("Sqrt", [0.5, 2.0]),
        ("Log", [math.log(0.25), math.log(4.0)]),
        ("Exp", [math.exp(0.25), math.exp(4.0)]),
    ):
        got, _ = run(op, {"x": x}, {"x": 0}, 0, np.float32, "c")
        assert got.dtype == np.float32
        np.testing.assert_allclose(got[:2], want, rtol=1e-6)
    got, _ = run("Neg", {"x": x}, {"x": 0}, 0, np.float32, "c")
    assert got.tolist() == [-0.25, -4.0, 1.0]


# --- Relu: dl_module_relu.hpp ---------------------------------------------------------------


@pytest.mark.parametrize("target,half", [("c", 1), ("esp32s3", 1), ("esp32p4", 0)])
def test_relu_rescales_when_exponents_differ(target, half):
    """e_in != e_out without a table: round(x * 2^e_in * 2^-e_out), negatives 0: 0.25 * 2 =
    0.5 is a half step; 0.75 * 2 = 1.5 rounds to 2 both ways; 31.75 * 2 saturates."""
    x = np.array([1, 3, -3, 127, 0], np.int8)
    got, _ = run("Relu", {"x": x}, {"x": -2}, -1, np.int8, target)
    assert got.tolist() == [half, 2, 0, 64, 0]
    got, _ = run("Relu", {"x": x}, {"x": 0}, -2, np.int8, target)
    assert got.tolist() == [4, 12, 0, 127, 0]
    same, _ = run("Relu", {"x": x}, {"x": -2}, -2, np.int8, target)
    assert same.tolist() == [1, 3, 0, 127, 0]


def test_relu_int16_rescale_matches_loop():
    x = np.arange(-32768, 32768, 97).astype(np.int16)
    for target in ("c", "esp32p4"):
        got, _ = run("Relu", {"x": x}, {"x": -9}, -7, np.int16, target)
        want = [
            0
            if v < 0
            else truncate(c_round(F32(v) * F32(2**-9) * F32(2**7), target == "esp32p4"), np.int16)
            for v in x.tolist()
        ]
        assert got.tolist() == want


# --- PRelu: dl_module_prelu.hpp, dl_base_prelu.cpp ------------------------------------------


def prelu_model(x, alpha, e_alpha, dtype, lut=None):
    inits = {"a": Tensor("a", alpha, [e_alpha])}
    attrs = {}
    if lut is not None:
        inits["t"] = Tensor("t", lut, [-5])
        attrs["lut"] = "t"
    return {"x": x}, attrs, inits


@pytest.mark.parametrize("target", ["c", "esp32s3", "esp32p4"])
def test_prelu_int8_reads_its_table_on_every_target(target):
    table = (np.arange(256) - 128).astype(np.int8)[::-1].copy()  # any table: it is read as is
    x = np.array([[[[-128, -1, 0, 5]]]], np.int8)
    inputs, attrs, inits = prelu_model(x, np.full((4, 1, 1), 64, np.int8), -8, np.int8, table)
    got, _ = run("PRelu", inputs, {"x": -5}, -5, np.int8, target, attrs, inits)
    assert got.reshape(-1).tolist() == [table[0], table[127], table[128], table[133]]


@pytest.mark.parametrize(
    "target,neg", [("c", [-2, -1]), ("esp32p4", [-2, -1]), ("esp32s3", [-1, -1])]
)
def test_prelu_int16_kernels(target, neg):
    """int16 ignores the table: prelu_11c (c, esp32p4) floors (x * alpha) >> shift and copies
    x >= 0; esp32s3's EE.VPRELU.S16 rounds half up. -6 * 0.25 = -1.5, -3 * 0.25 = -0.75;
    one slope is repeated over the 3 channels (get_output_shape)."""
    x = np.array([[[[-6, -3, 7]]]], np.int16)
    lut = np.zeros(65536, np.int16)
    inputs, attrs, inits = prelu_model(x, np.array([[[16384]]], np.int16), -16, np.int16, lut)
    got, _ = run("PRelu", inputs, {"x": -8}, -8, np.int16, target, attrs, inits)
    assert got.reshape(-1).tolist() == [*neg, 7]


def test_prelu_refusals_without_a_table():
    x = np.array([[[[-6, 5]]]], np.int8)
    inputs, attrs, inits = prelu_model(x, np.array([[[64]], [[64]]], np.int8), -8, np.int8)
    with pytest.raises(EspdlError, match="esp32p4"):
        run("PRelu", inputs, {"x": -5}, -5, np.int8, "esp32p4", attrs, inits)
    inputs, attrs, inits = prelu_model(x, np.array([[[64]]], np.int8), -8, np.int8)
    with pytest.raises(EspdlError, match="1 slopes for 2 channels"):
        run("PRelu", inputs, {"x": -5}, -5, np.int8, "c", attrs, inits)


# --- Mul: dl_base_mul.cpp -------------------------------------------------------------------


@pytest.mark.parametrize(
    "target,a,b,short,long",
    [
        # 32767 * 32766 / 2^16 = 16382.50003: float32 product 16382.5, rne 16382
        ("esp32p4", 32767, 32766, 16382, 16383),
        # 32724 * 32024 / 2^16 = 15990.4995: float32 product 15990.5, half up 15991
        ("esp32s3", 32724, 32024, 15991, 15990),
        ("c", 32724, 32024, 15991, 15991),
    ],
)
def test_mul_int16_short_rows_run_the_float_kernel(target, a, b, short, long):
    """Rows under 8 int16 values run c_impl_mul (float32 product); longer rows on esp32s3 and
    esp32p4 run the assembly (exact product, rounding shift)."""
    for size, want in ((4, short), (16, long)):
        got, _ = run(
            "Mul",
            {"a": np.full(size, a, np.int16), "b": np.full(size, b, np.int16)},
            {"a": -8, "b": -8},
            0,
            np.int16,
            target,
        )
        assert set(got.tolist()) == {want}


def test_mul_suite_file_one_off_is_esp_ppq_float():
    """esp32p4_16/Mul/10: the one value off is esp-ppq's float32 product (-7108.5, rne -7108);
    the chip's assembly rounds the exact -7108.50014 to -7109, within the chip's ±1."""
    model = read_espdl(SUITE / "esp32p4_16" / "Mul" / "10_mul_ishap_3_4_5_to_2_1_1_1_s16.espdl")
    result = simulate_espdl(model)
    out = model.test_outputs[0]
    got = result.outputs[out.name].reshape(out.data.shape)
    diff = np.argwhere(got != out.data)
    assert [tuple(d) for d in diff] == [(1, 0, 0, 0)]
    assert (got[1, 0, 0, 0], out.data[1, 0, 0, 0]) == (-7109, -7108)


# --- lookup tables: dl_module_lut.hpp, the activation modules --------------------------------


def test_sigmoid_int16_computes_instead_of_its_table():
    """dl_module_sigmoid.hpp: int16 Sigmoid computes 1 / (1 + expf(-x)) even with a table."""
    table = Tensor("t", np.zeros(65536, np.int16), [-15])
    x = np.array([0, 2048, -2048], np.int16)  # 0, 1, -1 at 2^-11
    got, _ = run("Sigmoid", {"x": x}, {"x": -11}, -15, np.int16, "c", {"lut": "t"}, {"t": table})
    assert got.tolist() == [
        16384,
        round(32768 / (1 + math.exp(-1))),
        round(32768 / (1 + math.exp(1))),
    ]


@pytest.mark.parametrize(
    "q,half_even,want",
    [
        ([0.5, 1.5, 2.5, -0.5, -2.5], False, [1, 2, 3, 0, -2]),
        ([0.5, 1.5, 2.5, -0.5, -2.5], True, [0, 2, 2, 0, -2]),
        ([np.inf, -np.inf, np.nan, 3e9, -3e9], False, [127, -128, 127, 127, -128]),
        ([np.inf, -np.inf, np.nan, 3e9, -3e9], True, [127, -128, 127, 127, -128]),
    ],
)
def test_round_saturate(q, half_even, want):
    assert round_saturate(np.float32(q), np.dtype(np.int8), half_even).tolist() == want
    assert [truncate(c_round(v, half_even), np.int8) for v in q] == want


def test_suite_copies_cover_every_target_for_the_new_ops():
    """Every op of this file has at least one suite file per 8-bit target in tests/data."""
    for op, target in itertools.product(
        ["Div", "Pow", "Mod", "Neg", "Exp", "Log", "Sqrt", "Relu", "PRelu"],
        ["c_8", "esp32_8", "esp32s3_8", "esp32p4_8", "esp32s31_8"],
    ):
        assert list((SUITE / target / op).glob("*.espdl")), (target, op)
