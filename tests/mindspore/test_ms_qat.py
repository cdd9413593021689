"""MindSpore quantization-aware training: fake-quant forward, STE / clip gradients, EMA ranges,
BN folding, the QAT record and sidecar, strip_qat, init_record, bad input; GRAPH and PyNative."""

import json

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from mindspore.train import Model

from amct_bridge.calibration.qat import layer_factors
from amct_bridge.errors import QuantError, RecordError
from amct_bridge.mindspore import simulate
from amct_bridge.mindspore.qat import qat_record, quantize_aware, save_qat_record, strip_qat
from amct_bridge.quant import qat as core
from amct_bridge.records import LayerFactors, Record, load, validate


@pytest.fixture
def pynative():
    before = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=before)


class Net(nn.Cell):
    """Conv(group 1) + BN + ReLU, depthwise conv + ReLU, Conv2dTranspose, Dense (8x8 input)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, has_bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.dw = nn.Conv2d(4, 4, 3, group=4, stride=2, has_bias=True)
        self.relu2 = nn.ReLU()
        self.up = nn.Conv2dTranspose(4, 4, 2, stride=2)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 8 * 8, 3)

    def construct(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu2(self.dw(x))
        return self.fc(self.flatten(self.up(x)))


def make_net(seed=0):
    ms.set_seed(seed)
    rng = np.random.default_rng(seed)
    net = Net()
    for name, p in net.parameters_and_names():
        if name.startswith("bn1."):  # BN statistics that make the fold visible
            p.set_data(Tensor(rng.uniform(0.5, 1.5, p.shape).astype(np.float32)))
    net.set_train(False)
    return net


def data(seed=0, n=16):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (n, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, n).astype(np.int32)
    return x, y


def train(qat, x, y, lr=0.01, epochs=1, batch=8):
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(qat, loss, nn.SGD(qat.trainable_params(), lr))
    dataset = ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False).batch(batch)
    model.train(epochs, dataset)
    return model


def params(net):
    return {p.name: p.asnumpy().copy() for p in net.get_parameters()}


def test_qat_trains_and_strip_simulates_to_the_qat_net(mode, tmp_path):
    net = make_net()
    before = params(net)
    x, y = data()
    qat = quantize_aware(net, "INT8", sample_input=(1, 1, 8, 8))
    # parameter names: the network's own, plus the QAT ranges under <cell>.qat.*
    names = {p.name for p in qat.get_parameters()}
    assert set(before) <= names
    assert all(n.split(".")[1] == "qat" for n in names - set(before)), names - set(before)
    trainable = {p.name for p in qat.trainable_params()}
    assert trainable == {
        "conv1.weight",
        "bn1.beta",
        "dw.weight",
        "dw.bias",
        "up.weight",
        "fc.weight",
        "fc.bias",
    }  # BN folded: gamma frozen at 1, its beta is conv1's bias
    train(qat, x, y, epochs=2)
    after = params(net)
    assert all(np.array_equal(before[k], after[k]) for k in before)  # the user's net untouched
    rec = save_qat_record(qat, tmp_path / "qat.txt")
    assert validate(rec) == []
    loaded = load(tmp_path / "qat.txt")
    assert list(loaded.layers) == ["conv1", "dw", "up", "fc"]
    assert {f.dst_type for f in loaded.layers.values()} == {"INT8"}
    assert len(loaded.layers["dw"].scale_w) == 4 and len(loaded.layers["up"].scale_w) == 4
    assert len(loaded.layers["fc"].scale_w) == 1
    side = json.loads((tmp_path / "qat.txt.calib.json").read_text())
    assert side["algorithm"] == "qat-ema" and side["batches"] == 4
    assert list(side["layers"]) == ["conv1", "bn1", "relu", "dw", "relu2", "up", "fc"]
    # the ReLU's output is what dw reads: dw's clip range, the EMA kept as observed
    assert side["layers"]["relu"]["output"]["max"] == side["layers"]["dw"]["input"]["max"]

    plain = strip_qat(qat)
    assert type(plain.conv1) is nn.Conv2d and type(plain.bn1) is nn.BatchNorm2d
    assert {p.name for p in plain.get_parameters()} == set(before)
    qat.set_train(False)
    want = qat(Tensor(x)).asnumpy()
    got = simulate(plain, tmp_path / "qat.txt", x).outputs
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # the stripped checkpoint loads into a freshly built float network of the same class
    ms.save_checkpoint(plain, str(tmp_path / "deploy.ckpt"))
    fresh = Net()
    not_loaded, _ = ms.load_param_into_net(fresh, ms.load_checkpoint(str(tmp_path / "deploy.ckpt")))
    assert not_loaded == []
    fresh.set_train(False)
    plain.set_train(False)
    np.testing.assert_allclose(fresh(Tensor(x)).asnumpy(), plain(Tensor(x)).asnumpy(), atol=1e-6)


def test_ema_ranges_and_record_factors_by_hand(mode):
    """lr 0: weights stay, the first cell's input range is the EMA of the batches' min/max;
    the record's factors are AMCT's formulas of it (worked in numpy here)."""
    net = nn.SequentialCell([nn.Dense(5, 3)])
    w = np.random.default_rng(1).normal(0, 1, (3, 5)).astype(np.float32)
    net[0].weight.set_data(Tensor(w))
    qat = quantize_aware(net, "INT4", ema_decay=0.9)
    rng = np.random.default_rng(2)
    batches = [rng.normal(0, s, (4, 5)).astype(np.float32) for s in (1.0, 3.0, 0.5)]
    x = np.concatenate(batches)
    train(qat, x, np.zeros(12, np.int32), lr=0.0, batch=4)
    lo, hi = float(batches[0].min()), float(batches[0].max())
    for b in batches[1:]:
        lo = float(np.float32(0.9) * np.float32(lo) + np.float32(0.1) * b.min())
        hi = float(np.float32(0.9) * np.float32(hi) + np.float32(0.1) * b.max())
    f = qat_record(qat).layers["0"]
    lo32, hi32 = np.float32(min(lo, 0)), np.float32(max(hi, 0))
    scale = np.float32(hi32 - lo32) / 15
    np.testing.assert_allclose(f.scale_d, scale, rtol=1e-6)
    assert f.offset_d == -8 - int(np.round(lo32 / scale))
    mx, mn = w.max(), w.min()
    want_w = max(mx, -mn) / (8 if -mn >= mx else 7)
    np.testing.assert_allclose(f.scale_w, [want_w], rtol=1e-6)
    # eval: the fake-quantized forward is the core's numpy reference
    qat.set_train(False)
    xt = rng.normal(0, 2, (6, 5)).astype(np.float32)
    lo_t, hi_t = qat[0].in_min.asnumpy(), qat[0].in_max.asnumpy()
    xq = core.fake_quant_range(xt, lo_t, hi_t, 4)
    wq = core.arq_fake_quant(w, "OI", 4)
    want = xq @ wq.T + net[0].bias.asnumpy()
    np.testing.assert_allclose(qat(Tensor(xt)).asnumpy(), want, rtol=1e-5, atol=1e-5)


def test_ste_round_and_true_clip_gradients(pynative):
    """d(sum y)/dx = W_q summed over outputs inside the clip range, 0 outside (STE for round,
    true clip gradient); d/dW reaches the weight through the fake-quant (STE)."""
    net = nn.SequentialCell([nn.Dense(4, 2, has_bias=False)])
    w = np.float32([[0.5, -0.25, 1.0, 0.3], [0.2, 0.4, -0.6, 0.1]])
    net[0].weight.set_data(Tensor(w))
    qat = quantize_aware(net, "INT8", ema_decay=0.0)
    qat.set_train(True)
    qat(Tensor(np.float32([[-1.0, 0.0, 0.5, 1.0]])))  # range [-1, 1]
    qat.set_train(False)
    x = Tensor(np.float32([[-2.0, 0.3, 0.9, 1.5]]))
    grad = ops.GradOperation()(lambda v: qat(v).sum())(x).asnumpy()
    wq = core.arq_fake_quant(w, "OI", 8)
    inside = np.float32([0, 1, 1, 0])
    np.testing.assert_allclose(grad[0], wq.sum(0) * inside, rtol=1e-6)
    gw = ms.grad(lambda v: qat(v).sum(), grad_position=None, weights=[net_w(qat)])(x)[0]
    xq = core.fake_quant_range(x.asnumpy(), -1.0, 1.0, 8)
    np.testing.assert_allclose(gw.asnumpy(), np.repeat(xq, 2, 0), rtol=1e-6)


def net_w(qat):
    return next(p for p in qat.trainable_params() if p.name == "0.weight")


def test_fold_batchnorm_is_exact_and_skip_fusion(pynative):
    net = make_net()
    x, y = data()
    want = net(Tensor(x)).asnumpy()
    plain = strip_qat(quantize_aware(net, sample_input=(1, 1, 8, 8)))
    plain.set_train(False)
    np.testing.assert_allclose(plain(Tensor(x)).asnumpy(), want, rtol=1e-5, atol=1e-6)
    bn = plain.bn1
    assert np.all(bn.gamma.asnumpy() == 1) and np.all(bn.moving_mean.asnumpy() == 0)
    assert np.all(np.float32(bn.moving_variance.asnumpy() + np.float32(bn.eps)) == 1)
    kept = quantize_aware(net, fold_batchnorm=False, sample_input=(1, 1, 8, 8))
    assert {p.name for p in kept.trainable_params()} >= {"bn1.gamma", "bn1.beta"}
    train(kept, x, y)
    rec = qat_record(kept)
    assert rec.layers["conv1"].skip_fusion is True and not rec.layers["dw"].skip_fusion


def test_learned_ranges_train(mode):
    net = nn.SequentialCell([nn.Dense(6, 3), nn.ReLU()])
    qat = quantize_aware(net, "INT4", activation_range="learned")
    lo = qat[0].in_min
    assert lo.requires_grad and any(p is lo for p in qat.trainable_params())
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (32, 6)).astype(np.float32)
    y = rng.integers(0, 3, 32).astype(np.int32)
    train(qat, x, y, lr=0.05, epochs=3)
    first = float(x[:8].min())
    assert float(lo.asnumpy()) != pytest.approx(first)  # moved by gradients after batch 1
    assert np.isfinite(qat_record(qat).layers["0"].scale_d)


def _ptq_record(net, x, path):
    """A minmax PTQ record of the float net (the calibration callback's)."""
    from amct_bridge.mindspore import calibrate

    return calibrate(net, x, path, algorithm="minmax", batch_size=len(x))


def test_init_record_first_step_quantizes_with_its_ranges(pynative, tmp_path):
    """The first training step's outputs equal simulate(float net, PTQ record): the batch is
    the calibration's, so the EMA update keeps the first cell's range; deeper cells see
    fake-quantized inputs, whose range differs from the float one by a step or so."""
    net = make_net()
    x, _ = data(n=8)
    rec = _ptq_record(net, x, tmp_path / "ptq.txt")
    want = simulate(net, rec, x).outputs
    qat = quantize_aware(net, "INT8", sample_input=(1, 1, 8, 8), init_record=rec)
    for key, f in rec.layers.items():
        assert qat_record_scale(qat, key) == pytest.approx(f.scale_d, rel=1e-6)
    qat.set_train(True)
    got = qat(Tensor(x)).asnumpy()
    err = np.abs(got - want).max()
    assert err < 1e-3 * np.abs(want).max() * 10, (err, np.abs(want).max())
    cold = quantize_aware(net, "INT8", sample_input=(1, 1, 8, 8))
    cold.set_train(True)
    cold_err = np.abs(cold(Tensor(x)).asnumpy() - want).max()
    print("init_record error", err, "cold start", cold_err)
    assert cold_err > 3 * err  # without it the first step uses the batch's own ranges
    with pytest.raises(RecordError, match="'nope'"):
        bad = Record({"nope": LayerFactors(scale_d=0.1, offset_d=0)})
        quantize_aware(net, sample_input=(1, 1, 8, 8), init_record=bad)


def qat_record_scale(qat, key):
    cell = next(c for _, c in qat.cells_and_names() if getattr(c, "key", None) == key)
    lo, hi, seen = cell.input_range()
    return layer_factors(key, lo, hi, seen, 8).scale_d


def test_bad_input_nothing_written(pynative, tmp_path):
    with pytest.raises(QuantError, match="no quantizable cell.*ReLU"):
        quantize_aware(nn.SequentialCell([nn.ReLU(), nn.Flatten()]))
    with pytest.raises(QuantError, match="skip_layers names no quantizable cell.*'nope'"):
        quantize_aware(nn.SequentialCell([nn.Dense(2, 2)]), skip_layers=["nope"])
    with pytest.raises(QuantError, match="no quantizable cell.*not in skip_layers"):
        quantize_aware(nn.SequentialCell([nn.Dense(2, 2)]), skip_layers=["0"])
    with pytest.raises(QuantError, match="dst_type"):
        quantize_aware(nn.SequentialCell([nn.Dense(2, 2)]), "INT2")
    with pytest.raises(QuantError, match="sample_input"):
        quantize_aware(make_net())
    qat = quantize_aware(nn.SequentialCell([nn.Dense(2, 2)]))
    path = tmp_path / "qat.txt"
    with pytest.raises(QuantError, match="'0'.*never observed.*train at least one step"):
        save_qat_record(qat, path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(QuantError, match="not a QAT network"):
        save_qat_record(nn.SequentialCell([nn.Dense(2, 2)]), path)
    assert list(tmp_path.iterdir()) == []
    # a float checkpoint loaded into the QAT network un-folds its BN: refused, not recorded
    net = make_net()
    ms.save_checkpoint(net, str(tmp_path / "float.ckpt"))
    qat = quantize_aware(net, sample_input=(1, 1, 8, 8))
    x, y = data(n=8)
    train(qat, x, y)
    ms.load_param_into_net(qat, ms.load_checkpoint(str(tmp_path / "float.ckpt")))
    with pytest.raises(QuantError, match="'bn1' was folded into 'conv1'.*before quantize_aware"):
        save_qat_record(qat, path)
    with pytest.raises(QuantError, match="'bn1' was folded"):
        strip_qat(qat)
    assert not path.exists()


@pytest.mark.parametrize(
    "name",
    [
        "amct_bridge.mindspore.qat",
        "amct_bridge.mindspore.qat.fake_quant",
        "amct_bridge.mindspore.qat.cells",
        "amct_bridge.mindspore.qat.model",
        "amct_bridge.mindspore.qat.strip",
    ],
)
def test_docstring_examples_run(pynative, name):
    import doctest
    import importlib

    module = importlib.import_module(name)
    failures, tried = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert failures == 0 and tried > 0


class Residual(nn.Cell):
    """conv-relu, conv + identity (functional add), relu, Dense."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 2, 3)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(2, 2, 3)
        self.relu2 = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(2 * 4 * 4, 3)

    def construct(self, x):
        y = self.relu(self.conv1(x))
        return self.fc(self.flatten(self.relu2(self.conv2(y) + y)))


def test_functional_add_gets_a_sidecar_range(pynative, tmp_path):
    """x + y has no cell: its range is observed at the cell that reads it alone (relu2's
    input), as the calibration session does; checked against relu2's input seen by a hook."""
    ms.set_seed(0)
    net = Residual()
    rng = np.random.default_rng(4)
    x = rng.normal(0, 1, (8, 2, 4, 4)).astype(np.float32)
    qat = quantize_aware(net, ema_decay=0.0, sample_input=(1, 2, 4, 4))
    train(qat, x, np.zeros(8, np.int32), lr=0.0)
    save_qat_record(qat, tmp_path / "qat.txt")
    side = json.loads((tmp_path / "qat.txt.calib.json").read_text())["layers"]
    adds = [k for k, v in side.items() if v["kind"] == "Add"]
    assert adds == ["add_op0"], list(side)
    seen = []
    inner = next(c for _, c in qat.cells_and_names() if getattr(c, "key", None) == "relu2").cell
    handle = inner.register_forward_pre_hook(lambda cell, args: seen.append(args[0].asnumpy()))
    qat.set_train(False)  # ema_decay 0: the ranges are those of the (only) training batch
    qat(Tensor(x))
    handle.remove()
    out = side["add_op0"]["output"]
    np.testing.assert_allclose([out["min"], out["max"]], [seen[0].min(), seen[0].max()], rtol=1e-6)
    assert list(side).index("add_op0") == list(side).index("relu2") - 1


def test_qat_checkpoint_resumes(pynative, tmp_path):
    """A QAT checkpoint holds the network's names and the <cell>.qat.* ranges; it loads into
    a new quantize_aware copy, which then writes the same record."""
    net = nn.SequentialCell([nn.Dense(6, 3), nn.ReLU()])
    qat = quantize_aware(net, "INT4")
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (16, 6)).astype(np.float32)
    train(qat, x, rng.integers(0, 3, 16).astype(np.int32), lr=0.05)
    ms.save_checkpoint(qat, str(tmp_path / "q.ckpt"))
    names = sorted(ms.load_checkpoint(str(tmp_path / "q.ckpt")))
    assert names == [
        "0.bias",
        "0.qat.input_max",
        "0.qat.input_min",
        "0.qat.input_seen",
        "0.qat.output_max",
        "0.qat.output_min",
        "0.qat.output_seen",
        "0.weight",
        "1.qat.output_max",
        "1.qat.output_min",
        "1.qat.output_seen",
    ]
    again = quantize_aware(net, "INT4")
    assert ms.load_param_into_net(again, ms.load_checkpoint(str(tmp_path / "q.ckpt")))[0] == []
    assert qat_record(again).layers["0"] == qat_record(qat).layers["0"]
