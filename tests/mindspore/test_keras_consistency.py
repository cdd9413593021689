"""The same small network in Keras (NHWC) and MindSpore (NCHW), identical weights and data, gives
the same results (issue 12, section 5):

* calibration (minmax and hfmg): the same record keys, scale_d / offset_d / scale_w within
  float tolerance (the two frameworks' convolutions round differently in the last bits);
* prune groups: equal once names are equal (the layers carry the MindSpore cell names);
* ESP-DL export: each network exported with its own record gives the same config.json and the
  same coefficient integers;
* simulate: the fake-quantized outputs of both agree.

Network: stem Conv + BN + ReLU, a residual block (conv + BN, functional add, ReLU), depthwise +
BN + ReLU, pointwise conv, global average pool (``ops.mean``), Dense. The Keras twin's weights are
converted from MindSpore's layouts with explicit loops (twin_weights.py, independent of the
adapters).
"""

from __future__ import annotations

import keras
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops
from twin_weights import copy_weights

import amct_bridge.keras as akeras
import amct_bridge.mindspore as ams
from amct_bridge.keras.prune import prune_discovery as keras_discovery
from amct_bridge.quant.espdl import range_to_exponent

BN_EPS = 1e-5  # MindSpore's default, given to the Keras BNs


class Twin(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, has_bias=True)
        self.bn2 = nn.BatchNorm2d(8)
        self.relu2 = nn.ReLU()
        self.dw = nn.Conv2d(8, 8, 3, group=8, has_bias=True)
        self.bn3 = nn.BatchNorm2d(8)
        self.relu3 = nn.ReLU()
        self.pw = nn.Conv2d(8, 4, 1, has_bias=True)
        self.fc = nn.Dense(4, 3)

    def construct(self, x):
        r1 = self.relu1(self.bn1(self.conv1(x)))
        y = self.relu2(r1 + self.bn2(self.conv2(r1)))
        y = self.relu3(self.bn3(self.dw(y)))
        # a functional global pool: nn.AdaptiveAvgPool2d(1) is op type AvgPool in the graph IR,
        # Keras' GlobalAveragePooling2D is Mean
        return self.fc(ops.mean(self.pw(y), (2, 3)))


def ms_twin() -> Twin:
    net = Twin()
    rng = np.random.default_rng(11)
    for _, p in net.parameters_and_names():
        shape = tuple(p.shape)
        if p.name.endswith(("moving_variance", "gamma")):
            value = rng.uniform(0.5, 1.5, shape)
        else:
            value = rng.normal(0, 0.3, shape)
        p.set_data(ms.Tensor(value.astype(np.float32)))
    net.set_train(False)
    return net


def keras_twin(net: Twin) -> keras.Model:
    L = keras.layers  # noqa: N806

    def bn(name):
        return L.BatchNormalization(epsilon=BN_EPS, name=name)

    x = keras.Input((8, 8, 3), name="input0")
    r1 = L.ReLU(name="relu1")(
        bn("bn1")(L.Conv2D(8, 3, padding="same", use_bias=False, name="conv1")(x))
    )
    y = bn("bn2")(L.Conv2D(8, 3, padding="same", name="conv2")(r1))
    y = L.ReLU(name="relu2")(L.Add(name="add_op0")([r1, y]))
    y = L.ReLU(name="relu3")(bn("bn3")(L.DepthwiseConv2D(3, padding="same", name="dw")(y)))
    y = L.Conv2D(4, 1, name="pw")(y)
    y = L.GlobalAveragePooling2D(name="reducemean_op0")(y)  # MindSpore's name of ops.mean
    model = keras.Model(x, L.Dense(3, name="fc")(y))
    copy_weights(model, net)
    return model


@pytest.fixture(scope="module")
def twins():
    ms.set_context(mode=ms.GRAPH_MODE)
    net = ms_twin()
    model = keras_twin(net)
    data = np.random.default_rng(12).uniform(-1, 1, (6, 3, 8, 8)).astype(np.float32)
    want = net(ms.Tensor(data)).asnumpy()
    got = model.predict(data.transpose(0, 2, 3, 1), verbose=0)
    # the twins compute the same float function: the weight conversion above is right
    assert np.allclose(got, want, atol=1e-5 * max(1.0, float(np.abs(want).max())))
    return net, model, data


# ---- prune groups ---------------------------------------------------------------------------
def _described(found):
    def member(m):
        return (m.name, m.op_type, m.begin, m.end, m.attrs)

    groups = sorted(
        (tuple(member(m) for m in g.producers), tuple(sorted(member(m) for m in g.consumers)))
        for g in found.groups
    )
    refused = sorted((r.layer, r.begin, r.end, r.reason.value) for r in found.refusals)
    return groups, refused


def test_same_prune_groups(twins):
    net, model, _ = twins
    k_groups, k_refused = _described(keras_discovery(model))
    m_groups, m_refused = _described(ams.prune_discovery(net, (1, 3, 8, 8)))
    assert m_groups == k_groups
    assert m_refused == k_refused
    # worked by hand: conv1 and conv2 are coupled by the add; pw feeds pool -> fc
    assert [tuple(p[0] for p in g[0]) for g in k_groups] == [("conv1", "conv2"), ("pw",)]
    consumers = {name for g in k_groups for name, *_ in g[1]}
    assert {"dw", "bn3", "reducemean_op0", "fc"} <= consumers
    assert ("fc", 0, 3, "MODEL_OUTPUT") in k_refused


# ---- ESP-DL export --------------------------------------------------------------------------
def _ints(res):
    out = {}
    for layer in res.layers:
        p = layer.preview
        out[layer.name] = [
            (np.asarray(t.values).tolist(), np.asarray(t.exponent).tolist())
            for t in (p.filter, p.bias, p.activation)
            if t is not None
        ]
    return out


def _same_export(net, model, k_record, m_record, ftype, granularity):
    opts = {"feature_type": ftype, "granularity": granularity}
    k = akeras.export_espdl(model, k_record, None, **opts)
    m = ams.export_espdl(net, m_record, None, sample_input=(1, 3, 8, 8), **opts)
    assert m.config == k.config
    assert _ints(m) == _ints(k)
    assert [x.source for x in m.layers] == ["conv1", "conv2", "dw", "pw", "fc"]
    _away_from_exponent_edges(m, k, bits=8 if ftype == "s8" else 16)
    return m, k


def _away_from_exponent_edges(*results, bits: int) -> None:
    """Each framework's output ranges differ in their last bits, and so may another CPU's: the
    equal exponents above hold only if no range sits next to a power-of-two edge. Ranges moved
    by 1e-5 relative (ten times what the frameworks differ by) keep every exponent."""
    checked = 0
    for res in results:
        for layer in res.layers:
            if layer.output_range is None:
                continue
            checked += 1
            lo, hi = layer.output_range
            chosen = range_to_exponent(lo, hi, bits)
            for f in (1 - 1e-5, 1 + 1e-5):
                assert range_to_exponent(lo * f, hi * f, bits) == chosen, layer.name
    assert checked >= len(results) * 4


@pytest.fixture(scope="module")
def keras_record(twins, tmp_path_factory):
    _, model, data = twins
    path = tmp_path_factory.mktemp("keras") / "record.txt"
    akeras.calibrate(model, data.transpose(0, 2, 3, 1), path, algorithm="minmax", batch_size=3)
    return path


@pytest.mark.parametrize("ftype, granularity", [("s8", "per-channel"), ("s16", "per-tensor")])
def test_same_espdl_export_from_one_record(twins, keras_record, ftype, granularity):
    net, model, _ = twins
    m, _ = _same_export(net, model, keras_record, keras_record, ftype, granularity)
    assert [x.fused for x in m.layers][:3] == [
        ["conv1", "bn1", "relu1"],
        ["conv2", "bn2"],
        ["dw", "bn3", "relu3"],
    ]


# ---- calibration ----------------------------------------------------------------------------
_RECORDS: dict = {}


def _records(twins, algorithm, tmp_path_factory):
    """(Keras record path, MindSpore record path), each calibrated by its own adapter on the
    same data (NHWC / NCHW), batches of 3."""
    if algorithm not in _RECORDS:
        net, model, data = twins
        out = tmp_path_factory.mktemp(algorithm)
        k_path, m_path = out / "keras.txt", out / "mindspore.txt"
        akeras.calibrate(
            model, data.transpose(0, 2, 3, 1), k_path, algorithm=algorithm, batch_size=3
        )
        ams.calibrate(net, data, m_path, algorithm=algorithm, batch_size=3)
        _RECORDS[algorithm] = (k_path, m_path)
    return _RECORDS[algorithm]


@pytest.mark.parametrize("algorithm", ["minmax", "hfmg"])
def test_same_factors(twins, algorithm, tmp_path_factory):
    from amct_bridge.records import load

    k_path, m_path = _records(twins, algorithm, tmp_path_factory)
    # a MindSpore-flavor text record reads like a TF one: say which it is
    k, m = load(k_path), load(m_path, flavor="mindspore")
    assert list(m.layers) == list(k.layers) == ["conv1", "conv2", "dw", "pw", "fc"]
    for key, kf in k.layers.items():
        mf = m.layers[key]
        # activations differ in the last float bits between the two frameworks' kernels
        assert mf.scale_d == pytest.approx(kf.scale_d, rel=1e-5), key
        assert mf.offset_d == kf.offset_d, key
        assert np.allclose(mf.scale_w, kf.scale_w, rtol=1e-6), key  # same weights, same ARQ
        assert mf.offset_w == kf.offset_w == [0] * len(kf.scale_w)
    # per output channel on each layout (8 for dw: its multiplier is 1), Dense per tensor
    assert [len(m.layers[key].scale_w) for key in m.layers] == [8, 8, 8, 4, 1]


@pytest.mark.parametrize("algorithm", ["minmax", "hfmg"])
def test_same_espdl_export_from_own_records(twins, algorithm, tmp_path_factory):
    net, model, _ = twins
    k_path, m_path = _records(twins, algorithm, tmp_path_factory)
    _same_export(net, model, k_path, m_path, "s8", "per-channel")


def test_same_simulated_outputs(twins, tmp_path_factory):
    net, model, data = twins
    k_path, m_path = _records(twins, "minmax", tmp_path_factory)
    k_out = akeras.simulate(model, k_path).predict(data.transpose(0, 2, 3, 1), verbose=0)
    m_out = ams.simulate(net, m_path, data).outputs
    float_out = net(ms.Tensor(data)).asnumpy()
    scale = float(np.abs(float_out).max())
    assert np.allclose(m_out, k_out, atol=1e-4 * scale)
    assert np.abs(m_out - float_out).max() > 1e-3 * scale  # quantization did something
