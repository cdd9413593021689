"""Twins: the same tiny network in Keras and MindSpore, identical weights and batches (SGD, no
shuffling, a few steps), gives the same QAT record within float tolerance: one formula (the
core's, amct_bridge.quant.qat) in both adapters, BN folding included."""

import keras
import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Model

from amct_bridge.keras.qat import qat_record as keras_record
from amct_bridge.keras.qat import quantize_aware as keras_qat
from amct_bridge.mindspore.qat import qat_record as ms_record
from amct_bridge.mindspore.qat import quantize_aware as ms_qat

H = W = 6
C = 2


def keras_net():
    x = keras.Input((H, W, 1))
    y = keras.layers.Conv2D(C, 3, use_bias=False, name="conv1")(x)
    y = keras.layers.BatchNormalization(epsilon=1e-3, name="bn1")(y)
    y = keras.layers.ReLU(name="relu")(y)
    y = keras.layers.Dense(3, name="fc")(keras.layers.Flatten(name="flatten")(y))
    return keras.Model(x, y, name="twin")


class MsNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, C, 3, pad_mode="valid", has_bias=False)
        self.bn1 = nn.BatchNorm2d(C, eps=1e-3)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(C * (H - 2) * (W - 2), 3)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.bn1(self.conv1(x)))))


def weights(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "kernel": rng.normal(0, 0.5, (3, 3, 1, C)).astype(np.float32),  # HWIO
        "gamma": rng.uniform(0.5, 1.5, C).astype(np.float32),
        "beta": rng.normal(0, 0.2, C).astype(np.float32),
        "mean": rng.normal(0, 0.2, C).astype(np.float32),
        "var": rng.uniform(0.5, 1.5, C).astype(np.float32),
        "fc": rng.normal(0, 0.3, ((H - 2) * (W - 2) * C, 3)).astype(np.float32),  # (hwc, out)
        "fc_bias": rng.normal(0, 0.1, 3).astype(np.float32),
    }


def to_ms(net, w):
    h, wd = H - 2, W - 2
    # Keras flattens NHWC (h, w, c), MindSpore NCHW (c, h, w): permute Dense's input rows
    fc = w["fc"].reshape(h, wd, C, 3).transpose(2, 0, 1, 3).reshape(-1, 3)
    values = {
        "conv1.weight": w["kernel"].transpose(3, 2, 0, 1),
        "bn1.gamma": w["gamma"],
        "bn1.beta": w["beta"],
        "bn1.moving_mean": w["mean"],
        "bn1.moving_variance": w["var"],
        "fc.weight": fc.T,
        "fc.bias": w["fc_bias"],
    }
    for p in net.get_parameters():
        p.set_data(Tensor(values[p.name]))


@pytest.fixture
def pynative():
    before = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=before)


@pytest.mark.parametrize("dst_type", ["INT8", "INT4"])
def test_keras_and_mindspore_give_the_same_qat_record(pynative, dst_type):
    w = weights()
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (24, H, W, 1)).astype(np.float32)  # NHWC; 3 batches of 8
    y = rng.integers(0, 3, 24).astype(np.int32)

    km = keras_net()
    km.get_layer("conv1").set_weights([w["kernel"]])
    km.get_layer("bn1").set_weights([w["gamma"], w["beta"], w["mean"], w["var"]])
    km.get_layer("fc").set_weights([w["fc"], w["fc_bias"]])
    kq = keras_qat(km, dst_type)
    kq.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    kq.fit(x, y, batch_size=8, shuffle=False, epochs=1, verbose=0)

    mnet = MsNet()
    to_ms(mnet, w)
    mq = ms_qat(mnet, dst_type, sample_input=(1, 1, H, W))
    start = next(p for p in mq.get_parameters() if p.name == "conv1.weight").asnumpy().copy()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(mq, loss, nn.SGD(mq.trainable_params(), 0.1))
    data = ds.NumpySlicesDataset(
        (x.transpose(0, 3, 1, 2).copy(), y), column_names=["x", "y"], shuffle=False
    ).batch(8)
    model.train(1, data)

    kr, mr = keras_record(kq), ms_record(mq)
    assert list(kr.layers) == list(mr.layers) == ["conv1", "fc"]
    for key in kr.layers:
        a, b = kr.layers[key], mr.layers[key]
        assert a.dst_type == b.dst_type == dst_type
        np.testing.assert_allclose(b.scale_d, a.scale_d, rtol=1e-4, err_msg=key)
        assert a.offset_d == b.offset_d, key
        np.testing.assert_allclose(b.scale_w, a.scale_w, rtol=1e-4, err_msg=key)
        assert a.offset_w == b.offset_w
    # and the trained weights agree (so the gradients were the same, STE and clip included)
    kk = np.asarray(kq.get_layer("conv1").layer.kernel).transpose(3, 2, 0, 1)
    mk = next(p for p in mq.get_parameters() if p.name == "conv1.weight").asnumpy()
    np.testing.assert_allclose(mk, kk, rtol=1e-4, atol=1e-6)
    # the weights moved: the records describe trained networks, not the initial ones
    assert np.abs(mk - start).max() > 1e-3
