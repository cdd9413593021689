"""Regressions found by trying the MindSpore side as a new user (issue 21, "as users write them").

Each test is a net no other test uses, trained or calibrated as the docs say, then exported.
"""

from __future__ import annotations

from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import nn, ops

import amct_bridge.mindspore as ams


class TwoBranch(nn.Cell):
    """A 3x3 and a 1x1 conv of a 1-channel input, each with its BN, concatenated: the 1x1 conv
    holds one weight per output channel (max == min), as a first 1x1 layer of a grey image does."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(1, 4, 3, pad_mode="pad", padding=1)
        self.b = nn.Conv2d(1, 4, 1)
        self.bn_a = nn.BatchNorm2d(4)
        self.bn_b = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.flat = nn.Flatten()
        self.fc = nn.Dense(8 * 4 * 4, 3)

    def construct(self, x):
        y = ops.cat((self.bn_a(self.a(x)), self.bn_b(self.b(x))), 1)
        return self.fc(self.flat(self.relu(y)))


def test_a_record_of_the_same_weights_gives_no_scale_w_warning_on_one_weight_channels(tmp_path):
    """A channel of one positive weight: AMCT's ARQ gives w / 127 (the sign of the dominant
    value picks the divisor); the export's consistency check divided by 128 (ties |min| == |max|
    taken as negative) and warned 'record scale_w differs ... by up to 1%' on the right record."""
    ms.set_seed(0)
    net = TwoBranch()
    w = net.b.weight.asnumpy()
    w[:2] = np.abs(w[:2]) + 0.1  # channels 0, 1 one positive weight, 2, 3 negative
    w[2:] = -np.abs(w[2:]) - 0.1
    net.b.weight.set_data(ms.Tensor(w))
    x = np.random.default_rng(0).normal(size=(16, 1, 4, 4)).astype(np.float32)
    record = ams.calibrate(net, x, tmp_path / "r.txt", algorithm="minmax")
    # the record's scales are AMCT's on the folded weight (independent of the export)
    bn = net.bn_b
    g = bn.gamma.asnumpy() / np.sqrt(bn.moving_variance.asnumpy() + bn.eps)
    folded = w * g.reshape(-1, 1, 1, 1)
    assert np.all(folded[:2] > 0) and np.all(folded[2:] < 0)
    want = np.where(folded > 0, folded / 127, folded / -128).reshape(4)  # arq.cpp, one weight
    np.testing.assert_allclose(record.layers["b"].scale_w, want, rtol=1e-6)
    res = ams.export_espdl(net, tmp_path / "r.txt", tmp_path / "out", sample_input=x[:1])
    assert not [m for m in res.warnings if "scale_w differs" in m], res.warnings


def test_a_model_checkpoint_of_the_qat_network_exports_as_strip_qat_does(tmp_path, capsys):
    """``ModelCheckpoint`` in a QAT ``Model.train`` saves the QAT network: the trained, folded
    weights, the BNs as exact identities, the ``<cell>.qat.*`` ranges and, with learned ranges,
    Adam's slots of them (``moment1.0.qat.input_min``). ``export-espdl --ckpt`` of it refused
    every ``.qat.`` entry ('is not a parameter of the network'), though the weights it holds
    are what ``strip_qat`` gives: the CLI's export now equals the API's export of strip_qat."""
    from mindspore import dataset as ds
    from mindspore.train import CheckpointConfig, Model, ModelCheckpoint
    from nets import sequential_net

    from amct_bridge.cli import main
    from amct_bridge.commands.mindspore_net import load_mindspore_net
    from amct_bridge.mindspore.qat import quantize_aware, save_qat_record, strip_qat

    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 2, 16).astype(np.int32)
    qat = quantize_aware(sequential_net(), activation_range="learned", sample_input=x[:1])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    keep = ModelCheckpoint("qat", str(tmp_path), CheckpointConfig(save_checkpoint_steps=4))
    data = ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(4)
    Model(qat, loss, nn.Adam(qat.trainable_params(), 1e-2)).train(1, data, callbacks=[keep])
    ckpt = sorted(tmp_path.glob("qat*.ckpt"))[-1]
    saved = ms.load_checkpoint(str(ckpt))
    assert "0.qat.input_min" in saved and "moment1.0.qat.input_min" in saved  # as users get it
    save_qat_record(qat, tmp_path / "qat.txt")
    plain = strip_qat(qat)

    spec = f"{Path(__file__).with_name('nets.py')}:sequential_net"
    loaded = load_mindspore_net(spec, str(ckpt))
    got = {n: p.asnumpy() for n, p in loaded.parameters_and_names()}
    for name, p in plain.parameters_and_names():
        np.testing.assert_array_equal(got[name], p.asnumpy(), err_msg=name)

    ams.export_espdl(plain, tmp_path / "qat.txt", tmp_path / "api", sample_input=x[:1])
    argv = ["export-espdl", "--mindspore", spec, "--ckpt", str(ckpt), "--input-shape", "1,3,8,8"]
    code = main([*argv, "--record", str(tmp_path / "qat.txt"), "--out", str(tmp_path / "cli")])
    assert code == 0, capsys.readouterr().err
    api, cli = tmp_path / "api", tmp_path / "cli"
    assert (cli / "config.json").read_text() == (api / "config.json").read_text()
    for f in api.glob("*.npy"):
        np.testing.assert_array_equal(np.load(cli / f.name), np.load(f), err_msg=f.name)


def test_qat_skip_layers_cell_keeps_its_output_range_for_the_export(tmp_path):
    """``quantize_aware(skip_layers=["fc"])`` keeps the classifier float, as users do; the QAT
    sidecar then had no entry for it and the export stopped ('no calibrated output range for
    'fc' ... pass the sidecar'), though PTQ's sidecar has one for a skipped cell. The skipped
    cell is observed now: its range is the float classifier's output range on the batch."""
    from mindspore import dataset as ds
    from mindspore.train import Model

    from amct_bridge.mindspore.qat import quantize_aware, save_qat_record, strip_qat
    from amct_bridge.records.calibration import load_stats, sidecar_path

    ms.set_seed(0)
    net = nn.SequentialCell(
        [nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Dense(4 * 6 * 6, 3), nn.Softmax()]
    )
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 1, 6, 6)).astype(np.float32)
    y = rng.integers(0, 3, 8).astype(np.int32)
    qat = quantize_aware(net, skip_layers=["3"])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    data = ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(8)
    Model(qat, loss, nn.SGD(qat.trainable_params(), 0.0)).train(1, data)  # weights unchanged
    path = tmp_path / "qat.txt"
    record = save_qat_record(qat, path)
    assert "3" not in record.layers
    plain = strip_qat(qat)
    # the classifier's input is the fake-quantized conv output: the simulated network's
    logits = ams.simulate(nn.SequentialCell(list(plain.cell_list)[:4]), record, x).outputs
    out = load_stats(sidecar_path(path)).layers["3"].output
    np.testing.assert_allclose([out.min, out.max], [logits.min(), logits.max()], rtol=1e-5)
    res = ams.export_espdl(plain, path, tmp_path / "v1", sample_input=x[:1])
    head = next(layer for layer in res.layers if layer.source == "3")
    assert head.sources["output_exponent"] == "sidecar output range of '3'", head.sources


def test_qat_without_folding_gets_a_refusal_that_names_the_option_and_v3_runs_it(tmp_path):
    """``quantize_aware(fold_batchnorm=False)`` writes ``skip_fusion`` (docs/qat.md promised
    the ESP-DL exporter would fold it); ESP-DL v1 refused each BN with the pre-activation
    advice ('DenseNet, ResNet v2 ... needs that BN moved'), which does not apply: the BN is
    where it folds. Now the refusal names skip_fusion and fold_batchnorm=True, nothing is
    written, and ESP-DL v3 exports the BN (Mul + Add) with the chip near the float net."""
    import pytest
    from mindspore import dataset as ds
    from mindspore.train import Model

    from amct_bridge.errors import ExportError
    from amct_bridge.mindspore.qat import quantize_aware, save_qat_record, strip_qat

    ms.set_seed(0)
    net = nn.SequentialCell(
        [nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Dense(4 * 6 * 6, 3)]
    )
    rng = np.random.default_rng(2)
    x = rng.normal(size=(16, 1, 6, 6)).astype(np.float32)
    y = rng.integers(0, 3, 16).astype(np.int32)
    qat = quantize_aware(net, fold_batchnorm=False, sample_input=x[:1])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    data = ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(8)
    Model(qat, loss, nn.SGD(qat.trainable_params(), 1e-3)).train(1, data)
    path = tmp_path / "qat.txt"
    assert save_qat_record(qat, path).layers["0"].skip_fusion is True
    plain = strip_qat(qat)
    with pytest.raises(ExportError) as err:
        ams.export_espdl(plain, path, tmp_path / "v1", sample_input=x[:1])
    text = str(err.value)
    assert "the record sets skip_fusion for '0'" in text and "fold_batchnorm=True" in text, text
    assert "DenseNet" not in text and not (tmp_path / "v1").exists()
    ams.export_espdl(plain, path, tmp_path / "m.espdl", sample_input=x[:1], format="espdl")
    ev = ams.evaluate_espdl(tmp_path / "m.espdl", plain, x, y)
    rows = {row.source: row for row in ev.layers}
    assert rows["1"].kind == "Add" and "4" in rows, [(r.source, r.kind) for r in ev.layers]
    assert min(r.snr_db for r in ev.layers) > 25, [(r.source, r.snr_db) for r in ev.layers]
