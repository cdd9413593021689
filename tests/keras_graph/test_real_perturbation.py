"""Soundness by perturbation on keras.applications models: no channel outside a group changes.

For sampled groups and a root channel i, output channel i of every producer is perturbed; in
every layer output that is not downstream of one of the group's closing consumers, the channels
that change must be among those the group names for root i (activations such as ReLU6 may hide
some changes, so the check is inclusion), and each producer must change exactly channel i.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from amct_bridge.graph import discover_groups
from amct_bridge.keras.graph import extract_graph
from amct_bridge.keras.prune import find_layer, kernel_variable

MODELS = {
    "mobilenet_v2": lambda: keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), alpha=0.35, weights=None
    ),
    "efficientnet_b0": lambda: keras.applications.EfficientNetB0(
        input_shape=(32, 32, 3), weights=None
    ),
    "densenet121": lambda: keras.applications.DenseNet121(input_shape=(32, 32, 3), weights=None),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    keras.utils.set_random_seed(3)
    model = MODELS[request.param]()
    graph = extract_graph(model)
    names = [n.name for n in graph if n.is_layer and len(n.outputs) == 1]
    probe = keras.Model(model.input, [model.get_layer(n).output for n in names])
    data = np.random.default_rng(0).uniform(0, 1, size=(1, 32, 32, 3)).astype("float32")
    return model, graph, discover_groups(graph), probe, names, data


def expected(member, i: int) -> set[int]:
    if member.attr("depth_multiplier"):
        m = member.attr("depth_multiplier")
        return set(range((member.begin + i) * m, (member.begin + i + 1) * m))
    mult, stride, tiles = member.attr("multiplier") or 1, member.attr("stride") or 0, 1
    tiles = member.attr("tile") or 1
    first = member.begin + i * mult
    return {first + j + t * stride for j in range(mult) for t in range(tiles)}


def downstream(graph, starts: set[str]) -> set[str]:
    seen = set(starts)
    for node in graph:
        if any((p := graph.producer_of(t)) is not None and p.name in seen for t in node.inputs):
            seen.add(node.name)
    return seen


def changed(before: np.ndarray, after: np.ndarray) -> set[int]:
    diff = np.abs(after - before).reshape(-1, before.shape[-1]).max(axis=0)
    return set(np.flatnonzero(diff > 0).tolist())  # untouched channels are bit-identical


def test_no_channel_outside_the_group_changes(case):
    model, graph, found, probe, names, data = case
    base = [np.asarray(v) for v in probe(data)]
    sample = found.groups[:5] + found.groups[-3:]
    for group in sample:
        i = group.width // 2
        free = downstream(graph, {m.name for m in group.consumers if m.closing})
        saved = []
        for p in group.producers:
            var = kernel_variable(find_layer(model, p.name))
            w = np.asarray(var).copy()
            saved.append((var, w.copy()))
            w[..., p.begin + i] += 1.0  # Conv2D HWIO and Dense IO: output channel last
            var.assign(w)
        after = [np.asarray(v) for v in probe(data)]
        for var, w in saved:
            var.assign(w)
        producers = {p.name: p.begin + i for p in group.producers}
        for name, b, a in zip(names, base, after, strict=True):
            if name in free:
                continue
            got = changed(b, a)
            if name in producers:
                assert got == {producers[name]}, (name, got)
                continue
            allowed = set()
            for m in group.consumers:
                if m.name == name and not m.closing:
                    allowed |= expected(m, i)
            assert got <= allowed, (group.producers[0].name, name, sorted(got - allowed))
