"""MindSpore calibration (QuantCalibration in Model.eval / train / fit, calibrate()) against an
independent computation, in GRAPH_MODE and PyNative.

Reference: the network is a SequentialCell, so the input of cell ``i`` is the output of cell
``i - 1``; a plain PyNative forward cell by cell (no probes, no amct_bridge code) gives every
cell's input. From those, minmax factors are AMCT's formula written out here (asymmetric INT8:
``scale = (max(hi, 0) - min(lo, 0)) / 255`` in float32, ``offset = -128 - round(min / scale)``),
and ARQ ``scale_w`` is max |w| of each output channel of the OIHW kernel (``m / 127`` or
``|n| / 128``), on the kernel with its BatchNorm2d folded in (``gamma / sqrt(var + eps)`` per
output channel); Dense gets one scale per tensor.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore import dataset as ds
from mindspore.train import Model

from amct_bridge.mindspore import QuantCalibration, calibrate
from amct_bridge.mindspore.session import Session
from amct_bridge.records import load
from amct_bridge.records.calibration import load_stats, sidecar_path

MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}
QUANTIZED = {"0": 1, "3": 4, "6": None, "8": None}  # record key -> folded BN cell index


def make_net() -> nn.SequentialCell:
    """conv+BN (eps 1e-3), ReLU, depthwise (multiplier 2)+BN, ReLU6, AvgPool, Flatten, Dense."""
    net = nn.SequentialCell(
        [
            nn.Conv2d(3, 4, 3, has_bias=True),
            nn.BatchNorm2d(4, eps=1e-3),
            nn.ReLU(),
            nn.Conv2d(4, 8, 3, group=4),
            nn.BatchNorm2d(8),
            nn.ReLU6(),
            nn.AvgPool2d(2, 2),
            nn.Flatten(),
            nn.Dense(8 * 4 * 4, 3),
        ]
    )
    rng = np.random.default_rng(0)
    for name, p in net.parameters_and_names():
        if name.endswith(("moving_variance", "gamma")):
            value = rng.uniform(0.5, 2.0, p.shape)
        else:
            value = rng.normal(0.0, 0.5, p.shape)
        p.set_data(Tensor(value.astype(np.float32)))
    return net


def data(n: int = 6, seed: int = 1, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(0, 1, (n, 3, 8, 8)) * scale).astype(np.float32)


def dataset(x: np.ndarray, batch: int = 2) -> ds.Dataset:
    y = np.zeros(len(x), np.int32)
    return ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(batch)


def make_model(net, lr: float | None = None) -> Model:
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), lr, 0.9) if lr is not None else None
    return Model(net, loss, opt, metrics={"acc"})


# ---- the independent reference ----------------------------------------------------------------


def cell_inputs(net, batches: list[np.ndarray], train: bool = False) -> list[list[np.ndarray]]:
    """Per batch, the input of every cell (PyNative, cell by cell)."""
    before = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net.set_train(train)
    try:
        out = []
        for x in batches:
            t, ins = Tensor(x), []
            for cell in net:
                ins.append(t.asnumpy())
                t = cell(t)
            ins.append(t.asnumpy())
            out.append(ins)
        return out
    finally:
        net.set_train(False)
        ms.set_context(mode=before)


def act_factors(lo: float, hi: float) -> tuple[float, int]:
    mx, mn = np.float32(max(hi, 0.0)), np.float32(min(lo, 0.0))
    scale = float(np.float32(mx - mn)) / 255
    ratio = float(mn / np.float32(scale))
    return scale, -128 - int(np.sign(ratio) * np.floor(abs(ratio) + 0.5))


def arq(kernel: np.ndarray, per_channel: bool) -> np.ndarray:
    rows = kernel.reshape(kernel.shape[0], -1) if per_channel else kernel.reshape(1, -1)
    mx, mn = rows.max(1), rows.min(1)
    dominant = np.where(np.abs(mx) > np.abs(mn), mx, mn)
    return np.where(dominant > 0, dominant / np.float32(127), dominant / np.float32(-128))


def folded_kernel(net, conv: int, bn: int | None) -> np.ndarray:
    k = net[conv].weight.asnumpy().astype(np.float64)
    if bn is None:
        return k
    cell = net[bn]
    var, gamma = cell.moving_variance.asnumpy(), cell.gamma.asnumpy()
    return k * (gamma / np.sqrt(var + float(cell.eps)))[:, None, None, None]


def check_record(record, net, ins: list[list[np.ndarray]], fold: bool = True) -> None:
    """Keys, scale_d/offset_d from the cells' inputs, scale_w from the (folded) kernels."""
    assert sorted(record.layers) == sorted(QUANTIZED)
    for key, bn in QUANTIZED.items():
        i = int(key)
        lo = min(float(b[i].min()) for b in ins)
        hi = max(float(b[i].max()) for b in ins)
        scale, offset = act_factors(lo, hi)
        got = record.layers[key]
        assert got.scale_d == pytest.approx(scale, rel=1e-6), key
        assert got.offset_d == offset, key
        if key == "6":  # AvgPool2d: data factors only
            assert not got.scale_w
            continue
        kernel = folded_kernel(net, i, bn if fold else None).astype(np.float32)
        expected = arq(kernel, per_channel=key != "8")
        assert len(got.scale_w) == (1 if key == "8" else kernel.shape[0]), key
        np.testing.assert_allclose(got.scale_w, expected, rtol=1e-6, err_msg=key)


def spy_instrumentation(monkeypatch) -> list:
    """Keep every Instrumentation the sessions create (our own class; calls go through)."""
    made = []
    original = Session._instrument

    def keep(self, mode, points):
        inst = original(self, mode, points)
        made.append(inst)
        return inst

    monkeypatch.setattr(Session, "_instrument", keep)
    return made


def probe_counts(insts: list) -> list[int]:
    return [int(p.count.asnumpy()) for inst in insts for p in inst._probes]


def snapshot(net, x: np.ndarray, tmp_path, name: str):
    """Outputs (eval), parameter names, checkpoint keys, cell classes."""
    net.set_train(False)
    out = net(Tensor(x)).asnumpy()
    ms.save_checkpoint(net, str(tmp_path / name))
    keys = sorted(ms.load_checkpoint(str(tmp_path / name)))
    cells = [(n, type(c).__name__) for n, c in net.cells_and_names()]
    return out, sorted(net.parameters_dict()), keys, cells


# ---- tests --------------------------------------------------------------------------------------


def test_model_eval_equals_numpy_no_stale_graph_network_unchanged(mode, tmp_path, monkeypatch):
    """Model.eval: factors equal the reference; a graph compiled before the callback collects
    (GRAPH: its cache is cleared on install); afterwards nothing collects and the network is
    exactly as before (outputs, parameter names, checkpoint keys, cells)."""
    net, x = make_net(), data()
    ins = cell_inputs(make_net(), [x[:2], x[2:4], x[4:]])
    model = make_model(net)
    model.eval(dataset(x))  # compiles the eval network without probes (GRAPH)
    before = snapshot(net, x[:2], tmp_path, "before.ckpt")
    made = spy_instrumentation(monkeypatch)
    path = tmp_path / "record.txt"

    cb = QuantCalibration(path, algorithm="minmax")
    model.eval(dataset(x), callbacks=[cb])

    record = load(path, flavor="mindspore")  # keys "0", "3": not detectable as cell names
    assert cb.written == record
    check_record(record, net, ins)
    stats = load_stats(sidecar_path(path))
    assert stats.batches == 3
    relu = stats.layers["2"].output  # activation ranges go to the sidecar
    assert (relu.min, relu.max) == pytest.approx(
        (min(b[3].min() for b in ins), max(b[3].max() for b in ins))
    )
    assert stats.layers["1"].output == stats.layers["0"].output  # the folded BN's output
    # after removal: neither the eval network nor a direct call collects
    text, counts = path.read_bytes(), probe_counts(made)
    assert counts and all(c == 3 for c in counts)
    model.eval(dataset(x))
    net(Tensor(x[:2]))
    assert probe_counts(made) == counts and path.read_bytes() == text
    after = snapshot(net, x[:2], tmp_path, "after.ckpt")
    np.testing.assert_array_equal(after[0], before[0])
    assert after[1:] == before[1:]


def test_batch_num_stops_collecting_mid_run(mode, tmp_path, monkeypatch):
    """batch_num=1: the probes come out after batch 0 (caches cleared) and the later, much
    larger batches of the same Model.eval are not seen."""
    net = make_net()
    x = np.concatenate([data(2), data(4, seed=2, scale=10.0)])
    made = spy_instrumentation(monkeypatch)
    path = tmp_path / "record.txt"
    cb = QuantCalibration(path, algorithm="minmax", batch_num=1)
    make_model(net).eval(dataset(x), callbacks=[cb])
    check_record(load(path), net, cell_inputs(make_net(), [x[:2]]))
    assert load_stats(sidecar_path(path)).batches == 1
    assert probe_counts(made) and all(c == 1 for c in probe_counts(made))


def test_model_train(mode, tmp_path):
    """Model.train: training batches through BatchNorm in training mode (batch statistics);
    scale_w folds the moving statistics the training left."""
    net, x = make_net(), data()
    ins = cell_inputs(make_net(), [x[:2], x[2:4], x[4:]], train=True)
    names = sorted(net.parameters_dict())
    path = tmp_path / "record.txt"
    model = make_model(net, lr=0.0)  # weights stay, BN moving statistics move
    model.train(1, dataset(x), callbacks=[QuantCalibration(path, algorithm="minmax")])
    check_record(load(path), net, ins)
    assert load_stats(sidecar_path(path)).batches == 3
    assert sorted(net.parameters_dict()) == names
    assert all(type(c).__name__ != "Probe" for _, c in net.cells_and_names())


def test_fit_validation_only_and_auto_pauses_for_validation(tmp_path):
    """fit(on="validation"): only the validation batches (eval mode) are seen; fit(on="auto"):
    only training batches (the pass pauses while validation runs). The validation data is 10x
    larger, so mixing them up changes the factors."""
    net = make_net()
    x, v = data(), data(4, seed=3, scale=10.0)
    model = make_model(net, lr=0.0)
    val_path, auto_path = tmp_path / "val.txt", tmp_path / "auto.txt"
    model.fit(
        1,
        dataset(x),
        dataset(v),
        callbacks=[
            QuantCalibration(val_path, algorithm="minmax", on="validation"),
            QuantCalibration(auto_path, algorithm="minmax"),
        ],
    )
    check_record(load(val_path), net, cell_inputs(net, [v[:2], v[2:]]))
    assert load_stats(sidecar_path(val_path)).batches == 2
    auto = load(auto_path)
    assert auto.layers["0"].scale_d == pytest.approx(
        act_factors(float(x.min()), float(x.max()))[0], rel=1e-6
    )
    assert load_stats(sidecar_path(auto_path)).batches == 3


def test_calibrate_function_dataset_and_skip_fusion(tmp_path):
    """calibrate() (PyNative; GRAPH_MODE in the hfmg test below): numpy arrays and a
    mindspore.dataset give the reference record; with skip_fusion_layers the kernel is not
    folded and the entry says skip_fusion."""
    net, x = make_net(), data()
    ins = cell_inputs(make_net(), [x[:2], x[2:4], x[4:]])
    a = calibrate(net, x, tmp_path / "a.txt", batch_size=2, algorithm="minmax")
    check_record(a, net, ins)
    assert a.flavor == "mindspore" and a == load(tmp_path / "a.txt", flavor="mindspore")
    b = calibrate(net, dataset(x), tmp_path / "b.txt", algorithm="minmax")
    assert (tmp_path / "b.txt").read_text() == (tmp_path / "a.txt").read_text()
    assert b.layers == a.layers
    c = calibrate(
        net, x, tmp_path / "c.txt", batch_size=2, algorithm="minmax", skip_fusion_layers=["0"]
    )
    expected = arq(folded_kernel(net, 0, None).astype(np.float32), per_channel=True)
    np.testing.assert_allclose(c.layers["0"].scale_w, expected, rtol=1e-6)
    assert c.layers["0"].skip_fusion and not c.layers["3"].skip_fusion
    assert c.layers["3"].scale_w == a.layers["3"].scale_w


def test_hfmg_inner_flavor_equals_across_modes(tmp_path):
    """hfmg (histograms in the graph) gives the same record in GRAPH_MODE and PyNative;
    flavor "inner" on request."""
    x = data(8, seed=4)
    texts = []
    for name, value in MODES.items():
        before = ms.get_context("mode")
        ms.set_context(mode=value)
        try:
            rec = calibrate(
                make_net(),
                x,
                tmp_path / f"{name}.txt",
                batch_size=4,
                algorithm="hfmg",
                flavor="inner",
            )
        finally:
            ms.set_context(mode=before)
        assert rec.flavor == "inner"
        texts.append((tmp_path / f"{name}.txt").read_text())
    assert texts[0] == texts[1]


def test_functional_add_range_in_sidecar(tmp_path):
    """A functional ``x + y`` whose inputs and output are single-call cells' outputs / input
    gets a sidecar entry (graph name ``add_op0``): input = union of both operands, output =
    the sum's range (reference: the forward written out cell by cell)."""
    from nets import loop_net

    net, x = loop_net(), data(4, seed=5)
    calibrate(net, x, tmp_path / "r.txt", algorithm="minmax")
    t = net.stem(Tensor(x))
    f0 = net.blocks[0](t)
    f2 = net.blocks[2](net.blocks[1](f0))
    f0, f2 = f0.asnumpy(), f2.asnumpy()
    add = load_stats(sidecar_path(tmp_path / "r.txt")).layers["add_op0"]
    assert add.kind == "Add"
    assert (add.input.min, add.input.max) == pytest.approx(
        (min(f0.min(), f2.min()), max(f0.max(), f2.max())), rel=1e-6
    )
    assert (add.output.min, add.output.max) == pytest.approx(
        ((f0 + f2).min(), (f0 + f2).max()), rel=1e-6
    )


def test_conv_transpose_folded_per_output_channel(tmp_path):
    """Conv2dTranspose weight (in, out, kH, kW): its BN folds along axis 1 and scale_w has one
    value per output channel (axis 1)."""
    ms.set_seed(3)
    net = nn.SequentialCell([nn.Conv2dTranspose(3, 5, 3), nn.BatchNorm2d(5, eps=1e-2)])
    rng = np.random.default_rng(6)
    for name, p in net.parameters_and_names():
        low = 0.5 if name.endswith(("moving_variance", "gamma")) else -1.0
        p.set_data(Tensor(rng.uniform(low, 2.0, p.shape).astype(np.float32)))
    rec = calibrate(net, data(2), tmp_path / "r.txt", algorithm="minmax")
    bn = net[1]
    factor = bn.gamma.asnumpy() / np.sqrt(bn.moving_variance.asnumpy() + 1e-2)
    kernel = (net[0].weight.asnumpy() * factor[None, :, None, None]).astype(np.float32)
    expected = arq(kernel.transpose(1, 0, 2, 3), per_channel=True)
    np.testing.assert_allclose(rec.layers["0"].scale_w, expected, rtol=1e-6)


def test_save_every_epoch_and_accumulate(tmp_path):
    """save_every_epoch writes at each epoch end what was gathered so far; accumulate keeps
    statistics across Model.eval calls (a second call with 10x data widens the range)."""
    from mindspore.train import Callback

    path = tmp_path / "r.txt"
    seen = []

    class Spy(Callback):
        def on_train_epoch_end(self, run_context):
            seen.append(load_stats(sidecar_path(path)).batches)

    net, x = make_net(), data(4)
    cb = QuantCalibration(path, algorithm="minmax", save_every_epoch=True)
    make_model(net, lr=0.0).train(2, dataset(x), callbacks=[cb, Spy()])
    assert seen == [2, 4] and load_stats(sidecar_path(path)).batches == 4

    model, big = make_model(net), data(2, seed=9, scale=10.0)
    cb = QuantCalibration(path, algorithm="minmax", accumulate=True)
    model.eval(dataset(x), callbacks=[cb])
    model.eval(dataset(big), callbacks=[cb])
    check_record(load(path, flavor="mindspore"), net, cell_inputs(net, [x, big]))
    assert load_stats(sidecar_path(path)).batches == 3


def test_checkpoints_of_a_calibrated_epoch_hold_only_the_network(mode, tmp_path, caplog):
    """ModelCheckpoint during a calibrated Model.train saves what the network has: no
    amct_bridge.* statistics (they grew LeNet5's checkpoint to 3.3 MB and made export-espdl
    --ckpt refuse it), and the checkpoint, optimizer state included, loads into a plain net."""
    from mindspore.train.callback import CheckpointConfig, ModelCheckpoint

    from amct_bridge.commands.mindspore_net import load_checkpoint

    net, x = make_net(), data()
    model = make_model(net, lr=0.01)
    saver = ModelCheckpoint(
        "calib", str(tmp_path / "ckpt"), CheckpointConfig(save_checkpoint_steps=1)
    )
    path = tmp_path / "record.txt"
    model.train(1, dataset(x), callbacks=[QuantCalibration(path, algorithm="minmax"), saver])
    files = sorted((tmp_path / "ckpt").glob("*.ckpt"))
    assert len(files) == 3 and path.is_file()
    for f in files:
        assert not [k for k in ms.load_checkpoint(str(f)) if k.startswith("amct_bridge")], f
    plain = make_net()
    load_checkpoint(plain, str(files[-1]))
    pairs = zip(net.parameters_and_names(), plain.parameters_and_names(), strict=True)
    for (name, p), (_, q) in pairs:
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy(), err_msg=name)

    # a checkpoint an older amct_bridge wrote, statistics inside: ignored with a note
    old = [{"name": n, "data": p} for n, p in net.parameters_and_names()]
    old.append({"name": "amct_bridge.0.0.minmax", "data": Tensor(np.zeros((2, 5)))})
    ms.save_checkpoint(old, str(tmp_path / "old.ckpt"))
    with caplog.at_level("WARNING"):
        load_checkpoint(make_net(), str(tmp_path / "old.ckpt"))
    assert "ignoring 1 amct_bridge.* entries" in caplog.text


def test_a_cell_called_at_four_sites_gets_a_range_per_site(mode, tmp_path):
    """LeNet5 calls one ``self.relu`` at four sites and ``self.max_pool2d`` at two. The sidecar
    held one merged range (the largest site's), so every site exported at that exponent;
    now ``relu`` is the first site and ``relu@1..3`` the others, each its own extremes
    (reference: the forward written out cell by cell), and the export uses them."""
    from nets import lenet5

    from amct_bridge.quant.espdl import range_to_exponent

    net = lenet5()
    for name, p in net.parameters_and_names():
        if name.startswith("fc2."):
            p.set_data(p * 8)  # the sites' ranges far apart
    x = np.random.default_rng(3).normal(0, 3, (8, 1, 32, 32)).astype(np.float32)
    path = tmp_path / "r.txt"
    calibrate(net, x, path, algorithm="minmax", batch_size=4)
    before = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        t = Tensor(x)
        a1 = net.relu(net.conv1(t))
        p1 = net.max_pool2d(a1)
        a2 = net.relu(net.conv2(p1))
        p2 = net.max_pool2d(a2)
        a3 = net.relu(net.fc1(net.flatten(p2)))
        a4 = net.relu(net.fc2(a3))
        pre = [net.conv1(t), net.conv2(p1), net.fc1(net.flatten(p2)), net.fc2(a3)]
    finally:
        ms.set_context(mode=before)
    layers = load_stats(sidecar_path(path)).layers
    sites = {"relu": 0, "relu@1": 1, "relu@2": 2, "relu@3": 3}
    for key, k in sites.items():
        got = layers[key]
        want_in, want_out = pre[k].asnumpy(), (a1, a2, a3, a4)[k].asnumpy()
        assert (got.input.min, got.input.max) == pytest.approx(
            (want_in.min(), want_in.max()), rel=1e-6
        ), key
        assert got.output.max == pytest.approx(want_out.max(), rel=1e-6), key
    assert layers["max_pool2d@1"].output.max == pytest.approx(p2.asnumpy().max(), rel=1e-6)
    assert list(layers).index("relu@1") == list(layers).index("relu") + 1  # execution order
    maxima = [layers[k].output.max for k in sites]
    assert max(maxima) > 3 * min(maxima)  # the sites do differ

    import amct_bridge.mindspore as ams

    res = ams.export_espdl(net, path, None, sample_input=x[:1], feature_type="s8")
    by_source = {layer.source: layer for layer in res.layers}
    for conv, key in (("conv1", "relu"), ("conv2", "relu@1"), ("fc1", "relu@2")):
        exported = by_source[conv]
        assert exported.sources["output_exponent"] == f"sidecar output range of {key!r}"
        assert exported.entry["output_exponent"] == range_to_exponent(0.0, layers[key].output.max)
