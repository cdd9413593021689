"""A cell called back to back (``fc(fc(x))``) is one graph node per call, as everywhere else.

Both calls' MindIR primitives carry the same scope and are connected by data, so they used to
merge into one node: the second call disappeared from the graph, the calibration sidecar,
pruning groups and the export. Real MindSpore 2.10 on CPU, tiny nets.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from nets import SharedDense

from amct_bridge.errors import ExportError
from amct_bridge.graph import discover_groups
from amct_bridge.mindspore import calibrate, export_espdl, extract_graph
from amct_bridge.mindspore.espdl_weights import source_layers
from amct_bridge.records.calibration import load_stats, sidecar_path


@pytest.fixture(autouse=True)
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.GRAPH_MODE)


class Twice(nn.Cell):
    """``self.cell`` applied ``times`` times in a row."""

    def __init__(self, cell: nn.Cell, times: int = 2):
        super().__init__()
        self.cell = cell
        self.times = times

    def construct(self, x):
        for _ in range(self.times):
            x = self.cell(x)
        return x


class Block(nn.Cell):
    """A custom leaf cell of several primitives (no children)."""

    def construct(self, x):
        return (x * 2.0 + 1.0) * x


class Doubled(nn.Cell):
    """One call running the same primitive twice in a row: must stay one call."""

    def construct(self, x):
        return (x * 2.0) * 2.0


class CastSigmoid(nn.Sigmoid):
    """A known activation class whose call runs Cast, Sigmoid, Cast (Cast counts as an
    activation primitive too): the rarest required primitive marks the calls."""

    def construct(self, x):
        return ops.cast(ops.sigmoid(ops.cast(x, ms.float16)), ms.float32)


class TwoBlocks(nn.Cell):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def construct(self, x):
        return self.block(self.block(x))


def chain(names, kind):
    """The expected nodes of back-to-back calls: (name, kind, inputs, outputs)."""
    out, prev = [], "input0"
    for name in names:
        out.append((name, kind, [prev], [f"{name}:0"]))
        prev = f"{name}:0"
    return out


CASES = {
    "dense_bias": (lambda: nn.Dense(6, 6), (1, 6), "Dense"),
    "dense_no_bias": (lambda: nn.Dense(6, 6, has_bias=False), (1, 6), "Dense"),
    "dense_relu": (lambda: nn.Dense(6, 6, activation="relu"), (1, 6), "Dense"),
    "dense_on_a_map": (lambda: nn.Dense(3, 3), (1, 2, 3, 3), "Dense"),  # Reshape..Reshape
    "leaky_relu": (lambda: nn.LeakyReLU(0.1), (1, 2, 3, 3), "LeakyReLU"),  # Mul + Maximum
    "batch_norm": (lambda: nn.BatchNorm2d(2), (1, 2, 3, 3), "BatchNormalization"),
    "conv_bias": (lambda: nn.Conv2d(2, 2, 3, has_bias=True), (1, 2, 5, 5), "Conv2D"),
    "flatten": (lambda: nn.Flatten(), (1, 2, 3, 3), "Flatten"),
    "relu": (lambda: nn.ReLU(), (1, 4), "ReLU"),
    "custom_block": (Block, (1, 4), "mindspore:Block"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_back_to_back_calls_are_one_node_each(case):
    make, shape, kind = CASES[case]
    graph = extract_graph(Twice(make()), shape)
    got = [(n.name, n.kind, n.inputs, n.outputs) for n in graph]
    assert got == chain(["cell", "cell@1"], kind)
    assert [(n.layer, n.call_index, n.shared) for n in graph] == [
        ("cell", 0, True),
        ("cell", 1, True),
    ]
    assert graph.outputs == ["cell@1:0"]
    assert graph.tensors["cell@1:0"].shape[0] == 1


def test_three_calls_and_the_shapes_between_them():
    graph = extract_graph(Twice(nn.Conv2d(2, 2, 3, pad_mode="valid"), 3), (1, 2, 9, 9))
    assert [(n.name, n.inputs) for n in graph] == [
        ("cell", ["input0"]),
        ("cell@1", ["cell:0"]),
        ("cell@2", ["cell@1:0"]),
    ]
    # valid 3x3 convs: 9 -> 7 -> 5 -> 3, each call's own output
    assert [graph.tensors[f"{n}:0"].shape for n in ("cell", "cell@1", "cell@2")] == [
        (1, 2, 7, 7),
        (1, 2, 5, 5),
        (1, 2, 3, 3),
    ]


def test_a_sequential_cell_used_twice_back_to_back():
    seq = nn.SequentialCell([nn.Dense(4, 4), nn.ReLU()])
    graph = extract_graph(Twice(seq), (1, 4))
    assert [(n.name, n.kind, n.inputs) for n in graph] == [
        ("cell.0", "Dense", ["input0"]),
        ("cell.1", "ReLU", ["cell.0:0"]),
        ("cell.0@1", "Dense", ["cell.1:0"]),
        ("cell.1@1", "ReLU", ["cell.0@1:0"]),
    ]
    single = extract_graph(Twice(nn.SequentialCell([nn.Dense(4, 4)])), (1, 4))
    assert [(n.name, n.inputs) for n in single] == [
        ("cell.0", ["input0"]),
        ("cell.0@1", ["cell.0:0"]),
    ]


def test_a_custom_block_called_twice_and_one_repeating_itself_once():
    graph = extract_graph(TwoBlocks(), (1, 4))
    assert [(n.name, n.inputs) for n in graph] == [("block", ["input0"]), ("block@1", ["block:0"])]
    # x * 2 * 2 in one call looks like two calls of x * 2: the cell exported alone settles it
    once = extract_graph(Twice(Doubled(), 1), (1, 4))
    assert [(n.name, n.inputs) for n in once] == [("cell", ["input0"])]
    twice = extract_graph(Twice(Doubled(), 2), (1, 4))
    assert [(n.name, n.inputs) for n in twice] == [("cell", ["input0"]), ("cell@1", ["cell:0"])]


def test_an_activation_running_several_activation_primitives_per_call():
    once = extract_graph(Twice(CastSigmoid(), 1), (1, 4))
    assert [(n.name, n.kind, n.inputs) for n in once] == [("cell", "Activation", ["input0"])]
    twice = extract_graph(Twice(CastSigmoid(), 2), (1, 4))
    assert [(n.name, n.inputs) for n in twice] == [("cell", ["input0"]), ("cell@1", ["cell:0"])]


def test_pynative_mode_gives_the_same_nodes():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    graph = extract_graph(Twice(nn.Dense(6, 6)), (1, 6))
    assert [(n.name, n.inputs) for n in graph] == [("cell", ["input0"]), ("cell@1", ["cell:0"])]


class Chain(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = nn.Dense(6, 6)
        self.fc = nn.Dense(6, 6)
        self.o = nn.Dense(6, 3)

    def construct(self, x):
        return self.o(self.fc(self.fc(self.a(x))))


def test_source_layers_and_prune_groups_see_both_calls():
    net = Chain()
    names = [(x.name, x.inputs) for x in source_layers(net, (1, 6))]
    assert names == [
        ("input0", []),
        ("a", ["input0"]),
        ("fc", ["a"]),
        ("fc@1", ["fc"]),
        ("o", ["fc@1"]),
    ]
    # fc's second call reads fc's output: fc's output channels are its input channels, so
    # they prune together with a's (one merged node had fc's outputs free on their own)
    found = discover_groups(extract_graph(net, (1, 6)))
    groups = [
        (sorted(m.name for m in g.producers), sorted({m.name for m in g.consumers}))
        for g in found.groups
    ]
    assert groups == [(["a", "fc"], ["fc", "o"])]  # consumers by layer: fc reads both


class B2B(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(6, 6)

    def construct(self, x):
        return self.fc(self.fc(x))


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_calibration_sidecar_has_each_calls_range(mode, tmp_path):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_seed(3)
    net = B2B()
    x = np.random.default_rng(0).normal(0, 2, (8, 6)).astype(np.float32)
    path = tmp_path / "r.txt"
    calibrate(net, x, path, algorithm="minmax", batch_size=4)
    layers = load_stats(sidecar_path(path)).layers
    w = net.fc.weight.asnumpy().astype(np.float64)
    b = net.fc.bias.asnumpy().astype(np.float64)
    y1 = x @ w.T + b  # the forward by hand
    y2 = y1 @ w.T + b
    assert set(layers) == {"fc", "fc@1"}
    for key, (inp, out) in {"fc": (x, y1), "fc@1": (y1, y2)}.items():
        got = layers[key]
        want = (inp.min(), inp.max(), out.min(), out.max())
        have = (got.input.min, got.input.max, got.output.min, got.output.max)
        assert have == pytest.approx(want, rel=1e-5, abs=1e-5), key
    assert not np.isclose(y1.max(), y2.max())  # the two calls do differ


def test_export_refuses_a_shared_dense_naming_it_whether_back_to_back_or_apart(tmp_path):
    x = np.random.default_rng(1).normal(0, 1, (4, 6)).astype(np.float32)
    messages = {}
    # one format per net (suite time); the apart net in both: test_v3_refusal_wording_mindspore
    for cls, fmt in ((B2B, "espdl"), (SharedDense, "v1")):
        net = cls()
        path = tmp_path / f"{cls.__name__}.txt"
        calibrate(net, x, path, algorithm="minmax", batch_size=4)
        out = tmp_path / (f"{cls.__name__}.espdl" if fmt == "espdl" else cls.__name__)
        with pytest.raises(ExportError) as err:
            export_espdl(net, path, out, sample_input=x[:1], format=fmt)
        messages[cls.__name__] = str(err.value)
        assert not out.exists()  # nothing half written
    for text in messages.values():
        assert "cell 'fc' called 2 times (fc, fc@1" in text
        assert "a chip layer holds its own weights" in text
        assert "'fc'" in text


def test_forward_of_the_test_nets_matches_numpy():
    """The nets above compute what the hand-written forwards say (guards the references)."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = B2B()
    x = np.random.default_rng(2).normal(0, 1, (2, 6)).astype(np.float32)
    w, b = net.fc.weight.asnumpy(), net.fc.bias.asnumpy()
    want = (x @ w.T + b) @ w.T + b
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), want, rtol=1e-5, atol=1e-5)
