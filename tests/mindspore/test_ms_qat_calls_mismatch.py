"""MindSpore QAT of a shared cell whose calls per step differ from the graph's call sites.

MindSpore's compiler merges identical calls (CSE): in ``fc(x) + fc(x) + fc(relu(x))`` the
MindIR export computes ``fc(x)`` once (sites ``fc``, ``fc@1``), while the QAT cells (their
range updates are side effects) make all 3 calls run, so ``calls mod 2`` used to rotate the
site across steps and give ``fc@1`` the range of ``x`` (min < 0 though ``relu(x) >= 0``),
silently. ``quantize_aware`` now counts the calls of one forward and refuses, naming the cell,
the sites and the calls. Shared cells the compiler does not merge still train per site, their
input EMAs checked against a numpy EMA (``core.ema_update``). Real MindSpore 2.10 on CPU,
GRAPH_MODE and PyNative.
"""

from __future__ import annotations

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Model
from nets import DenseBackToBack, SharedDense

from amct_bridge.errors import QuantError
from amct_bridge.mindspore.qat import quantize_aware, save_qat_record
from amct_bridge.quant import qat as core
from amct_bridge.records.calibration import load_stats, sidecar_path

DECAY = 0.5


class Merged(nn.Cell):
    """``fc(x)`` written twice: the export computes it once (2 sites), 3 calls run."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(6, 6)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.fc(x) + self.fc(x) + self.fc(self.relu(x))


def inputs(n: int = 12, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(0, 2, (n, 6)).astype(np.float32), rng.integers(0, 6, n).astype(np.int32)


def train(qat, x, y, batch=4):
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(qat, loss, nn.SGD(qat.trainable_params(), 0.0))  # lr 0: weights unchanged
    model.train(1, ds.NumpySlicesDataset((x, y), ["x", "y"], shuffle=False).batch(batch))


def numpy_ema(batches: list[np.ndarray]) -> tuple[float, float]:
    lo = hi = 0.0
    for k, b in enumerate(batches):
        lo, hi = core.ema_update(lo, hi, b.min(), b.max(), DECAY, first=k == 0)
    return lo, hi


def test_compiler_merged_calls_are_refused_naming_cell_sites_and_calls(mode, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ms.set_seed(1)
    net = Merged()
    with pytest.raises(QuantError) as err:
        quantize_aware(net, "INT8", sample_input=(4, 6))
    text = str(err.value)
    assert "cell 'fc' (Dense)" in text, text
    assert "2 call site(s) per step ('fc', 'fc@1')" in text, text
    assert "calls it 3 time(s) per step" in text, text
    assert "reuse its result" in text and "its own cell" in text, text
    assert type(net.fc) is nn.Dense  # the network is not changed
    assert list(tmp_path.iterdir()) == []  # nothing written (no debris of the forward either)


@pytest.mark.parametrize("cls", [SharedDense, DenseBackToBack])
def test_shared_cells_the_compiler_keeps_apart_are_not_refused(mode, cls):
    """The counting forward leaves nothing behind: counters and ranges at 0, eval mode kept."""
    ms.set_seed(2)
    net = cls()
    net.set_train(False)
    qat = quantize_aware(net, sample_input=(4, 6))
    assert qat.amct_qat.sites == {"fc": ["fc", "fc@1"]}
    params = {p.name: p.asnumpy() for p in qat.get_parameters()}
    assert params["fc.qat.calls"] == 0
    assert all(not v.any() for k, v in params.items() if ".qat." in k)
    assert not any(c.training for _, c in qat.cells_and_names())
    assert not any(getattr(c, "counting", False) for _, c in qat.cells_and_names())


def test_per_site_input_ranges_of_a_shared_cell(mode, tmp_path):
    """``fc(x) + fc(relu(x))``: each site's input EMA is the numpy EMA of its own input, so
    ``fc@1``'s min is >= 0; the sidecar carries them under the graph's site names (as
    observed; both sites clip at their union, the record's one range)."""
    ms.set_seed(3)
    net = SharedDense()
    x, y = inputs()
    qat = quantize_aware(net, ema_decay=DECAY, sample_input=(4, 6))
    train(qat, x, y)
    batches = [x[k : k + 4] for k in range(0, len(x), 4)]
    want = {"fc": numpy_ema(batches), "fc@1": numpy_ema([np.maximum(b, 0) for b in batches])}
    params = {p.name: p.asnumpy() for p in qat.get_parameters()}
    assert params["fc.qat.calls"] == 2 * 3
    np.testing.assert_array_equal(params["fc.qat.input_seen"], [3, 3])
    for k, site in enumerate(["fc", "fc@1"]):
        got = params["fc.qat.input_min"][k], params["fc.qat.input_max"][k]
        np.testing.assert_allclose(got, want[site], rtol=1e-6, atol=1e-6, err_msg=site)
    assert params["fc.qat.input_min"][1] >= 0
    save_qat_record(qat, tmp_path / "qat.txt")
    layers = load_stats(sidecar_path(tmp_path / "qat.txt")).layers
    union = (min(lo for lo, _ in want.values()), max(hi for _, hi in want.values()))
    for site, (lo, hi) in want.items():
        got = layers[site].input
        have = (got.observed_min, got.observed_max, got.min, got.max)
        np.testing.assert_allclose(have, (lo, hi, *union), rtol=1e-6, atol=1e-6, err_msg=site)
    assert layers["fc@1"].input.observed_min >= 0
