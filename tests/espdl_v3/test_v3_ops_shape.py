"""ESP-DL v3 simulator: comparisons, Gather, ScatterND, ReverseSequence, DepthToSpace,
SpaceToDepth and Resize (nearest and linear) against independent computations.

Each reference below is a plain Python loop written from the runtime's source (the module's
index arithmetic, ``resize_linear_c1``'s float32 steps with exact fractions for the fused
multiply-adds), not the simulator's vectorised code; the hand-worked cases pin the rounding
edges: exact half steps under half up (esp32s3, c) and half to even (esp32p4), saturation, and
the one-rounding multiply-add of the FPU chips. Espressif's own suite files for these ops are
in ``tests/data/espdl_v3/ops_test`` (checked by the conformance test of that folder); the last
test here runs this module's share of them.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.espdl.v3.check import check_outputs
from amct_bridge.espdl.v3.model import EspdlError, EspdlModel, Node, Tensor, ValueInfo
from amct_bridge.espdl.v3.ops import OPS, Context
from amct_bridge.espdl.v3.ops._base import elemwise_rows

F32 = np.float32
SUITE = Path(__file__).parent.parent / "data" / "espdl_v3" / "ops_test"
MY_OPS = (
    "Equal Greater GreaterOrEqual Less LessOrEqual Gather ScatterND ReverseSequence "
    "DepthToSpace SpaceToDepth Resize"
).split()


def _ctx(target="esp32s3", init=None, exps=None, **values) -> Context:
    """A context holding ``values`` (exponent from ``exps``, default 0) and initializers."""
    exps = exps or {}
    names = set(values) | set(exps) | {"y"}
    infos = [ValueInfo(n, [1], 3, [exps.get(n, 0)]) for n in sorted(names)]
    ctx = Context(EspdlModel([], init or {}, value_info=infos), target)
    ctx.values.update(values)
    return ctx


def _run(ctx: Context, op: str, inputs, **attrs) -> np.ndarray:
    attrs.setdefault("quant_type", "S8")
    return OPS[op](ctx, Node("n", op, list(inputs), ["y"], attrs))[0]


# ---------------------------------------------------------------- comparisons


RELATIONS = {
    "Equal": lambda a, b: a == b,
    "Greater": lambda a, b: a > b,
    "GreaterOrEqual": lambda a, b: a >= b,
    "Less": lambda a, b: a < b,
    "LessOrEqual": lambda a, b: a <= b,
}


@pytest.mark.parametrize("op", sorted(RELATIONS))
@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [((1, 4, 5, 16), (1, 4, 5, 16)), ((1, 4, 5, 1), (1, 4, 5, 31)), ((3,), (2, 1))],
)
def test_comparison_is_the_stored_integers_broadcast(op, shape_a, shape_b):
    rng = np.random.default_rng(3)
    a = rng.integers(-4, 4, shape_a).astype(np.int8)  # a small range: many equal pairs
    b = rng.integers(-4, 4, shape_b).astype(np.int8)
    got = _run(_ctx(a=a, b=b), op, ["a", "b"])
    shape = np.broadcast_shapes(shape_a, shape_b)
    ref = np.empty(shape, bool)
    for index in np.ndindex(*shape):  # ONNX broadcasting, one element at a time
        ia = tuple(
            i if d > 1 else 0 for i, d in zip(index[len(index) - a.ndim :], a.shape, strict=True)
        )
        ib = tuple(
            i if d > 1 else 0 for i, d in zip(index[len(index) - b.ndim :], b.shape, strict=True)
        )
        ref[index] = RELATIONS[op](int(a[ia]), int(b[ib]))
    assert got.dtype == np.bool_ and got.shape == shape
    assert (got == ref).all()


def test_comparison_ignores_exponents_and_takes_int16():
    # 3 at 2^-4 (0.1875) against 2 at 2^-2 (0.5): the runtime compares 3 > 2, not the values
    ctx = _ctx(exps={"a": -4, "b": -2}, a=np.int16([3, -32768]), b=np.int16([2, 32767]))
    assert _run(ctx, "Greater", ["a", "b"], quant_type="S16").tolist() == [True, False]
    assert any("without rescaling" in n for n in ctx.notes)


def test_comparison_merges_to_four_dimensions_or_refuses():
    assert elemwise_rows([1, 4, 5, 16], [1, 4, 5, 16])[3] == 1
    assert elemwise_rows([1, 4, 5, 1], [1, 4, 5, 31])[3] == 2  # (20, 1) against (20, 31)
    # alternating broadcasts never merge: 5 dimensions, beyond the runtime's 4-D loop
    a, b = [2, 1, 2, 1, 2], [1, 2, 1, 2, 1]
    assert elemwise_rows(a, b)[3] == 5
    ctx = _ctx(a=np.zeros(a, np.int8), b=np.zeros(b, np.int8))
    with pytest.raises(EspdlError, match="more than 4 dimensions"):
        _run(ctx, "Equal", ["a", "b"])
    with pytest.raises(EspdlError, match="quant_type"):
        _run(_ctx(a=np.int8([1]), b=np.int8([1])), "Less", ["a", "b"], quant_type="F32")


# ---------------------------------------------------------------- Gather


def _gather_loop(x: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    # dl_module_gather.hpp forward_template: outer blocks, then indices, rows of inner_size
    outer = int(np.prod(x.shape[:axis], dtype=int))
    inner = int(np.prod(x.shape[axis + 1 :], dtype=int))
    flat, out = x.reshape(-1), []
    for o in range(outer):
        for i in indices.reshape(-1):
            start = (o * x.shape[axis] + int(i)) * inner
            out.extend(flat[start : start + inner])
    shape = x.shape[:axis] + indices.shape + x.shape[axis + 1 :]
    return np.array(out, x.dtype).reshape(shape)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_gather_copies_rows_as_the_module_does(axis):
    x = np.arange(2 * 3 * 4, dtype=np.int16).reshape(2, 3, 4) - 12
    axis_n = axis % 3
    indices = np.int64([[0, 1, 1], [x.shape[axis_n] - 1, 0, 1]])
    ctx = _ctx(init={"i": Tensor("i", indices, [0])}, x=x)
    got = _run(ctx, "Gather", ["x", "i"], axis=axis, quant_type="S16")
    assert (got == _gather_loop(x, indices, axis_n)).all()


def test_gather_refuses_indices_outside_the_axis():
    ctx = _ctx(init={"i": Tensor("i", np.int64([0, -1]), [0])}, x=np.int8([[1, 2], [3, 4]]))
    with pytest.raises(EspdlError, match="no wrap of negative"):
        _run(ctx, "Gather", ["x", "i"], axis=0)


# ---------------------------------------------------------------- ScatterND


def _scatter_loop(data, indices, updates, reduction, lo, hi):
    # dl_module_scatter_nd.hpp: copy, then each slice at sum(index · axis_offset), in order
    out = data.reshape(-1).astype(int).tolist()
    depth = indices.shape[-1]
    strides = [int(np.prod(data.shape[i + 1 :], dtype=int)) for i in range(data.ndim)]
    size = int(np.prod(data.shape[depth:], dtype=int))
    rows = indices.reshape(-1, depth)
    upd = updates.reshape(-1).astype(int).tolist()
    for k, index in enumerate(rows):
        base = sum(int(i) * strides[d] for d, i in enumerate(index))
        for j in range(size):
            cur, new = out[base + j], upd[k * size + j]
            if reduction == "add":
                new = min(max(cur + new, lo), hi)
            elif reduction == "mul":
                new = min(max(cur * new, lo), hi)
            elif reduction == "max":
                new = max(cur, new)
            elif reduction == "min":
                new = min(cur, new)
            out[base + j] = new
    return np.array(out).reshape(data.shape)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_in_order_with_saturation(reduction):
    rng = np.random.default_rng(7)
    data = rng.integers(-128, 128, (3, 4, 2)).astype(np.int8)
    indices = np.int64([[0, 1], [2, 3], [0, 1], [1, 0]])  # [0, 1] twice: the later sees the first
    updates = rng.integers(-128, 128, (4, 2)).astype(np.int8)
    data[0, 1], updates[0], updates[2] = [120, -120], [100, -100], [5, 3]  # 220: saturates
    init = {"i": Tensor("i", indices, [0])}
    ctx = _ctx(init=init, exps={"d": -5, "u": -5}, d=data, u=updates)
    got = _run(ctx, "ScatterND", ["d", "i", "u"], reduction=reduction)
    ref = _scatter_loop(data, indices, updates, reduction, -128, 127)
    assert got.dtype == np.int8 and (got == ref).all()
    if reduction in ("add", "mul"):  # the case reaches saturation
        assert (_scatter_loop(data, indices, updates, reduction, -(2**20), 2**20) != ref).any()


def test_scatter_nd_hand_worked_int16_and_refusals():
    ctx = _ctx(
        init={"i": Tensor("i", np.int64([[1], [1]]), [0])},
        exps={"d": -14, "u": -15},
        d=np.int16([5, 30000, -2]),
        u=np.int16([2000, 1000]),
    )
    got = _run(ctx, "ScatterND", ["d", "i", "u"], reduction="add", quant_type="S16")
    assert got.tolist() == [5, 32767, -2]  # 30000 + 2000 saturates, + 1000 stays there
    assert any("without rescaling" in n for n in ctx.notes)
    bad = _ctx(init={"i": Tensor("i", np.int64([[3]]), [0])}, d=np.int8([1, 2]), u=np.int8([9]))
    with pytest.raises(EspdlError, match="does not wrap"):
        _run(bad, "ScatterND", ["d", "i", "u"])


# ---------------------------------------------------------------- ReverseSequence


def _reverse_loop(x, lengths, batch_axis, time_axis):
    # dl_module_reverse_sequence.hpp: swap feature blocks t <-> len - 1 - t, in place
    out = x.reshape(-1).copy()
    strides = [int(np.prod(x.shape[i + 1 :], dtype=int)) for i in range(x.ndim)]
    feature = int(np.prod(x.shape[2:], dtype=int))
    for b in range(x.shape[batch_axis]):
        n = int(lengths[b])
        for t in range(n // 2 if n > 1 else 0):
            p1 = b * strides[batch_axis] + t * strides[time_axis]
            p2 = b * strides[batch_axis] + (n - 1 - t) * strides[time_axis]
            for i in range(feature):
                out[p1 + i], out[p2 + i] = out[p2 + i], out[p1 + i]
    return out.reshape(x.shape)


@pytest.mark.parametrize(("batch_axis", "time_axis"), [(0, 1), (1, 0)])
def test_reverse_sequence_swaps_steps(batch_axis, time_axis):
    x = np.arange(4 * 5 * 3, dtype=np.int8).reshape((4, 5, 3) if batch_axis == 0 else (5, 4, 3))
    lengths = np.int64([5, 1, 0, 4])
    ctx = _ctx(init={"n": Tensor("n", lengths, [0])}, x=x)
    got = _run(ctx, "ReverseSequence", ["x", "n"], batch_axis=batch_axis, time_axis=time_axis)
    assert (got == _reverse_loop(x, lengths, batch_axis, time_axis)).all()
    ctx = _ctx(init={"n": Tensor("n", np.int64([6, 1, 1, 1]), [0])}, x=x)
    with pytest.raises(EspdlError, match="past the"):
        _run(ctx, "ReverseSequence", ["x", "n"], batch_axis=batch_axis, time_axis=time_axis)


# ---------------------------------------------------------------- DepthToSpace / SpaceToDepth


def _d2s_loop(x, bs, mode):
    # dl_module_depth_to_space.hpp depth_to_space_crd / _dcr, writes in memory order
    n, h, w, c = x.shape
    c_out = c // (bs * bs)
    out = [None] * x.size
    src = iter(x.reshape(-1).tolist())
    for b, i, j, k in itertools.product(range(n), range(h), range(w), range(c)):
        if mode == "CRD":
            oc, oh, ow = k // (bs * bs), i * bs + (k % (bs * bs)) // bs, j * bs + k % bs
        else:
            oc, oh, ow = k % bs, i * bs + k // (bs * bs), j * bs + (k % (bs * bs)) // bs
        idx = b * h * w * c + oh * (w * bs * c_out) + ow * c_out + oc
        value = next(src)
        if not 0 <= idx < len(out):
            return None, None  # a write outside the output
        out[idx] = value
    return out, (n, h * bs, w * bs, c_out)


@pytest.mark.parametrize(
    ("c", "bs", "mode"),
    [(8, 2, "CRD"), (12, 2, "CRD"), (9, 3, "CRD"), (8, 2, "DCR"), (18, 3, "DCR"), (12, 2, "DCR")],
)
def test_depth_to_space_follows_the_module(c, bs, mode):
    x = np.arange(2 * 2 * 3 * c, dtype=np.int16).reshape(2, 2, 3, c)
    ref, shape = _d2s_loop(x, bs, mode)
    ctx = _ctx(x=x)
    if ref is None or None in ref:  # DCR with C/bs² != bs: outputs unwritten or overflowed
        with pytest.raises(EspdlError, match="writes|outside"):
            _run(ctx, "DepthToSpace", ["x"], blocksize=bs, mode=mode, quant_type="S16")
        return
    got = _run(ctx, "DepthToSpace", ["x"], blocksize=bs, mode=mode, quant_type="S16")
    assert got.shape == shape and got.reshape(-1).tolist() == ref
    if mode == "DCR" and c != bs**3:
        return  # the module's DCR moves values where ONNX does not; the loop above is the rule
    # where the module agrees with ONNX (CRD always, DCR when C/bs² == bs), so does this
    nchw = x.transpose(0, 3, 1, 2)
    n, ch, h, w = nchw.shape
    if mode == "CRD":
        onnx = nchw.reshape(n, ch // bs**2, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        onnx = nchw.reshape(n, bs, bs, ch // bs**2, h, w).transpose(0, 3, 4, 1, 5, 2)
    onnx = onnx.reshape(n, ch // bs**2, h * bs, w * bs).transpose(0, 2, 3, 1)
    assert (got == onnx).all()


def test_space_to_depth_is_pixel_unshuffle_order():
    x = np.arange(2 * 4 * 6 * 3, dtype=np.int8).reshape(2, 4, 6, 3)
    bs = 2
    n, h, w, c = x.shape
    ref = np.zeros(x.size, np.int8)
    for b, i, j, k in itertools.product(range(n), range(h), range(w), range(c)):
        oc = k * bs * bs + (i % bs) * bs + j % bs  # dl_module_space_to_depth.hpp
        idx = b * h * w * c + (i // bs) * (w // bs * c * 4) + (j // bs) * c * 4 + oc
        ref[idx] = x[b, i, j, k]
    got = _run(_ctx(x=x), "SpaceToDepth", ["x"], blocksize=bs)
    assert got.shape == (2, 2, 3, 12) and (got.reshape(-1) == ref).all()
    # ... which is not ONNX's channel order (block offset first) once C > 1
    onnx = x.reshape(n, h // bs, bs, w // bs, bs, c).transpose(0, 1, 3, 2, 4, 5)
    assert not (got == onnx.reshape(got.shape)).all()
    with pytest.raises(EspdlError, match="multiples"):
        _run(_ctx(x=np.zeros((1, 3, 4, 1), np.int8)), "SpaceToDepth", ["x"], blocksize=2)


# ---------------------------------------------------------------- Resize


def _f32(value: Fraction) -> F32:
    """The float32 nearest to an exact fraction, ties to even."""
    f = F32(float(value))
    best = min(
        (np.nextafter(f, F32(-np.inf)), f, np.nextafter(f, F32(np.inf))),
        key=lambda g: (abs(Fraction(float(g)) - value), int(F32(g).view(np.int32)) & 1),
    )
    return F32(best)


def _mul(a, b, fused_c=None):
    """float32 ``a·b`` (one rounding), or ``a·b + c`` with one rounding when ``fused_c``."""
    exact = Fraction(float(a)) * Fraction(float(b))
    if fused_c is not None:
        exact += Fraction(float(fused_c))
    return _f32(exact)


def _coeffs(o, n_in, inv, align, fused):
    # linear_coeffs of dl_base_resize.cpp, one float32 operation at a time
    if align:
        fx = _mul(F32(o), inv)
    elif fused:
        fx = _mul(F32(o) + F32(0.5), inv, F32(-0.5))
    else:
        fx = F32(_mul(F32(o) + F32(0.5), inv) - F32(0.5))
    i = int(np.floor(fx))
    fx = F32(fx - F32(i))
    if i < 0:
        i, fx = 0, F32(0)
    if i >= n_in - 1:
        i, fx = n_in - 2, F32(1)
    return i, F32(F32(1) - fx), fx


def _lerp(v0, r0, v1, r1, fused):
    p1 = _mul(v1, r1)
    return _mul(v0, r0, p1) if fused else F32(_mul(v0, r0) + p1)


def _round(v, half_even):
    if half_even:
        return int(np.rint(v))
    return int(np.floor(F32(float(v) + 0.5)))  # floorf(value + 0.5): the double sum as float


def _resize_linear_loop(x, out_hw, e_in, e_out, target, align=False, scales=None):
    """resize_linear_c1 for an int8 [1, (H,) W, C] tensor: W first, then H."""
    fused, half_even = target in ("esp32s3", "esp32p4"), target == "esp32p4"
    hw = x.shape[1:-1]
    if align:
        scales = [F32(o - 1) / F32(i - 1) for o, i in zip(out_hw, hw, strict=True)]
    elif scales is None:
        scales = [F32(o) / F32(i) for o, i in zip(out_hw, hw, strict=True)]
    coef = [
        [_coeffs(o, n, F32(1) / s, align, fused) for o in range(m)]
        for n, m, s in zip(hw, out_hw, scales, strict=True)
    ]
    v = x[0].astype(F32) * F32(2.0**e_in)
    if x.ndim == 3:
        v = v[None]
        coef = [[(0, F32(1), F32(0))], *coef]
    rows = np.empty((v.shape[0], out_hw[-1], x.shape[-1]), F32)
    for y, (ox, (i, r0, r1)), c in itertools.product(
        range(v.shape[0]), enumerate(coef[-1]), range(x.shape[-1])
    ):
        rows[y, ox, c] = _lerp(v[y, i, c], r0, v[y, min(i + 1, hw[-1] - 1), c], r1, fused)
    out = np.empty((len(coef[0]), out_hw[-1], x.shape[-1]), np.int64)
    last = v.shape[0] - 1
    for (oy, (j, q0, q1)), ox, c in itertools.product(
        enumerate(coef[0]), range(out_hw[-1]), range(x.shape[-1])
    ):
        value = (
            rows[j, ox, c]
            if x.ndim == 3
            else _lerp(rows[j, ox, c], q0, rows[min(j + 1, last), ox, c], q1, fused)
        )
        out[oy, ox, c] = min(max(_round(F32(value * F32(2.0**-e_out)), half_even), -128), 127)
    return out.reshape((1, *out_hw, x.shape[-1]))


def _resize_ctx(x, e_in, e_out, target, scales=None, sizes=None):
    init = {}
    if scales is not None:
        init["s"] = Tensor("s", F32(scales), [0])
    if sizes is not None:
        init["z"] = Tensor("z", np.int64(sizes), [0])
    return _ctx(target, init=init, exps={"x": e_in, "y": e_out}, x=x)


def _resize(ctx, mode, scales=True, **attrs):
    inputs = ["x", "", "s"] if scales else ["x", "", "", "z"]
    return _run(ctx, "Resize", inputs, mode=mode, **attrs)


@pytest.mark.parametrize(
    ("target", "want"),
    [("esp32s3", [0, 3, 8, 10]), ("c", [0, 3, 8, 10]), ("esp32p4", [0, 2, 8, 10])],
)
def test_resize_linear_hand_worked_half_steps(target, want):
    # [0, 10] doubled, half_pixel: weights 1, .75/.25, .25/.75, 1 -> 0, 2.5, 7.5, 10
    ctx = _resize_ctx(np.int8([[[0], [10]]]), 0, 0, target, scales=[1, 1, 2])
    assert _resize(ctx, "linear").reshape(-1).tolist() == want


def test_resize_linear_fused_multiply_add_decides_a_value():
    # 2 -> 7 (scale 3.5), output 3: fx = 3.5 / 3.5 - 0.5 = 0.5 unfused, but the FPU's one
    # rounding of (3 + .5) · fl(1/3.5) - .5 keeps 0.50000006; with -63 and -128 at 2^0 the
    # value is -95.5 unfused (half up: -95; half even: -96) and -95.50001 fused (-96)
    x = np.int8([[[-63], [-128]]])
    got = {
        t: _resize(_resize_ctx(x, 0, 0, t, sizes=[1, 1, 7]), "linear", scales=False)
        for t in ("c", "esp32s3", "esp32p4")
    }
    assert got["c"][0, 3, 0] == -95 and got["esp32s3"][0, 3, 0] == -96
    assert got["esp32p4"][0, 3, 0] == -96
    for t, value in got.items():
        assert (value == _resize_linear_loop(x, [7], 0, 0, t)).all()


@pytest.mark.parametrize("target", ["c", "esp32s3", "esp32p4"])
@pytest.mark.parametrize(
    ("hw", "out_hw", "align"),
    [((3, 4), (7, 10), False), ((4, 3), (9, 7), True), ((1, 5), (3, 9), False)],
)
def test_resize_linear_2d_matches_the_kernel_loop(target, hw, out_hw, align):
    rng = np.random.default_rng(11)
    x = rng.integers(-128, 128, (1, *hw, 3)).astype(np.int8)
    e_in, e_out = -5, -4  # a right shift of the result, with rounding
    ctx = _resize_ctx(x, e_in, e_out, target, sizes=[1, 3, *out_hw])
    attrs = {"coordinate_transformation_mode": "align_corners"} if align else {}
    got = _resize(ctx, "linear", scales=False, **attrs)
    assert (got == _resize_linear_loop(x, list(out_hw), e_in, e_out, target, align)).all()


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_samples_of_a_batch_one_model_are_separate_runs(mode):
    x = np.random.default_rng(5).integers(-128, 128, (3, 2, 3, 4)).astype(np.int8)
    batch = _resize(_resize_ctx(x, -3, -3, "esp32p4", scales=[1, 1, 2, 1.5]), mode)
    for k in range(3):
        one = _resize(_resize_ctx(x[k : k + 1], -3, -3, "esp32p4", scales=[1, 1, 2, 1.5]), mode)
        assert (batch[k : k + 1] == one).all()
    assert batch.shape == (3, 4, 4, 4)


def test_resize_linear_saturates():
    # 127 at 2^0 into an output at 2^-1: 254 saturates to 127
    x = np.int8([[[127], [-128]]])
    got = _resize(_resize_ctx(x, 0, -1, "esp32s3", scales=[1, 1, 2]), "linear")
    assert got.reshape(-1).tolist() == [127, 127, -128, -128]


def test_resize_nearest_rescale_per_target():
    x = np.int8([[[[100], [-3]]]])  # [1, 1, 2, 1]
    # output one exponent down: 100 · 2 = 200; the C kernel wraps it, the PIE kernels saturate
    c = _resize(_resize_ctx(x, -4, -5, "c", scales=[1, 1, 1, 2]), "nearest")
    s3 = _resize(_resize_ctx(x, -4, -5, "esp32s3", scales=[1, 1, 1, 2]), "nearest")
    assert c.reshape(-1).tolist() == [-56, -56, -6, -6] and s3.reshape(-1).tolist() == [
        127,
        127,
        -6,
        -6,
    ]
    # output one exponent up: -3 / 2 = -1.5 -> -1 half up, -2 half to even
    up = {
        t: _resize(_resize_ctx(x, -4, -3, t, scales=[1, 1, 1, 2]), "nearest")
        for t in ("esp32s3", "esp32p4")
    }
    assert up["esp32s3"].reshape(-1).tolist() == [50, 50, -1, -1]
    assert up["esp32p4"].reshape(-1).tolist() == [50, 50, -2, -2]


def test_resize_nearest_sizes_and_refusals():
    x = np.arange(5, dtype=np.int8).reshape(1, 5, 1)
    got = _resize(_resize_ctx(x, 0, 0, "c", sizes=[1, 1, 15]), "nearest", scales=False)
    assert got.reshape(-1).tolist() == [i * 5 // 15 for i in range(15)]  # floor(out · in / out)
    ctx = _resize_ctx(np.zeros((2, 4, 1), np.int8), 0, 0, "c", scales=[1, 1, 2])
    ctx.infos["x"] = ValueInfo("x", [2, 4, 1], 3, [0])  # a model declaring batch 2
    with pytest.raises(EspdlError, match="first only"):
        _resize(ctx, "nearest")
    ctx = _resize_ctx(np.zeros((1, 4, 1), np.int16), 0, 0, "c", scales=[1, 1, 2])
    with pytest.raises(EspdlError, match="int16"):
        _resize(ctx, "nearest", quant_type="S16")
    with pytest.raises(EspdlError, match="'cubic'"):
        _resize(_resize_ctx(x, 0, 0, "c", scales=[1, 1, 2]), "cubic")


# ---------------------------------------------------------------- Espressif's suite files


def _suite_files():
    return sorted(p for p in SUITE.glob("*/*/*.espdl") if p.parent.name in MY_OPS)


def test_suite_files_of_these_ops_are_present_for_every_target():
    folders = {(p.parent.parent.name, p.parent.name) for p in _suite_files()}
    for op in MY_OPS:
        have = {f for f, o in folders if o == op}
        assert {"c_8", "esp32_8", "esp32s3_8", "esp32p4_8", "esp32s31_8"} <= have, op


@pytest.mark.parametrize("path", _suite_files(), ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_suite_file_equal_under_the_chip_rule(path):
    model = read_espdl(path)
    target = path.parent.parent.name.rsplit("_", 1)[0]
    result = simulate_espdl(model, None, target)
    expected = {t.name: t.data for t in model.test_outputs}
    exps = {t.name: t.exponent for t in model.test_outputs}
    checks = check_outputs(result.outputs, expected, result.exponents, exps)
    assert checks and all(c.ok for c in checks), [c.summary() for c in checks]
