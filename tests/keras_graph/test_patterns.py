"""The 21-pattern matrix of prune-discovery.md, one test (or a few) per pattern.

Each test builds a small Keras 3 model and states the exact groups (producer ranges ->
consumer entries in record order) and refusals (layer range -> reason) it expects; the
numbers are worked out by hand from the model in the test.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers, ops
from kgraph_helpers import discover, groups, head, kname, refusals

from amct_bridge.keras.graph import extract_graph


def inp(shape=(8, 8, 3), name="x"):
    return keras.Input(shape, name=name)


def conv(filters, name, k=1, **kw):
    return layers.Conv2D(filters, k, padding="same", name=name, **kw)


# 1 --------------------------------------------------------------------------------------------
def test_conv_bn_act_pool_dropout_conv_is_one_group():
    x = inp()
    y = conv(8, "c1", 3)(x)
    y = layers.BatchNormalization(name="bn")(y)
    y = layers.ReLU(name="relu")(y)
    y = layers.MaxPooling2D(name="pool")(y)
    y = layers.Dropout(0.1, name="drop")(y)
    y = conv(4, "c2")(y)
    d = discover(keras.Model(x, head(y)))
    assert groups(d) == {
        (("c1", 0, 8),): [
            ("bn", "FusedBatchNormV3", 0, 8),
            ("relu", "Relu", 0, 8),
            ("pool", "MaxPool", 0, 8),
            ("drop", "Identity", 0, 8),
            ("c2", "Conv2D", 0, 8),
        ],
        (("c2", 0, 4),): [("gap", "Mean", 0, 4), ("fc", "MatMul", 0, 4)],
    }
    assert refusals(d) == {("fc", 0, 2): "MODEL_OUTPUT"}


# 2 --------------------------------------------------------------------------------------------
def test_residual_adds_share_one_mask():
    x = inp()
    c0 = conv(8, "c0")(x)
    s1 = layers.Add(name="add1")([c0, conv(8, "c1")(c0)])
    s2 = s1 + conv(8, "c2")(s1)  # raw op twin of Add
    d = discover(keras.Model(x, head(conv(4, "c3")(s2))))
    g = groups(d)
    assert g[(("c0", 0, 8), ("c1", 0, 8), ("c2", 0, 8))] == [
        ("c1", "Conv2D", 0, 8),
        ("add1", "AddV2", 0, 8),
        ("c2", "Conv2D", 0, 8),
        (kname(s2), "AddV2", 0, 8),
        ("c3", "Conv2D", 0, 8),
    ]
    assert len(d.groups) == 2


def test_broadcast_one_channel_is_refused_other_side_kept():
    x = inp()
    a = conv(1, "one")(x)
    b = conv(8, "eight")(x)
    s = a + b
    d = discover(keras.Model(x, head(conv(4, "c3")(s))))
    assert refusals(d)[("one", 0, 1)] == "BROADCAST"
    assert groups(d)[(("eight", 0, 8),)] == [(kname(s), "AddV2", 0, 8), ("c3", "Conv2D", 0, 8)]


# 3 --------------------------------------------------------------------------------------------
def test_add_with_model_input_blocks_group():
    x = inp((8, 8, 8))
    y = conv(4, "c2")(layers.Add(name="add")([conv(8, "c1")(x), x]))
    d = discover(keras.Model(x, head(y)))
    assert refusals(d)[("c1", 0, 8)] == "MERGED_WITH_UNPRUNABLE"
    assert (("c1", 0, 8),) not in groups(d)


class Doubler(layers.Layer):
    """A custom layer: its channel behaviour is unknown to the discovery."""

    def call(self, x):
        return x * 2.0


def test_add_with_unprunable_branch_blocks_group():
    x = inp()
    u = Doubler(name="custom")(conv(8, "c1")(x))
    y = conv(4, "c3")(layers.Add(name="add")([conv(8, "c2")(x), u]))
    d = discover(keras.Model(x, head(y)))
    r = refusals(d)
    assert r[("c1", 0, 8)] == "UNKNOWN_OP"
    assert r[("c2", 0, 8)] == "MERGED_WITH_UNPRUNABLE"


# 4 --------------------------------------------------------------------------------------------
def test_nested_concat_offsets_compose():
    x = inp()
    a, b, c = conv(4, "c1")(x), conv(6, "c2")(x), conv(5, "c3")(x)
    k1 = layers.Concatenate(name="cat1")([a, b])
    k2 = ops.concatenate([c, k1], axis=-1)
    d = discover(keras.Model(x, head(conv(3, "c4")(k2))))
    cat = kname(k2)
    assert groups(d)[(("c1", 0, 4),)] == [
        ("cat1", "ConcatV2", 0, 4),
        (cat, "ConcatV2", 5, 9),
        ("c4", "Conv2D", 5, 9),
    ]
    assert groups(d)[(("c2", 0, 6),)] == [
        ("cat1", "ConcatV2", 4, 10),
        (cat, "ConcatV2", 9, 15),
        ("c4", "Conv2D", 9, 15),
    ]
    assert groups(d)[(("c3", 0, 5),)] == [
        (cat, "ConcatV2", 0, 5),
        ("c4", "Conv2D", 0, 5),
    ]


# 5 --------------------------------------------------------------------------------------------
def test_concat_of_same_tensor_gives_two_ranges():
    x = inp()
    a = conv(4, "c1")(x)
    d = discover(keras.Model(x, head(conv(3, "c2")(layers.Concatenate(name="cat")([a, a])))))
    assert groups(d)[(("c1", 0, 4),)] == [
        ("cat", "ConcatV2", 0, 4),
        ("cat", "ConcatV2", 4, 8),
        ("c2", "Conv2D", 0, 4),
        ("c2", "Conv2D", 4, 8),
    ]


def test_concat_on_non_channel_axis_is_identity_for_channels():
    x = inp()
    a, b = conv(4, "c1")(x), conv(4, "c2")(x)
    k = layers.Concatenate(axis=1, name="cat_h")([a, b])
    d = discover(keras.Model(x, head(conv(3, "c3")(k))))
    assert groups(d)[(("c1", 0, 4), ("c2", 0, 4))] == [
        ("cat_h", "ConcatV2", 0, 4),
        ("c3", "Conv2D", 0, 4),
    ]


# 6 --------------------------------------------------------------------------------------------
def test_uneven_split_then_concat_slices_per_branch():
    x = inp()
    p, q = ops.split(conv(8, "c1")(x), [3], axis=-1)
    k = ops.concatenate([q, p], axis=-1)
    d = discover(keras.Model(x, head(conv(2, "c2")(k))))
    split, cat = kname(p), kname(k)
    g = groups(d)
    assert g[(("c1", 0, 3),)] == [
        (split, "SplitV", 0, 3, {"branch_idx": 0}),
        (cat, "ConcatV2", 5, 8),
        ("c2", "Conv2D", 5, 8),
    ]
    assert g[(("c1", 3, 8),)] == [
        (split, "SplitV", 3, 8, {"branch_idx": 1}),
        (cat, "ConcatV2", 0, 5),
        ("c2", "Conv2D", 0, 5),
    ]


# 7, 8 -----------------------------------------------------------------------------------------
def test_depthwise_multiplier_one_passes_range():
    x = inp()
    y = layers.DepthwiseConv2D(3, padding="same", name="dw")(conv(8, "c1")(x))
    y = conv(4, "c2")(layers.BatchNormalization(name="bn")(y))
    g = groups(discover(keras.Model(x, head(y))))
    assert g[(("c1", 0, 8),)] == [
        ("dw", "DepthwiseConv2dNative", 0, 8),
        ("bn", "FusedBatchNormV3", 0, 8),
        ("c2", "Conv2D", 0, 8),
    ]


def test_depthwise_multiplier_m_expands_each_channel_to_m():
    x = inp()
    y = layers.DepthwiseConv2D(3, depth_multiplier=3, padding="same", name="dw")(conv(4, "c1")(x))
    y = conv(2, "c2")(layers.BatchNormalization(name="bn")(y))
    g = groups(discover(keras.Model(x, head(y))))
    assert g[(("c1", 0, 4),)] == [
        ("dw", "DepthwiseConv2dNative", 0, 4, {"depth_multiplier": 3}),
        ("bn", "FusedBatchNormV3", 0, 12, {"multiplier": 3}),
        ("c2", "Conv2D", 0, 12, {"multiplier": 3}),
    ]


def test_depthwise_multiplier_after_split_keeps_root_channel_blocks():
    # root channel k of c1[4, 6) lands on depthwise outputs [(k - 4) * 2, (k - 3) * 2)
    x = inp()
    _, q = ops.split(conv(6, "c1")(x), [4], axis=-1)
    y = layers.DepthwiseConv2D(1, depth_multiplier=2, name="dw")(q)
    g = groups(discover(keras.Model(x, head(conv(2, "c2")(y)))))
    assert g[(("c1", 4, 6),)][-1] == ("c2", "Conv2D", 0, 4, {"multiplier": 2})


# 9 --------------------------------------------------------------------------------------------
def test_group_conv_is_refused_with_reason():
    x = inp()
    y = conv(8, "g", 3, groups=2)(conv(8, "c1")(x))
    r = refusals(discover(keras.Model(x, head(conv(4, "c3")(y)))))
    assert r[("c1", 0, 8)] == "GROUPED_CONV"
    assert r[("g", 0, 8)] == "GROUPED_CONV"


def test_group_conv_with_groups_equal_channels_is_depthwise():
    x = inp()
    y = conv(16, "g", 3, groups=8)(conv(8, "c1")(x))
    g = groups(discover(keras.Model(x, head(conv(4, "c3")(y)))))
    assert g[(("c1", 0, 8),)] == [
        ("g", "Conv2D", 0, 8, {"depth_multiplier": 2}),
        ("c3", "Conv2D", 0, 16, {"multiplier": 2}),
    ]


# 10 -------------------------------------------------------------------------------------------
def test_separable_conv_depthwise_part_passes_pointwise_part_closes():
    x = inp()
    y = layers.SeparableConv2D(6, 3, depth_multiplier=2, padding="same", name="sep")(
        conv(4, "c1")(x)
    )
    g = groups(discover(keras.Model(x, head(conv(3, "c2")(y)))))
    assert g[(("c1", 0, 4),)] == [
        ("sep/depthwise", "DepthwiseConv2dNative", 0, 4, {"depth_multiplier": 2}),
        ("sep/pointwise", "Conv2D", 0, 8, {"multiplier": 2}),
    ]
    assert g[(("sep/pointwise", 0, 6),)] == [("c2", "Conv2D", 0, 6)]


# 11, 12 ---------------------------------------------------------------------------------------
def test_flatten_dense_nhwc_is_tiled():
    x = inp((3, 3, 2))
    c = conv(4, "c1")(x)
    fc = layers.Dense(5, name="fc1")(layers.Flatten(name="flat")(c))
    d = discover(keras.Model(x, layers.Dense(2, name="fc2")(fc)))
    tiled = {"tile": 9, "stride": 4}
    assert groups(d)[(("c1", 0, 4),)] == [
        ("flat", "Reshape", 0, 4, tiled),
        ("fc1", "MatMul", 0, 4, tiled),
    ]
    # independent check: the Dense rows fed by conv channel 1 after a real NHWC flatten
    probe = np.zeros((3, 3, 4))
    probe[..., 1] = 1
    rows = np.flatnonzero(probe.reshape(-1))
    assert rows.tolist() == [1 + s * 4 for s in range(9)]


def test_global_pool_dense_is_identity():
    x = inp()
    d = discover(keras.Model(x, head(conv(4, "c1")(x))))
    assert groups(d)[(("c1", 0, 4),)] == [("gap", "Mean", 0, 4), ("fc", "MatMul", 0, 4)]


# 13 -------------------------------------------------------------------------------------------
def test_reshape_mixing_channels_stops():
    x = inp((4, 4, 3))
    y = layers.Reshape((8, 8), name="rs")(conv(4, "c1")(x))
    r = refusals(discover(keras.Model(x, layers.Dense(2, name="fc")(y))))
    assert r[("c1", 0, 4)] == "CHANNEL_MIXING"


def test_reshape_keeping_channels_last_passes():
    x = inp((4, 4, 3))
    y = layers.Reshape((16, 4), name="rs")(conv(4, "c1")(x))
    g = groups(discover(keras.Model(x, layers.Dense(2, name="fc")(y))))
    assert g[(("c1", 0, 4),)] == [("rs", "Reshape", 0, 4), ("fc", "MatMul", 0, 4)]


def test_transpose_moving_channels_stops_keeping_them_passes():
    x = inp()
    a, b = conv(4, "c1")(x), conv(4, "c2")(x)
    moved = ops.transpose(a, (0, 3, 1, 2))
    kept = ops.transpose(b, (0, 2, 1, 3))
    m = keras.Model(x, [head(layers.Flatten()(moved)[:, None, None, :], "fa"), head(kept, "fb")])
    d = discover(m)
    assert refusals(d)[("c1", 0, 4)] == "CHANNEL_MIXING"
    assert groups(d)[(("c2", 0, 4),)][0] == (kname(kept), "Transpose", 0, 4)


def test_attention_and_activation_matmul_stop():
    x = keras.Input((5, 3))
    a, b = layers.Dense(6, name="qa")(x), layers.Dense(6, name="qb")(x)
    scores = layers.Dot(axes=2, name="dot")([a, b])
    v = layers.Dense(4, name="v")(x)
    att = layers.MultiHeadAttention(2, 4, name="mha")(v, v)
    d = discover(keras.Model(x, [layers.Dense(2, name="o1")(scores), att]))
    r = refusals(d)
    assert r[("qa", 0, 6)] == r[("qb", 0, 6)] == r[("v", 0, 4)] == "CHANNEL_MIXING"


# 14, 15 ---------------------------------------------------------------------------------------
def test_producer_reaching_model_output_is_refused():
    x = inp()
    c1 = conv(4, "c1")(x)
    d = discover(keras.Model(x, [layers.BatchNormalization(name="bn")(c1), head(c1)]))
    assert refusals(d)[("c1", 0, 4)] == "REACHES_OUTPUT"
    assert not d.groups


def test_unused_split_branch_has_no_closing_consumer():
    x = inp()
    p, _ = ops.split(conv(8, "c1")(x), [5], axis=-1)
    d = discover(keras.Model(x, head(p)))
    assert refusals(d)[("c1", 5, 8)] == "NO_CLOSING_CONSUMER"
    assert (("c1", 0, 5),) in groups(d)


def test_custom_and_lambda_layers_are_never_guessed():
    x = inp()
    a = Doubler(name="custom")(conv(4, "c1")(x))
    b = layers.Lambda(lambda t: t * 3.0, name="lam")(conv(4, "c2")(x))
    r = refusals(discover(keras.Model(x, [head(a, "fa"), head(b, "fb")])))
    assert r[("c1", 0, 4)] == r[("c2", 0, 4)] == "UNKNOWN_OP"


# 16, 17, 18 -----------------------------------------------------------------------------------
def test_shared_layer_couples_its_calls():
    x = inp()
    shared = conv(4, "s")
    a, b = shared(conv(8, "c1")(x)), shared(conv(8, "c2")(x))
    s = a + b
    d = discover(keras.Model(x, head(conv(2, "c3")(s))))
    g = groups(d)
    # producers in graph (topological) order: Keras puts c2's branch first here
    assert g[(("c2", 0, 8), ("c1", 0, 8))] == [("s", "Conv2D", 0, 8)]
    assert g[(("s", 0, 4),)] == [(kname(s), "AddV2", 0, 4), ("c3", "Conv2D", 0, 4)]


def test_layer_used_in_two_models_counts_only_this_models_calls():
    shared = conv(4, "s")
    x1, x2 = inp(name="x1"), inp(name="x2")
    keras.Model(x1, shared(x1))
    m2 = keras.Model(x2, head(shared(x2)))
    assert len(shared._inbound_nodes) == 2  # the layer knows both models' calls
    graph = extract_graph(m2)
    assert [n.name for n in graph if n.layer == "s"] == ["s"]
    assert not graph.node("s").shared
    assert groups(discover(m2)) == {(("s", 0, 4),): [("gap", "Mean", 0, 4), ("fc", "MatMul", 0, 4)]}


def test_nested_functional_and_sequential_are_recursed():
    seq = keras.Sequential(
        [keras.Input((8, 8, 8)), layers.BatchNormalization(name="bn"), conv(4, "ci")], name="seq"
    )
    xi = keras.Input((8, 8, 4))
    inner = keras.Model(xi, layers.ReLU(name="r")(xi), name="fn")
    x = inp()
    y = conv(2, "c2")(inner(seq(conv(8, "c1")(x))))
    g = groups(discover(keras.Model(x, head(y))))
    assert g[(("c1", 0, 8),)] == [("seq/bn", "FusedBatchNormV3", 0, 8), ("seq/ci", "Conv2D", 0, 8)]
    assert g[(("seq/ci", 0, 4),)] == [("fn/r", "Relu", 0, 4), ("c2", "Conv2D", 0, 4)]


def test_raw_ops_match_their_layer_twins():
    def build(names=None):
        x = inp()
        a, b = conv(4, "c1")(x), conv(4, "c2")(x)
        s = a + b if names is None else layers.Add(name=names[0])([a, b])
        k = (
            ops.concatenate([s, a], axis=-1)
            if names is None
            else layers.Concatenate(name=names[1])([s, a])
        )
        return discover(keras.Model(x, head(conv(2, "c3")(k)))), (kname(s), kname(k))

    raw, names = build()
    twin, _ = build(names)  # layers named as Keras named the raw ops
    assert groups(raw) == groups(twin)


# 19, 20 ---------------------------------------------------------------------------------------
def test_conv_transpose_output_axis_2_input_axis_3():
    x = inp()
    y = layers.Conv2DTranspose(6, 3, name="tr")(conv(4, "c1")(x))
    m = keras.Model(x, head(conv(2, "c2")(y)))
    assert extract_graph(m).node("tr").params["kernel_shape"] == (3, 3, 6, 4)
    g = groups(discover(m))
    assert g[(("c1", 0, 4),)] == [("tr", "Conv2DBackpropInput", 0, 4)]
    assert g[(("tr", 0, 6),)] == [("c2", "Conv2D", 0, 6)]


def test_bn_without_scale_and_conv_without_bias():
    x = inp()
    y = layers.BatchNormalization(scale=False, center=False, name="bn")(
        conv(4, "c1", use_bias=False)(x)
    )
    m = keras.Model(x, head(y))
    graph = extract_graph(m)
    assert graph.node("bn").params["scale"] is False
    assert graph.node("bn").params["center"] is False
    assert graph.node("c1").params["use_bias"] is False
    assert [w.name for w in m.get_layer("bn").weights] == ["moving_mean", "moving_variance"]
    assert groups(discover(m))[(("c1", 0, 4),)][0] == ("bn", "FusedBatchNormV3", 0, 4)


def test_fused_softmax_producer_and_per_channel_rescaling_are_refused():
    x = inp()
    attn = layers.Dense(4, activation="softmax", name="sm")(conv(6, "c0")(x))
    scaled = layers.Rescaling(np.arange(1, 5, dtype="float32"), name="resc")(conv(4, "c1")(x))
    plain = layers.Rescaling(0.5, name="half")(conv(4, "c2")(x))
    r = refusals(discover(keras.Model(x, [head(attn, "fa"), head(scaled, "fb"), head(plain)])))
    assert r[("sm", 0, 4)] == "CHANNEL_MIXING"
    assert r[("c1", 0, 4)] == "CONSTANT_OPERAND"
    assert ("c2", 0, 4) not in r  # a scalar rescale is channel-wise


def test_nested_model_called_twice_shares_its_layers():
    block = keras.Sequential(
        [keras.Input((8, 8, 8)), conv(4, "bc"), layers.ReLU(name="br")], name="blk"
    )
    x = inp()
    a, b = block(conv(8, "c1")(x)), block(conv(8, "c2")(x))
    m = keras.Model(x, head(conv(2, "c3")(layers.Add(name="add")([a, b]))))
    graph = extract_graph(m)
    assert [n.name for n in graph if n.layer == "blk/bc"] == ["blk/bc", "blk/bc@1"]
    assert graph.node("blk/bc@1").shared and graph.node("blk/bc@1").call_index == 1
    g = groups(discover(m))
    producers = next(k for k in g if ("c1", 0, 8) in k)
    assert sorted(producers) == [("c1", 0, 8), ("c2", 0, 8)]
    assert g[producers] == [("blk/bc", "Conv2D", 0, 8)]
    assert g[(("blk/bc", 0, 4),)] == [
        ("blk/br", "Relu", 0, 4),
        ("add", "AddV2", 0, 4),
        ("c3", "Conv2D", 0, 4),
    ]


def test_add_of_multiplier_blocks_with_plain_channels_is_refused():
    x = inp()
    d = layers.DepthwiseConv2D(1, depth_multiplier=2, name="dw")(conv(4, "c1")(x))
    y = layers.Add(name="add")([d, conv(8, "c2")(x)])
    r = refusals(discover(keras.Model(x, head(conv(2, "c3")(y)))))
    assert r[("c1", 0, 4)] == r[("c2", 0, 8)] == "MAPPING_MISMATCH"
