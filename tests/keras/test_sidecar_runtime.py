"""Sidecar ranges of runtime layers (Add, raw x + y, Concatenate, pools) and their ESP-DL exponents.

References are independent: activations from ``keras.Model(inputs, intermediate outputs)`` and a
numpy exponent rule written out here.
"""

from __future__ import annotations

import json
import math

import keras
import numpy as np
import pytest

from amct_bridge.cli import main
from amct_bridge.config import QuantConfig
from amct_bridge.espdl.v1.report import format_preview
from amct_bridge.keras import export_espdl
from amct_bridge.keras.calibrate import calibrate
from amct_bridge.keras.session import Session
from amct_bridge.records.calibration import load_stats, sidecar_path


def raw(model: keras.Model) -> str:
    """Keras' own name of the model's one raw op (``add``, ``add_3``...: counted per process)."""
    return next(op.name for op in model.operations if not isinstance(op, keras.layers.Layer))


def runtime(model: keras.Model) -> list[str]:
    return ["res", raw(model), "mp", "ap", "cat", "gap"]


def ref_exponent(absmax: float, bits: int = 8) -> int:
    """Smallest e with absmax <= (2^(bits-1) - 1) * 2^e."""
    top = 2 ** (bits - 1) - 1
    e = math.ceil(math.log2(absmax / top))
    return e + 1 if absmax > top * 2.0**e else e


def _model() -> keras.Model:
    keras.utils.set_random_seed(3)
    x = keras.Input((8, 8, 3))
    a = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="c1")(x)
    b = keras.layers.Conv2D(4, 1, name="c2")(a)
    s = keras.layers.Add(name="res")([a, b])
    r = s + b  # a raw op: graph node and keys named as Keras names it ("add", "add_1"...)
    m = keras.layers.MaxPooling2D(2, name="mp")(r)
    p = keras.layers.AveragePooling2D(2, name="ap")(r)
    cat = keras.layers.Concatenate(name="cat")([m, p])
    c3 = keras.layers.Conv2D(5, 1, name="c3")(cat)
    g = keras.layers.GlobalAveragePooling2D(name="gap")(c3)
    return keras.Model(x, keras.layers.Dense(3, name="fc")(g))


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    model = _model()
    data = np.random.default_rng(0).uniform(-1, 1, (8, 8, 8, 3)).astype("float32")
    record = tmp_path_factory.mktemp("sidecar") / "record.txt"
    calibrate(model, data, record, algorithm="minmax", batch_size=4)
    # independent activations: one probe model over the intermediate outputs
    names = ["c1", "c2", "res", raw(model), "mp", "ap", "cat", "c3", "gap"]
    ops = {op.name: op for op in model.operations}
    probe = keras.Model(model.inputs, [ops[n].output for n in names])
    acts = dict(zip(names, probe.predict(data, verbose=0), strict=True))
    return model, data, record, acts


def _minmax(*arrays) -> tuple[float, float]:
    return min(float(a.min()) for a in arrays), max(float(a.max()) for a in arrays)


def test_sidecar_has_runtime_ranges_equal_to_numpy(calibrated):
    model, data, record, acts = calibrated
    stats = load_stats(sidecar_path(record))
    assert stats.algorithm == "minmax"
    add = raw(model)
    order = ["c1", "c2", "res", add, "mp", "ap", "cat", "c3", "gap", "fc"]
    assert list(stats.layers) == order  # execution order
    inputs = {
        "res": ("c1", "c2"),
        add: ("res", "c2"),
        "mp": (add,),
        "ap": (add,),
        "cat": ("mp", "ap"),
        "gap": ("c3",),
    }
    kinds = {add: "Add", "res": "Add", "mp": "MaxPooling2D", "ap": "AveragePooling2D"}
    for name in runtime(model):
        entry = stats.layers[name]
        assert entry.kind == kinds.get(name, entry.kind)
        out = entry.output
        assert (out.min, out.max) == pytest.approx(_minmax(acts[name]), rel=1e-6), name
        assert (out.observed_min, out.observed_max) == pytest.approx((out.min, out.max))
        inp = entry.input  # Add / Concatenate: the range over all inputs
        want = _minmax(*(acts[i] for i in inputs[name]))
        assert (inp.min, inp.max) == pytest.approx(want, rel=1e-6), name
    # max pooling keeps the input's maximum (and its exponent)
    assert stats.layers["mp"].output.max == pytest.approx(stats.layers["mp"].input.max)


def test_runtime_points_add_no_histogram():
    """With a histogram algorithm (IFMR), runtime layers add min/max points only, or share."""
    model = _model()
    session = Session(model, QuantConfig(), batch_num=None)
    session.new_run()
    keys = {t.key for t in session.plan.targets if t.runtime}
    assert keys == set(runtime(model)) - {"ap"}  # AveragePooling2D is quantized (a record entry)
    needed = {i for (key, _), i in session.tensors.items() if key not in keys}
    for index, obs in enumerate(session.observed):
        if index not in needed:  # a point only a runtime layer reads: min/max only
            assert obs.point.bins == 0 and obs.settings[0] == "minmax", obs.point.key
    # gap reads c3's output and feeds fc's input: both IFMR points, shared at no cost
    gap = next(t for t in session.plan.targets if t.key == "gap")
    assert gap.config.algorithm == "ifmr"
    assert session.tensors[("gap", "input")] == session.tensors[("c3", "output")]
    assert session.tensors[("gap", "output")] == session.tensors[("fc", "input")]


def test_export_reports_runtime_exponents(calibrated, tmp_path):
    model, data, record, acts = calibrated
    res = export_espdl(model, record, tmp_path / "espdl")
    e = {name: ref_exponent(max(abs(v) for v in _minmax(acts[name]))) for name in acts}
    # chains: output exponent of their own range
    config = res.config
    for name in ("c1", "c2", "c3"):
        assert config[name]["output_exponent"] == e[name]
    got = {r.source: r for r in res.runtime}
    add = raw(model)
    assert list(got) == runtime(model)
    # Add2D: own range, raised to the larger input exponent (the sum has no finer bits)
    assert got["res"].input_exponents == [e["c1"], e["c2"]]
    assert got["res"].output_exponent == max(e["res"], e["c1"], e["c2"])
    e_res = got["res"].output_exponent
    assert got[add].input_exponents == [e_res, e["c2"]]
    e_add = max(e[add], e_res, e["c2"])
    assert got[add].output_exponent == e_add
    # MaxPool keeps its input's exponent; AvgPool its own range, raised to Concat's shared one
    assert got["mp"].output_exponent == e_add
    assert got["ap"].output_exponent == max(e["ap"], e_add)
    assert got["cat"].input_exponents == [e_add, e_add] and got["cat"].output_exponent == e_add
    assert got["gap"].output_exponent == e["gap"]
    # the chips' tensors: a conv after a runtime layer takes that layer's exponent as input
    assert config["c3"]["input_exponent"] == e_add
    assert config["fc"]["input_exponent"] == e["gap"]
    assert got["gap"].cpp == f'dl::layer::GlobalAveragePool2D<int8_t>({e["gap"]}, "gap")'
    assert got["res"].cpp == f'dl::layer::Add2D<int8_t>({got["res"].output_exponent}, NULL, "res")'
    assert (
        got["mp"].cpp == 'dl::layer::MaxPool2D<int8_t>({2, 2}, dl::PADDING_VALID, {}, 2, 2, "mp")'
    )
    assert got["cat"].cpp == 'dl::layer::Concat<int8_t>(-1, "cat")'
    report = json.loads((tmp_path / "espdl" / "export.json").read_text())
    assert [r["name"] for r in report["runtime_layers"]] == runtime(model)
    assert report["runtime_layers"][5]["output_exponent"] == e["gap"]
    table = format_preview(res).splitlines()
    row = next(line.split() for line in table if line.startswith("gap "))
    assert row[:4] == ["gap", "GlobalAveragePool2D", str(e["c3"]), str(e["gap"])]
    assert res.warnings == []


def test_export_runtime_s16(calibrated):
    model, data, record, acts = calibrated
    res = export_espdl(model, record, None, feature_type="s16")
    gap = next(r for r in res.runtime if r.source == "gap")
    assert gap.output_exponent == ref_exponent(max(abs(v) for v in _minmax(acts["gap"])), 16)
    assert gap.cpp.startswith("dl::layer::GlobalAveragePool2D<int16_t>(")


def test_cli_preview_lists_runtime_layers(calibrated, tmp_path, capsys):
    model, data, record, acts = calibrated
    path = tmp_path / "m.keras"
    model.save(path)
    code = main(["export-espdl", "--record", str(record), "--model", str(path), "--preview"])
    assert code == 0, capsys.readouterr().err
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    e_gap = ref_exponent(max(abs(v) for v in _minmax(acts["gap"])))
    assert rows["gap"][1:2] == ["GlobalAveragePool2D"] and rows["gap"][3] == str(e_gap)
    assert rows[raw(model)][1] == "Add2D" and rows["cat"][1] == "Concat"
