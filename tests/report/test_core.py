"""Report core with a numpy "model" (no framework): ranking, grouping of a layer's parts,
DMQ-divided inputs, the config fragment, JSON and HTML."""

import base64
import json
import math
import re

import numpy as np
import pytest

from amct_bridge.config import parse_simple_config
from amct_bridge.errors import CalibrationError, RecordError
from amct_bridge.records import LayerFactors, Record
from amct_bridge.report import (
    LayerInfo,
    RunResult,
    build_report,
    clip_range,
    render_html,
    saturated_share,
    snr_db,
    text_table,
    top1_accuracy,
)


def fq(x, f):
    q = np.clip(np.copysign(np.floor(np.abs(x / f.scale_d) + 0.5), x) + f.offset_d, -128, 127)
    return (q - f.offset_d) * f.scale_d


class Chain:
    """Three elementwise "layers" a -> b -> c (y = x * gain per channel); each quantizes its
    input with the record's scale_d/offset_d (divided by a DMQ factor first, if any). b's input
    has an outlier channel: its per-tensor scale is large and the small channels lose bits."""

    gains = {"a": np.array([1.0, 1.0, 1.0, 1.0]), "b": np.ones(4), "c": np.ones(4)}
    parts = [("a", "a"), ("b/depthwise", "b"), ("c", "c")]

    def __init__(self):
        rng = np.random.default_rng(0)
        self.x = rng.uniform(-1, 1, (200, 4))
        self.gains = {
            "a": np.array([50.0, 1, 1, 1]),
            "b/depthwise": np.array([0.02, 1, 1, 1]),
            "c": np.ones(4),
        }

    def layers(self):
        return [LayerInfo(k, layer, "Toy") for k, layer in self.parts]

    def run(self, record, keys):
        x, outputs, inputs = self.x, {}, {}
        for key, _ in self.parts:
            f = record.layers.get(key) if record else None
            inputs[key] = x
            if f is not None:
                x = fq(x / np.float32(f.tensor_balance_factor or 1.0), f) * np.float32(
                    f.tensor_balance_factor or 1.0
                )
            x = x * self.gains[key]
            outputs[key] = x
        return RunResult(
            final=x,
            outputs={k: outputs[k] for k in keys},
            inputs={k: inputs[k] for k in keys} if record is None else {},
        )


def minmax_record(chain, balance=None):
    flt = chain.run(None, [k for k, _ in chain.parts])
    layers = {}
    for key, _ in chain.parts:
        v = flt.inputs[key] / (balance if key == "c" and balance is not None else 1.0)
        lo, hi = min(v.min(), 0), max(v.max(), 0)
        scale = float(np.float32((hi - lo) / 255))
        layers[key] = LayerFactors(scale_d=scale, offset_d=int(-128 - round(lo / scale)))
    if balance is not None:
        layers["c"].tensor_balance_factor = list(balance)
    return Record(layers)


def test_outlier_part_ranked_worst_and_numbers():
    chain = Chain()
    record = minmax_record(chain)
    labels = np.argmax(chain.run(None, []).final, axis=1)
    rep = build_report(record, chain, labels, top_k=1)
    rows = {r.key: r for r in rep.rows}
    assert [r.key for r in rep.rows] == ["a", "b/depthwise", "c"]  # execution order
    assert rows["b/depthwise"].rank == 1 and rep.top == ["b/depthwise"]
    assert rep.skip_layers == ["b"]  # the framework layer, the name skip_layers takes
    assert parse_simple_config(rep.fragment).skip_layers == ["b"]
    # independent: b's input alone quantized, compared with float
    flt = chain.run(None, ["b/depthwise"])
    f = record.layers["b/depthwise"]
    ref = flt.outputs["b/depthwise"]
    test = fq(flt.inputs["b/depthwise"], f) * chain.gains["b/depthwise"]
    signal, noise = np.sum(ref**2), np.sum((ref - test) ** 2)
    assert rows["b/depthwise"].snr_alone == pytest.approx(10 * np.log10(signal / noise))
    lo, hi = (-128 - f.offset_d) * f.scale_d, (127 - f.offset_d) * f.scale_d
    assert (rows["b/depthwise"].clip_min, rows["b/depthwise"].clip_max) == pytest.approx((lo, hi))
    assert rows["a"].accuracy_drop == pytest.approx(0.0, abs=0.02)
    assert rep.float_accuracy == 1.0 and rep.kept_float_accuracy >= rep.quantized_accuracy
    assert set(rep.histograms) == {"b/depthwise"}
    counts, edges = rep.histograms["b/depthwise"]
    assert sum(counts) == flt.inputs["b/depthwise"].size and edges[0] <= lo and edges[-1] >= hi


def test_dmq_input_is_divided_before_range_and_saturation():
    chain = Chain()
    balance = np.array([2.0, 2.0, 4.0, 2.0])
    record = minmax_record(chain, balance)
    rep = build_report(record, chain, top_k=0)
    row = next(r for r in rep.rows if r.key == "c")
    divided = chain.run(None, ["c"]).inputs["c"] / balance
    assert (row.input_min, row.input_max) == pytest.approx((divided.min(), divided.max()))
    f = record.layers["c"]
    lo, hi = (-128 - f.offset_d) * f.scale_d, (127 - f.offset_d) * f.scale_d
    assert row.saturated == np.mean((divided < lo) | (divided > hi)) < 0.01
    undivided = chain.run(None, ["c"]).inputs["c"]
    assert np.mean((undivided < lo) | (undivided > hi)) > 0.2  # so the division was applied
    assert rep.top == [] and rep.skip_layers == []
    assert rep.snr_model_kept_float == rep.snr_model_quantized


def test_parts_of_one_layer_are_skipped_together():
    chain = Chain()
    chain.parts = [("a", "a"), ("b/depthwise", "b"), ("c", "b")]  # c: b's pointwise part
    rep = build_report(minmax_record(chain), chain, top_k=1)
    assert rep.skip_layers == ["b"] and sorted(rep.top) == ["b/depthwise", "c"]
    assert parse_simple_config(rep.fragment).skip_layers == ["b"]


def test_json_text_and_html_without_plots():
    chain = Chain()
    record = minmax_record(chain)
    record.layers["a"].scale_w = [0.5, 0.25]
    rep = build_report(record, chain, top_k=2)
    doc = json.loads(json.dumps(rep.to_dict()))
    assert doc["rows"][0]["scale_spread"] == 2.0 and doc["top"] == rep.top
    assert "b/depthwise" in text_table(rep)
    page = render_html(rep, with_plots=False)
    assert "No plots:</b> plots were not requested" in page and "<img" not in page


def test_html_embeds_pngs():
    chain = Chain()
    record = minmax_record(chain)
    record.layers["a"].scale_w = [0.5, 0.25]
    page = render_html(build_report(record, chain, top_k=1))
    pngs = [base64.b64decode(d) for d in re.findall(r"base64,([A-Za-z0-9+/=]+)", page)]
    assert len(pngs) == 3 and all(p.startswith(b"\x89PNG\r\n\x1a\n") for p in pngs)


def test_unknown_or_empty_record_is_refused():
    chain = Chain()
    with pytest.raises(RecordError, match=r"'zz' name no quantizable layer of the model; it has: "):
        build_report(Record({"zz": LayerFactors(scale_d=1.0, offset_d=0)}), chain)
    with pytest.raises(RecordError, match="no quantized layer"):
        build_report(Record({"a": LayerFactors()}), chain)


def test_nan_in_the_report_data_names_the_layer_and_sample():
    chain = Chain()
    chain.x[7, 2] = np.nan
    record = Record({"a": LayerFactors(scale_d=0.01, offset_d=0)})
    with pytest.raises(RecordError, match=r"layer 'a': its float input .* NaN or Inf \(sample 7\)"):
        build_report(record, chain)


def test_metrics_hand_worked():
    assert snr_db([3.0, 4.0], [3.0, 4.5]) == pytest.approx(10 * math.log10(25 / 0.25))
    assert snr_db([0.0], [1.0]) == -math.inf and snr_db([1.0], [1.0]) == math.inf
    assert clip_range(0.5, -128, 8) == (0.0, 127.5)
    assert clip_range(1.0, 0, 4) == (-8.0, 7.0)
    assert saturated_share(np.array([-2.0, -1.0, 1.0, 1.5]), -1.0, 1.0) == 0.5
    assert top1_accuracy(np.array([[0.2], [0.7]]), np.array([0, 0])) == 0.5  # binary output
    assert top1_accuracy(np.eye(3), np.eye(3)) == 1.0  # one-hot labels
    with pytest.raises(CalibrationError, match="expected one label per sample"):
        top1_accuracy(np.eye(3), np.array([0, 1]))


def test_plots_of_many_long_names_draw_without_a_matplotlib_warning():
    """A DenseNet report printed matplotlib's "Tight layout not applied" (found by a new-user
    trial): the PNG is still drawn, untightened, and nothing is printed."""
    import warnings

    from amct_bridge.report.plots import _figure, _png

    def crowded():
        fig = _figure(2, 1.5)
        ax = fig.add_subplot(111)
        ax.set_xticks(range(60))
        ax.set_xticklabels([f"very_long_layer_name_{i}/conv" for i in range(60)], rotation=90)
        return fig

    with pytest.warns(UserWarning, match="Tight layout not applied"):
        crowded().tight_layout()  # the case is real
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        png = _png(crowded())
    assert png.startswith(b"\x89PNG")


def test_progress_is_logged_per_pass(caplog):
    """N + 3 passes over the data took minutes on a DenseNet with no sign of life (found by a
    new-user trial): `-v` (INFO) now shows each layer's pass."""
    chain = Chain()
    with caplog.at_level("INFO", logger="amct_bridge.report.table"):
        build_report(minmax_record(chain), chain, top_k=1)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "report: 3 layers, 6 passes over the data"
    assert [x.split(" alone")[0] for x in lines[1:]] == [
        "report: layer 1/3 'a'",
        "report: layer 2/3 'b/depthwise'",
        "report: layer 3/3 'c'",
    ]


def test_text_table_columns_stay_in_line_with_long_names():
    """MindSpore cell names (``backbone.layer3.1.downsample.0``) are longer than the layer
    column: every row's columns must still start where the header's do."""
    chain = Chain()
    rep = build_report(minmax_record(chain), chain, top_k=0)
    long = "backbone.stage3.block12.downsample.conv_0"
    rep.rows[0].key = long
    lines = text_table(rep).splitlines()
    table = lines[1 : 2 + len(rep.rows)]
    assert long in table[1]
    kind_at = table[0].index("kind")  # left-aligned: every row's kind starts there
    assert all(t[kind_at - 1] == " " and t[kind_at] != " " for t in table[1:]), table
    end = table[0].index("scale_d") + len("scale_d")  # right-aligned: every value ends there
    assert all(t[end - 1] != " " and (len(t) == end or t[end] == " ") for t in table[1:]), table
