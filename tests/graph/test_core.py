"""Framework-free core: IR, index mappings, discovery on hand-built graphs, 2:4 masks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amct_bridge.errors import GraphError
from amct_bridge.graph import Graph, Node, TensorInfo, discover_groups
from amct_bridge.graph.mapping import Misaligned, Piece
from amct_bridge.graph.selective import pack_mask, two_four_mask, unpack_mask


class G:
    """Tiny builder: G().inp("x", 8).op("c1", "Conv2D", ["x"], 4, filters=4)..."""

    def __init__(self) -> None:
        self.g = Graph()

    def inp(self, tid: str, c: int, spatial=(4, 4)) -> G:
        self.g.tensors[tid] = TensorInfo((None, *spatial, c))
        self.g.inputs.append(tid)
        return self

    def op(self, name, kind, inputs, c, spatial=(4, 4), outputs=None, **params) -> G:
        outs = outputs or [(f"{name}:0", c)]
        for tid, width in outs:
            self.g.tensors[tid] = TensorInfo((None, *spatial, width) if width else (None,))
        self.g.add_node(Node(name, name, kind, kind, inputs, [t for t, _ in outs], params))
        return self

    def out(self, tid: str) -> Graph:
        self.g.outputs.append(tid)
        return self.g


def summary(d):
    groups = {
        tuple((p.name, p.begin, p.end) for p in g.producers): [
            (c.name, c.begin, c.end) for c in g.consumers
        ]
        for g in d.groups
    }
    return groups, {(r.layer, r.begin, r.end): r.reason.value for r in d.refusals}


def conv(b: G, name, inp, c, **kw) -> G:
    return b.op(name, "Conv2D", [inp], c, filters=c, groups=1, **kw)


# ---- IR ------------------------------------------------------------------------------------------
def test_graph_rejects_duplicates_and_unknown_tensors():
    b = G().inp("x", 3)
    conv(b, "c1", "x", 4)
    with pytest.raises(GraphError, match="duplicate node name 'c1'"):
        conv(b, "c1", "x", 4)
    with pytest.raises(GraphError, match="input tensor 'nope' is unknown"):
        b.g.add_node(Node("c2", "c2", "Conv2D", "Conv2D", ["nope"], []))
    with pytest.raises(GraphError, match="no node 'zz'"):
        b.g.node("zz")


def test_producer_consumers_and_chains():
    b = G().inp("x", 3)
    conv(b, "c1", "x", 4).op("bn", "BatchNormalization", ["c1:0"], 4)
    b.op("relu", "ReLU", ["bn:0"], 4)
    conv(b, "c2", "relu:0", 4)
    g = b.out("c2:0")
    assert g.producer_of("bn:0").name == "bn" and g.producer_of("x") is None
    assert [n.name for n in g.consumers_of("c1:0")] == ["bn"]
    chains = g.chains(("Conv2D",), ("BatchNormalization", "ReLU"))
    assert [[n.name for n in c] for c in chains] == [["c1", "bn", "relu"], ["c2"]]


# ---- mappings ----
@settings(max_examples=60, deadline=None)
@given(
    lo=st.integers(0, 5),
    n=st.integers(1, 5),
    off=st.integers(0, 6),
    m=st.integers(1, 3),
    shift=st.integers(0, 7),
)
def test_piece_compositions_match_brute_force(lo, n, off, m, shift):
    p = Piece(0, lo, lo + n, offset=off)
    width = off + n
    # brute force: track each root channel as a one-hot plane through the same ops
    for k in range(lo, lo + n):
        vec = np.zeros(width)
        vec[off + k - lo] = 1
        dw = np.repeat(vec, m)  # depthwise multiplier m: channel i -> [i*m, (i+1)*m)
        cat = np.concatenate([np.zeros(shift), dw])
        flat = np.tile(cat, 3)  # flatten 3 spatial positions (NHWC): row s*C + c
        got = p.repeated(m).shifted(shift).tiled(3, cat.size).sub(k, k + 1).positions()
        assert got == np.flatnonzero(flat).tolist()


def test_piece_slicing_rejects_split_inside_a_root_block():
    p = Piece(0, 0, 4).repeated(2)
    assert p.sliced(2, 6) == Piece(0, 1, 3, offset=0, repeat=2)
    with pytest.raises(Misaligned):
        p.sliced(3, 6)


# ---- discovery on hand-built graphs ----
def test_width_mismatch_at_add_is_refused():
    b = G().inp("x", 3)
    conv(b, "a", "x", 8)
    conv(b, "b", "x", 4)
    b.op("add", "Add", ["a:0", "b:0"], 8)
    conv(b, "c", "add:0", 2)
    _, refused = summary(discover_groups(b.out("c:0")))
    assert refused[("a", 0, 8)] == refused[("b", 0, 4)] == "WIDTH_MISMATCH"


def test_concat_then_add_couples_partial_ranges():
    # cat(a[4], b[4]) + c[8]: c's first half shares a's mask, its second half b's
    b = G().inp("x", 3)
    for name, c in (("a", 4), ("b", 4), ("c", 8)):
        conv(b, name, "x", c)
    b.op("cat", "Concatenate", ["a:0", "b:0"], 8, axis=-1)
    b.op("add", "Add", ["cat:0", "c:0"], 8)
    conv(b, "d", "add:0", 2)
    groups, refused = summary(discover_groups(b.out("d:0")))
    assert groups[(("a", 0, 4), ("c", 0, 4))] == [("cat", 0, 4), ("add", 0, 4), ("d", 0, 4)]
    assert groups[(("b", 0, 4), ("c", 4, 8))] == [("cat", 4, 8), ("add", 4, 8), ("d", 4, 8)]
    assert refused == {("d", 0, 2): "MODEL_OUTPUT"}


def test_self_coupling_through_concat_of_same_tensor():
    # cat(a, a) + c: c[0:4) and c[4:8) both share a's mask -> one group, c listed twice
    b = G().inp("x", 3)
    conv(b, "a", "x", 4)
    conv(b, "c", "x", 8)
    b.op("cat", "Concatenate", ["a:0", "a:0"], 8, axis=-1)
    b.op("add", "Add", ["cat:0", "c:0"], 8)
    conv(b, "d", "add:0", 2)
    groups, _ = summary(discover_groups(b.out("d:0")))
    assert list(groups)[0] == (("a", 0, 4), ("c", 0, 4), ("c", 4, 8))


def test_tiled_maps_merge_only_when_identical():
    b = G().inp("x", 3, spatial=(2, 2))
    conv(b, "a", "x", 4, spatial=(2, 2))
    conv(b, "b", "x", 4, spatial=(2, 2))
    for name in ("a", "b"):
        b.op(f"f{name}", "Flatten", [f"{name}:0"], None, spatial=(), outputs=[(f"f{name}:0", 0)])
        b.g.tensors[f"f{name}:0"] = TensorInfo((None, 16))
    b.op("add", "Add", ["fa:0", "fb:0"], None, outputs=[("add:0", 0)])
    b.g.tensors["add:0"] = TensorInfo((None, 16))
    b.op("fc", "Dense", ["add:0"], None, outputs=[("fc:0", 0)], units=2)
    b.g.tensors["fc:0"] = TensorInfo((None, 2))
    groups, _ = summary(discover_groups(b.out("fc:0")))
    assert groups[(("a", 0, 4), ("b", 0, 4))][-1] == ("fc", 0, 4)


def test_unknown_shape_stops():
    b = G().inp("x", 3)
    conv(b, "a", "x", 4)
    b.op("odd", "ReLU", ["a:0"], None, outputs=[("odd:0", None)])
    b.g.tensors["odd:0"] = TensorInfo((None, None))
    _, refused = summary(discover_groups(b.out("odd:0")))
    assert refused[("a", 0, 4)] == "UNKNOWN_SHAPE"


def test_channels_first_layout_is_refused():
    b = G().inp("x", 3)
    conv(b, "a", "x", 4)
    b.op("bn", "BatchNormalization", ["a:0"], 4, axis=1, channel_axis=-3)
    conv(b, "c", "bn:0", 2)
    _, refused = summary(discover_groups(b.out("c:0")))
    assert refused[("a", 0, 4)] == "UNSUPPORTED_LAYOUT"


# ---- 2:4 masks ----
@settings(max_examples=40, deadline=None)
@given(cin=st.integers(1, 11), cout=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_two_four_mask_keeps_two_largest_per_run(cin, cout, seed):
    w = np.random.default_rng(seed).normal(size=(2, cin, cout))
    w = np.round(w, 1)  # force ties sometimes
    mask = two_four_mask(w[None], "HWIO")[0]
    for h in range(2):
        for o in range(cout):
            for start in range(0, cin, 4):
                run = np.abs(w[h, start : start + 4, o])
                order = sorted(range(run.size), key=lambda i: (-run[i], i))[:2]
                expect = np.zeros(run.size, dtype=bool)
                expect[order] = True
                assert mask[h, start : start + 4, o].tolist() == expect.tolist()


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), seed=st.integers(0, 999))
def test_pack_unpack_round_trip(shape, seed):
    mask = np.random.default_rng(seed).random(shape) > 0.5
    packed = pack_mask(mask)
    assert len(packed) == -(-mask.size // 64)  # 64 bits per int64
    np.testing.assert_array_equal(unpack_mask(packed, tuple(shape)), mask)


def test_pack_layout_is_msb_first_little_endian_int64():
    mask = np.zeros(64, dtype=bool)
    mask[0] = True  # first bit -> MSB of byte 0 -> low byte of a little-endian int64
    assert pack_mask(mask) == [0x80]
    mask[:] = False
    mask[8] = True  # byte 1 MSB
    assert pack_mask(mask) == [0x8000]


def test_graph_built_from_a_node_list_is_indexed():
    tensors = {"x": TensorInfo((None, 3)), "y": TensorInfo((None, 2))}
    g = Graph([Node("fc", "fc", "Dense", "MatMul", ["x"], ["y"])], tensors, ["x"], ["y"])
    assert g.producer_of("y").name == "fc" and g.node("fc").kind == "Dense"
