"""Invariants of the discovery on keras.applications models (weights=None, small inputs).

For every model: each node of a group sees ranges of the group's width (times its multiplier),
concat ranges tile the concat width, no accepted group reaches a model output, and every
quantizable layer is in a group or refused with a reason. The widths are checked against the
real tensor shapes Keras computed, independently of the discovery.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from amct_bridge.graph import Reason, discover_groups
from amct_bridge.graph.groups import QUANTIZABLE_KINDS
from amct_bridge.keras.graph import extract_graph

MODELS = {
    "resnet50": (keras.applications.ResNet50, 64),
    "mobilenet_v2": (keras.applications.MobileNetV2, 64),
    "densenet121": (keras.applications.DenseNet121, 64),
    "efficientnet_b0": (keras.applications.EfficientNetB0, 64),
    "xception": (keras.applications.Xception, 71),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    ctor, size = MODELS[request.param]
    model = ctor(input_shape=(size, size, 3), weights=None)
    graph = extract_graph(model)
    return request.param, model, graph, discover_groups(graph)


def layer_of(name: str) -> str:
    """The graph node of a record name (a SeparableConv2D's two parts are one node)."""
    return name.removesuffix("/depthwise").removesuffix("/pointwise")


def coordinate_width(graph, member) -> int:
    """Channels of the tensor a member's range indexes: inputs for weights/split, else outputs."""
    node = graph.node(layer_of(member.name))
    reads_input = member.closing or node.kind in ("Split", "DepthwiseConv2D")
    reads_input |= member.name.endswith("/depthwise")
    return graph.channels(node.inputs[0] if reads_input else node.outputs[0])


def test_graph_matches_model(case):
    _, model, graph, _ = case
    assert {n.layer for n in graph if n.is_layer} == {
        layer.name for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)
    }
    order = {name: i for i, name in enumerate(n.name for n in graph)}
    for node in graph:
        for tid in node.inputs:
            producer = graph.producer_of(tid)
            assert producer is None or order[producer.name] < order[node.name]


def test_every_member_range_has_the_group_width_and_fits(case):
    _, model, graph, d = case
    assert d.groups
    for g in d.groups:
        for p in g.producers:
            assert p.end - p.begin == g.width
            assert 0 <= p.begin < p.end <= graph.channels(graph.node(layer_of(p.name)).outputs[0])
        for c in g.consumers:
            per_tile = g.width * (c.attr("multiplier") or 1)
            assert c.end - c.begin == per_tile, (g.producers, c)
            limit = coordinate_width(graph, c)
            last = c.end + (c.attr("stride") or 0) * ((c.attr("tile") or 1) - 1)
            assert 0 <= c.begin and last <= limit, (c, limit)
        assert any(c.closing for c in g.consumers)


def test_concat_ranges_tile_the_concat_width(case):
    _, _, graph, d = case
    for node in (n for n in graph if n.kind == "Concatenate"):
        width = graph.channels(node.outputs[0])
        bounds = np.cumsum([0] + [graph.channels(t) for t in node.inputs])
        covered = np.zeros(width, dtype=int)
        for c in (c for g in d.groups for c in g.consumers if c.name == node.layer):
            covered[c.begin : c.end] += 1
            i = np.searchsorted(bounds, c.begin, side="right") - 1
            assert c.end <= bounds[i + 1]  # a range never straddles two concat inputs
        # only the classifier is refused in these models: groups cover every concat channel once
        assert covered.tolist() == [1] * width


def test_no_group_reaches_a_model_output(case):
    _, _, graph, d = case
    out_layers = {graph.producer_of(t).layer for t in graph.outputs}
    # a closing consumer (the classifier reading the last group) may produce an output;
    # nothing whose channels ARE the group's may
    producers = {p.name for g in d.groups for p in g.producers}
    passing = {c.name for g in d.groups for c in g.consumers if not c.closing}
    assert not out_layers & (producers | passing)
    assert all(r.reason in Reason for r in d.refusals)
    # the softmax classifier is refused as the model output (not for its fused softmax)
    refused_outputs = {r.layer: r.reason for r in d.refusals if r.layer in out_layers}
    assert set(refused_outputs.values()) == {Reason.MODEL_OUTPUT}
    assert set(refused_outputs) == out_layers


def test_every_quantizable_layer_is_grouped_or_refused(case):
    _, _, graph, d = case
    grouped = {layer_of(m.name) for g in d.groups for m in g.members}
    refused = {layer_of(r.layer) for r in d.refusals}
    for node in graph:
        if node.kind in QUANTIZABLE_KINDS:
            assert node.layer in grouped | refused, node.layer


def test_every_layer_producer_range_is_covered_once(case):
    _, _, graph, d = case
    spans: dict[str, list[tuple[int, int]]] = {}
    for g in d.groups:
        for p in g.producers:
            spans.setdefault(p.name, []).append((p.begin, p.end))
    for r in d.refusals:
        if r.end > r.begin:
            spans.setdefault(r.layer, []).append((r.begin, r.end))
    for node in graph:
        if (
            node.kind in ("Conv2D", "Dense", "SeparableConv2D")
            and node.params.get("groups", 1) == 1
        ):
            pointwise = node.kind == "SeparableConv2D"  # its record name, as the export's
            ranges = sorted(spans[f"{node.layer}/pointwise" if pointwise else node.layer])
            width = graph.channels(node.outputs[0])
            assert ranges[0][0] == 0 and ranges[-1][1] == width
            assert all(a[1] == b[0] for a, b in zip(ranges[:-1], ranges[1:], strict=True))
