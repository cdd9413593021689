"""Hypothesis strategy of random small Keras functional models, drawn as a plain spec (so
hypothesis shrinks specs, not Keras objects) and built by :func:`build`.

Layer kinds: Conv2D, DepthwiseConv2D (depth multipliers 1-3), Dense, BatchNormalization, ReLU,
Add, Concatenate, MaxPooling2D, AveragePooling2D, GlobalAveragePooling2D, Flatten; random widths,
kernel sizes, strides, paddings, and branches (any earlier tensor may be read again).

Example:
    >>> from fuzz_keras import keras_specs
    >>> spec = keras_specs().example()  # doctest: +SKIP
    >>> model = build(spec)  # doctest: +SKIP
"""

from __future__ import annotations

import keras
import numpy as np
from hypothesis import strategies as st

SPATIAL = (
    "conv",
    "dw",
    "bn",
    "relu",
    "add",
    "concat",
    "maxpool",
    "avgpool",
    "gap",
    "flatten",
    "dense",
)
FLAT = ("dense", "bn", "relu", "add", "concat")


@st.composite
def keras_specs(draw, max_layers: int = 7) -> dict:
    """A model spec: input shape and a list of (kind, params, source indices) steps."""
    flat = draw(st.integers(0, 5)) == 5
    shape = (
        (draw(st.integers(2, 8)),)
        if flat
        else (draw(st.integers(2, 7)), draw(st.integers(2, 7)), draw(st.integers(1, 4)))
    )
    shapes = [shape]
    steps = []
    for i in range(draw(st.integers(1, max_layers))):
        src = len(shapes) - 1 if draw(st.integers(0, 2)) else draw(st.integers(0, len(shapes) - 1))
        s = shapes[src]
        kinds = SPATIAL if len(s) == 3 else FLAT
        kind = draw(st.sampled_from(kinds))
        if i == 0 or draw(st.integers(0, 3)) == 3:  # weights most steps can prune / export
            kind = draw(st.sampled_from(("conv", "dw") if len(s) == 3 else ("dense",)))
        params: dict = {}
        srcs = [src]
        c = s[-1]
        if kind in ("conv", "dw"):
            k = draw(st.integers(1, 3))
            stride = draw(st.integers(1, 2))
            pad = draw(st.sampled_from(["same", "valid"]))
            if pad == "valid" and k > min(s[:2]):
                pad = "same"
            params = {
                "k": k,
                "stride": stride,
                "padding": pad,
                "bias": draw(st.booleans()),
                "activation": draw(st.sampled_from([None, None, "relu"])),
            }
            h, w = (
                (-(-s[0] // stride), -(-s[1] // stride))
                if pad == "same"
                else ((s[0] - k) // stride + 1, (s[1] - k) // stride + 1)
            )
            if kind == "conv":
                params["filters"] = draw(st.integers(1, 6))
                out = (h, w, params["filters"])
            else:
                params["mult"] = draw(st.sampled_from([1, 1, 2, 3]))
                out = (h, w, c * params["mult"])
        elif kind == "dense":
            params = {"units": draw(st.integers(1, 6)), "bias": draw(st.booleans())}
            out = (*s[:-1], params["units"])
        elif kind in ("bn", "relu"):
            out = s
        elif kind == "add":
            same = [j for j, t in enumerate(shapes) if t == s]
            srcs.append(draw(st.sampled_from(same)))
            out = s
        elif kind == "concat":
            same = [j for j, t in enumerate(shapes) if len(t) == len(s) and t[:-1] == s[:-1]]
            srcs.append(draw(st.sampled_from(same)))
            out = (*s[:-1], c + shapes[srcs[1]][-1])
        elif kind in ("maxpool", "avgpool"):
            p = draw(st.integers(1, 2))
            pad = "valid" if p <= min(s[:2]) and draw(st.booleans()) else "same"
            params = {"pool": p, "padding": pad}
            out = (
                (-(-s[0] // p), -(-s[1] // p), c)
                if pad == "same"
                else ((s[0] - p) // p + 1, (s[1] - p) // p + 1, c)
            )
        elif kind == "gap":
            out = (c,)
        else:  # flatten
            out = (s[0] * s[1] * c,)
        params["named"] = draw(st.integers(0, 4)) < 4  # else Keras' own auto name
        steps.append((kind, params, srcs))
        shapes.append(out)
    return {
        "shape": shape,
        "steps": steps,
        "seed": draw(st.integers(0, 2**16)),
        "closing_head": draw(st.booleans()),
    }


def build(spec: dict) -> keras.Model:
    """The Keras model of ``spec`` (weights seeded; BN statistics not trivial)."""
    keras.utils.set_random_seed(spec["seed"])
    x = keras.Input(spec["shape"])
    tensors = [x]
    for i, (kind, p, srcs) in enumerate(spec["steps"]):
        name = f"{kind}{i}" if p.get("named") else None
        ins = [tensors[j] for j in srcs]
        if kind == "conv":
            layer = keras.layers.Conv2D(
                p["filters"],
                p["k"],
                p["stride"],
                p["padding"],
                activation=p["activation"],
                use_bias=p["bias"],
                name=name,
            )
        elif kind == "dw":
            layer = keras.layers.DepthwiseConv2D(
                p["k"],
                p["stride"],
                p["padding"],
                depth_multiplier=p["mult"],
                activation=p["activation"],
                use_bias=p["bias"],
                name=name,
            )
        elif kind == "dense":
            layer = keras.layers.Dense(p["units"], use_bias=p["bias"], name=name)
        elif kind == "bn":
            layer = keras.layers.BatchNormalization(name=name)
        elif kind == "relu":
            layer = keras.layers.ReLU(name=name)
        elif kind == "add":
            layer = keras.layers.Add(name=name)
        elif kind == "concat":
            layer = keras.layers.Concatenate(name=name)
        elif kind == "maxpool":
            layer = keras.layers.MaxPooling2D(p["pool"], padding=p["padding"], name=name)
        elif kind == "avgpool":
            layer = keras.layers.AveragePooling2D(p["pool"], padding=p["padding"], name=name)
        elif kind == "gap":
            layer = keras.layers.GlobalAveragePooling2D(name=name)
        else:
            layer = keras.layers.Flatten(name=name)
        tensors.append(layer(ins if kind in ("add", "concat") else ins[0]))
    y = tensors[-1]
    if spec["closing_head"]:  # a Dense head: groups before it can close
        if len(y.shape) > 2:
            y = keras.layers.Flatten(name="head_flat")(y)
        y = keras.layers.Dense(2, name="head")(y)
    model = keras.Model(x, y)
    rng = np.random.default_rng(spec["seed"])
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.set_weights(
                [
                    rng.uniform(0.5, 2, c),
                    rng.normal(0, 0.5, c),
                    rng.normal(0, 0.5, c),
                    rng.uniform(0.3, 2, c),
                ]
            )
    return model
