"""Every chip layer kind against a brute-force reference: plain Python loops over tiny tensors,
Python integers, following the arithmetic written in docs/espdl-export.md ("Chip simulator")."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1.chip import quantize_input, simulate_chip
from amct_bridge.espdl.v1.chip_ops import exact_matmul
from amct_bridge.espdl.v1.network import INPUT, IntTensor, NetLayer, Network

RNG = np.random.default_rng(7)


def sat(v: int, bits: int) -> int:
    return max(-(2 ** (bits - 1)), min(2 ** (bits - 1) - 1, v))


def fshift(v: int, s: int) -> int:
    return v // 2**s if s > 0 else v * 2**-s  # Python // floors


def act_ref(y: int, kind: str | None, alpha: list[int], e_a: int, c: int, bits: int) -> int:
    if kind == "ReLU":
        return max(y, 0)
    if kind in ("LeakyReLU", "PReLU") and y < 0:
        a = alpha[c] if len(alpha) > 1 else alpha[0]
        return sat(fshift(y * a, -e_a), bits)
    return y


def pads_ref(size, k, s, mode):
    """[before, after], written from TF's SAME definition."""
    if mode == "VALID":
        return 0, 0
    out = (size + s - 1) // s
    total = max((out - 1) * s + k - size, 0)
    return (
        (total - total // 2, total // 2)
        if mode == "SAME_BEGIN"
        else (total // 2, total - total // 2)
    )


def padded(x, pads, value=0):
    t, b, l_, r = pads
    h, w, c = len(x), len(x[0]), len(x[0][0])
    out = [[[value] * c for _ in range(w + l_ + r)] for _ in range(h + t + b)]
    for i in range(h):
        for j in range(w):
            out[i + t][j + l_] = list(x[i][j])
    return out


def conv_ref(x, w, pads, strides, depthwise):
    """Σ x·w per output pixel/channel, loops (x HWC lists, w HWCN array)."""
    xp = padded(x, pads)
    kh, kw, c, n = w.shape
    n_out = c if depthwise else n
    ho = (len(xp) - kh) // strides[0] + 1
    wo = (len(xp[0]) - kw) // strides[1] + 1
    out = [[[0] * n_out for _ in range(wo)] for _ in range(ho)]
    for i in range(ho):
        for j in range(wo):
            for o in range(n_out):
                acc = 0
                for di in range(kh):
                    for dj in range(kw):
                        px = xp[i * strides[0] + di][j * strides[1] + dj]
                        if depthwise:
                            acc += px[o] * int(w[di, dj, o, 0])
                        else:
                            acc += sum(px[ci] * int(w[di, dj, ci, o]) for ci in range(c))
                out[i][j][o] = acc
    return out


def requant_ref(acc, c, layer, e_in, bits, s3):
    if s3:
        lane = 40 if bits == 16 else 20
        acc = max(-(2 ** (lane - 1)), min(2 ** (lane - 1) - 1, acc))
    e_w, e_out = layer.filter.exponent, layer.output_exponent
    if isinstance(e_w, np.ndarray):
        b16 = int(layer.bias.values[c]) if layer.bias is not None else 0
        t = sat(acc // 16 + b16, 16)
        d = e_out - (e_in + int(e_w[c]) + 4)
        y = 0 if d > 12 else sat((t * (2 ** (12 - d))) // 4096, 8) if d <= 12 else 0
    else:
        y = fshift(acc, e_out - e_in - e_w) + (int(layer.bias.values[c]) if layer.bias else 0)
        y = sat(y, bits)
    alpha = [] if layer.alpha is None else [int(a) for a in layer.alpha.values]
    e_a = 0 if layer.alpha is None else layer.alpha.exponent
    return sat(act_ref(y, layer.activation, alpha, e_a, c, bits), bits)


def rand_ints(shape, bits, scale=1.0):
    hi = int((2 ** (bits - 1) - 1) * scale)
    return RNG.integers(-hi - 1, hi + 1, shape)


def run(layers, x, e_in, ftype="s16", target="esp32", per_channel=False):
    net = Network(ftype, per_channel, layers, input_exponent=e_in, outputs=[layers[-1].name])
    return simulate_chip(net, np.asarray(x)[None], target=target)


CONV_CASES = [  # ftype, depthwise, padding, pads, strides, k, activation, per_channel, target
    ("s16", False, "SAME_END", None, (2, 2), (3, 3), "ReLU", False, "esp32"),
    ("s16", False, "VALID", None, (1, 1), (3, 2), "LeakyReLU", False, "esp32s3"),
    ("s16", True, "SAME_BEGIN", None, (2, 2), (3, 3), "PReLU", False, "esp32"),
    ("s8", False, "NOT_SET", [1, 0, 2, 1], (1, 2), (2, 3), None, False, "esp32c3"),
    ("s8", True, "SAME_END", None, (1, 1), (3, 3), "ReLU", True, "esp32"),
    ("s8", False, "SAME_END", None, (1, 1), (1, 1), "LeakyReLU", True, "esp32s3"),
    ("s8", False, "VALID", None, (1, 1), (3, 3), None, True, "esp32s3"),
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_and_depthwise_match_loops(case):
    ftype, dw, padding, pads, strides, k, act, per_channel, target = case
    bits = 16 if ftype == "s16" else 8
    c, n = 3, (3 if dw else 4)
    x = rand_ints((5, 6, c), bits, 0.5)
    w = rand_ints((*k, c, 1 if dw else n), bits)
    e_in = -3
    if per_channel:
        e_w = RNG.integers(-9, -5, n)
        bias = IntTensor(rand_ints((n,), 16, 0.1), e_in + e_w + 4)
        filt = IntTensor(w, e_w)
        e_out = -1
    else:
        filt, e_out = IntTensor(w, -9 if bits == 16 else -6), -2 if bits == 16 else 1
        bias = IntTensor(rand_ints((n,), bits, 0.2), e_out)
    alpha = None
    if act in ("LeakyReLU", "PReLU"):
        alpha = IntTensor(RNG.integers(1, 2 ** (bits - 2), n if act == "PReLU" else 1), -(bits - 2))
    attrs = {"padding": padding, "strides": list(strides)}
    if pads:
        attrs["pads"] = pads
    kind = "DepthwiseConv2D" if dw else "Conv2D"
    layer = NetLayer(
        "c", kind, [INPUT], e_out, attrs=attrs, filter=filt, bias=bias, activation=act, alpha=alpha
    )
    got = run([layer], x, e_in, ftype, target, per_channel)["c"].values[0]
    if padding == "NOT_SET":
        p = pads
    else:
        p = [*pads_ref(5, k[0], strides[0], padding), *pads_ref(6, k[1], strides[1], padding)]
    acc = conv_ref(x.tolist(), w, p, strides, dw)
    want = [
        [
            [
                requant_ref(acc[i][j][o], o, layer, e_in, bits, target == "esp32s3")
                for o in range(len(acc[0][0]))
            ]
            for j in range(len(acc[0]))
        ]
        for i in range(len(acc))
    ]
    assert got.tolist() == want
    assert got.dtype == (np.int16 if bits == 16 else np.int8)


def test_esp32s3_accumulator_saturation_differs_from_esp32():
    """int8 1x1 conv with |acc| > 2^19: esp32s3 clips the 20-bit lane, esp32 does not."""
    c = 64
    x = np.full((1, 1, c), 127)
    w = np.full((1, 1, c, 1), 127)  # acc = 64 * 127 * 127 = 1032256 > 2^19
    layer = NetLayer("c", "Conv2D", [INPUT], 6, filter=IntTensor(w, 0))
    acc = c * 127 * 127
    out = {t: int(run([layer], x, 0, "s8", t)["c"].values.ravel()[0]) for t in ("esp32", "esp32s3")}
    assert out["esp32"] == sat(acc // 64, 8) == 127
    layer.output_exponent = 13
    out = {t: int(run([layer], x, 0, "s8", t)["c"].values.ravel()[0]) for t in ("esp32", "esp32s3")}
    assert out == {"esp32": acc // 2**13, "esp32s3": (2**19 - 1) // 2**13}
    assert out["esp32"] != out["esp32s3"]


@pytest.mark.parametrize("flatten", [True, False])
def test_fully_connected(flatten):
    x = rand_ints((2, 3, 4), 16, 0.3)
    n_in = 24 if flatten else 4
    w = rand_ints((1, 1, n_in, 5), 16)
    layer = NetLayer(
        "fc",
        "FullyConnected",
        [INPUT],
        -4,
        attrs={"flatten": flatten},
        filter=IntTensor(w, -15),
        bias=IntTensor(rand_ints((5,), 16, 0.1), -4),
        activation="ReLU",
    )
    got = run([layer], x, -6)["fc"].values[0]
    rows = [x.ravel().tolist()] if flatten else x.reshape(-1, 4).tolist()
    want = [
        [
            requant_ref(
                sum(r[i] * int(w[0, 0, i, o]) for i in range(n_in)), o, layer, -6, 16, False
            )
            for o in range(5)
        ]
        for r in rows
    ]
    assert got.reshape(len(rows), 5).tolist() == want
    assert got.shape == ((5,) if flatten else (2, 3, 5))


@pytest.mark.parametrize("kind", ["Add2D", "Sub2D", "Mul2D"])
@pytest.mark.parametrize("exps", [(-5, -3, -4), (-2, -6, -7), (-4, -4, 1)])
def test_add_sub_mul(kind, exps):
    """Two inputs at different exponents: the input (copied at e0) and a 1x1 conv of it at e1."""
    e0, e1, e_out = exps
    x = RNG.integers(-3000, 3000, (2, 3, 2))
    sign = np.zeros((1, 1, 2, 2), np.int64)
    sign[0, 0, 0, 0], sign[0, 0, 1, 1] = 1, -1
    a = NetLayer("a", "Reshape", [INPUT], attrs={"shape": [2, 3, 2]})
    b = NetLayer("b", "Conv2D", [INPUT], e1, filter=IntTensor(sign, 0))
    op = NetLayer("op", kind, ["a", "b"], e_out, activation="ReLU" if kind == "Add2D" else None)
    got = run([a, b, op], x, e0)
    xb = got["b"].values[0]
    assert xb.tolist() == [
        [[sat(fshift(v * (1 - 2 * c), e1 - e0), 16) for c, v in enumerate(px)] for px in row]
        for row in x.tolist()
    ]
    want = []
    for row_a, row_b in zip(x.tolist(), xb.tolist(), strict=True):
        out_row = []
        for pa, pb in zip(row_a, row_b, strict=True):
            out_px = []
            for va, vb in zip(pa, pb, strict=True):
                if kind == "Mul2D":
                    y = sat(fshift(va * vb, e_out - e0 - e1), 16)
                else:
                    hi = max(e0, e1)
                    sa, sb = fshift(va, hi - e0), fshift(vb, hi - e1)
                    y = sat(fshift(sa + sb if kind == "Add2D" else sa - sb, e_out - hi), 16)
                out_px.append(max(y, 0) if kind == "Add2D" else y)
            out_row.append(out_px)
        want.append(out_row)
    assert got["op"].values[0].tolist() == want
    assert got["op"].approximate == (kind != "Add2D")
    assert got.approximate_layers == ([] if kind == "Add2D" else ["op"])


def test_pools_and_global_pools():
    x = RNG.integers(-2000, 2000, (5, 5, 2))
    layers = [
        NetLayer(
            "mp",
            "MaxPool2D",
            [INPUT],
            attrs={"pool": [2, 2], "padding": "SAME_END", "strides": [2, 2]},
        ),
        NetLayer(
            "ap",
            "AvgPool2D",
            [INPUT],
            -3,
            attrs={"pool": [3, 3], "padding": "VALID", "strides": [1, 1]},
        ),
        NetLayer("gmp", "GlobalMaxPool2D", [INPUT]),
        NetLayer("gap", "GlobalAveragePool2D", ["mp"], -2),
        NetLayer("after", "ReLU", ["gap"]),
    ]
    got = run(layers, x, -4)
    xl = x.tolist()
    # max pool SAME_END 2x2 stride 2 on 5x5: pads (0, 1): padded cells never win
    mp = [
        [
            [
                max(
                    xl[i][j][c]
                    for i in range(2 * oi, min(2 * oi + 2, 5))
                    for j in range(2 * oj, min(2 * oj + 2, 5))
                )
                for c in range(2)
            ]
            for oj in range(3)
        ]
        for oi in range(3)
    ]
    assert got["mp"].values[0].tolist() == mp and got["mp"].exponent == -4

    def avg(total, n, e_in, e_out):  # v3 rule: k = largest with 2^k // n < 16384
        k = max(k for k in range(40) if 2**k // n < 16384)
        return sat(fshift(total * (2**k // n), e_out - e_in + k), 16)

    ap = [
        [
            [
                avg(
                    sum(xl[i][j][c] for i in range(oi, oi + 3) for j in range(oj, oj + 3)),
                    9,
                    -4,
                    -3,
                )
                for c in range(2)
            ]
            for oj in range(3)
        ]
        for oi in range(3)
    ]
    assert got["ap"].values[0].tolist() == ap
    assert got["gmp"].values[0].tolist() == [
        [[max(xl[i][j][c] for i in range(5) for j in range(5)) for c in range(2)]]
    ]
    gap = [avg(sum(mp[i][j][c] for i in range(3) for j in range(3)), 9, -4, -2) for c in range(2)]
    assert got["gap"].values[0].tolist() == [[gap]]
    # approximate: the layers themselves and what reads them
    assert got.approximate_layers == ["ap", "gap"]
    assert [got[n].approximate for n in ("mp", "ap", "gmp", "gap", "after")] == [
        False,
        True,
        False,
        True,
        True,
    ]
    # the average of a constant tensor is that constant (the rule is close to a true mean)
    const = run([NetLayer("g", "GlobalAveragePool2D", [INPUT], -4)], np.full((3, 3, 1), 700), -4)
    assert abs(int(const["g"].values.ravel()[0]) - 700) <= 1


def test_shape_and_copy_layers():
    x = RNG.integers(-100, 100, (2, 3, 4))
    alpha = RNG.integers(1, 60, 4)
    layers = [
        NetLayer("p", "Pad", [INPUT], attrs={"paddings": [1, 0, 0, 2], "constant": 0}),
        NetLayer("t", "Transpose", [INPUT], attrs={"perm": [1, 0, 2]}),
        NetLayer("cat", "Concat", [INPUT, "t2"], attrs={"axis": 1}),
    ]
    t2 = NetLayer("t2", "Reshape", ["t"], attrs={"shape": [2, 3, 4]})
    layers.insert(2, t2)
    layers += [
        NetLayer("f", "Flatten", ["cat"]),
        NetLayer("lr", "LeakyReLU", [INPUT], attrs={"alpha": 13, "alpha_exponent": -6}),
        NetLayer("pr", "PReLU", [INPUT], attrs={"alpha": alpha.tolist(), "alpha_exponent": -6}),
        NetLayer("mx", "Max2D", [INPUT, "lr"]),
        NetLayer("mn", "Min2D", [INPUT, "lr"]),
        NetLayer("r", "ReLU", ["mn"]),
    ]
    got = run(layers, x, -5, "s8")
    xl = x.tolist()
    assert got["p"].values[0].tolist() == padded(xl, [1, 0, 0, 2])
    assert got["t"].values[0].tolist() == [[xl[i][j] for i in range(2)] for j in range(3)]
    cat = [xl[i] + got["t2"].values[0].tolist()[i] for i in range(2)]
    assert got["cat"].values[0].tolist() == cat
    assert got["f"].values[0].tolist() == [v for row in cat for px in row for v in px]
    lr = [[[v if v >= 0 else fshift(v * 13, 6) for v in px] for px in row] for row in xl]
    pr = [
        [[v if v >= 0 else fshift(v * int(alpha[c]), 6) for c, v in enumerate(px)] for px in row]
        for row in xl
    ]
    assert got["lr"].values[0].tolist() == lr and got["pr"].values[0].tolist() == pr
    rows = zip(xl, lr, strict=True)
    pairs = [list(zip(*px, strict=True)) for r in rows for px in zip(*r, strict=True)]
    assert got["mx"].values[0].ravel().tolist() == [max(p) for px in pairs for p in px]
    mn = [min(p) for px in pairs for p in px]
    assert got["mn"].values[0].ravel().tolist() == mn
    assert got["r"].values[0].ravel().tolist() == [max(v, 0) for v in mn]
    assert {got[n].exponent for n in got.layers} == {-5}


def test_inputs_errors_and_exact_matmul():
    assert quantize_input(np.array([0.25, 0.75, -0.25, 1e9]), -1, 16).tolist() == [0, 2, 0, 32767]
    layer = NetLayer("r", "ReLU", [INPUT])
    net = Network("s8", False, [layer], input_exponent=-2, input_shape=(2,))
    assert simulate_chip(net, np.array([1.1, -0.3]))["r"].values.tolist() == [4, 0]
    assert simulate_chip(net, np.array([[1, 2]]))["r"].values.tolist() == [[1, 2]]
    with pytest.raises(ExportError, match=r"integers outside \[-128, 127\]"):
        simulate_chip(net, np.array([200, 0]))
    with pytest.raises(ExportError, match="shape"):
        simulate_chip(net, np.zeros((2, 3)))
    with pytest.raises(ExportError, match="target"):
        simulate_chip(net, np.zeros(2), target="esp32p4")
    cat = Network(
        "s8",
        False,
        [
            NetLayer(
                "lr", "Conv2D", [INPUT], -1, filter=IntTensor(np.ones((1, 1, 1, 1), np.int64), 0)
            ),
            NetLayer("c", "Concat", [INPUT, "lr"]),
        ],
        input_exponent=-2,
    )
    with pytest.raises(ExportError, match=r"input exponents \[-2, -1\] differ"):
        simulate_chip(cat, np.zeros((1, 1, 1, 1), np.int8))
    big = RNG.integers(-(2**40), 2**40, (3, 50))
    w = RNG.integers(-(2**20), 2**20, (50, 2))
    want = [
        [sum(int(a) * int(b) for a, b in zip(row, col, strict=True)) for col in w.T] for row in big
    ]
    assert exact_matmul(big, w).tolist() == want


def test_per_channel_shift_extremes():
    """d_c < 0 multiplies (m_c = 2^(12 - d_c)), d_c > 12 gives 0 (m_c = 0), 0..12 floors."""
    x = np.array([[[40, -7]]])
    w = np.array([[[[3, 1, -2], [1, 5, 1]]]])  # 1x1, C=2 -> N=3
    e_in, e_out = 0, -2
    e_w = np.array([-8, -3, 10])  # d = e_out - (e_in + e_w + 4) = [2, -3, -16]
    bias = IntTensor(np.array([100, -3, 7]), e_in + e_w + 4)
    layer = NetLayer("c", "Conv2D", [INPUT], e_out, filter=IntTensor(w, e_w), bias=bias)
    got = run([layer], x, e_in, "s8", per_channel=True)["c"].values.ravel().tolist()
    acc = [40 * 3 - 7 * 1, 40 * 1 - 7 * 5, 40 * -2 - 7 * 1]
    t = [sat(a // 16 + int(b), 16) for a, b in zip(acc, bias.values, strict=True)]
    assert got == [sat(t[0] // 4, 8), sat(t[1] * 8, 8), sat(t[2] * 2**16, 8)]
    layer.output_exponent = 14  # d = [18, 13, 0]: both > 12 -> 0
    got = run([layer], x, e_in, "s8", per_channel=True)["c"].values.ravel().tolist()
    assert got == [0, 0, sat(t[2], 8)]


@pytest.mark.parametrize("ftype", ["s8", "s16"])
@pytest.mark.parametrize("target", ["esp32", "esp32s3"])
def test_degenerate_shifts_saturate_instead_of_nan(ftype, target):
    """Found by `make fuzz`: an all-zero kernel (weight exponent 0) whose output range is
    1e-9 gave a left shift of 128; 2^128 overflows float32 and 0 * inf made the output NaN,
    cast to garbage integers. The shift only feeds a saturation, so the loops' Python integers
    (no overflow) are the reference at any shift."""
    bits = 8 if ftype == "s8" else 16
    x = np.array([[[40, -7], [0, 3]]])
    for w, e_out in (([[[[0], [0]]]], -128), ([[[[1], [-1]]]], -120), ([[[[3], [2]]]], 90)):
        layer = NetLayer("c", "Conv2D", [INPUT], e_out, filter=IntTensor(np.array(w), 0))
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            got = run([layer], x, 0, ftype, target)["c"].values.ravel().tolist()
        acc = [40 * w[0][0][0][0] - 7 * w[0][0][1][0], 3 * w[0][0][1][0]]
        assert got == [sat(fshift(a, e_out), bits) for a in acc], (w, e_out)


def test_input_exponent_required():
    net = Network("s8", False, [NetLayer("r", "ReLU", [INPUT])])
    with pytest.raises(ExportError, match="exponent unknown.*input_exponent"):
        simulate_chip(net, np.zeros((1, 2), np.int8))
    assert simulate_chip(net, np.zeros((1, 2), np.int8), input_exponent=-3)["r"].exponent == -3


def test_bias_scale_mismatch_warns():
    w = np.ones((1, 1, 1, 2), np.int64)
    tensor = NetLayer(
        "c", "Conv2D", [INPUT], -3, filter=IntTensor(w, -2), bias=IntTensor(np.array([1, 2]), -4)
    )
    res = run([tensor], np.ones((1, 1, 1)), -1)
    assert res.warnings == [
        "layer 'c' (Conv2D): bias quantized at exponent -4, output exponent is -3: the chip adds "
        "it scaled by 2^-1"
    ]
    channel = NetLayer(
        "c",
        "Conv2D",
        [INPUT],
        -3,
        filter=IntTensor(w, np.array([-2, -3])),
        bias=IntTensor(np.array([1, 2]), np.array([-2, -3]) + (-5) + 4),
    )
    assert run([channel], np.ones((1, 1, 1)), -5, "s8", per_channel=True).warnings == []
    (msg,) = run([channel], np.ones((1, 1, 1)), -4, "s8", per_channel=True).warnings
    assert "quantized for input exponent -5, but its input tensor has exponent -4" in msg
