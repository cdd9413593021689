"""Searched ESP-DL v1 exponents (issue 23 §5): never worse than the range rule on the
calibration data, checked against a numpy reimplementation of the chip on a one-layer model,
and within a point of float on a small digits CNN at s8."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from sklearn.datasets import load_digits

from amct_bridge.errors import ExportError
from amct_bridge.espdl import export, simulate_chip
from amct_bridge.espdl.exponent_search import (
    CalibrationData,
    Tuning,
    bias_offsets,
    coordinate_search,
    relative_error,
)
from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v1.export import export_layers
from amct_bridge.espdl.v1.network import network_from_result
from amct_bridge.espdl.v1.search import CachedChip, search_tuning
from amct_bridge.keras import calibrate, evaluate_espdl, export_espdl
from amct_bridge.keras.espdl_weights import source_layers
from amct_bridge.records import load
from amct_bridge.records.calibration import (
    CalibrationStats,
    LayerStats,
    TensorRange,
    load_stats,
    sidecar_path,
)


def _range(a: np.ndarray) -> TensorRange:
    return TensorRange(float(a.min()), float(a.max()))


def _mlp(seed: int = 0):
    """fc1 (6 -> 5, bias) + ReLU, fc2 (5 -> 3, bias); calibration data; numpy float outputs."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.6, (6, 5)).astype(np.float32)
    b1 = rng.normal(0, 0.05, 5).astype(np.float32)
    w2 = rng.normal(0, 0.6, (5, 3)).astype(np.float32)
    b2 = np.float32([0.01, -0.02, 0.015])  # small: they round to 0 at a coarse output step
    x = rng.uniform(-1, 1, (256, 6)).astype(np.float32)
    h = np.maximum(x.astype(np.float64) @ w1 + b1, 0)
    out = h @ w2 + b2
    layers = [
        SourceLayer("in", "input", attrs={"shape": (6,)}),
        SourceLayer("fc1", "dense", ["in"], "Dense", {"kernel": w1, "bias": b1}, {"input_rank": 2}),
        SourceLayer("r1", "relu", ["fc1"], "ReLU"),
        SourceLayer("fc2", "dense", ["r1"], "Dense", {"kernel": w2, "bias": b2}, {"input_rank": 2}),
    ]
    stats = CalibrationStats(
        layers={
            "fc1": LayerStats("Dense", _range(x), _range(h)),
            "r1": LayerStats("ReLU", _range(h), _range(h)),
            "fc2": LayerStats("Dense", _range(h), _range(out)),
        }
    )
    return layers, stats, x, {"r1": h, "fc2": out}


@pytest.mark.parametrize("granularity", ["per-tensor", "per-channel"])
def test_searched_exponents_never_beat_by_the_range_rule_on_the_calibration_data(granularity):
    layers, stats, x, floats = _mlp()
    opts = {"stats": stats, "granularity": granularity, "target": "esp32s3"}
    ref = floats["fc2"]
    errors = {}
    for rule in ("max", "search"):
        res = export(
            None,
            layers,
            None,
            exponents=rule,
            calibration=CalibrationData(x, floats, "fc2"),
            **opts,
        )
        got = simulate_chip(res, x).output.to_float()
        errors[rule] = relative_error(ref, got)
    assert errors["search"] <= errors["max"]
    assert errors["search"] < 0.8 * errors["max"]  # the floors and zeroed biases: room to win


def _numpy_chip(x, w, e_in, e_w, e_out):
    """One bias-free s8 per-tensor FullyConnected as docs/espdl-export.md specifies it."""
    q = np.clip(np.rint(np.ldexp(x.astype(np.float64), -e_in)), -128, 127)
    wq = np.clip(np.rint(np.ldexp(w.astype(np.float64), -e_w)), -128, 127)
    acc = q @ wq
    y = np.clip(np.floor(np.ldexp(acc, -(e_out - e_in - e_w))), -128, 127)
    return np.ldexp(y, e_out)


def test_search_result_is_a_coordinate_minimum_of_the_numpy_chip_error():
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.5, (8, 4)).astype(np.float32)
    x = rng.normal(0, 0.4, (200, 8)).astype(np.float32)
    ref = x.astype(np.float64) @ w
    layers = [
        SourceLayer("in", "input", attrs={"shape": (8,)}),
        SourceLayer("fc", "dense", ["in"], "Dense", {"kernel": w}, {"input_rank": 2}),
    ]
    stats = CalibrationStats(layers={"fc": LayerStats("Dense", _range(x), _range(ref))})
    opts = {"stats": stats, "target": "esp32"}  # esp32: no accumulator lanes to clip
    base = export_layers(layers, None, **opts).config["fc"]
    start = (base["input_exponent"], base["filter_exponent"], base["output_exponent"])
    tuning = search_tuning(layers, x, {"fc": ref}, bias_correction=False, passes=8, **opts)
    chosen = export_layers(layers, None, tuning=tuning, **opts).config["fc"]
    e = (chosen["input_exponent"], chosen["filter_exponent"], chosen["output_exponent"])

    def err(exps):
        return relative_error(ref, _numpy_chip(x, w, *exps))

    # the judge is the chip: numpy's reimplementation gives the same outputs
    res = export_layers(layers, None, tuning=tuning, **opts)
    np.testing.assert_array_equal(simulate_chip(res, x).output.to_float(), _numpy_chip(x, w, *e))
    assert err(e) <= err(start)
    for axis in range(3):  # no single ±1 move (within the span) lowers the numpy error
        for step in (-1, 1):
            moved = list(e)
            moved[axis] += step
            if abs(moved[axis] - start[axis]) <= 3:
                assert err(tuple(moved)) >= err(e), (axis, step)


def test_bias_correction_cancels_the_floor_bias():
    layers, stats, x, floats = _mlp(1)
    opts = {"stats": stats, "target": "esp32s3"}
    ref = floats["fc2"]
    fixed = search_tuning(layers, x, floats, output="fc2", **opts)
    plain = Tuning(fixed.exponents)  # the same exponents, the model's own biases
    assert "fc2" in fixed.bias_offsets
    means = []
    for tuning in (plain, fixed):
        res = export_layers(layers, None, tuning=tuning, **opts)
        diff = simulate_chip(res, x).output.to_float() - ref
        step = 2.0 ** res.config["fc2"]["output_exponent"]
        means.append(np.abs(diff.mean(axis=0)).max() / step)
    assert means[1] < means[0] and means[1] <= 0.5  # half a step at most is left


def test_coordinate_search_keeps_the_start_without_a_strict_gain():
    calls = []

    def flat(values):
        calls.append(dict(values))
        return 1.0

    best, score, tried = coordinate_search({"a": -5, "b": 2}, flat)
    assert best == {"a": -5, "b": 2} and score == 1.0 and tried == len(calls) == 5
    best, _, _ = coordinate_search({"a": 0}, lambda v: -abs(v["a"]), span=2)
    assert best == {"a": -2}  # walks at most ``span`` steps


def test_bias_offsets_average_only_the_linear_side():
    ref = np.array([[[2.0, -1.0]], [[0.0, 3.0]], [[4.0, 1.0]]])
    got = np.array([[[1.5, 0.0]], [[0.0, 2.0]], [[3.5, 1.0]]])
    np.testing.assert_allclose(bias_offsets(ref, got, linear_above=0.0), [0.5, 0.5])
    np.testing.assert_allclose(bias_offsets(ref, got), [1 / 3, 0.0])


def test_search_needs_calibration_data():
    layers, stats, _, _ = _mlp()
    with pytest.raises(ExportError, match="calibration_data= .* --data"):
        export(None, layers, None, stats=stats, exponents="search")
    with pytest.raises(ExportError, match="expected one of max, search"):
        export(None, layers, None, stats=stats, exponents="best")


def test_tuning_reaches_config_and_sources():
    layers, stats, _, _ = _mlp()
    tuning = Tuning(
        {("fc2", "output"): -6, ("fc2", "filter"): -8},
        {"fc2": np.float32([0.1, 0.0, 0.0])},
        ["a note"],
    )
    res = export_layers(layers, None, stats=stats, tuning=tuning)
    entry = res.config["fc2"]
    assert (entry["output_exponent"], entry["filter_exponent"]) == (-6, -8)
    fc2 = next(x for x in res.layers if x.name == "fc2")
    np.testing.assert_allclose(fc2.coefficients.bias, layers[3].weights["bias"] + [0.1, 0, 0])
    assert "searched" in fc2.sources["output_exponent"] and "bias" in fc2.sources
    assert "a note" in res.warnings


@pytest.fixture(scope="module")
def digits_cnn():
    """A tiny digits CNN trained on 1400 digits (seeded; float accuracy about 0.92)."""
    return tiny_digits_cnn()


def tiny_digits_cnn(seed: int = 1, epochs: int = 15):
    """A tiny digits CNN (conv+BN+ReLU, depthwise, pointwise+BN+LeakyReLU, pool, Dense)."""
    keras.utils.set_random_seed(seed)
    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    y = data.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv1")(inputs)
    h = keras.layers.BatchNormalization(name="bn1")(h)
    h = keras.layers.ReLU(name="relu1")(h)
    h = keras.layers.DepthwiseConv2D(3, padding="same", activation="relu", name="dw2")(h)
    h = keras.layers.Conv2D(12, 1, use_bias=False, name="pw2")(h)
    h = keras.layers.BatchNormalization(name="bn2")(h)
    h = keras.layers.LeakyReLU(negative_slope=0.1, name="lrelu2")(h)
    h = keras.layers.MaxPooling2D(2, name="pool")(h)
    h = keras.layers.Flatten(name="flatten")(h)
    model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(h))
    model.compile(
        keras.optimizers.Adam(0.01),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x[:1400], y[:1400], epochs=epochs, batch_size=64, verbose=0)
    return model, x[:1400], x[1400:], y[1400:]


def test_s8_chip_within_a_point_of_float_on_digits(digits_cnn, tmp_path):
    model, x_train, x_test, y_test = digits_cnn
    record = tmp_path / "record.txt"
    calibrate(model, x_train[:256], record, algorithm="ifmr")
    for granularity in ("per-tensor", "per-channel"):
        res = export_espdl(
            model,
            record,
            None,
            target="esp32s3",
            granularity=granularity,
            calibration_data=x_train[:256],
        )
        assert any("exponents searched" in w for w in res.warnings)
        ev = evaluate_espdl(res, model, x_test, y_test, target="esp32s3")
        assert ev.chip_acc >= ev.float_acc - 0.01, (granularity, ev.float_acc, ev.chip_acc)


def test_cli_data_searches_and_search_without_data_is_refused(digits_cnn, tmp_path, capsys):
    from amct_bridge.cli import main

    model, x_train, _, _ = digits_cnn
    path, record, xs = tmp_path / "m.keras", tmp_path / "r.txt", tmp_path / "x.npy"
    model.save(path)
    calibrate(model, x_train[:128], record, algorithm="ifmr")
    np.save(xs, x_train[:128])
    base = ["export-espdl", "--record", str(record), "--model", str(path), "--out"]
    assert main([*base, str(tmp_path / "a"), "--exponents", "search"]) != 0
    assert "add --data" in capsys.readouterr().err
    assert main([*base, str(tmp_path / "b"), "--data", str(xs)]) == 0
    report = json.loads((tmp_path / "b" / "export.json").read_text())
    sources = [s for layer in report["layers"] for s in layer["exponent_sources"].values()]
    assert any("searched on the calibration data" in s for s in sources)
    note = "exponents searched on 128 of 128 calibration samples"
    assert any(note in w for w in report["warnings"])


def test_cached_chip_gives_simulate_chips_integers(digits_cnn, tmp_path):
    model, x_train, _, _ = digits_cnn
    x = x_train[:64]
    record = tmp_path / "r.txt"
    calibrate(model, x, record, algorithm="ifmr")
    layers = source_layers(model)
    opts = {"record": load(record), "stats": load_stats(sidecar_path(record))}
    cached = CachedChip(x, "esp32s3")
    runs = [("per-tensor", {}), ("per-channel", {}), ("per-tensor", {("lrelu2", "output"): -7})]
    for granularity, exponents in runs:  # the last one: the layers before pw2 come from cache
        res = export_layers(
            layers,
            None,
            granularity=granularity,
            target="esp32s3",
            tuning=Tuning(exponents),
            **opts,
        )
        net = network_from_result(res)
        want = simulate_chip(net, x)
        for name, tensor in cached.run(net).items():
            np.testing.assert_array_equal(tensor.values, want[name].values, err_msg=name)
            assert tensor.exponent == want[name].exponent
    assert len(cached.cache) < 3 * len(net.layers)  # reused, not recomputed


def test_outputs_meeting_at_a_concat_move_together():
    from amct_bridge.espdl.v1.network import INPUT, NetLayer, Network
    from amct_bridge.espdl.v1.search import adjustable_exponents

    layers = [
        NetLayer("a", "AvgPool2D", [INPUT], -5, "a"),
        NetLayer("b", "AvgPool2D", [INPUT], -6, "b"),
        NetLayer("r", "ReLU", ["b"], None, "r"),
        NetLayer("cat", "Concat", ["a", "r"], None, "cat"),
    ]
    variables, keys = adjustable_exponents(Network("s8", False, layers, input_exponent=-7))
    assert variables == {("a", "output"): -5}  # the export raises both to the larger one
    assert keys == {("a", "output"): [("a", "output"), ("b", "output")]}
