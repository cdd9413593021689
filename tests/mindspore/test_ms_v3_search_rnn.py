"""Issue 31, MindSpore: the v3 exponent search scores an nn.GRU keyword-spotting net one sample
at a time (the runtime runs GRU / LSTM at batch 1) on the first ``V3_RNN_SAMPLES`` calibration
samples; the MindSpore adapter hands the float outputs over on more samples and the search
takes the rows it scores. The searched file passes ``espdl-run --check`` and its output SNR
against the net on those samples (each simulated on its own) is at least the range rule's."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn

import amct_bridge.mindspore as ams
from amct_bridge.cli import main
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.espdl.v3.evaluation import quantize_input
from amct_bridge.espdl.v3.search import V3_RNN_SAMPLES

T, F, H, SAMPLES = 8, 6, 8, 64


class Kws(nn.Cell):
    """nn.GRU over (N, T, F), its last step, nn.Dense(4)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(F, H, batch_first=True)
        self.fc = nn.Dense(H, 4)

    def construct(self, x):
        y, _ = self.rnn(x)
        return self.fc(y[:, -1])


def _snr(path, x: np.ndarray, ref: np.ndarray) -> float:
    """The simulated chip's output SNR (dB) against ``ref``, one sample per run."""
    model = read_espdl(path)
    q = quantize_input(model, x, "esp32s3")
    out = model.outputs[0]
    rows = [simulate_espdl(model, q[i : i + 1], "esp32s3").outputs[out.name] for i in range(len(q))]
    got = np.concatenate(rows).astype(np.float64) * 2.0**out.exponent
    ref = ref.astype(np.float64).reshape(got.shape)
    return float(10 * np.log10(np.sum(ref**2) / np.sum((got - ref) ** 2)))


def test_search_scores_a_gru_net(tmp_path):
    ms.set_seed(2)
    net = Kws()
    rng = np.random.default_rng(7)
    for p in net.rnn.get_parameters():  # random biases, larger kernels: every gate matters
        value = p.asnumpy()
        value = rng.normal(0, 0.4, value.shape) if value.ndim == 1 else value * 1.5
        p.set_data(ms.Tensor(value.astype(np.float32)))
    net.set_train(False)
    data = np.random.default_rng(0).normal(0, 1, (SAMPLES, T, F)).astype(np.float32)
    record = tmp_path / "r.txt"
    ams.calibrate(net, data, record, algorithm="minmax")
    rule, searched = tmp_path / "rule.espdl", tmp_path / "searched.espdl"
    options = {"sample_input": (1, T, F), "format": "espdl", "target": "esp32s3"}
    ams.export_espdl(net, record, rule, **options)
    res = ams.export_espdl(net, record, searched, calibration_data=data, **options)
    note = next(n for n in res.notes if "exponents" in n)
    assert note.startswith(f"exponents searched on {V3_RNN_SAMPLES} of {SAMPLES} calibration")
    assert main(["espdl-run", str(searched), "--check"]) == 0
    scored = data[:V3_RNN_SAMPLES]
    ref = net(ms.Tensor(scored)).asnumpy()
    base, best = _snr(rule, scored, ref), _snr(searched, scored, ref)
    assert best >= base - 1e-9, (base, best, note)
    assert base > 20
