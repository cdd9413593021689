"""Hypothesis strategy of random ESP-DL source models: a list of SourceLayer with consistent
shapes (convs, depthwise with multipliers, dense, BN, activations, Add, Concat, pools, Flatten,
Dropout, unsupported layers), plus a sidecar and a record, and sometimes a defect (a NaN or huge
weight, a wrong kernel shape, an unknown input, a duplicate or path-like name, a bad range).

Example:
    >>> from fuzz_sources import source_models
    >>> layers, stats, record, x = source_models().example()  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from amct_bridge.espdl.source import SourceLayer
from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
from amct_bridge.records.model import LayerFactors, Record

ACTIVATIONS = [None, None, None, "relu", "relu", "leaky_relu", "relu6", "tanh"]
BAD_NAMES = ["../x", "a/b", "a b", "", "9x", "in", "con.v", "ü", "/abs"]


def _weights(draw, shape, rng) -> np.ndarray:
    w = rng.normal(0, draw(st.sampled_from([0.05, 0.5, 3.0])), shape).astype(np.float32)
    defect = draw(st.integers(0, 30))  # hypothesis often draws 0: defects are high values
    if defect == 30 and w.size:
        w.flat[0] = draw(st.sampled_from([np.nan, np.inf, 1e30, -1e-30]))
    elif defect == 29:
        w[:] = 0.0
    return w


def _out_hw(h, w, k, s, padding):
    if padding == "same":
        return -(-h // s[0]), -(-w // s[1])
    return (h - k[0]) // s[0] + 1, (w - k[1]) // s[1] + 1


@st.composite
def source_models(draw, max_layers: int = 7):
    """(layers, stats, record, input array) of a random model."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    flat_input = draw(st.integers(0, 4)) == 4
    shape = (
        (draw(st.integers(1, 9)),)
        if flat_input
        else (draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 4)))
    )
    layers = [SourceLayer("in", "input", [], "InputLayer", attrs={"shape": shape})]
    shapes = {"in": shape}
    for i in range(draw(st.integers(1, max_layers))):
        names = list(shapes)
        src = names[-1] if draw(st.integers(0, 2)) else draw(st.sampled_from(names))
        s = shapes[src]
        name = f"l{i}"
        ops = (
            [
                "conv2d",
                "depthwise_conv2d",
                "batch_norm",
                "relu",
                "leaky_relu",
                "prelu",
                "relu6",
                "add",
                "concat",
                "pool",
                "gpool",
                "flatten",
                "dropout",
                "dense",
                "unsupported",
                "pad",
            ]
            if len(s) == 3
            else ["dense", "batch_norm", "relu", "leaky_relu", "add", "dropout"]
        )
        op = draw(st.sampled_from(ops))
        if i == 0 or draw(st.integers(0, 3)) == 3:  # most models should have a layer to export
            op = draw(st.sampled_from(ops[:2] if len(s) == 3 else ops[:1]))
        c = s[-1]
        layer = None
        if op in ("conv2d", "depthwise_conv2d"):
            k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
            strides = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
            padding = draw(st.sampled_from(["same", "valid"]))
            if padding == "valid" and (k[0] > s[0] or k[1] > s[1]):
                padding = "same"
            if op == "conv2d":
                n = draw(st.integers(1, 6))
                kernel, out_c, attrs = (k[0], k[1], c, n), n, {}
            else:
                m = draw(st.sampled_from([1, 1, 2]))
                kernel, out_c, attrs = (k[0], k[1], c, m), c * m, {"depth_multiplier": m}
            act = draw(st.sampled_from(ACTIVATIONS))
            attrs.update(activation=act, strides=strides, padding=padding)
            if act == "leaky_relu":
                attrs["alpha"] = draw(st.sampled_from([0.1, 0.3, 0.0]))
            weights = {"kernel": _weights(draw, kernel, rng)}
            if draw(st.booleans()):
                weights["bias"] = _weights(draw, (out_c,), rng)
            kind = "Conv2D" if op == "conv2d" else "DepthwiseConv2D"
            layer = SourceLayer(name, op, [src], kind, weights, attrs)
            shapes[name] = (*_out_hw(s[0], s[1], k, strides, padding), out_c)
        elif op == "dense":
            n = draw(st.integers(1, 6))
            weights = {"kernel": _weights(draw, (c, n), rng)}
            if draw(st.booleans()):
                weights["bias"] = _weights(draw, (n,), rng)
            act = draw(st.sampled_from(ACTIVATIONS))
            attrs = {"activation": act, "input_rank": len(s) + 1}
            layer = SourceLayer(name, "dense", [src], "Dense", weights, attrs)
            shapes[name] = (*s[:-1], n)
        elif op == "batch_norm":
            var = np.abs(_weights(draw, (c,), rng)) + draw(st.sampled_from([1e-3, 1.0, -2.0]))
            weights = {
                "gamma": _weights(draw, (c,), rng),
                "beta": _weights(draw, (c,), rng),
                "mean": _weights(draw, (c,), rng),
                "variance": var.astype(np.float32),
            }
            layer = SourceLayer(
                name, "batch_norm", [src], "BatchNormalization", weights, {"epsilon": 1e-3}
            )
            shapes[name] = s
        elif op in ("relu", "relu6"):
            layer = SourceLayer(name, op, [src], "ReLU")
            shapes[name] = s
        elif op == "leaky_relu":
            layer = SourceLayer(name, op, [src], "LeakyReLU", attrs={"alpha": 0.2})
            shapes[name] = s
        elif op == "prelu":
            layer = SourceLayer(name, op, [src], "PReLU", {"alpha": _weights(draw, (c,), rng)})
            shapes[name] = s
        elif op in ("add", "concat"):
            same = (
                [n for n in names if shapes[n] == s]
                if op == "add"
                else [n for n in names if len(shapes[n]) == 3 and shapes[n][:2] == s[:2]]
            )
            other = draw(st.sampled_from(same))
            if op == "add":
                layer = SourceLayer(
                    name, "runtime", [src, other], "Add", attrs={"keeps_exponent": False}
                )
                shapes[name] = s
            else:
                layer = SourceLayer(
                    name,
                    "runtime",
                    [src, other],
                    "Concatenate",
                    attrs={"keeps_exponent": True, "axis": -1},
                )
                shapes[name] = (*s[:2], c + shapes[other][-1])
        elif op == "pool":
            p = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
            padding = draw(st.sampled_from(["same", "valid"]))
            if padding == "valid" and (p[0] > s[0] or p[1] > s[1]):
                padding = "same"
            kind = draw(st.sampled_from(["MaxPooling2D", "AveragePooling2D"]))
            layer = SourceLayer(
                name,
                "runtime",
                [src],
                kind,
                attrs={
                    "keeps_exponent": kind == "MaxPooling2D",
                    "pool_size": p,
                    "strides": p,
                    "padding": padding,
                },
            )
            shapes[name] = (*_out_hw(s[0], s[1], p, p, padding), c)
        elif op == "gpool":
            kind = draw(st.sampled_from(["GlobalMaxPooling2D", "GlobalAveragePooling2D"]))
            layer = SourceLayer(
                name, "runtime", [src], kind, attrs={"keeps_exponent": kind == "GlobalMaxPooling2D"}
            )
            shapes[name] = (c,)
        elif op == "flatten":
            layer = SourceLayer(name, "runtime", [src], "Flatten", attrs={"keeps_exponent": True})
            shapes[name] = (s[0] * s[1] * c,)
        elif op == "pad":
            pad = draw(st.sampled_from([1, "((0, 1), (1, 0))", ((1, 1), (0, 0))]))
            layer = SourceLayer(
                name,
                "runtime",
                [src],
                "ZeroPadding2D",
                attrs={"keeps_exponent": True, "padding": pad},
            )
            t = (
                {1: (1, 1, 1, 1), "((0, 1), (1, 0))": (0, 1, 1, 0)}.get(pad, (1, 1, 0, 0))
                if not isinstance(pad, tuple)
                else (1, 1, 0, 0)
            )
            shapes[name] = (s[0] + t[0] + t[1], s[1] + t[2] + t[3], c)
        elif op == "dropout":
            layer = SourceLayer(name, "runtime", [src], "Dropout", attrs={"keeps_exponent": True})
            shapes[name] = s
        else:
            layer = SourceLayer(name, "unsupported", [src], "LSTM", attrs={"reason": "RNN"})
            shapes[name] = s
        layers.append(layer)
    layers[-1].attrs["model_output"] = True
    _maybe_break(draw, layers)
    stats = _stats(draw, layers)
    record = _record(draw, layers)
    x = rng.uniform(-2, 2, shape).astype(np.float32)
    return layers, stats, record, x


def _maybe_break(draw, layers: list[SourceLayer]) -> None:
    """Sometimes one defect a model file or an adapter bug could bring."""
    defect = 12 - draw(st.integers(0, 12))  # hypothesis often draws 0: 12 is "no defect"
    target = draw(st.sampled_from(layers))
    if defect == 6:
        target.name = draw(st.sampled_from(BAD_NAMES))  # readers keep the old name
    elif defect == 1 and len(layers) > 1:
        target.inputs = ["nowhere"]
    elif defect == 2 and "kernel" in target.weights:
        k = target.weights["kernel"]
        target.weights["kernel"] = np.ones(
            (*k.shape[:-2], k.shape[-2] + 1, k.shape[-1]), np.float32
        )
    elif defect == 3 and "bias" in target.weights:
        target.weights["bias"] = target.weights["bias"][:-1]
    elif defect == 4:
        target.op = "bogus"
    elif defect == 5 and "kernel" in target.weights:
        target.weights["kernel"] = np.round(target.weights["kernel"] * 10).astype(np.int32)


def _range(draw) -> TensorRange:
    lo, hi = draw(
        st.sampled_from(
            [
                (-1.0, 1.0),
                (0.0, 6.0),
                (-3.0, 0.5),
                (0.0, 0.0),
                (-1e30, 1e30),
                (1e-9, 2e-9),
            ]
        )
    )
    if draw(st.integers(0, 20)) == 20:
        lo, hi = draw(st.sampled_from([(2.0, -2.0), (float("nan"), 1.0), (0.0, float("inf"))]))
    return TensorRange(lo, hi)


def _stats(draw, layers) -> CalibrationStats | None:
    if draw(st.integers(0, 8)) == 8:
        return None
    stats = CalibrationStats(algorithm="minmax", batches=1)
    for layer in layers[1:]:
        if draw(st.integers(0, 20)) < 20:
            inp = None if draw(st.booleans()) else _range(draw)
            stats.layers[layer.name] = LayerStats(layer.kind, inp, _range(draw))
    return stats


def _record(draw, layers) -> Record | None:
    if draw(st.booleans()):
        return None
    record = Record(flavor="inner")
    for layer in layers:
        if layer.op in ("conv2d", "depthwise_conv2d", "dense") and draw(st.booleans()):
            record.layers[layer.name] = LayerFactors(
                scale_d=draw(st.sampled_from([1 / 255, 0.02, 1.0, 1 / 255, 0.0, float("nan")])),
                offset_d=draw(st.sampled_from([-128, 0, 5])),
                skip_fusion=draw(st.sampled_from([None, True, False])),
            )
    if draw(st.integers(0, 8)) == 8:
        record.layers["not_in_model"] = LayerFactors(scale_d=0.1, offset_d=0)
    return record
