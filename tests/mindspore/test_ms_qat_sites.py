"""MindSpore QAT of cells called at several sites per step (the tutorial LeNet5's one
``self.relu`` called four times): each site keeps its own ranges, named as the graph and the
calibration sidecar name them (``relu``, ``relu@1``...), and the ESP-DL export uses them; a
quantized cell called at two sites clips both at the union of its sites' ranges (the record
holds one); GRAPH_MODE and PyNative.

References are independent of amct_bridge's graph code: the plain network's cells run one by
one in PyNative (the site outputs), the EMA is ``core.ema_update`` (numpy, float32) and the
fake-quantized Dense is ``core.fake_quant_range`` / ``core.arq_fake_quant`` in numpy.
"""

from __future__ import annotations

import logging

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Model

from amct_bridge.errors import QuantError
from amct_bridge.mindspore import export_espdl, simulate
from amct_bridge.mindspore.qat import qat_stats, quantize_aware, save_qat_record, strip_qat
from amct_bridge.quant import qat as core
from amct_bridge.quant.espdl import range_to_exponent
from amct_bridge.quant.factors import activation_factors
from amct_bridge.records.calibration import load_stats, sidecar_path

SAMPLE = (1, 1, 12, 12)
DECAY = 0.5


class TinyLeNet(nn.Cell):
    """LeNet5's construct on a 12x12 input: one ``relu`` at four sites, one ``max_pool2d`` at
    two."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 2, 3, pad_mode="valid")
        self.conv2 = nn.Conv2d(2, 4, 3, pad_mode="valid")
        self.fc1 = nn.Dense(4, 8)
        self.fc2 = nn.Dense(8, 6)
        self.fc3 = nn.Dense(6, 3)
        self.relu = nn.ReLU()
        self.max_pool2d = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()

    def construct(self, x):
        x = self.max_pool2d(self.relu(self.conv1(x)))
        x = self.max_pool2d(self.relu(self.conv2(x)))
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


def tiny_lenet() -> TinyLeNet:
    ms.set_seed(0)
    net = TinyLeNet()
    for name, p in net.parameters_and_names():
        if name.startswith("fc2."):
            p.set_data(p * 20)  # the sites' ranges far apart
    net.set_train(False)
    return net


def data(n: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 2, (n, 1, 12, 12)).astype(np.float32)
    return x, rng.integers(0, 3, n).astype(np.int32)


def train(qat, x, y, lr=0.0, batch=4):
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(qat, loss, nn.SGD(qat.trainable_params(), lr))
    model.train(1, ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(batch))


def site_outputs(net: TinyLeNet, b: np.ndarray) -> dict[str, np.ndarray]:
    """Every call site's output, the plain network's cells run one by one in PyNative."""
    before = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        a1 = net.relu(net.conv1(Tensor(b)))
        p1 = net.max_pool2d(a1)
        a2 = net.relu(net.conv2(p1))
        p2 = net.max_pool2d(a2)
        a3 = net.relu(net.fc1(net.flatten(p2)))
        a4 = net.relu(net.fc2(a3))
    finally:
        ms.set_context(mode=before)
    out = {"relu": a1, "relu@1": a2, "relu@2": a3, "relu@3": a4, "max_pool2d": p1}
    out["max_pool2d@1"] = p2
    return {k: v.asnumpy() for k, v in out.items()}


def numpy_ema(batches: list[np.ndarray]) -> tuple[float, float]:
    lo = hi = 0.0
    for k, b in enumerate(batches):
        lo, hi = core.ema_update(lo, hi, b.min(), b.max(), DECAY, first=k == 0)
    return lo, hi


def test_per_site_ranges_are_the_numpy_ema_of_each_site(mode, tmp_path):
    """Only fc3 quantized (lr 0): every relu / max_pool2d site sees the float network's
    tensors, so each site's range is the EMA of that site's outputs over the batches."""
    net = tiny_lenet()
    x, y = data()
    skip = ["conv1", "conv2", "fc1", "fc2"]
    qat = quantize_aware(net, ema_decay=DECAY, skip_layers=skip, sample_input=SAMPLE)
    info = qat.amct_qat
    assert info.sites == {
        "relu": ["relu", "relu@1", "relu@2", "relu@3"],
        "max_pool2d": ["max_pool2d", "max_pool2d@1"],
    }
    train(qat, x, y)
    outs = [site_outputs(net, x[k : k + 4]) for k in range(0, len(x), 4)]
    want = {site: numpy_ema([o[site] for o in outs]) for site in outs[0]}
    params = {p.name: p.asnumpy() for p in qat.get_parameters()}
    assert params["relu.qat.output_max"].shape == (4,)
    assert params["relu.qat.calls"] == 4 * 3 and params["max_pool2d.qat.calls"] == 2 * 3
    np.testing.assert_array_equal(params["relu.qat.output_seen"], [3, 3, 3, 3])
    for k, site in enumerate(["relu", "relu@1", "relu@2", "relu@3"]):
        got = params["relu.qat.output_min"][k], params["relu.qat.output_max"][k]
        np.testing.assert_allclose(got, want[site], rtol=1e-6, atol=1e-7, err_msg=site)
    save_qat_record(qat, tmp_path / "qat.txt")
    layers = load_stats(sidecar_path(tmp_path / "qat.txt")).layers
    for site, (lo, hi) in want.items():
        got = layers[site].output
        observed = (got.observed_min, got.observed_max) if site == "relu@3" else (got.min, got.max)
        np.testing.assert_allclose(observed, (lo, hi), rtol=1e-6, atol=1e-7, err_msg=site)
    # relu@3 is what fc3 reads: fc3's clip range (its own EMA of the same tensor)
    assert layers["relu@3"].output.max == layers["fc3"].input.max
    maxima = [layers[s].output.max for s in ("relu", "relu@1", "relu@2", "relu@3")]
    assert max(maxima) > 3 * min(maxima)  # the sites do differ: one range would merge them
    # execution order, a cell's sites right after its first one (as the calibration sidecar)
    # (the skip_layers cells are observed too: their output EMAs feed the export)
    assert [k for k in layers if k not in skip] == [*want, "fc3"]
    assert all(layers[k].output is not None for k in skip)


def test_lenet_sidecar_sites_feed_the_export(tmp_path):
    """Fully quantized, trained a few steps (GRAPH_MODE): the sidecar has the calibration
    sidecar's site keys, strip_qat + simulate reproduce the QAT network, and the ESP-DL v1
    export takes each chain's output exponent from its own site (conv1's is no longer the
    merged range's)."""
    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        net = tiny_lenet()
        x, y = data(16, seed=1)
        qat = quantize_aware(net, "INT8", sample_input=SAMPLE)
        train(qat, x, y, lr=0.01)
        path = tmp_path / "qat.txt"
        record = save_qat_record(qat, path)
        qat.set_train(False)
        want = qat(Tensor(x)).asnumpy()
    finally:
        ms.set_context(mode=before)
    layers = load_stats(sidecar_path(path)).layers
    sites = ["relu", "relu@1", "relu@2", "relu@3", "max_pool2d", "max_pool2d@1"]
    assert set(sites) <= set(layers)
    plain = strip_qat(qat)
    np.testing.assert_allclose(simulate(plain, record, x).outputs, want, rtol=1e-4, atol=1e-4)
    res = export_espdl(plain, path, None, sample_input=x[:1], feature_type="s8")
    by_source = {layer.source: layer for layer in res.layers}
    exponents = {}
    for conv, key in (("conv1", "relu"), ("conv2", "relu@1"), ("fc1", "relu@2"), ("fc2", "relu@3")):
        exported = by_source[conv]
        assert exported.sources["output_exponent"] == f"sidecar output range of {key!r}"
        exponents[conv] = exported.entry["output_exponent"]
        assert exponents[conv] == range_to_exponent(0.0, layers[key].output.max), conv
    merged = range_to_exponent(0.0, max(layers[k].output.max for k in sites[:4]))
    assert exponents["conv1"] != merged  # what one range for the four sites forced
    assert len(set(exponents.values())) > 1


class SharedDense(nn.Cell):
    """``fc`` quantized and called at two sites whose inputs differ (``mid`` scales by ~5)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(4, 4)
        self.mid = nn.Dense(4, 4)
        self.out = nn.Dense(4, 2)

    def construct(self, x):
        return self.out(self.fc(self.mid(self.fc(x))))


def shared_dense() -> SharedDense:
    net = SharedDense()
    rng = np.random.default_rng(5)
    for name, p in net.parameters_and_names():
        scale = 2.5 if name.startswith("mid.") else 0.5
        p.set_data(Tensor(rng.normal(0, scale, p.shape).astype(np.float32)))
    net.set_train(False)
    return net


def _dense(cell, x):
    return x @ cell.weight.asnumpy().T + cell.bias.asnumpy()


# two of the four mode x range pairs: each mode and each range once (suite time)
@pytest.mark.parametrize(
    ("mode", "activation_range"), [("graph", "ema"), ("pynative", "learned")], indirect=["mode"]
)
def test_a_quantized_cell_at_two_sites_clips_both_at_the_union(mode, activation_range, caplog):
    """EMA: each site keeps its own input EMA (numpy reference: fc's fake-quantized forward,
    site by site, clipping at the union of the sites' EMAs so far; mid skipped, float);
    learned: one range, started at the union of the first step's sites. The record's factors
    are the union's, and simulate(strip_qat) reproduces the QAT network."""
    net = shared_dense()
    rng = np.random.default_rng(6)
    x = rng.normal(0, 1, (12, 4)).astype(np.float32)
    with caplog.at_level(logging.WARNING, "amct_bridge.mindspore.qat.model"):
        qat = quantize_aware(
            net,
            ema_decay=DECAY,
            activation_range=activation_range,
            skip_layers=["mid", "out"] if activation_range == "ema" else ["mid"],
            sample_input=(1, 4),
        )
    assert "'fc' (sites fc, fc@1)" in caplog.text and "one range" in caplog.text
    batches = [x[k : k + 4] for k in range(0, 12, 4)] if activation_range == "ema" else [x[:4]]
    train(qat, np.concatenate(batches), np.zeros(4 * len(batches), np.int32))

    wq = core.arq_fake_quant(net.fc.weight.asnumpy(), "OI", 8)
    bias = net.fc.bias.asnumpy()
    state = [[0.0, 0.0, 0], [0.0, 0.0, 0]]  # per site: lo, hi, seen
    learned = None
    for b in batches:
        inp = b
        for site in (0, 1):
            lo, hi, seen = state[site]
            lo, hi = core.ema_update(lo, hi, inp.min(), inp.max(), DECAY, first=seen == 0)
            state[site] = [lo, hi, seen + 1]
            if activation_range == "ema":
                clip = (min(state[0][0], state[1][0]), max(state[0][1], state[1][1]))
            else:  # site 0 of step 1 starts it, site 1 widens it
                learned = (inp.min(), inp.max()) if learned is None else learned
                learned = (min(learned[0], inp.min()), max(learned[1], inp.max()))
                clip = learned
            yq = core.fake_quant_range(inp, *clip, 8) @ wq.T + bias
            inp = _dense(net.mid, yq) if site == 0 else yq
    params = {p.name: p.asnumpy() for p in qat.get_parameters()}
    if activation_range == "ema":
        assert params["fc.qat.input_min"].shape == (2,)
        for site in (0, 1):
            got = params["fc.qat.input_min"][site], params["fc.qat.input_max"][site]
            np.testing.assert_allclose(got, state[site][:2], rtol=1e-5, atol=1e-6)
        union = (min(state[0][0], state[1][0]), max(state[0][1], state[1][1]))
    else:
        assert params["fc.qat.input_min"].shape == () and params["fc.qat.input_seen"] == 1
        union = learned
        got = params["fc.qat.input_min"], params["fc.qat.input_max"]
        np.testing.assert_allclose(got, union, rtol=1e-5, atol=1e-6)
    wide = [state[k][1] - state[k][0] for k in (0, 1)]
    assert wide[1] > 1.5 * wide[0]  # the sites differ (site 1 reads mid's wider output)
    stats = qat_stats(qat)
    assert (
        stats.layers["fc"].input.max
        == stats.layers["fc@1"].input.max
        == pytest.approx(union[1], rel=1e-5)
    )
    from amct_bridge.mindspore.qat import qat_record

    record = qat_record(qat)
    scale_d, offset_d = activation_factors(*union, 8, False)
    assert record.layers["fc"].scale_d == pytest.approx(scale_d, rel=1e-5)
    assert record.layers["fc"].offset_d == offset_d
    qat.set_train(False)
    xt = rng.normal(0, 1, (5, 4)).astype(np.float32)
    want = qat(Tensor(xt)).asnumpy()
    np.testing.assert_allclose(
        simulate(strip_qat(qat), record, xt).outputs, want, rtol=1e-4, atol=1e-4
    )


def test_sample_input_is_required_where_cells_may_be_shared():
    with pytest.raises(QuantError, match="'TinyLeNet'.*give sample_input.*construct of its own"):
        quantize_aware(tiny_lenet())
    relu = nn.ReLU()
    with pytest.raises(QuantError, match="cell '0' \\(ReLU\\) is held at several places"):
        quantize_aware(nn.SequentialCell([relu, nn.Dense(2, 2), relu]))
    # nested SequentialCells call each child once: no graph needed
    nested = nn.SequentialCell([nn.SequentialCell([nn.Dense(2, 2), nn.ReLU()]), nn.Dense(2, 1)])
    assert quantize_aware(nested).amct_qat.sites == {}


class Block(nn.Cell):
    """A residual block written the common way: one ``relu`` before and after ``+ identity``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 2, 3)
        self.conv2 = nn.Conv2d(2, 2, 3)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(2 * 4 * 4, 3)

    def construct(self, x):
        y = self.relu(self.conv1(x))
        return self.fc(self.flatten(self.relu(self.conv2(y) + y)))


def test_an_add_read_by_a_second_site_gets_that_sites_input_range(mode, tmp_path):
    """``out = relu(conv2(y) + y)``, the block's second call of ``relu``: the add's sidecar
    entry is relu@1's input EMA (reference: the plain block's add output, by hand)."""
    ms.set_seed(0)
    net = Block()
    net.set_train(False)
    x = np.random.default_rng(7).normal(0, 1, (8, 2, 4, 4)).astype(np.float32)
    qat = quantize_aware(net, ema_decay=DECAY, skip_layers=["conv1", "conv2"], sample_input=x[:1])
    assert qat.amct_qat.functional == {"add_op0": ("Add", "relu@1")}
    train(qat, x, np.zeros(8, np.int32))
    before = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        adds = []
        for k in (0, 4):
            y = net.relu(net.conv1(Tensor(x[k : k + 4])))
            adds.append((net.conv2(y) + y).asnumpy())
    finally:
        ms.set_context(mode=before)
    save_qat_record(qat, tmp_path / "qat.txt")
    layers = load_stats(sidecar_path(tmp_path / "qat.txt")).layers
    got = layers["add_op0"].output
    np.testing.assert_allclose((got.min, got.max), numpy_ema(adds), rtol=1e-6, atol=1e-7)
    assert got.min < 0 and layers["relu@1"].output.min == 0.0  # before and after the ReLU
