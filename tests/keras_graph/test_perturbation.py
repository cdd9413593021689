"""Independent check of discovered ranges by perturbation, on a real Keras model.

For each group and each root channel i, the weights of output channel i of every producer are
changed and the model is run: in every tapped tensor exactly the channels the group's record
names for root i must change (begin/end, multiplier, tile/stride, concat offsets), tensors not
in the group must not change, and only what follows a closing consumer may change freely.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras import layers, ops

from amct_bridge.graph import discover_groups
from amct_bridge.keras.graph import extract_graph
from amct_bridge.keras.prune import find_layer, kernel_variable

OUT_AXIS = {"Conv2D": -1, "Dense": -1, "Conv2DTranspose": -2}


@pytest.fixture(scope="module")
def built():
    keras.utils.set_random_seed(1)
    x = keras.Input((5, 5, 3))
    taps = {}

    def tap(name, tensor):
        taps[name] = tensor
        return tensor

    a = tap("c1", layers.Conv2D(6, 1, name="c1")(x))
    b = tap("c2", layers.Conv2D(4, 1, name="c2")(x))
    k = tap("cat", layers.Concatenate(name="cat")([a, b]))
    d = tap("dw", layers.DepthwiseConv2D(1, depth_multiplier=2, name="dw")(k))
    d = tap("bn", layers.BatchNormalization(name="bn")(d))
    p, q = ops.split(d, [8], axis=-1)
    split = p._keras_history.operation.name  # Keras' own name of the raw op (graph node name)
    tap(f"{split}:0", p)
    tap(f"{split}:1", q)
    c3 = tap("c3", layers.Conv2D(6, 1, name="c3")(x))
    c3 = tap("dw3", layers.DepthwiseConv2D(1, depth_multiplier=2, name="dw3")(c3))
    s = q + c3  # couples c1[4, 6) + c2 with c3, both in blocks of 2
    tap(s._keras_history.operation.name, s)
    t = tap("act", layers.Activation("tanh", name="act")(p))
    f = tap("flat", layers.Flatten(name="flat")(t))
    fc1 = tap("fc1", layers.Dense(3, name="fc1")(f))
    tr = tap("tr", layers.Conv2DTranspose(5, 2, name="tr")(s))
    c4 = tap("c4", layers.Conv2D(2, 1, name="c4")(tr))
    out = layers.Dense(2, name="head")(layers.GlobalAveragePooling2D(name="gap")(c4))
    model = keras.Model(x, [layers.Dense(2, name="head1")(fc1), out])
    probe = keras.Model(x, list(taps.values()))
    data = np.random.default_rng(0).normal(size=(2, 5, 5, 3)).astype("float32")
    return model, probe, list(taps), data


def positions(member, i: int) -> set[int]:
    """Output channels of ``member``'s node that carry root channel i of its group."""
    mult = member.attr("multiplier") or 1
    if member.attr("depth_multiplier"):  # range in input channels: outputs are blocks of m
        m = member.attr("depth_multiplier")
        return set(range((member.begin + i) * m, (member.begin + i + 1) * m))
    stride, tiles = member.attr("stride") or 0, member.attr("tile") or 1
    first = member.begin + i * mult
    return {first + j + t * stride for j in range(mult) for t in range(tiles)}


def changed_channels(before: np.ndarray, after: np.ndarray) -> set[int]:
    diff = np.abs(after - before).reshape(-1, before.shape[-1]).max(axis=0)
    return set(np.flatnonzero(diff > 1e-5).tolist())


def downstream(graph, starts: set[str]) -> set[str]:
    """Node names reachable from (and including) ``starts``."""
    seen, order = set(starts), [n.name for n in graph]
    for name in order:
        node = graph.node(name)
        if any(
            graph.producer_of(t) is not None and graph.producer_of(t).name in seen
            for t in node.inputs
        ):
            seen.add(name)
    return seen


def test_every_group_range_matches_perturbation(built):
    model, probe, names, data = built
    graph = extract_graph(model)
    found = discover_groups(graph)
    assert len(found.groups) >= 5
    base = [np.asarray(v) for v in probe(data)]
    for group in found.groups:
        closing = {m.name for m in group.consumers if m.closing}
        free = downstream(graph, closing)
        for i in range(group.width):
            saved = []
            for p in group.producers:
                layer = find_layer(model, p.name)
                var = kernel_variable(layer)
                saved.append((var, np.asarray(var).copy()))
                w = np.asarray(var).copy()
                idx = [slice(None)] * w.ndim
                idx[OUT_AXIS[type(layer).__name__]] = p.begin + i
                w[tuple(idx)] += 1.0
                var.assign(w)
            after = [np.asarray(v) for v in probe(data)]
            for var, w in saved:
                var.assign(w)
            for name, b, a in zip(names, base, after, strict=True):
                node = name.split(":")[0]
                expect = set()
                for p in group.producers:
                    if p.name == node:
                        expect.add(p.begin + i)
                for m in group.consumers:
                    if m.name == node and not m.closing:
                        expect |= positions(m, i)
                if graph.node(node).kind == "Split":
                    continue  # checked through its consumers (ranges are in its input)
                if node in free - {p.name for p in group.producers} and not expect:
                    continue  # after a closing consumer anything may change
                assert changed_channels(b, a) == expect, (group.producers, i, name)
