"""Issue 33 §1, the MindSpore twin: ``nn.Conv1d`` (MindSpore's own Conv2D of height 1, weight
``(out, in, 1, k)``) and its depthwise form (group = channels) are quantized in calibration,
simulate, QAT, prune groups and both ESP-DL exports; a cell with weights left float is named.

Before the fix the record of this network held only ``fc``, the prune groups stopped at the
Conv1d cells (unknown kind) and the exporters refused them. Tolerances as in
tests/espdl/test_conv1d_export.py: v3 output SNR >= 25 dB and arg max equal on >= 95 % of
the inputs (measured: 43 dB, 100 %), v1 arg max >= 95 % and SNR >= 15 dB (measured: 21 dB,
100 %); the record's factors equal the Keras twin's (float tolerance)."""

from __future__ import annotations

import logging

import keras
import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import nn, ops
from mindspore.train import Model

from amct_bridge.espdl import simulate_chip
from amct_bridge.espdl.v3 import simulate_espdl
from amct_bridge.espdl.v3.evaluation import quantize_input
from amct_bridge.keras import calibrate as keras_calibrate
from amct_bridge.mindspore import calibrate, export_espdl, prune_record, simulate
from amct_bridge.mindspore.qat import quantize_aware, save_qat_record, strip_qat
from amct_bridge.records import load

SHAPE = (1, 4, 32)  # NCW


class Net1d(nn.Cell):
    """Issue 33's model in MindSpore: Conv1d -> depthwise Conv1d -> Conv1d -> mean over W ->
    Dense, 4 channels x 32 steps in, 8 filters."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(4, 8, 3, pad_mode="same", has_bias=True)
        self.r1 = nn.ReLU()
        self.dw = nn.Conv1d(8, 8, 3, pad_mode="pad", padding=1, group=8, has_bias=True)
        self.r2 = nn.ReLU()
        self.c2 = nn.Conv1d(8, 8, 3, pad_mode="same", has_bias=True)
        self.r3 = nn.ReLU()
        self.fc = nn.Dense(8, 4)

    def construct(self, x):
        x = self.r1(self.c1(x))
        x = self.r2(self.dw(x))
        x = self.r3(self.c2(x))
        return self.fc(ops.mean(x, 2))


def _net() -> Net1d:
    ms.set_seed(0)
    net = Net1d()
    rng = np.random.default_rng(0)
    for _, p in net.parameters_and_names():
        p.set_data(ms.Tensor(rng.normal(0, 0.4, tuple(p.shape)).astype(np.float32)))
    net.set_train(False)
    return net


def _snr(ref, got) -> float:
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64).reshape(np.shape(ref))
    return float(10 * np.log10((ref**2).sum() / max(((ref - got) ** 2).sum(), 1e-30)))


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    path = tmp_path_factory.mktemp("ms_conv1d") / "record.txt"
    net = _net()
    x = np.random.default_rng(1).normal(size=(256, 4, 32)).astype(np.float32)
    calibrate(net, x[:128], path, algorithm="minmax")
    yield net, path, x
    ms.set_context(mode=before)


def test_record_holds_every_conv1d_with_the_keras_twins_factors(calibrated, tmp_path):
    net, path, x = calibrated
    record = load(path)
    assert list(record.layers) == ["c1", "dw", "c2", "fc"]
    for key in ("c1", "dw", "c2"):
        f = record.layers[key]
        assert f.scale_d is not None and len(f.scale_w) == 8 and f.offset_w == [0] * 8, key
    # the Keras twin (weights (O, I, 1, k) -> (k, I, O), data NCW -> NWC): the same factors
    keras.utils.set_random_seed(0)
    inp = keras.Input((32, 4))
    h = keras.layers.Conv1D(8, 3, padding="same", activation="relu", name="c1")(inp)
    h = keras.layers.DepthwiseConv1D(3, padding="same", activation="relu", name="dw")(h)
    h = keras.layers.Conv1D(8, 3, padding="same", activation="relu", name="c2")(h)
    h = keras.layers.GlobalAveragePooling1D()(h)
    twin = keras.Model(inp, keras.layers.Dense(4, name="fc")(h))
    params = {name: p.asnumpy() for name, p in net.parameters_and_names()}
    for key in ("c1", "c2"):
        twin.get_layer(key).set_weights(
            [params[f"{key}.weight"][:, :, 0].transpose(2, 1, 0), params[f"{key}.bias"]]
        )
    dw = params["dw.weight"][:, 0, 0].T[:, :, None]  # (C, 1, 1, k) -> (k, C, 1)
    twin.get_layer("dw").set_weights([dw, params["dw.bias"]])
    twin.get_layer("fc").set_weights([params["fc.weight"].T, params["fc.bias"]])
    nwc = x[:128].transpose(0, 2, 1)
    ours = keras_calibrate(twin, nwc, tmp_path / "k.txt", algorithm="minmax")
    for key in record.layers:
        a, b = record.layers[key], ours.layers[key]
        np.testing.assert_allclose(a.scale_w, b.scale_w, rtol=1e-6, err_msg=key)
        np.testing.assert_allclose(a.scale_d, b.scale_d, rtol=1e-4, err_msg=key)
        assert abs(a.offset_d - b.offset_d) <= 1, key


def test_simulate_quantizes_the_conv1d_cells(calibrated):
    net, path, x = calibrated
    ref = net(ms.Tensor(x[128:])).asnumpy()
    res = simulate(net, path, x[128:])
    assert list(res.cells) == ["c1", "dw", "c2", "fc"]  # the Conv1d cells run fake-quantized
    assert 25.0 <= _snr(ref, np.asarray(res.outputs)) < 80.0


def test_prune_groups_follow_the_conv1d_channels(calibrated):
    net, _, _ = calibrated
    groups = prune_record(net, SHAPE).prune_records
    first = groups[0]
    assert [n.name for n in first.producers] == ["c1"]
    consumers = {n.name: n.get("type") for n in first.consumers}
    assert consumers["dw"] == "DepthwiseConv2dNative" and consumers["c2"] == "Conv2D"
    assert [n.name for n in groups[1].producers] == ["c2"]


def test_exports_follow_the_float_network(calibrated, tmp_path):
    net, path, x = calibrated
    test = x[128:]
    ref = net(ms.Tensor(test)).asnumpy()
    v3 = export_espdl(net, path, tmp_path / "n.espdl", sample_input=SHAPE, format="espdl")
    convs = [n for n in v3.model.nodes if n.op_type == "Conv"]
    assert [(n.name, n.attributes["kernel_shape"]) for n in convs] == [
        ("c1", [3]),
        ("dw", [3]),
        ("c2", [3]),
    ]
    nwc = test.transpose(0, 2, 1)  # the chip holds NCW maps as NWC
    info = v3.model.outputs[0]
    run = simulate_espdl(v3.model, quantize_input(v3.model, nwc, "esp32s3"), "esp32s3")
    got = np.ldexp(run.outputs[info.name].astype(np.float64), info.exponents[0])
    assert _snr(ref, got) >= 25.0
    assert (ref.argmax(1) == got.reshape(ref.shape).argmax(1)).mean() >= 0.95
    res = export_espdl(net, path, tmp_path / "v1", sample_input=SHAPE)
    assert [(e.name, e.operation) for e in res.layers][:3] == [
        ("c1", "conv2d"),
        ("dw", "depthwise_conv2d"),
        ("c2", "conv2d"),
    ]
    chip = simulate_chip(tmp_path / "v1", nwc)
    out = chip[chip.outputs[0]]
    got = np.ldexp(out.values.astype(np.float64), out.exponent).reshape(ref.shape)
    assert (ref.argmax(1) == got.argmax(1)).mean() >= 0.95 and _snr(ref, got) >= 15.0


def test_qat_then_export(calibrated, tmp_path):
    net, _, x = calibrated
    qat = quantize_aware(net, sample_input=SHAPE)
    target = net(ms.Tensor(x[:64])).asnumpy()
    train = ds.NumpySlicesDataset((x[:64], target), ["x", "y"], shuffle=False).batch(16)
    Model(qat, nn.MSELoss(), nn.Adam(qat.trainable_params(), 1e-3)).train(1, train)
    save_qat_record(qat, tmp_path / "qat.txt")
    record = load(tmp_path / "qat.txt")
    assert {k: len(f.scale_w) for k, f in record.layers.items()} == {
        "c1": 8,
        "dw": 8,
        "c2": 8,
        "fc": 1,
    }
    plain = strip_qat(qat)
    test = x[128:]
    ref = np.asarray(simulate(plain, tmp_path / "qat.txt", test).outputs)
    v3 = export_espdl(plain, tmp_path / "qat.txt", None, sample_input=SHAPE, format="espdl")
    nwc = test.transpose(0, 2, 1)
    info = v3.model.outputs[0]
    run = simulate_espdl(v3.model, quantize_input(v3.model, nwc, "esp32s3"), "esp32s3")
    got = np.ldexp(run.outputs[info.name].astype(np.float64), info.exponents[0])
    assert _snr(ref, got) >= 25.0


def test_a_cell_with_weights_left_float_is_named(tmp_path, caplog):
    """A grouped Conv1d (1 < group < channels: no AMCT rule) stays float: the calibration and
    QAT name it; the exports refuse it with the reason."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = nn.SequentialCell(
        [nn.Conv1d(4, 8, 3, has_bias=True), nn.Conv1d(8, 8, 3, group=2), nn.Flatten()]
    )
    x = np.random.default_rng(0).normal(size=(8, 4, 6)).astype(np.float32)
    with caplog.at_level(logging.WARNING):
        record = calibrate(net, x, tmp_path / "r.txt", algorithm="minmax")
    assert list(record.layers) == ["0"]
    assert (
        "layer '1' (GroupedConv1D) has weights but no record entry: AMCT and simulate run it "
        "in float (not a quantizable type)"
    ) in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        quantize_aware(net, sample_input=(1, 4, 6))
    assert "layer '1' (GroupedConv1D) has weights but no record entry" in caplog.text
    with pytest.raises(Exception, match=r"'1' \(Conv1d\): group 2 \(grouped convolution"):
        export_espdl(net, tmp_path / "r.txt", None, sample_input=(1, 4, 6), format="espdl")
