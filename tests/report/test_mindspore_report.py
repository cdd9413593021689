"""MindSpore report: the outlier network (tests/report/report_models.py) built in MindSpore with
the Keras model's weights gives the Keras report's numbers (both calibrated by their own
adapters on the same data), the numpy forward's SNR, and the same CLI output.

A layer's output is its cell's output: MindSpore's ReLU is a cell of its own, so the Keras twin
here has its ReLUs as layers too (``Conv2D(activation="relu")``'s output would be after it).
"""

import base64
import re

import keras
import mindspore as ms
import numpy as np
import pytest
from report_models import conv_valid, fq_act, fq_kernel, images, outlier_cnn, snr

import amct_bridge.mindspore as ams
from amct_bridge.cli import main
from amct_bridge.commands.mindspore_net import load_mindspore_net
from amct_bridge.config import parse_simple_config
from amct_bridge.keras import calibrate as keras_calibrate
from amct_bridge.keras.report import quant_report as keras_report
from amct_bridge.records import load

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

NET_SOURCE = '''
from mindspore import nn, ops


class Outlier(nn.Cell):
    """image (NCHW 3x8x8) -> conv1 -> relu -> conv2 -> relu -> mean -> fc."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, pad_mode="valid", has_bias=True)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(6, 8, 3, pad_mode="valid", has_bias=True)
        self.relu2 = nn.ReLU()
        self.fc = nn.Dense(8, 4)

    def construct(self, x):
        x = self.relu2(self.conv2(self.relu1(self.conv1(x))))
        return self.fc(ops.mean(x, (2, 3)))


def make():
    return Outlier()
'''


def _ms_twin(model, tmp_path):
    """The MindSpore network from NET_SOURCE with the Keras model's weights (HWIO -> OIHW by
    explicit transposes), its module file and checkpoint for the CLI."""
    module = tmp_path / "outlier_net.py"
    module.write_text(NET_SOURCE)
    net = load_mindspore_net(f"{module}:make")  # imported as the CLI does (GRAPH_MODE needs it)
    for name in ("conv1", "conv2"):
        kernel, bias = model.get_layer(name).get_weights()
        getattr(net, name).weight.set_data(
            ms.Tensor(np.ascontiguousarray(kernel.transpose(3, 2, 0, 1)))
        )
        getattr(net, name).bias.set_data(ms.Tensor(bias))
    kernel, bias = model.get_layer("fc").get_weights()
    net.fc.weight.set_data(ms.Tensor(np.ascontiguousarray(kernel.T)))
    net.fc.bias.set_data(ms.Tensor(bias))
    ckpt = tmp_path / "outlier.ckpt"
    ms.save_checkpoint(net, str(ckpt))
    return net, module, ckpt


def _keras_split(model):
    """``model`` with its convolutions' ReLUs as layers of their own (same weights)."""
    inputs = keras.Input((8, 8, 3), name="image")
    x = keras.layers.ReLU(name="relu1")(keras.layers.Conv2D(6, 3, name="conv1")(inputs))
    x = keras.layers.ReLU(name="relu2")(keras.layers.Conv2D(8, 3, name="conv2")(x))
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    split = keras.Model(inputs, keras.layers.Dense(4, name="fc")(x), name="outlier_split")
    for name in ("conv1", "conv2", "fc"):
        split.get_layer(name).set_weights(model.get_layer(name).get_weights())
    return split


def _numpy_forward(model, record, x, quantized):
    """float64 forward of the split model; parts in ``quantized`` use the record's factors.
    Returns (conv2 input, conv2 output before its ReLU, fc output)."""

    def part(name, inp):
        kernel, bias = model.get_layer(name).get_weights()
        f = record.layers[name]
        if name in quantized:
            return (
                fq_act(inp.astype(np.float64), f.scale_d, f.offset_d),
                fq_kernel(kernel, f.scale_w),
                bias,
            )
        return inp.astype(np.float64), kernel, bias

    a1 = np.maximum(conv_valid(*part("conv1", x)), 0)
    c2 = conv_valid(*part("conv2", a1))
    pi, kernel, bias = part("fc", np.maximum(c2, 0).mean(axis=(1, 2)))
    return a1, c2, pi @ kernel + bias


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    out = tmp_path_factory.mktemp("ms_report")
    model = _keras_split(outlier_cnn())
    x = images(64)
    y = np.argmax(model.predict(x, verbose=0), axis=1)
    net, module, ckpt = _ms_twin(model, out)
    xc = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    keras_calibrate(model, x[:32], out / "k_record.txt", algorithm="minmax")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        ams.calibrate(net, xc[:32], out / "m_record.txt", algorithm="minmax")
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    np.save(out / "xc.npy", xc)
    np.save(out / "y.npy", y)
    return model, net, x, xc, y, out, module, ckpt


def test_same_report_as_keras_and_the_outlier_ranked_worst(twins):
    model, net, x, xc, y, out, _, _ = twins
    ms.set_context(mode=ms.GRAPH_MODE)  # the runner's PyNative runs put the mode back
    try:
        rep = ams.quant_report(net, out / "m_record.txt", xc, y, top_k=1)
        assert ms.get_context("mode") == ms.GRAPH_MODE
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    ref = keras_report(model, out / "k_record.txt", x, y, top_k=1)
    assert [r.key for r in rep.rows] == [r.key for r in ref.rows] == ["conv1", "conv2", "fc"]
    assert rep.top == ref.top == ["conv2"] and rep.skip_layers == ["conv2"]
    assert parse_simple_config(rep.fragment).skip_layers == ["conv2"]
    for got, want in zip(rep.rows, ref.rows, strict=True):
        assert got.kind == {"conv1": "Conv2d", "conv2": "Conv2d", "fc": "Dense"}[got.key]
        for field in ("input_min", "input_max", "calib_min", "calib_max", "clip_min", "clip_max"):
            assert getattr(got, field) == pytest.approx(getattr(want, field), rel=1e-4), field
        assert got.saturated == pytest.approx(want.saturated, abs=2e-4)
        assert got.scale_w == pytest.approx(want.scale_w, rel=1e-4)
        for field in ("snr_alone", "snr_cumulative", "snr_model"):
            assert getattr(got, field) == pytest.approx(getattr(want, field), abs=0.1), field
        assert got.accuracy_drop == pytest.approx(want.accuracy_drop, abs=1.5 / len(x))
    assert rep.kept_float_accuracy > rep.quantized_accuracy
    assert rep.float_accuracy == 1.0 and "conv2" in rep.histograms


def test_conv2_numbers_match_numpy(twins):
    model, net, x, xc, y, out, _, _ = twins
    record = load(out / "m_record.txt")
    rows = {r.key: r for r in ams.quant_report(net, record, xc, y).rows}
    a1, ref2, ref_out = _numpy_forward(model, record, x, set())  # NHWC: same values as NCHW
    _, alone2, alone_out = _numpy_forward(model, record, x, {"conv2"})
    _, cum2, _ = _numpy_forward(model, record, x, {"conv1", "conv2"})
    assert rows["conv2"].snr_alone == pytest.approx(snr(ref2, alone2), abs=0.05)
    assert rows["conv2"].snr_cumulative == pytest.approx(snr(ref2, cum2), abs=0.05)
    assert rows["conv2"].snr_model == pytest.approx(snr(ref_out, alone_out), abs=0.05)
    assert (rows["conv2"].input_min, rows["conv2"].input_max) == pytest.approx(
        (a1.min(), a1.max()), rel=1e-5
    )


def test_cli_with_mindspore_network(twins, capsys, tmp_path):
    _, _, _, _, _, out, module, ckpt = twins
    html = tmp_path / "r.html"
    argv = ["report", "--mindspore", f"{module}:make", "--ckpt", str(ckpt)]
    argv += ["--record", str(out / "m_record.txt"), "--data", str(out / "xc.npy")]
    assert main([*argv, "--labels", str(out / "y.npy"), "--html", str(html), "--top-k", "1"]) == 0
    text = capsys.readouterr().out
    assert "conv2" in text and "skip_layers" in text and f"wrote {html}" in text
    pngs = [
        base64.b64decode(d)
        for d in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html.read_text())
    ]
    assert pngs and all(p.startswith(PNG_MAGIC) for p in pngs)
    assert main(["report", "--record", str(out / "m_record.txt"), "--data", "x.npy"]) == 2
    assert "give either --model (Keras) or --mindspore" in capsys.readouterr().err
    both = ["--model", "m.keras", "--mindspore", f"{module}:make"]
    assert main(["report", *both, "--record", "r.txt", "--data", "x.npy"]) == 2
    assert (
        main(["report", "--model", "m.keras", "--ckpt", str(ckpt), "--record", "r", "--data", "x"])
        == 2
    )
    assert "--ckpt goes with --mindspore" in capsys.readouterr().err


def test_a_record_of_another_network_is_refused_by_name(twins, tmp_path, capsys):
    _, net, _, xc, _, out, module, ckpt = twins
    from amct_bridge.errors import RecordError
    from amct_bridge.records import LayerFactors, Record, save

    factors = LayerFactors(scale_d=0.1, offset_d=0, scale_w=[0.1] * 8, offset_w=[0] * 8)
    bad = Record({"conv9": factors}, flavor="mindspore")
    text = r"record keys 'conv9' \(did you mean 'conv2'\?\) name no quantizable layer"
    text += ".*it has: conv1, conv2, fc"
    with pytest.raises(RecordError, match=text):
        ams.quant_report(net, bad, xc)
    save(bad, tmp_path / "bad.txt")
    argv = ["report", "--mindspore", f"{module}:make", "--ckpt", str(ckpt)]
    argv += ["--record", str(tmp_path / "bad.txt"), "--data", str(out / "xc.npy")]
    assert main([*argv, "--html", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert re.search(text, err) and "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


def test_bad_report_data_is_an_input_error(twins, tmp_path, capsys):
    """NHWC data for the NCHW network, and NaN in the data: exit 2 naming them (both were
    internal errors: MindSpore's RuntimeError, numpy's non-finite histogram range)."""
    _, _, x, xc, _, out, module, ckpt = twins
    np.save(tmp_path / "nhwc.npy", x)
    nan = xc.copy()
    nan[5, 1, 2, 2] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    argv = ["report", "--mindspore", f"{module}:make", "--ckpt", str(ckpt)]
    argv += ["--record", str(out / "m_record.txt"), "--data"]
    assert main([*argv, str(tmp_path / "nhwc.npy")]) == 2
    err = capsys.readouterr().err
    assert "report data of shape (64, 8, 8, 3) does not run through network 'Outlier'" in err
    assert main([*argv, str(tmp_path / "nan.npy")]) == 2
    err = capsys.readouterr().err
    assert (
        "layer 'conv1': its float input over the report data contains NaN or Inf (sample 5)" in err
    )
    assert "Traceback" not in err and "internal error" not in err
