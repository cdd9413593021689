"""The same small network in Keras (NHWC) and MindSpore (NCHW) gives the same prune groups.

Stem with BN, a residual block (functional add), depthwise with multiplier 2, a spatial mean
and Dense: producers, consumers, op types, ranges and attrs must be equal once the names are
mapped (the layers carry the same names where both frameworks let us choose them).
"""

from __future__ import annotations

import keras
import mindspore as ms
from keras import layers
from mindspore import nn, ops

from amct_bridge.keras.prune import prune_discovery as keras_discovery
from amct_bridge.mindspore import prune_discovery as ms_discovery


def keras_twin() -> keras.Model:
    x = keras.Input((8, 8, 3))
    r1 = layers.ReLU(name="relu1")(
        layers.BatchNormalization(name="bn1")(
            layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv1")(x)
        )
    )
    y = layers.BatchNormalization(name="bn2")(layers.Conv2D(8, 3, padding="same", name="conv2")(r1))
    y = layers.ReLU(name="relu2")(r1 + y)
    y = layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same", name="dw")(y)
    y = layers.ReLU(max_value=6.0, name="relu3")(layers.BatchNormalization(name="bn3")(y))
    y = layers.GlobalAveragePooling2D(name="pool")(layers.Conv2D(4, 1, name="pw")(y))
    return keras.Model(x, layers.Dense(2, name="fc")(y))


class MsTwin(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, has_bias=True)
        self.bn2 = nn.BatchNorm2d(8)
        self.relu2 = nn.ReLU()
        self.dw = nn.Conv2d(8, 16, 3, group=8, has_bias=True)
        self.bn3 = nn.BatchNorm2d(16)
        self.relu3 = nn.ReLU6()
        self.pw = nn.Conv2d(16, 4, 1, has_bias=True)
        self.fc = nn.Dense(4, 2)

    def construct(self, x):
        r1 = self.relu1(self.bn1(self.conv1(x)))
        y = self.relu2(r1 + self.bn2(self.conv2(r1)))
        y = self.relu3(self.bn3(self.dw(y)))
        return self.fc(ops.mean(self.pw(y), (2, 3)))


def described(discovery, rename=None):
    rename = rename or {}

    def member(m):
        return (rename.get(m.name, m.name), m.op_type, m.begin, m.end, m.attrs)

    groups = sorted(
        (tuple(member(m) for m in g.producers), tuple(sorted(member(m) for m in g.consumers)))
        for g in discovery.groups
    )
    refused = sorted(
        (rename.get(r.layer, r.layer), r.begin, r.end, r.reason) for r in discovery.refusals
    )
    return groups, refused


def test_keras_and_mindspore_twins_give_the_same_groups():
    ms.set_context(mode=ms.GRAPH_MODE)
    twin = keras_twin()
    k_groups, k_refused = described(keras_discovery(twin))
    # Keras names the raw r1 + y itself ("add", "add_3"...: counted per process); MindSpore
    # has no name for it, so it is "add_op0"
    k_add = next(op.name for op in twin.operations if not isinstance(op, keras.layers.Layer))
    m_groups, m_refused = described(
        ms_discovery(MsTwin(), (1, 3, 8, 8)), rename={"reducemean_op0": "pool", "add_op0": k_add}
    )
    assert m_groups == k_groups
    assert m_refused == k_refused
    # and the expectations worked by hand (not only equal to each other)
    assert [g[0] for g in k_groups] == [
        (("conv1", "Conv2D", 0, 8, ()), ("conv2", "Conv2D", 0, 8, ())),
        (("pw", "Conv2D", 0, 4, ()),),
    ]
    assert ("dw", "DepthwiseConv2dNative", 0, 8, (("depth_multiplier", 2),)) in k_groups[0][1]
    assert ("relu3", "Relu6", 0, 16, (("multiplier", 2),)) in k_groups[0][1]
    assert ("pool", "Mean", 0, 4, ()) in k_groups[1][1]
    assert [(n, b, e, r.value) for n, b, e, r in k_refused] == [("fc", 0, 2, "MODEL_OUTPUT")]
