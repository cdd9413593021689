"""MindSpore QAT of an nn.Conv2dTranspose with output_padding (issue 21 follow-up).

MindSpore 2.10 appends ``output_padding`` rows / columns of zeros after the transposed
convolution and its bias (``ops.Pad``, ``pad_mode='pad'`` only), not PyTorch's computed rows.
Checked here against a numpy transposed convolution written from the definition; the QAT cell
must give the plain cell's shapes and, on fake-quantized input and weight (the core's numpy
formulas), its values. Then train -> save_qat_record -> strip_qat -> simulate reproduces the
QAT net (1e-4), and the ESP-DL exports refuse the transposed convolution naming their format.
"""

from __future__ import annotations

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Model

import amct_bridge.mindspore as ams
from amct_bridge.errors import ExportError, QuantError
from amct_bridge.mindspore.qat import qat_record, quantize_aware, save_qat_record, strip_qat
from amct_bridge.quant import qat as core
from amct_bridge.records import load, validate


def deconv_numpy(x, w, b, stride, pads, out_pad):
    """Transposed convolution from its definition: every input pixel adds ``x * w`` at
    ``stride`` steps (IOHW weight), the ``pads`` (top, bottom, left, right) are cropped, the
    bias is added, then ``out_pad`` (bottom, right) zero rows / columns are appended."""
    n, _, h, wd = x.shape
    _, cout, kh, kw = w.shape
    full = np.zeros((n, cout, (h - 1) * stride + kh, (wd - 1) * stride + kw), np.float64)
    for i in range(h):
        for j in range(wd):
            patch = np.einsum("nc,cokl->nokl", x[:, :, i, j], w)
            full[:, :, i * stride : i * stride + kh, j * stride : j * stride + kw] += patch
    t, bt, left, r = pads
    y = full[:, :, t : full.shape[2] - bt, left : full.shape[3] - r] + b.reshape(1, -1, 1, 1)
    return np.pad(y, ((0, 0), (0, 0), (0, out_pad[0]), (0, out_pad[1])))


def _up(output_padding, padding=1):
    ms.set_seed(0)
    cell = nn.Conv2dTranspose(
        2, 3, 3, stride=2, pad_mode="pad", padding=padding, output_padding=output_padding,
        has_bias=True, weight_init="normal",
    )  # fmt: skip
    cell.bias.set_data(Tensor(np.float32([0.5, -0.25, 1.0])))  # a bias the padding must not get
    return cell


# each mode and each padding form once (suite time)
@pytest.mark.parametrize(
    ("mode", "output_padding", "padding"),
    [("graph", 1, 1), ("pynative", (1, 0), (1, 1, 0, 1))],
    ids=["graph-int", "pynative-tuple"],
    indirect=["mode"],
)
def test_output_padding_shapes_and_values_equal_the_plain_cell(mode, output_padding, padding):
    up = _up(output_padding, padding)
    net = nn.SequentialCell([up])
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (2, 2, 4, 4)).astype(np.float32)
    w = up.weight.asnumpy()
    pads = [padding] * 4 if isinstance(padding, int) else list(padding)
    out_pad = (output_padding,) * 2 if isinstance(output_padding, int) else output_padding
    # the plain cell is the definition above: zero rows after the bias
    plain = net(Tensor(x)).asnumpy()
    want_float = deconv_numpy(x, w, up.bias.asnumpy(), 2, pads, out_pad)
    np.testing.assert_allclose(plain, want_float, atol=1e-5)
    size = [(4 - 1) * 2 - (pads[k] + pads[k + 1]) + 3 + out_pad[k // 2] for k in (0, 2)]
    assert plain.shape == (2, 3, *size)  # MindSpore's documented H_out / W_out
    assert not plain[:, :, -1, :].any()  # bias not added in the padded row

    qat = quantize_aware(net, "INT8", ema_decay=0.0)
    Model(qat, nn.MSELoss(), nn.SGD(qat.trainable_params(), 0.0)).train(
        1,
        ds.NumpySlicesDataset((x, np.zeros_like(plain)), ["x", "y"], shuffle=False).batch(2),
    )  # lr 0: the input range is this batch's, the weight unchanged
    qat.set_train(False)
    got = qat(Tensor(x)).asnumpy()
    f = qat_record(qat).layers["0"]
    x_fq = core.fake_quant_range(x, x.min(), x.max(), 8)
    w_fq = core.arq_fake_quant(w, "IOHW", 8)  # per output channel (axis 1)
    assert got.shape == plain.shape
    np.testing.assert_allclose(got, deconv_numpy(x_fq, w_fq, up.bias.asnumpy(), 2, pads, out_pad),
                               atol=1e-5)  # fmt: skip
    assert np.array_equal(got[:, :, -1, :], np.zeros_like(got[:, :, -1, :]))
    # the plain cell run on the record's dequantized input and weight gives the same
    up.weight.set_data(Tensor(w_fq.astype(np.float32)))
    np.testing.assert_allclose(got, net(Tensor(x_fq.astype(np.float32))).asnumpy(), atol=1e-5)
    assert len(f.scale_w) == 3


class UpNet(nn.Cell):
    """conv -> ReLU -> Conv2dTranspose(stride 2, padding 1, output_padding 1) -> Dense."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, pad_mode="same", has_bias=True)
        self.relu = nn.ReLU()
        self.up = nn.Conv2dTranspose(
            2, 2, 3, stride=2, pad_mode="pad", padding=1, output_padding=1, has_bias=True
        )
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(2 * 8 * 8, 3)

    def construct(self, x):
        return self.fc(self.flatten(self.up(self.relu(self.conv(x)))))


def test_train_record_strip_simulate_and_export_refusal(mode, tmp_path):
    ms.set_seed(1)
    net = UpNet()
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (16, 1, 4, 4)).astype(np.float32)
    y = rng.integers(0, 3, 16).astype(np.int32)
    qat = quantize_aware(net, "INT8", sample_input=(1, 1, 4, 4))
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    data = ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(8)
    Model(qat, loss, nn.SGD(qat.trainable_params(), 0.05)).train(2, data)
    rec = save_qat_record(qat, tmp_path / "qat.txt")
    assert validate(rec) == [] and list(load(tmp_path / "qat.txt").layers) == ["conv", "up", "fc"]
    plain = strip_qat(qat)
    assert type(plain.up) is nn.Conv2dTranspose and plain.up.output_padding == 1
    qat.set_train(False)
    want = qat(Tensor(x)).asnumpy()
    got = ams.simulate(plain, tmp_path / "qat.txt", x).outputs
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # neither ESP-DL export writes this transposed convolution: refused, naming the format
    with pytest.raises(ExportError) as v1:
        ams.export_espdl(plain, tmp_path / "qat.txt", tmp_path / "v1", sample_input=(1, 1, 4, 4))
    assert "layer 'up' (Conv2dTranspose): nn.Conv2dTranspose: ESP-DL v1 has no transposed" in str(
        v1.value
    )
    with pytest.raises(ExportError) as v3:
        ams.export_espdl(
            plain, tmp_path / "qat.txt", tmp_path / "m.espdl", sample_input=(1, 1, 4, 4),
            format="espdl",
        )  # fmt: skip
    text = str(v3.value)
    assert "layer 'up' (Conv2dTranspose)" in text and "v1" not in text, text
    # v3 writes InsertZeros + Conv for pad_mode 'same' / 'valid' only (issue 30)
    assert "pad_mode='pad', padding=1" in text and "InsertZeros + Conv" in text
    assert not (tmp_path / "v1").exists() and not (tmp_path / "m.espdl").exists()


def test_output_padding_the_cell_refuses_is_refused_up_front():
    same = nn.SequentialCell([nn.Conv2dTranspose(1, 1, 3, 2, pad_mode="same", output_padding=1)])
    with pytest.raises(QuantError, match=r"'0'.*output_padding 1 needs pad_mode='pad', not 'same'"):
        quantize_aware(same)
    big = nn.SequentialCell([nn.Conv2dTranspose(1, 1, 3, 2, pad_mode="pad", output_padding=2)])
    with pytest.raises(QuantError, match=r"'0'.*output_padding 2: the height value.*\[0, 2\)"):
        quantize_aware(big)
    with pytest.raises(ValueError, match="output_padding"):  # as the plain cell does when run
        big(Tensor(np.ones((1, 1, 3, 3), np.float32)))
