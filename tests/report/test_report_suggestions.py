"""The report's SNR chart keeps its legend off the bars, and a record with no accuracy drop gets
no "keep these layers in float" suggestion (issue 23 §6). A numpy runner, no framework."""

from __future__ import annotations

import numpy as np
import pytest

from amct_bridge.config import parse_simple_config
from amct_bridge.records import LayerFactors, Record
from amct_bridge.report import LayerInfo, LayerRow, Report, RunResult, build_report, text_table
from amct_bridge.report.plots import snr_figure


class Scaled:
    """Two "layers" (y = x · gain) quantizing their input with the record's scale_d. ``step``
    sets how coarse the record is: small keeps every arg max, large changes many."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.x = rng.uniform(-1, 1, (300, 4))
        self.parts = ["a", "b"]

    def layers(self):
        return [LayerInfo(k, k, "Toy") for k in self.parts]

    def run(self, record, keys):
        x, outputs, inputs = self.x, {}, {}
        for key in self.parts:
            inputs[key] = x
            f = record.layers.get(key) if record else None
            if f is not None:
                x = np.round(x / f.scale_d) * f.scale_d
            x = x * 1.5
            outputs[key] = x
        return RunResult(x, {k: outputs[k] for k in keys}, inputs if record is None else {})


def _record(step: float) -> Record:
    return Record({k: LayerFactors(scale_d=step, offset_d=0) for k in ("a", "b")})


def test_no_accuracy_drop_suggests_no_layer_in_float():
    runner = Scaled()
    labels = runner.run(None, []).final.argmax(axis=1)
    rep = build_report(_record(1e-4), runner, labels, top_k=1)
    # independent: the quantized arg max is the float one on every sample
    quantized = runner.run(_record(1e-4), []).final.argmax(axis=1)
    assert np.array_equal(quantized, labels)
    assert rep.float_accuracy == rep.quantized_accuracy == 1.0
    assert rep.no_drop and rep.skip_layers == [] and rep.kept_float_accuracy is None
    assert parse_simple_config(rep.fragment).skip_layers == []
    assert "no accuracy drop" in rep.fragment and "skip_layers" not in rep.fragment
    text = text_table(rep)
    assert "no layer needs to stay in float" in text and " in float 1.0000" not in text
    assert rep.top  # the ranking is still reported


def test_an_accuracy_drop_still_suggests_the_worst_layer():
    runner = Scaled()
    labels = runner.run(None, []).final.argmax(axis=1)
    rep = build_report(_record(0.5), runner, labels, top_k=1)
    quantized = runner.run(_record(0.5), []).final.argmax(axis=1)
    assert rep.quantized_accuracy == pytest.approx(np.mean(quantized == labels))
    assert rep.quantized_accuracy < 1.0
    assert not rep.no_drop and len(rep.skip_layers) == 1
    assert parse_simple_config(rep.fragment).skip_layers == rep.skip_layers


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("n", [1, 3, 12])
def test_snr_legend_covers_no_bar(n):
    # bars of full height in every slot: a legend inside the axes has no free corner
    rows = [
        LayerRow(f"l{i}", f"l{i}", "Conv2D", snr_alone=40.0, snr_cumulative=38.0, snr_model=39.0)
        for i in range(n)
    ]
    for rank, row in enumerate(rows, 1):
        row.rank = rank
    fig = snr_figure(Report(rows=rows, samples=8))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(renderer)
    bars = [p.get_window_extent(renderer) for p in ax.patches]
    assert len(bars) == 3 * n
    assert not [b for b in bars if _overlap(b, legend)]
    # and the legend is drawn inside the figure (not cut off)
    page = fig.bbox
    assert page.x0 <= legend.x0 and legend.x1 <= page.x1 and legend.y1 <= page.y1
