"""MindSpore network -> graph IR -> pruning groups, against hand-worked expectations.

Real MindSpore 2.10 on CPU; the networks are only exported to MindIR (never trained).
"""

from __future__ import annotations

import functools
import os

import mindspore as ms
import nets
import numpy as np
import pytest
from isolate import in_fresh_process
from mindspore import nn, ops

from amct_bridge.errors import GraphError
from amct_bridge.graph import discover_groups
from amct_bridge.mindspore import extract_graph, prune_discovery
from amct_bridge.mindspore.mindir import _log_hint


@pytest.fixture(autouse=True)
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.GRAPH_MODE)


def run(name: str):
    net = getattr(nets, name)()
    return net, extract_graph(net, nets.INPUT_SHAPES[name])


def summary(discovery):
    """{producers: {(consumer, begin, end, attrs)}} and {(layer, begin, end): reason}."""
    groups = {
        tuple((m.name, m.begin, m.end) for m in g.producers): {
            (m.name, m.begin, m.end, m.attrs) for m in g.consumers
        }
        for g in discovery.groups
    }
    refused = {(r.layer, r.begin, r.end): r.reason.value for r in discovery.refusals}
    return groups, refused


def chain(*names, width, attrs=()):
    return {(n, 0, width, attrs) for n in names}


def test_resnet_blocks_with_downsample_share_one_group_per_add_chain():
    net, graph = run("resnet_tiny")
    groups, refused = summary(discover_groups(graph))
    stem = (("conv1", 0, 8), ("layer1.0.conv2", 0, 8), ("layer1.1.conv2", 0, 8))
    stage2 = (("layer2.0.conv2", 0, 16), ("layer2.0.down.0", 0, 16), ("layer2.1.conv2", 0, 16))
    assert groups[stem] == chain(
        "bn1",
        "relu",
        "layer1.0.conv1",
        "layer1.0.bn2",
        "layer1.0.add_op0",
        "layer1.0.relu",
        "layer1.1.conv1",
        "layer1.1.bn2",
        "layer1.1.add_op0",
        "layer1.1.relu",
        "layer2.0.conv1",
        "layer2.0.down.0",
        width=8,
    )
    assert groups[stage2] == chain(
        "layer2.0.bn2",
        "layer2.0.down.1",
        "layer2.0.add_op0",
        "layer2.0.relu",
        "layer2.1.conv1",
        "layer2.1.bn2",
        "layer2.1.add_op0",
        "layer2.1.relu",
        "pool",
        "flatten",
        "fc",
        width=16,
    )
    for block, width in (("layer1.0", 8), ("layer1.1", 8), ("layer2.0", 16), ("layer2.1", 16)):
        inner = ((f"{block}.conv1", 0, width),)
        assert groups[inner] == chain(
            f"{block}.bn1", f"{block}.relu", f"{block}.conv2", width=width
        )
    assert len(groups) == 6
    assert refused == {("fc", 0, 3): "MODEL_OUTPUT"}
    # every weighted cell of the network is accounted for, under its cells_and_names() name
    weighted = {n for n, c in net.cells_and_names() if isinstance(c, (nn.Conv2d, nn.Dense))}
    seen = {m[0] for p in groups for m in p} | {n for n, *_ in refused}
    assert weighted == seen


def test_resnet_nodes_follow_mindspore_facts():
    net, graph = run("resnet_tiny")
    cells = dict(net.cells_and_names())
    conv = graph.node("layer2.0.conv1")
    assert conv.kind == "Conv2D" and conv.params["kernel_layout"] == "OIHW"
    assert (
        conv.params["kernel_shape"] == tuple(cells["layer2.0.conv1"].weight.shape) == (16, 8, 3, 3)
    )
    assert graph.tensors[conv.outputs[0]].shape == (1, 16, 8, 8)  # NCHW, stride 2
    assert graph.tensors[conv.outputs[0]].channel_axis == -3
    assert graph.node("fc").params["kernel_layout"] == "OI"
    assert graph.node("fc").params["kernel_shape"] == (3, 16)
    bn = graph.node("layer1.0.bn1")
    assert (bn.kind, bn.op_type, bn.params["epsilon"]) == (
        "BatchNormalization",
        "FusedBatchNormV3",
        1e-5,
    )
    # the block's relu is called twice: same layer key, second call "@1"
    relu2 = graph.node("layer1.0.relu@1")
    assert relu2.layer == "layer1.0.relu" and relu2.shared and relu2.call_index == 1
    adds = [n for n in graph if n.kind == "Add"]
    assert [n.name for n in adds] == [f"layer{i}.{j}.add_op0" for i in (1, 2) for j in (0, 1)]
    assert not any(n.is_layer for n in adds)
    # names are deterministic: a second extraction of a fresh network gives the same graph
    _, again = run("resnet_tiny")
    assert [(n.name, n.inputs, n.outputs) for n in again] == [
        (n.name, n.inputs, n.outputs) for n in graph
    ]


def test_nested_concat_offsets():
    _, graph = run("concat_net")
    groups, refused = summary(discover_groups(graph))
    assert groups[(("a", 0, 4),)] == {
        ("concat_op0", 0, 4, ()),
        ("concat_op1", 0, 4, ()),
        ("head", 0, 4, ()),
    }
    assert groups[(("b", 0, 6),)] == {
        ("bn_b", 0, 6, ()),
        ("concat_op0", 4, 10, ()),
        ("concat_op1", 4, 10, ()),
        ("head", 4, 10, ()),
    }
    assert groups[(("c", 0, 2),)] == {("concat_op1", 10, 12, ()), ("head", 10, 12, ())}
    assert refused == {("head", 0, 5): "REACHES_OUTPUT"}
    assert graph.node("concat_op0").params["axis"] == -3


def test_depthwise_passes_the_range_with_its_multiplier():
    net, graph = run("depthwise_net")
    dw = graph.node("1")
    assert dw.op_type == "DepthwiseConv2dNative" and dw.params["kernel_shape"] == (16, 1, 3, 3)
    assert tuple(net[1].weight.shape) == (16, 1, 3, 3)
    groups, refused = summary(discover_groups(graph))
    m2 = (("multiplier", 2),)
    assert groups == {
        (("0", 0, 8),): {
            ("1", 0, 8, (("depth_multiplier", 2),)),
            ("2", 0, 16, m2),
            ("3", 0, 16, m2),
            ("4", 0, 16, m2),
        }
    }
    assert graph.node("3").op_type == "Relu6"
    assert refused == {("4", 0, 4): "MODEL_OUTPUT"}


def test_a_depthwise_cell_is_refused_for_2_4_as_depthwise_not_grouped():
    """Issue 33 §7: nn.Conv2d(group=in_channels) is a depthwise convolution; 2:4 refused it as
    GROUPED_CONV (kept for 1 < group < in_channels, group_conv_net)."""
    from amct_bridge.graph.selective import selective_candidates

    net, graph = run("depthwise_net")
    assert net[1].group == net[1].in_channels == 8  # independent: the cell's own settings
    _, refused = selective_candidates(graph)
    assert {r.layer: r.reason.value for r in refused} == {"1": "DEPTHWISE_CONV"}
    net, graph = run("group_conv_net")
    assert 1 < net[1].group < net[1].in_channels
    _, refused = selective_candidates(graph)
    assert {r.layer: r.reason.value for r in refused} == {"1": "GROUPED_CONV"}


def test_group_conv_is_refused_with_a_reason():
    net, graph = run("group_conv_net")
    assert tuple(net[1].weight.shape) == (16, 2, 3, 3)
    groups, refused = summary(discover_groups(graph))
    assert groups == {}
    assert refused == {
        ("0", 0, 8): "GROUPED_CONV",
        ("1", 0, 16): "GROUPED_CONV",
        ("2", 0, 4): "MODEL_OUTPUT",
    }


def test_flatten_to_dense_maps_each_channel_to_a_block_of_rows():
    net, graph = run("flatten_dense")
    groups, _ = summary(discover_groups(graph))
    # conv 4 channels of 2x2 after the pool: channel c -> rows [4c, 4c + 4) of fc1 (NCHW)
    assert groups[(("conv", 0, 4),)] == {
        ("pool", 0, 4, ()),
        ("flatten", 0, 16, (("multiplier", 4),)),
        ("fc1", 0, 16, (("multiplier", 4),)),
    }
    assert groups[(("fc1", 0, 8),)] == {("fc2", 0, 8, ())}
    assert graph.node("fc1").params["activation"] == "relu"
    # independent check (the conv has no bias): zeroing conv channel c changes rows 4c..4c+3
    x = ms.Tensor(np.random.default_rng(0).normal(size=(1, 3, 6, 6)).astype(np.float32))
    flat = net.flatten(net.pool(net.conv(x))).asnumpy()[0]
    w = net.conv.weight.asnumpy().copy()
    for c in range(4):
        pruned = w.copy()
        pruned[c] = 0
        net.conv.weight.set_data(ms.Tensor(pruned))
        changed = np.flatnonzero(net.flatten(net.pool(net.conv(x))).asnumpy()[0] != flat)
        assert changed.tolist() == list(range(4 * c, 4 * c + 4))
    net.conv.weight.set_data(ms.Tensor(w))


def test_sequential_cell_children_are_named_by_index():
    _, graph = run("sequential_net")
    assert [n.name for n in graph] == [str(i) for i in range(8)]
    groups, refused = summary(discover_groups(graph))
    assert groups == {
        (("0", 0, 6),): chain("1", "2", "3", "4", width=6),
        (("4", 0, 4),): chain("5", "6", "7", width=4),
    }
    assert refused == {("7", 0, 2): "MODEL_OUTPUT"}


def test_a_cell_called_twice_couples_its_inputs():
    _, graph = run("called_twice")
    assert [n.name for n in graph if n.layer == "shared"] == ["shared", "shared@1"]
    groups, _ = summary(discover_groups(graph))
    # the shared conv reads a's and b's channels with the same weights: one mask for both
    assert groups[(("a", 0, 4), ("b", 0, 4))] == chain("act", "shared", width=4)
    assert groups[(("shared", 0, 6),)] == chain("add_op0", "out", width=6)


def test_functional_add_and_concat_are_nodes():
    _, graph = run("functional_net")
    kinds = [(n.name, n.kind, n.op_type) for n in graph if not n.is_layer]
    assert kinds == [
        ("add_op0", "Add", "AddV2"),  # x + y
        ("add_op1", "Add", "AddV2"),  # ops.add
        ("relu_op0", "Relu", "Relu"),  # ops.relu
        ("concat_op0", "Concatenate", "ConcatV2"),  # ops.concat
    ]
    groups, _ = summary(discover_groups(graph))
    assert groups[(("a", 0, 4), ("b", 0, 4), ("c", 0, 4))] == chain(
        "add_op0", "add_op1", "relu_op0", "concat_op0", "head", width=4
    )
    assert groups[(("d", 0, 2),)] == {("concat_op0", 4, 6, ()), ("head", 4, 6, ())}


def test_a_for_loop_in_construct_is_still_extracted():
    _, graph = run("loop_net")
    assert [n.name for n in graph] == [
        "stem",
        "blocks.0",
        "blocks.1",
        "blocks.2",
        "add_op0",
        "head",
    ]
    assert graph.node("add_op0").inputs == ["blocks.2:0", "blocks.0:0"]
    groups, _ = summary(discover_groups(graph))
    assert groups[(("blocks.0", 0, 4), ("blocks.2", 0, 4))] == chain(
        "blocks.1", "add_op0", "head", width=4
    )


class Swish(nn.Cell):
    def construct(self, x):
        return x * ops.sigmoid(x)


class Unknowns(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.act = Swish()
        self.b = nn.Conv2d(4, 4, 1)
        self.c = nn.Conv2d(4, 2, 1)

    def construct(self, x):
        y = self.b(self.act(self.a(x)))
        return self.c(ops.transpose(y, (0, 1, 3, 2)) + ops.softmax(y, 1))


def test_unknown_cells_and_channel_mixing_ops_stop_with_reasons():
    graph = extract_graph(Unknowns(), (1, 3, 4, 4))
    assert graph.node("act").kind == "mindspore:Swish"
    transpose = next(n for n in graph if n.params.get("primitive") == "Transpose")
    assert transpose.params["axes"] == (0, 1, 3, 2)
    groups, refused = summary(discover_groups(graph))
    assert refused[("a", 0, 4)] == "UNKNOWN_OP"
    # a transpose of H and W keeps channels; softmax over the channel axis mixes them
    assert refused[("b", 0, 4)] == "CHANNEL_MIXING"
    assert groups == {}


def test_pynative_mode_gives_the_same_graph_and_leaves_no_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    net = nets.resnet_tiny()
    net.set_train(True)
    before = {n: p.asnumpy().copy() for n, p in net.parameters_and_names()}
    ms.set_context(mode=ms.PYNATIVE_MODE)
    graph = extract_graph(net, np.zeros((1, 3, 16, 16), np.float32))
    ms.set_context(mode=ms.GRAPH_MODE)
    _, graph_mode = run("resnet_tiny")
    assert [(n.name, n.kind) for n in graph] == [(n.name, n.kind) for n in graph_mode]
    assert os.listdir(tmp_path) == []
    assert net.training  # restored
    after = dict(net.parameters_and_names())
    assert before.keys() == after.keys()
    for name, value in before.items():
        np.testing.assert_array_equal(after[name].asnumpy(), value)


class Broken(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 2)

    def construct(self, x):
        return self.fc(x)


def test_bad_input_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(GraphError, match="sample_input: expected a shape tuple"):
        extract_graph(Broken(), "1,4")
    with pytest.raises(
        GraphError, match=r"Broken: MindIR export failed.*sample input of shape \(1, 5\)"
    ) as err:
        extract_graph(Broken(), (1, 5))  # Dense(4, 2) cannot take 5 features
    # the log MindSpore printed (or, under the CLI without -v, hid) is named for what it is
    monkeypatch.delenv("GLOG_v", raising=False)
    assert "analyze_fail.ir in a temporary directory, removed since" in _log_hint()
    monkeypatch.setenv("GLOG_v", "4")
    assert "hidden: rerun with -v" in _log_hint()
    assert "MindSpore's own log" in str(err.value)
    assert os.listdir(tmp_path) == []  # no rank_0/ left behind
    with pytest.raises(GraphError, match="give sample_input"):
        prune_discovery(Broken())


class MixedOps(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 1)
        self.b1 = nn.Conv2d(2, 2, 1)
        self.b2 = nn.Conv2d(6, 2, 1)
        self.b3 = nn.Conv2d(3, 2, 1)
        self.up = nn.Conv2dTranspose(8, 4, 2, stride=2)
        self.fc = nn.Dense(4, 2)
        self.fc_w = nn.Dense(8, 3)

    def construct(self, x):
        p, q = ops.split(self.a(x), (2, 6), axis=1)  # StridedSlice in MindIR: not followed
        y = self.b1(p) + self.b2(q)
        m = ops.mean(self.b3(x) * y, (2, 3))  # spatial mean: channel-wise
        return self.fc(ops.concat((m, m), 1)), self.fc_w(self.up(self.a(x)))


def test_spatial_mean_concat_twice_transpose_conv_and_dense_on_a_map():
    graph = extract_graph(MixedOps(), (1, 3, 4, 4))
    up = graph.node("up")
    assert (up.kind, up.op_type, up.params["kernel_layout"]) == (
        "Conv2DTranspose",
        "Conv2DBackpropInput",
        "IOHW",
    )
    assert up.params["kernel_shape"] == (8, 4, 2, 2)
    mean = graph.node("reducemean_op0")
    assert mean.kind == "GlobalAveragePooling2D" and mean.params["axis"] == (-2, -1)
    assert graph.node("concat_op0").inputs == ["reducemean_op0:0", "reducemean_op0:0"]
    groups, refused = summary(discover_groups(graph))
    # concat([m, m]) puts the same channels at [0, 2) and [2, 4)
    assert groups == {
        (("b3", 0, 2), ("b1", 0, 2), ("b2", 0, 2)): {
            ("add_op0", 0, 2, ()),
            ("mul_op0", 0, 2, ()),
            ("reducemean_op0", 0, 2, ()),
            ("concat_op0", 0, 2, ()),
            ("concat_op0", 2, 4, ()),
            ("fc", 0, 2, ()),
            ("fc", 2, 4, ()),
        }
    }
    assert refused[("a", 0, 8)] == "UNKNOWN_OP"  # the slices of ops.split
    # nn.Dense on an NCHW map mixes the last axis (W), not channels
    assert refused[("up", 0, 4)] == refused[("fc_w", 0, 3)] == "UNSUPPORTED_LAYOUT"


class DataDependentIf(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(4, 4, 1)

    def construct(self, x):
        y = self.a(x)
        if y.sum() > 0:
            y = self.b(y)
        return y


def test_data_dependent_control_flow_is_refused_clearly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(GraphError, match="DataDependentIf: the MindIR holds .* sub-graph"):
        extract_graph(DataDependentIf(), (1, 3, 4, 4))
    assert os.listdir(tmp_path) == []


class AddBlock(nn.Cell):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(4, 4, 1)

    def construct(self, x):
        return self.c(x) + x  # the sum leaves the block directly


class AddBlocks(nn.Cell):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 1)
        self.blocks = nn.SequentialCell([AddBlock(), AddBlock()])
        self.head = nn.Conv2d(4, 2, 1)

    def construct(self, x):
        return self.head(self.blocks(self.stem(x)))


def test_functional_op_owner_rule_as_documented():
    # owner = deepest cell holding the latest producer and the first reading cell: the first
    # block's sum is read by blocks.1 (owner "blocks"), the second's by head (the top cell)
    graph = extract_graph(AddBlocks(), (1, 3, 4, 4))
    assert [n.name for n in graph] == [
        "stem",
        "blocks.0.c",
        "blocks.add_op0",
        "blocks.1.c",
        "add_op0",
        "head",
    ]


class TwoSwish(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.s1 = Swish()
        self.b = nn.Conv2d(4, 4, 1)
        self.s2 = Swish()

    def construct(self, x):
        return self.s2(self.b(self.s1(self.a(x))))


def test_two_instances_of_a_custom_cell_keep_their_own_names():
    # MindIR gives s2's ops partly the scope of s1 (the class's first instance)
    graph = extract_graph(TwoSwish(), (1, 3, 4, 4))
    assert [(n.name, n.kind) for n in graph] == [
        ("a", "Conv2D"),
        ("s1", "mindspore:Swish"),
        ("b", "Conv2D"),
        ("s2", "mindspore:Swish"),
    ]
    _, refused = summary(discover_groups(graph))
    assert refused == {("a", 0, 4): "UNKNOWN_OP", ("b", 0, 4): "UNKNOWN_OP"}


@functools.cache
def _resnet_tiny_groups():
    """The groups and refusals of ``+`` (resnet_tiny), which every spelling must give: one
    compile per worker, not one per spelling."""
    return summary(discover_groups(run("resnet_tiny")[1]))


_ADD_NAMES = {"+": "add_op0", "+=": "inplaceaddext_op0", "ops.add": "add_op0", "AddN": "addn_op0"}


@pytest.mark.parametrize("spelling", [s for s in nets.ADD_SPELLINGS if s != "+"])
@pytest.mark.parametrize("pad", [False, True], ids=["same", "pad1"])
def test_every_add_spelling_gives_the_resnet_groups(spelling, pad, request):
    """``out += identity`` compiles to InplaceAddExt (refused as UNKNOWN_OP before), ops.add
    to Add, ops.AddN to AddN: each is the residual Add, so the groups are those of ``+``
    (pad_mode='pad' changes no channel), only the add node's name differs."""
    if spelling == "+=" and in_fresh_process(request):  # out += y: see isolate.py
        return
    expected, expected_refused = _resnet_tiny_groups()
    net = nets.ResNetTiny(add=spelling, pad=pad)
    graph = extract_graph(net, nets.INPUT_SHAPES["resnet_tiny"])
    groups, refused = summary(discover_groups(graph))
    rename = {"add_op0": _ADD_NAMES[spelling]}

    def renamed(members):
        return {(".".join(rename.get(p, p) for p in n.split(".")), *rest) for n, *rest in members}

    assert groups == {k: renamed(v) for k, v in expected.items()}
    assert refused == expected_refused
    kinds = {n.name: n.kind for n in graph.nodes}
    assert kinds[f"layer1.0.{_ADD_NAMES[spelling]}"] == "Add"


class _Aliased(nn.Cell):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(4, 4, 3), nn.Conv2d(4, 4, 3)
        self.addn = ops.AddN()

    def construct(self, x):
        a, b = self.c1(x), self.c2(x)
        out = a
        out += b  # a is the same tensor: in GRAPH_MODE it changes too
        y = ops.add(out, a)
        w = self.addn([y + b, a])
        return ops.concat((ops.cat((w, a), 1), w), 1)


def test_inplace_add_updates_every_name_of_its_tensor(request):
    """After ``out = a; out += b``, GRAPH_MODE reads ``a`` as the sum (MindIR: a Load of the
    updated state); the graph follows it, checked against the network's own outputs."""
    if in_fresh_process(request):  # out += y: see isolate.py
        return
    graph = extract_graph(_Aliased(), (1, 4, 6, 6))
    got = {n.name: (n.kind, n.inputs) for n in graph.nodes if not n.is_layer}
    s = "inplaceaddext_op0:0"
    assert got == {
        "inplaceaddext_op0": ("Add", ["c1:0", "c2:0"]),
        "add_op0": ("Add", [s, s]),
        "add_op1": ("Add", ["add_op0:0", "c2:0"]),
        "addn_op0": ("Add", ["add_op1:0", s]),
        "concat_op0": ("Concatenate", ["addn_op0:0", s]),
        "concat_op1": ("Concatenate", ["concat_op0:0", "addn_op0:0"]),
    }
    net = _Aliased()
    x = ms.Tensor(np.random.default_rng(0).normal(size=(1, 4, 6, 6)).astype(np.float32))
    a, b = net.c1(x).asnumpy(), net.c2(x).asnumpy()
    s_ = a + b
    w = (s_ + s_ + b) + s_  # what the graph above says
    expected = np.concatenate([np.concatenate([w, s_], 1), w], 1)
    np.testing.assert_allclose(net(x).asnumpy(), expected, rtol=1e-5, atol=1e-5)
