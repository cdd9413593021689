"""MindSpore in-graph statistics (amct_bridge.mindspore.instrument) against numpy references.

The reference tensors are the cells' real inputs/outputs, captured with forward hooks in
PYNATIVE mode on the same network (eval mode, so the same numbers run again); the summaries of
min, max, count, per-channel ranges and histograms are recomputed from them with numpy
(amct_bridge.quant.stats.batch_stats and the grid formula written out below).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from amct_bridge.calibration.protocol import Point
from amct_bridge.errors import CalibrationError
from amct_bridge.mindspore.instrument import Instrumentation
from amct_bridge.quant.stats import batch_stats


class Net(nn.Cell):
    """conv-bn-relu stem, depthwise block in a SequentialCell, one ReLU used twice, pool, fc."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, has_bias=True)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.body = nn.SequentialCell([nn.Conv2d(4, 4, 3, group=4), nn.BatchNorm2d(4)])
        self.pool = nn.AvgPool2d(2, 2)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(64, 3)

    def construct(self, x):
        x = self.relu(self.bn(self.conv(x)))
        x = self.relu(self.body(x) + x)
        return self.fc(self.flatten(self.pool(x)))


def make_net(seed: int = 0) -> Net:
    ms.set_seed(seed)
    net = Net()
    rng = np.random.default_rng(seed)
    for cell in (net.bn, net.body[1]):  # non-trivial BN statistics
        cell.moving_mean.set_data(ms.Tensor(rng.normal(0, 0.3, 4).astype(np.float32)))
        cell.moving_variance.set_data(ms.Tensor(rng.uniform(0.5, 2, 4).astype(np.float32)))
    net.set_train(False)
    return net


def make_points(net: Net) -> list[Point]:
    return [
        Point("conv", "input", net.conv, bins=32, channel_axis=1, channels=3),
        Point("conv", "output", net.bn),  # a folded BN's output is observed on the BN
        Point("relu", "output", net.relu, calls=2),
        Point("body.0", "input", net.body[0], bins=32),
        Point("fc", "input", net.fc, bins=16, channel_axis=1, channels=64),
        Point("pool", "output", net.pool),
    ]


def batches() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    x = [rng.normal(0, 1, (2, 3, 8, 8)).astype(np.float32) for _ in range(4)]
    x[1] *= 0.5  # inside the grid set from batch 0
    x[2] *= 3.0  # outside: its own histogram
    x[3] *= 0.5  # inside, but past the limit: its own histogram
    return x


def _recorder(store: list, role: str):
    """A forward (pre-)hook appending the cell's input / output as numpy to ``store``."""
    if role == "input":
        return lambda cell, args: store.append(args[0].asnumpy())
    return lambda cell, args, out: store.append(out.asnumpy())


@pytest.fixture(scope="module")
def reference():
    """Per point, per call: the observed tensor (PYNATIVE forward hooks)."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = make_net()
    points = make_points(net)
    seen: dict[int, list[np.ndarray]] = {i: [] for i in range(len(points))}
    handles = []
    for i, p in enumerate(points):
        if p.role == "input":
            handles.append(p.layer.register_forward_pre_hook(_recorder(seen[i], "input")))
        else:
            handles.append(p.layer.register_forward_hook(_recorder(seen[i], "output")))
    outputs = [net(ms.Tensor(x)).asnumpy() for x in batches()]
    for h in handles:
        h.remove()
    return seen, outputs


def grid_hist(x: np.ndarray, lo: float, hi: float, bins: int) -> np.ndarray:
    """numpy: x binned onto [lo, hi] like batch_stats bins onto its own range."""
    pos = (x.ravel().astype(np.float64) - lo) / ((hi - lo) / bins)
    idx = np.clip(np.floor(pos).astype(np.int64), 0, bins - 1)
    return np.bincount(idx, minlength=bins)


def check_rows(rows, points, seen, batch: int, on_grid: set[int]) -> None:
    """Every point's rows of ``batch`` equal numpy on the hooked tensors."""
    by_point: dict[int, list] = {}
    for row in rows:
        by_point.setdefault(row.point, []).append(row)
    assert sorted(by_point) == list(range(len(points)))
    for i, p in enumerate(points):
        got = by_point[i]
        assert [r.step for r in got] == [batch * p.calls + c for c in range(p.calls)]
        for r, call in zip(got, range(p.calls), strict=True):
            x = seen[i][batch * p.calls + call]
            ref = batch_stats(x, p.bins, p.channel_axis)
            s = r.stats
            assert (s.count, s.min, s.max) == (ref.count, ref.min, ref.max), (p.key, p.role)
            if p.bins and i not in on_grid:
                np.testing.assert_array_equal(s.hist, ref.hist)
            else:
                assert s.hist is None
            if p.channel_axis is not None:
                axes = tuple(a for a in range(x.ndim) if a != 1)
                np.testing.assert_array_equal(r.channel_range, [x.min(axes), x.max(axes)])
                np.testing.assert_array_equal(s.channel_absmax, ref.channel_absmax)
            else:
                assert r.channel_range is None


def test_statistics_equal_numpy_in_both_modes(mode, reference):
    """Direct calls: min/max/count, channel ranges, own and grid histograms, the batch limit."""
    seen, outputs = reference
    net = make_net()
    points = make_points(net)
    inst = Instrumentation(net, points, steps_per_read=2)
    inst.install()
    xs = batches()
    try:
        got = net(ms.Tensor(xs[0])).asnumpy()
        np.testing.assert_array_equal(got, outputs[0])  # outputs unchanged while observed
        check_rows(inst.drain(), points, seen, 0, on_grid=set())
        assert inst.take_histograms([0, 3, 4]) == []  # nothing binned on a grid yet
        binned = [i for i, p in enumerate(points) if p.bins]
        grids = {}
        for i in binned:
            lo = min(a.min() for a in seen[i][:1]) - 0.25
            hi = max(a.max() for a in seen[i][:1]) + 0.25
            inst.set_grid(i, lo, hi)
            grids[i] = inst.grid(i)
            assert grids[i] == (float(np.float32(lo)), float(np.float32(hi)))
        assert inst.grid(1) is None
        net(ms.Tensor(xs[1]))
        check_rows(inst.drain(), points, seen, 1, on_grid=set(binned))
        net(ms.Tensor(xs[2]))  # 3x wider: outside every grid
        check_rows(inst.drain(), points, seen, 2, on_grid=set())
        taken = inst.take_histograms(binned)
        assert [t[0] for t in taken] == binned
        for i, lo, hi, counts in taken:
            assert (lo, hi) == grids[i]
            np.testing.assert_array_equal(counts, grid_hist(seen[i][1], lo, hi, points[i].bins))
        assert inst.take_histograms(binned) == []  # zeroed
        inst.set_limit(3)  # batch 3 (inside the grids) is past the limit: own histograms
        net(ms.Tensor(xs[3]))
        check_rows(inst.drain(), points, seen, 3, on_grid=set())
        assert inst.take_histograms(binned) == [] and inst.due() == []
    finally:
        inst.remove()
    np.testing.assert_array_equal(net(ms.Tensor(xs[0])).asnumpy(), outputs[0])


def names(net) -> tuple[list, list]:
    cells = [(n, type(c).__name__) for n, c in net.cells_and_names()]
    return cells, [(n, p.name) for n, p in net.parameters_and_names()]


def test_network_unchanged_afterwards(mode, tmp_path):
    """Outputs, cell tree, parameter names and the checkpoint are as before."""
    net = make_net()
    x = ms.Tensor(batches()[0])
    before, out = names(net), net(x).asnumpy()
    ms.save_checkpoint(net, str(tmp_path / "before.ckpt"))
    inst = Instrumentation(net, make_points(net))
    inst.install()
    during = names(net)
    assert any(n.endswith("relu.cell") for n, _ in during[0])  # the probes are really there
    net(x)
    inst.remove()
    inst.remove()  # idempotent
    assert names(net) == before
    assert type(net.body.cell_list[0]) is nn.Conv2d  # SequentialCell runs its own cells again
    np.testing.assert_array_equal(net(x).asnumpy(), out)
    ms.save_checkpoint(net, str(tmp_path / "after.ckpt"))
    a = ms.load_checkpoint(str(tmp_path / "before.ckpt"))
    b = ms.load_checkpoint(str(tmp_path / "after.ckpt"))
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key].asnumpy(), b[key].asnumpy())


def test_no_stale_graph_either_way(mode):
    """A network run before install gets observed; after remove nothing is collected."""
    net = make_net()
    x = ms.Tensor(batches()[0])
    net(x)  # compiled (GRAPH) without probes
    inst = Instrumentation(net, [Point("fc", "input", net.fc)])
    inst.install()
    net(x)
    net(x)
    assert [r.step for r in inst.drain()] == [0, 1]
    inst.remove()
    probe_count = inst._probes[0].count  # the Parameter the old graph would still write
    net(x)
    assert int(probe_count.asnumpy()) == 2 and inst.drain() == []
    inst.install()  # and in again: the graph without probes must not be reused either
    net(x)
    assert [r.step for r in inst.drain()] == [2]
    inst.remove()


def test_graph_without_probes_kept_across_the_swap():
    """GRAPH_MODE: after remove, the graph compiled before install is what runs again.

    MindSpore reruns a compiled graph when its phase (phase, creation time, id) is in the cell's
    compile cache and compiled (graph.api's reuse test)."""
    from mindspore.graph.api import _cell_graph_executor

    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        net = make_net()
        x = ms.Tensor(batches()[0])
        plain = net(x).asnumpy()
        phase, cache = net.compile_phase, set(net.compile_cache)
        inst = Instrumentation(net, [Point("fc", "input", net.fc)])
        inst.install()
        net(x)
        probed = net.compile_phase
        assert probed != phase and _cell_graph_executor.has_compiled(phase)
        inst.remove()
        assert set(net.compile_cache) == cache | {probed}  # freed with the net or next install
        assert phase in net.compile_cache and _cell_graph_executor.has_compiled(phase)
        np.testing.assert_array_equal(net(x).asnumpy(), plain)
        assert net.compile_phase == phase and [r.step for r in inst.drain()] == [0]
    finally:
        ms.set_context(mode=before)


def dataset(n_batches: int = 2):
    from mindspore import dataset as ds

    rng = np.random.default_rng(2)
    x = rng.normal(0, 1, (2 * n_batches, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, 2 * n_batches).astype(np.int32)
    return ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False).batch(2), x


def make_model(net):
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    return ms.Model(net, loss_fn=loss, optimizer=opt, metrics={"loss"})


def test_model_eval_observed_and_released(mode):
    """Model.eval compiles its own eval network: it must be rebuilt on install and remove."""
    net = make_net()
    model = make_model(net)
    data, x = dataset()
    model.eval(data)  # the eval network is compiled (GRAPH) before the probes go in
    inst = Instrumentation(net, [Point("conv", "input", net.conv, bins=8)], steps_per_read=4)
    inst.forget_graphs(model._eval_network)
    inst.install()
    model.eval(data)
    rows = inst.drain()
    assert [r.step for r in rows] == [0, 1]
    for r, k in zip(rows, range(2), strict=True):
        ref = batch_stats(x[2 * k : 2 * k + 2], 8)
        assert (r.stats.min, r.stats.max, r.stats.count) == (ref.min, ref.max, ref.count)
        np.testing.assert_array_equal(r.stats.hist, ref.hist)
    inst.remove()
    model.eval(data)
    assert int(inst._probes[0].count.asnumpy()) == 2


def test_model_train_gradients_unchanged(mode):
    """One Model.train epoch with probes trains exactly like one without."""
    trained = []
    for observed in (False, True):
        data, x = dataset()  # a dataset serves one Model only
        net = make_net()
        net.set_train(True)
        model = make_model(net)
        inst = Instrumentation(net, make_points(net), compiled=[model._train_network])
        if observed:
            inst.install()
        model.train(1, data)
        if observed:
            rows = inst.drain()
            inst.remove()
            steps = sorted({(r.point, r.step) for r in rows})
            expect = [(i, s) for i, p in enumerate(make_points(net)) for s in range(2 * p.calls)]
            assert steps == expect
            assert rows[0].stats.count == x[:2].size
            assert rows[0].stats.min == x[:2].min() and rows[0].stats.max == x[:2].max()
        params = {p.name: p.asnumpy() for p in net.get_parameters()}
        trained.append(params)
    assert sorted(trained[0]) == sorted(trained[1])
    for name, value in trained[0].items():
        np.testing.assert_array_equal(trained[1][name], value, err_msg=name)
    assert not np.array_equal(trained[0]["fc.weight"], make_net().fc.weight.asnumpy())


class UsesWeight(nn.Cell):
    """A parent reading its child's weight directly, and a shared cell called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(3, 3)
        self.relu = nn.ReLU()

    def construct(self, x):
        y = self.relu(self.fc(x)) + ms.ops.matmul(x, self.fc.weight)
        return self.relu(y)


def test_attribute_access_and_call_count_errors(mode):
    """self.fc.weight still resolves through the probe; an understated call count is caught."""
    net = UsesWeight()
    x = ms.Tensor(np.float32([[1, -2, 3], [0.5, 0, -1]]))
    out = net(x).asnumpy()
    inst = Instrumentation(net, [Point("relu", "input", net.relu)], steps_per_read=1)
    inst.install()
    try:
        np.testing.assert_array_equal(net(x).asnumpy(), out)
        with pytest.raises(CalibrationError, match="ran 2 times since the last read"):
            inst.drain()
    finally:
        inst.remove()


def test_bad_points():
    net = make_net()
    with pytest.raises(CalibrationError, match="'fc'.*not 'inner'"):
        Instrumentation(net, [Point("fc", "inner", net.fc)])
    inst = Instrumentation(net, [Point("net", "input", net)])
    with pytest.raises(CalibrationError, match="top-level cell itself cannot be observed"):
        inst.install()
    assert not inst._installed


def test_nan_and_inf_reach_the_host(mode):
    """A NaN/Inf batch gives a non-finite min/max row (the core stops on it), no crash, and
    nothing of it lands on the grid."""
    net = make_net()
    inst = Instrumentation(net, [Point("conv", "input", net.conv, bins=8)], steps_per_read=4)
    inst.set_grid(0, -10.0, 10.0)
    inst.install()
    x = batches()[1]
    bad = [x.copy(), x.copy()]
    bad[0][0, 0, 0, 0] = np.nan
    bad[1][1, 2, 3, 4] = np.inf
    for b in bad:
        net(ms.Tensor(b))
    rows = inst.drain()
    inst.remove()
    assert np.isnan(rows[0].stats.min) and np.isnan(rows[0].stats.max)
    assert rows[1].stats.max == np.inf and rows[1].stats.min == x.min()
    assert all(r.stats.hist is not None for r in rows)  # not inside the grid: own rows
    assert inst.take_histograms([0]) == []


def test_nan_flag_is_exact_on_a_min_max_point(mode):
    """Without a histogram, a NaN that is not the first element still makes the row NaN; huge
    finite values of both signs (partial sums could overflow to +inf and -inf) do not; +inf and -inf
    keep their own min/max."""
    pool = nn.SequentialCell([nn.AvgPool2d(2, 2)])
    inst = Instrumentation(pool, [Point("0", "input", pool[0])], steps_per_read=4)
    inst.install()
    nan_mid = np.ones((2, 3, 8, 8), np.float32)
    nan_mid[1, 2, 5, 6] = np.nan
    huge = np.full((2, 3, 8, 8), 3e38, np.float32)
    huge[1] = -3e38  # partial sums could overflow both ways
    infs = np.zeros((2, 3, 8, 8), np.float32)
    infs[0, 0, 0, 1], infs[1, 1, 1, 1] = np.inf, -np.inf
    for b in (nan_mid, huge, infs):
        pool(ms.Tensor(b))
    rows = inst.drain()
    inst.remove()
    assert np.isnan(rows[0].stats.min) and np.isnan(rows[0].stats.max)
    assert (rows[1].stats.min, rows[1].stats.max) == (
        float(np.float32(-3e38)),
        float(np.float32(3e38)),
    )
    assert (rows[2].stats.min, rows[2].stats.max) == (-np.inf, np.inf)
