"""Keras report: the bad layer is ranked worst, numbers match an independent numpy forward,
the CLI with and without labels, the HTML's embedded PNGs."""

import base64
import json
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
from report_models import conv_valid, fq_act, fq_kernel, images, outlier_cnn, snr

from amct_bridge.cli import main
from amct_bridge.config import parse_simple_config
from amct_bridge.keras import calibrate
from amct_bridge.keras.report import quant_report
from amct_bridge.records import load

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """The outlier model, 64 images, labels = the float model's classes, a minmax record
    calibrated on the first half (so the second half saturates a little)."""
    out = tmp_path_factory.mktemp("report")
    model = outlier_cnn()
    x = images(64)
    y = np.argmax(model.predict(x, verbose=0), axis=1)
    calibrate(model, x[:32], out / "record.txt", algorithm="minmax")
    model.save(out / "model.keras")
    np.save(out / "x.npy", x)
    np.save(out / "y.npy", y)
    return model, x, y, out


def numpy_forward(model, record, x, quantized):
    """conv1 -> relu -> conv2 -> relu -> mean -> fc in float64; parts in ``quantized`` use the
    record's factors. Returns (conv2 input, conv2 output, fc output)."""
    k1, b1 = model.get_layer("conv1").get_weights()
    k2, b2 = model.get_layer("conv2").get_weights()
    kf, bf = model.get_layer("fc").get_weights()

    def part(name, inp, kernel):
        f = record.layers[name]
        if name not in quantized:
            return inp.astype(np.float64), kernel
        return fq_act(inp.astype(np.float64), f.scale_d, f.offset_d), fq_kernel(kernel, f.scale_w)

    xi, k = part("conv1", x, k1)
    a1 = np.maximum(conv_valid(xi, k, b1), 0)
    ai, k = part("conv2", a1, k2)
    a2 = np.maximum(conv_valid(ai, k, b2), 0)
    pi, k = part("fc", a2.mean(axis=(1, 2)), kf)
    return a1, a2, pi @ k + bf


def test_outlier_layer_is_ranked_worst(case):
    model, x, y, out = case
    rep = quant_report(model, out / "record.txt", x, y, top_k=1)
    worst = min(rep.rows, key=lambda r: r.rank)
    assert worst.key == "conv2" and rep.top == ["conv2"] and rep.skip_layers == ["conv2"]
    # its input is dominated by one channel: the clip range is far wider than the other
    # channels' values, which is what the histogram and the spread of conv1 show
    assert worst.clip_max > 10 * np.percentile(conv_input(model, x)[..., 1:], 99)
    # the sidecar beside the record gives the range the calibration saw (first half of x)
    assert worst.calib_max == pytest.approx(conv_input(model, x[:32]).max(), rel=1e-5)
    assert worst.input_max == pytest.approx(conv_input(model, x).max(), rel=1e-5)
    assert max(rep.rows, key=lambda r: r.snr_model).key != "conv2"
    assert worst.accuracy_drop == max(r.accuracy_drop for r in rep.rows) > 0
    assert parse_simple_config(rep.fragment).skip_layers == ["conv2"]
    # keeping it in float recovers most of the loss
    assert rep.kept_float_accuracy > rep.quantized_accuracy
    assert rep.snr_model_kept_float > rep.snr_model_quantized + 10
    assert rep.float_accuracy == 1.0  # labels are the float model's own classes
    assert "conv2" in rep.histograms


def conv_input(model, x):
    k1, b1 = model.get_layer("conv1").get_weights()
    return np.maximum(conv_valid(x, k1, b1), 0)


def test_numbers_match_numpy(case):
    model, x, y, out = case
    record = load(out / "record.txt")
    rep = quant_report(model, record, x, y, top_k=1)
    rows = {r.key: r for r in rep.rows}
    a1, ref2, ref_out = numpy_forward(model, record, x, set())
    _, alone2, alone_out = numpy_forward(model, record, x, {"conv2"})
    _, cum2, _ = numpy_forward(model, record, x, {"conv1", "conv2"})
    _, _, full_out = numpy_forward(model, record, x, {"conv1", "conv2", "fc"})
    _, _, kept_out = numpy_forward(model, record, x, {"conv1", "fc"})
    row = rows["conv2"]
    assert row.snr_alone == pytest.approx(snr(ref2, alone2), abs=0.05)
    assert row.snr_cumulative == pytest.approx(snr(ref2, cum2), abs=0.05)
    assert row.snr_model == pytest.approx(snr(ref_out, alone_out), abs=0.05)
    assert rep.snr_model_quantized == pytest.approx(snr(ref_out, full_out), abs=0.05)
    assert rep.snr_model_kept_float == pytest.approx(snr(ref_out, kept_out), abs=0.05)
    acc = lambda o: float(np.mean(np.argmax(o, axis=1) == y))  # noqa: E731
    assert row.accuracy_drop == pytest.approx(1.0 - acc(alone_out), abs=1.5 / len(x))
    assert rep.kept_float_accuracy == pytest.approx(acc(kept_out), abs=1.5 / len(x))
    # ranges: the input over the report data, the clip range of scale_d/offset_d, saturation
    f = record.layers["conv2"]
    lo, hi = (-128 - f.offset_d) * f.scale_d, (127 - f.offset_d) * f.scale_d
    assert (row.clip_min, row.clip_max) == pytest.approx((lo, hi), rel=1e-6)
    assert (row.input_min, row.input_max) == pytest.approx((a1.min(), a1.max()), rel=1e-5)
    assert row.saturated == pytest.approx(np.mean((a1 < lo) | (a1 > hi)), abs=2 / a1.size)
    assert row.saturated > 0  # the second half of the data goes past the first half's max
    spread = max(record.layers["conv1"].scale_w) / min(record.layers["conv1"].scale_w)
    assert rows["conv1"].scale_spread == pytest.approx(spread)
    assert rows["conv1"].scale_w == pytest.approx(record.layers["conv1"].scale_w)
    assert rows["fc"].scale_spread == 1.0  # Dense: one weight scale (AMCT: no channel_wise)


def _pngs(html_text):
    return [
        base64.b64decode(d)
        for d in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html_text)
    ]


def test_cli_with_labels(case, capsys, tmp_path):
    _, x, _, out = case
    html, js = tmp_path / "r.html", tmp_path / "r.json"
    args = ["report", "--record", str(out / "record.txt"), "--model", str(out / "model.keras")]
    args += ["--data", str(out / "x.npy"), "--labels", str(out / "y.npy"), "--top-k", "1"]
    assert main([*args, "--html", str(html), "--json", str(js)]) == 0
    text = capsys.readouterr().out
    table = [line.split() for line in text.splitlines() if re.match(r"\s+\d+ (conv|fc)", line)]
    assert {r[1]: r[0] for r in table}["conv2"] == "1"
    assert "accuracy: float 1.0000" in text and 'skip_layers: "conv2"' in text
    pngs = _pngs(html.read_text())
    assert len(pngs) == 3 and all(p.startswith(PNG_MAGIC) for p in pngs)  # SNR, hist, spread
    doc = json.loads(js.read_text())
    assert [r["key"] for r in doc["rows"]] == ["conv1", "conv2", "fc"]
    assert doc["top"] == ["conv2"] and doc["rows"][1]["accuracy_drop"] > 0


def test_cli_without_labels(case, capsys, tmp_path):
    _, x, _, out = case
    html = tmp_path / "r.html"
    args = ["report", "--record", str(out / "record.txt"), "--model", str(out / "model.keras")]
    assert main([*args, "--data", str(out / "x.npy"), "--html", str(html), "--top-k", "1"]) == 0
    text = capsys.readouterr().out
    assert "accuracy:" not in text and 'skip_layers: "conv2"' in text
    rows = [line.split() for line in text.splitlines() if re.match(r"\s+\d+ (conv|fc)", line)]
    assert all(r[-1] == "-" for r in rows)  # no accuracy drop column values
    pngs = _pngs(html.read_text())
    assert len(pngs) == 3 and all(p.startswith(PNG_MAGIC) for p in pngs)


def test_cli_bad_labels(case, capsys, tmp_path):
    _, _, y, out = case
    np.save(tmp_path / "short.npy", y[:10])
    args = ["report", "--record", str(out / "record.txt"), "--model", str(out / "model.keras")]
    code = main([*args, "--data", str(out / "x.npy"), "--labels", str(tmp_path / "short.npy")])
    err = capsys.readouterr().err
    assert code == 2 and "short.npy: expected one label per sample" in err and "(64)" in err


def test_html_without_matplotlib(case, tmp_path):
    """matplotlib made unimportable: the text table still prints, the HTML says why no plots."""
    _, _, _, out = case
    html = tmp_path / "r.html"
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from amct_bridge.cli import main\n"
        f"sys.exit(main(['report', '--record', {str(out / 'record.txt')!r}, "
        f"'--model', {str(out / 'model.keras')!r}, '--data', {str(out / 'x.npy')!r}, "
        f"'--html', {str(html)!r}]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        "SNR alone" in result.stdout and "tables only: matplotlib is not installed" in result.stdout
    )
    page = html.read_text()
    assert "No plots:</b> matplotlib is not installed" in page and "<img" not in page
    assert "<table" in page and "conv2" in page


def test_separable_and_nested_layers(tmp_path):
    """A SeparableConv2D has two rows (the pointwise input is inside the layer: no input
    columns); a layer inside a nested model gets the model-level columns only."""
    inner = keras.Sequential(
        [keras.Input((6, 6, 4)), keras.layers.Conv2D(4, 1, name="inner_conv")], name="block"
    )
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.SeparableConv2D(4, 3, activation="relu", name="sep")(inputs)
    x = inner(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    model = keras.Model(inputs, keras.layers.Dense(3, name="fc")(x))
    x = images(16)
    calibrate(model, x, tmp_path / "r.txt", algorithm="minmax")
    rep = quant_report(model, tmp_path / "r.txt", x, top_k=1)
    rows = {r.key: r for r in rep.rows}
    assert list(rows) == ["sep/depthwise", "sep/pointwise", "block/inner_conv", "fc"]
    assert rows["sep/depthwise"].input_max == pytest.approx(float(x.max()))
    assert rows["sep/pointwise"].input_max is None and rows["sep/pointwise"].clip_max > 0
    assert rows["sep/pointwise"].snr_alone is not None  # the layer's output is observable
    nested = rows["block/inner_conv"]
    assert nested.snr_alone is None and nested.input_max is None
    assert nested.snr_model is not None and nested.clip_max > 0
    assert all(r.rank for r in rep.rows) and len(rep.skip_layers) == 1
    if rep.skip_layers == ["sep"]:  # both parts are kept in float together
        assert sorted(rep.top) == ["sep/depthwise", "sep/pointwise"]


def test_fragment_pasted_into_a_config_gives_the_kept_float_accuracy(case, tmp_path):
    """The printed fragment, used as the callback's config, leaves conv2 out of the record;
    that record simulates to the accuracy the report announced."""
    from amct_bridge.keras import simulate

    model, x, y, out = case
    rep = quant_report(model, out / "record.txt", x, y, top_k=1)
    config = tmp_path / "quant.cfg"
    config.write_text("batch_num: 1\n" + rep.fragment)
    record = calibrate(model, x[:32], tmp_path / "r.txt", algorithm="minmax", config=config)
    assert list(record.layers) == ["conv1", "fc"]
    predicted = np.argmax(simulate(model, record).predict(x, verbose=0), axis=1)
    assert float(np.mean(predicted == y)) == rep.kept_float_accuracy


def test_record_keyed_by_tf_ops(case, tmp_path):
    """A keys="tf_op" record (for convert_model) reports under the Keras layer names, with the
    same numbers as the Keras-keyed record of the same calibration."""
    model, x, y, out = case
    calibrate(model, x[:32], tmp_path / "r.txt", algorithm="minmax", keys="tf_op")
    assert "conv2" not in load(tmp_path / "r.txt").layers  # TF op names
    by_op = quant_report(model, tmp_path / "r.txt", x, y, top_k=1)
    by_layer = quant_report(model, out / "record.txt", x, y, top_k=1)
    assert [r.key for r in by_op.rows] == ["conv1", "conv2", "fc"]
    assert [r.snr_model for r in by_op.rows] == [r.snr_model for r in by_layer.rows]


def test_switched_copy_runs_as_a_fresh_simulated_copy(tmp_path):
    """The runner's one switchable copy, with parts switched on and off in any order (DMQ
    balance and a folded BN included), gives what simulate() of that part alone gives; a record
    with other factors gets a copy of its own."""
    from amct_bridge.keras import simulate
    from amct_bridge.keras.report import KerasReportRunner
    from amct_bridge.records import LayerFactors, Record

    keras.utils.set_random_seed(3)
    inputs = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(6, 3, name="c1")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.SeparableConv2D(5, 3, activation="relu", name="sep")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(3, name="fc")(h))
    bn = model.get_layer("bn")
    bn.set_weights([w + np.linspace(0.1, 0.5, w.size).astype("float32") for w in bn.get_weights()])
    x = images(24)
    full = calibrate(model, x, tmp_path / "r.txt", algorithm="minmax", migration_strength=0.5)
    assert full.layers["c1"].tensor_balance_factor  # DMQ: balanced input and kernel
    runner = KerasReportRunner(model, x, batch_size=8)
    keys = [i.key for i in runner.layers()]
    assert keys == ["c1", "sep/depthwise", "sep/pointwise", "fc"]
    runner.run(full, keys)
    for key in ["fc", "c1", "sep/pointwise", "c1", "sep/depthwise"]:
        alone = Record({key: full.layers[key]}, flavor=full.flavor)
        got = runner.run(alone, [key])
        want = simulate(model, alone).predict(x, verbose=0)
        np.testing.assert_allclose(got.final, want, rtol=1e-5, atol=1e-6)
        layer = runner.model.get_layer(key.split("/")[0])
        probe = keras.Model(model.inputs, layer.output)  # the float model's layer output
        float_out = probe.predict(x, verbose=0)
        assert got.outputs[key].shape == float_out.shape
        assert not np.allclose(got.outputs[key], float_out)  # this part is quantized
    # back to float everywhere: the final output is the float model's
    np.testing.assert_allclose(
        runner.run(Record({}), []).final, model.predict(x, verbose=0), rtol=1e-6, atol=1e-7
    )
    f = full.layers["fc"]
    other = LayerFactors(scale_d=f.scale_d * 4, offset_d=f.offset_d, scale_w=f.scale_w,
                         offset_w=f.offset_w)  # fmt: skip
    got = runner.run(Record({"fc": other}), ["fc"])
    want = simulate(model, Record({"fc": other})).predict(x, verbose=0)
    np.testing.assert_allclose(got.final, want, rtol=1e-5, atol=1e-6)
