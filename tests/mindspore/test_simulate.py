"""amct_bridge.mindspore.simulate: outputs equal an independent numpy forward of the deployed
integer network (BN folded into the kernel, DMQ-balanced input and kernel, ARQ per output
channel on MindSpore's layouts), in GRAPH_MODE and PyNative; the network is unchanged after."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Model
from numpy.lib.stride_tricks import sliding_window_view

from amct_bridge.errors import RecordError
from amct_bridge.mindspore import extract_graph, simulate
from amct_bridge.mindspore.simulation import simulated
from amct_bridge.records import LayerFactors, Record, save
from amct_bridge.records.model import PruneRecord

MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}


class SimNet(nn.Cell):
    """Stem conv + BN + ReLU, depthwise + ReLU, 1x1 conv (DMQ), residual add, AvgPool2d,
    Flatten, Dense: every quantizable kind but Conv2dTranspose, on 8x8 NCHW input."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.dw = nn.Conv2d(4, 4, 3, group=4, has_bias=True)
        self.relu2 = nn.ReLU()
        self.pw = nn.Conv2d(4, 4, 1, has_bias=True)
        self.pool = nn.AvgPool2d(2, 2)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(64, 3)

    def construct(self, x):
        y = self.relu(self.bn(self.stem(x)))
        z = self.pw(self.relu2(self.dw(y)))
        return self.fc(self.flatten(self.pool(z + y)))


def make_net() -> SimNet:
    net = SimNet()
    rng = np.random.default_rng(0)
    for _, p in net.parameters_and_names():
        shape = tuple(p.shape)
        if p.name.endswith(("moving_variance", "gamma")):
            value = rng.uniform(0.5, 1.5, shape)
        else:
            value = rng.normal(0, 0.4, shape)
        p.set_data(ms.Tensor(value.astype(np.float32)))
    net.set_train(False)
    return net


# ---- numpy reference (independent of the package) -------------------------------------------
def np_fq(x, scale, offset, bits=8):
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    v = np.asarray(x, np.float32) / np.float32(scale)
    q = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5) + offset, qmin, qmax)
    return ((q - offset) * np.float32(scale)).astype(np.float32)


def act_factors(x, bits=8):
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = float(np.float32((hi - lo) / (2**bits - 1)))
    v = lo / scale
    return scale, int(-(2 ** (bits - 1)) - np.sign(v) * np.floor(abs(v) + 0.5))


def arq(w, per_channel):
    """Symmetric scales per output channel (axis 0 of OIHW / OI) or one; /127 vs /128."""
    rows = w.reshape(w.shape[0], -1) if per_channel else w.reshape(1, -1)
    mx, mn = rows.max(axis=1), rows.min(axis=1)
    return np.where(-mn >= mx, -mn / 128, mx / 127).astype(np.float32)


def fq_w(w, scales):
    s = np.asarray(scales, np.float32).reshape((-1,) + (1,) * (w.ndim - 1))
    v = np.asarray(w, np.float32) / s
    return (np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -128, 127) * s).astype(np.float32)


def conv(x, w, b=None, depthwise=False):
    """NCHW, stride 1, 'same' padding (odd kernels)."""
    k = w.shape[-1]
    xp = np.pad(x, ((0, 0), (0, 0), (k // 2, k // 2), (k // 2, k // 2)))
    win = sliding_window_view(xp, (k, k), axis=(2, 3))  # (N, C, H, W, k, k)
    if depthwise:
        y = np.einsum("nchwij,cij->nchw", win, w[:, 0])
    else:
        y = np.einsum("nchwij,ocij->nohw", win, w)
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def weights(net):
    return {n: p.asnumpy().astype(np.float64) for n, p in net.parameters_and_names()}


def bn_k(p, eps):
    return p["bn.gamma"] / np.sqrt(p["bn.moving_variance"] + eps)


def float_parts(net, x):
    """The float activations each quantized cell reads."""
    p, eps = weights(net), float(net.bn.eps)
    k = bn_k(p, eps)
    s = conv(x, p["stem.weight"]) * k.reshape(1, -1, 1, 1)
    y = np.maximum(s + (p["bn.beta"] - p["bn.moving_mean"] * k).reshape(1, -1, 1, 1), 0)
    d = np.maximum(conv(y, p["dw.weight"], p["dw.bias"], depthwise=True), 0)
    z = conv(d, p["pw.weight"], p["pw.bias"])
    a = (z + y).reshape(len(x), 4, 4, 2, 4, 2).mean(axis=(3, 5))
    return {"stem": x, "dw": y, "pw": d, "pool": z + y, "fc": a.reshape(len(x), -1)}


def make_record(net, x, balance, skip_fusion=False):
    p, eps = weights(net), float(net.bn.eps)
    acts = float_parts(net, x)
    stem_w = (
        p["stem.weight"] if skip_fusion else p["stem.weight"] * bn_k(p, eps)[:, None, None, None]
    )
    kernels = {
        "stem": (stem_w, True),
        "dw": (p["dw.weight"], True),
        "pw": (p["pw.weight"] * balance.reshape(1, -1, 1, 1), True),
        "fc": (p["fc.weight"], False),
    }
    layers = {}
    for key, act in acts.items():
        if key == "pw":
            act = act / balance.reshape(1, -1, 1, 1)
        sd, od = act_factors(act)
        f = LayerFactors(scale_d=sd, offset_d=od)
        if key in kernels:
            w, per = kernels[key]
            f.scale_w = [float(s) for s in arq(w.astype(np.float32), per)]
            f.offset_w = [0] * len(f.scale_w)
        layers[key] = f
    layers["pw"].tensor_balance_factor = [float(v) for v in balance]
    layers["stem"].skip_fusion = skip_fusion
    return Record(layers)


def quantized_forward(net, x, record):
    """The deployed network: BN folded into the stem (unless skip_fusion), integer kernels."""
    p, eps, r = weights(net), float(net.bn.eps), record.layers
    k = bn_k(p, eps)
    fold = not r["stem"].skip_fusion
    w = p["stem.weight"] * k[:, None, None, None] if fold else p["stem.weight"]
    s = conv(np_fq(x, r["stem"].scale_d, r["stem"].offset_d), fq_w(w, r["stem"].scale_w))
    if not fold:
        s = s * k.reshape(1, -1, 1, 1)
    y = np.maximum(s + (p["bn.beta"] - p["bn.moving_mean"] * k).reshape(1, -1, 1, 1), 0)
    y = y.astype(np.float32)
    dq = fq_w(p["dw.weight"], r["dw"].scale_w)
    d = conv(np_fq(y, r["dw"].scale_d, r["dw"].offset_d), dq, p["dw.bias"], depthwise=True)
    d = np.maximum(d, 0).astype(np.float32)
    f = np.float32(r["pw"].tensor_balance_factor)
    dd = (d / f.reshape(1, -1, 1, 1)).astype(np.float32)
    pw = fq_w((p["pw.weight"] * f.reshape(1, -1, 1, 1)).astype(np.float32), r["pw"].scale_w)
    z = conv(np_fq(dd, r["pw"].scale_d, r["pw"].offset_d), pw, p["pw.bias"]).astype(np.float32)
    a = np_fq(z + y, r["pool"].scale_d, r["pool"].offset_d)
    a = a.reshape(len(x), 4, 4, 2, 4, 2).mean(axis=(3, 5)).reshape(len(x), -1)
    a = np_fq(a.astype(np.float32), r["fc"].scale_d, r["fc"].offset_d)
    return a @ fq_w(p["fc.weight"], r["fc"].scale_w).T + p["fc.bias"]


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(1).uniform(-1, 1, (4, 3, 8, 8)).astype(np.float32)


def _state(net):
    return [(n, p.name, p.asnumpy().tobytes()) for n, p in net.parameters_and_names()]


@pytest.mark.parametrize("mode", list(MODES))
def test_outputs_match_numpy_deployed_forward(mode, data):
    ms.set_context(mode=MODES[mode])
    net = make_net()
    balance = np.float32([0.5, 2.0, 1.25, 0.8])
    record = make_record(net, data, balance)
    before = net(ms.Tensor(data)).asnumpy()
    state, cells = _state(net), [n for n, _ in net.cells_and_names()]
    res = simulate(net, record, data, batch_size=3)  # two batches: 3 + 1
    want = quantized_forward(net, data, record)
    assert res.outputs.shape == want.shape == (4, 3)
    assert np.allclose(res.outputs, want, atol=1e-5 * float(np.abs(want).max())), np.abs(
        res.outputs - want
    ).max()
    # quantization did something: the float network differs by more than the tolerance
    assert np.abs(before - want).max() > 1e-3
    assert res.accuracy is None and res.cells == ["stem", "dw", "pw", "pool", "fc"]
    # the network is unchanged: parameters (names, bits), cell tree, outputs
    assert _state(net) == state
    assert [n for n, _ in net.cells_and_names()] == cells
    assert type(net.stem).__name__ == "Conv2d"
    assert np.array_equal(net(ms.Tensor(data)).asnumpy(), before)


def test_skip_fusion_quantizes_the_unfused_kernel(data):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = make_net()
    record = make_record(net, data, np.float32([1, 1, 1, 1]), skip_fusion=True)
    got = simulate(net, record, data).outputs
    want = quantized_forward(net, data, record)
    assert np.allclose(got, want, atol=1e-5 * float(np.abs(want).max()))
    # and it differs from quantizing the fused kernel with the same factors
    fused = Record(dict(record.layers))
    fused.layers["stem"] = LayerFactors(**{**vars(record.layers["stem"]), "skip_fusion": False})
    assert not np.allclose(quantized_forward(net, data, fused), want, atol=1e-4)


def _ce(logits, labels):
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(labels)), labels].mean())


def test_model_eval_inside_simulated_graph_mode(data, tmp_path):
    """A Model whose eval network (WithEvalCell, its own compile cache) was compiled before sees
    the simulated network inside the ``with`` and the float one after it: no stale graph in
    either direction. The record comes from a file; labels from a dataset give the accuracy."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net = make_net()
    record = make_record(net, data, np.float32([0.5, 2.0, 1.25, 0.8]))
    # DMQ: the MindSpore schema has no tensor_balance_factor, the inner flavor has
    save(record, tmp_path / "record.txt", flavor="inner")
    want = quantized_forward(net, data, record)
    labels = want.argmax(axis=1).astype(np.int32)
    labels[0] = (labels[0] + 1) % 3  # one wrong of four
    ds = ms.dataset.NumpySlicesDataset((data, labels), ["x", "y"], shuffle=False).batch(2)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss_fn=loss, metrics={"loss"})
    float_loss = model.eval(ds)["loss"]
    assert float_loss == pytest.approx(_ce(net(ms.Tensor(data)).asnumpy(), labels), rel=1e-5)
    # the graph of a network a Model compiled keeps the network's own cell names (MindIR scopes
    # would start with the WithEvalCell's "_network-SimNet/"): the stem's BN is still folded
    assert [n.layer for n in extract_graph(net, data[:1])][:2] == ["stem", "bn"]
    with simulated(net, tmp_path / "record.txt", data[:1], models=(model,)) as names:
        assert names == ["stem", "dw", "pw", "pool", "fc"]
        inside = model.eval(ds)["loss"]
    assert inside == pytest.approx(_ce(want, labels), rel=1e-4)
    assert abs(inside - float_loss) > 1e-3
    assert model.eval(ds)["loss"] == float_loss
    res = simulate(net, tmp_path / "record.txt", ds)
    assert res.accuracy == 0.75
    assert np.allclose(res.outputs, want, atol=1e-5 * float(np.abs(want).max()))


def test_record_without_factors_is_refused(data):
    net = make_net()
    rec = Record({}, prune_records=[PruneRecord()])
    with pytest.raises(RecordError, match=r"has no quantization factors \(no layers and 1 prune"):
        simulate(net, rec, data)


def test_unknown_keys_and_bad_factors_name_the_cell(data):
    net = make_net()
    f = LayerFactors(scale_d=0.1, offset_d=0)
    with pytest.raises(RecordError) as err:
        simulate(net, Record({"stm": f, "bn": f}), data)
    assert str(err.value).splitlines()[:3] == [
        "record keys name no quantizable cell of network 'SimNet':",
        "  find stm failure in model. Please match (did you mean 'stem'?)",
        "  find bn failure in model. Please match",
    ]
    bad = LayerFactors(scale_d=0.1, offset_d=0, scale_w=[0.1, 0.1], offset_w=[0, 0])
    with pytest.raises(RecordError, match=r"record key 'dw' \(Conv2d\): scale_w has 2 values, "):
        simulate(net, Record({"dw": bad}), data)
    dmq = LayerFactors(scale_d=0.1, offset_d=0, tensor_balance_factor=[1.0, 1.0])
    with pytest.raises(RecordError, match=r"'pw' \(Conv2d\): tensor_balance_factor's length 2"):
        simulate(net, Record({"pw": dmq}), data)
    with pytest.raises(RecordError, match="no data"):
        simulate(net, Record({"pw": f}), data[:0])
    with pytest.raises(RecordError, match="give sample_input"):
        with simulated(net, Record({"stem": LayerFactors(scale_w=[0.1], offset_w=[0])})):
            pass
    assert type(net.pw).__name__ == "Conv2d"  # nothing was left behind by the failures


def test_docstring_examples_run():
    import doctest

    import amct_bridge.mindspore.simulation as module

    ms.set_context(mode=ms.PYNATIVE_MODE)
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0 and tried > 0


class TwoInputs(nn.Cell):
    """fc(a) + fc2(b): two network inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(3, 2)
        self.fc2 = nn.Dense(4, 2)

    def construct(self, a, b):
        return self.fc(a) + self.fc2(b)


def test_two_input_network_takes_a_tuple_then_labels():
    """A tuple is one array per network input, then the labels (as calibrate() reads it; the
    arrays were stacked into one before); the outputs are those of simulated() by hand."""
    ms.set_seed(0)
    net = TwoInputs()
    rng = np.random.default_rng(3)
    a = rng.normal(0, 1, (10, 3)).astype(np.float32)
    b = rng.normal(0, 1, (10, 4)).astype(np.float32)
    y = rng.integers(0, 2, 10)
    f = LayerFactors(scale_d=0.05, offset_d=0, scale_w=[0.02], offset_w=[0])
    record = Record({"fc": f, "fc2": f})
    res = simulate(net, record, (a, b, y), batch_size=4)
    with simulated(net, record):
        want = net(ms.Tensor(a), ms.Tensor(b)).asnumpy()
    np.testing.assert_allclose(res.outputs, want, rtol=1e-6)
    assert res.accuracy == float(np.mean(want.argmax(-1) == y))
    assert not np.allclose(want, net(ms.Tensor(a), ms.Tensor(b)).asnumpy())  # quantized
    with pytest.raises(RecordError, match=r"takes 2 inputs, got 1 array\(s\)"):
        simulate(net, record, a)


def test_accuracy_needs_class_outputs(data):
    """Labels with a first output that is not (samples, classes) are refused, not scored by a
    broadcast argmax."""
    net = nn.SequentialCell([nn.Conv2d(3, 2, 1, has_bias=False)])
    f = LayerFactors(scale_d=0.05, offset_d=0, scale_w=[0.02, 0.02], offset_w=[0, 0])
    x = np.random.default_rng(0).normal(0, 1, (4, 3, 5, 5)).astype(np.float32)
    with pytest.raises(
        RecordError, match=r"accuracy needs \(samples, classes\) outputs.*\(4, 2, 5, 5\)"
    ):
        simulate(net, Record({"0": f}), x, np.zeros(4, np.int64))
