"""Issue 13, "Done when": a model with SeparableConv2D, Add (+ReLU), Concatenate, pools,
Flatten and Dense exports, its C++ compiles against ESP-DL release/v1.1's headers (s8 and s16),
and the simulated chip predicts what the float model predicts.

Also: runtime layers, config entries and outputs in execution (topological) order; the Concat
constructor's axis; ``export-espdl --set DIR --cpp NAME`` on any convert.py input directory.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import keras
import numpy as np
import pytest
from sklearn.datasets import load_digits

from amct_bridge.cli import main
from amct_bridge.espdl import SourceLayer, export_layers, load_network, simulate_chip
from amct_bridge.keras import QuantCalibration, evaluate_espdl, export_espdl
from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange

DATA = Path(__file__).resolve().parents[1] / "data"
HEADERS = DATA / "espdl_v1_headers"
L = keras.layers


def _model() -> keras.Model:
    x = keras.Input((8, 8, 1), name="image")
    a = L.Conv2D(12, 3, padding="same", use_bias=False, name="c1")(x)
    a = L.BatchNormalization(momentum=0.9, name="bn1")(a)
    a = L.ReLU(name="r1")(a)
    s = L.SeparableConv2D(12, 3, padding="same", name="sep")(a)
    s = L.BatchNormalization(momentum=0.9, name="bn_sep")(s)
    b = L.Conv2D(12, 1, name="c2")(a)
    r = L.ReLU(name="add_relu")(L.Add(name="add")([s, b]))  # fused into Add2D
    e = L.Conv2D(8, 1, activation="relu", name="c4")(r)  # built first, runs second
    d = L.Conv2D(8, 3, padding="same", activation="relu", name="c3")(r)
    cat = L.Concatenate(axis=3, name="cat")([d, e])
    mp = L.MaxPooling2D(2, name="mp")(cat)
    ap = L.AveragePooling2D(2, name="ap")(mp)
    logits = L.Dense(10, name="logits")(L.Flatten(name="flat")(ap))
    aux = L.Dense(10, name="aux")(L.GlobalAveragePooling2D(name="gap")(mp))
    return keras.Model(x, [logits, aux], name="done_when")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The model trained a little on scikit-learn's digits, calibrated by the real callback."""
    keras.utils.set_random_seed(0)
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int32")
    model = _model()
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    model.fit(x[:1200], (y[:1200], y[:1200]), epochs=8, batch_size=64, verbose=0)
    record = tmp_path_factory.mktemp("calib") / "record.txt"
    model.predict(x[:256], verbose=0, callbacks=[QuantCalibration(record, algorithm="minmax")])
    return model, record, x[1200:1500], y[1200:1500]


def _compiles(workdir: Path, source: str) -> None:
    """The headers README's compile check (x86-64 host, 32-bit-target headers: -fpermissive)."""
    includes = [f"-I{d}" for d in sorted(p for p in (HEADERS / "include").rglob("*") if p.is_dir())]
    cmd = ["g++", "-std=c++17", "-fsyntax-only", "-fpermissive", "-w", "-include", "cstddef"]
    cmd += ["-I", str(HEADERS / "host_stubs"), f"-I{HEADERS / 'include'}", *includes]
    cmd += ["-I", str(workdir), str(workdir / source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


CLASSES = {
    "Conv2D", "DepthwiseConv2D", "Add2D", "Concat", "MaxPool2D", "AvgPool2D", "Flatten",
    "FullyConnected", "GlobalAveragePool2D",
}  # fmt: skip


@pytest.mark.parametrize(
    ("feature_type", "granularity", "agree"),
    [("s8", "per-tensor", 0.9), ("s8", "per-channel", 0.9), ("s16", "per-tensor", 0.97)],
)
def test_done_when_model_exports_compiles_and_simulates(
    trained, tmp_path, feature_type, granularity, agree
):
    model, record, x, y = trained
    out = tmp_path / "espdl"
    result = export_espdl(
        model,
        record,
        out,
        feature_type=feature_type,
        granularity=granularity,
        target="esp32s3",
        cpp="done_coefficient",
    )
    assert result.skipped == [] and result.graph is not None
    assert not [w for w in result.warnings if "not written" in w]
    graph = result.graph
    assert {layer["class"] for layer in graph["layers"]} == CLASSES
    names = {layer["name"]: layer for layer in graph["layers"]}
    assert names["add"]["activation"] == "ReLU" and names["add"]["fused"] == ["add", "add_relu"]
    assert names["cat"]["attrs"]["axis"] == -1
    assert [names[n]["class"] for n in ("sep_depthwise", "sep_pointwise")] == [
        "DepthwiseConv2D",
        "Conv2D",
    ]
    assert names["sep_pointwise"]["fused"] == ["sep/pointwise", "bn_sep"]

    # the model class, app and coefficients compile with ESP-DL release/v1.1's headers
    ctype = {"s8": "int8_t", "s16": "int16_t"}[feature_type]
    header = (out / "done_model.hpp").read_text()
    assert "static const dl::Activation<" in header and "add(" in header
    (out / "t.cpp").write_text(
        f'#include "done_model.hpp"\nint main()\n{{\n    dl::Tensor<{ctype}> x;\n'
        "    DoneModel m;\n    m.build(x);\n    m.call(x);\n    return 0;\n}\n"
    )
    for source in ("t.cpp", "app_main.cpp", "done_coefficient.cpp"):
        _compiles(out, source)

    # the simulated chip (export directory) predicts what the float model predicts
    chip = simulate_chip(out, x, target="esp32s3")
    floats = dict(zip(["logits", "aux"], model.predict(x, verbose=0), strict=True))
    assert sorted(chip.outputs) == ["aux", "logits"]  # execution order, see below
    assert float(np.mean(floats["logits"].argmax(1) == y)) > 0.9  # trained: agreement matters
    for name, want in floats.items():
        got = chip[name].to_float()
        assert got.shape == want.shape == (len(x), 10)
        assert float(np.mean(got.argmax(1) == want.argmax(1))) >= agree, name
    assert set(chip.approximate_layers) == {"ap", "gap"}  # the documented approximate pools

    # espdl-eval scores the chip output that computes the model's first output
    ev = evaluate_espdl(out, model, x, y, target="esp32s3")
    assert ev.chip_acc == float(np.mean(chip["logits"].values.argmax(1) == y))


def _position(graph: dict) -> dict[str, int]:
    return {layer["name"]: i for i, layer in enumerate(graph["layers"])}


def test_runtime_layers_config_and_outputs_follow_execution_order(trained, tmp_path):
    model, record, _, _ = trained
    out = tmp_path / "espdl"
    export_espdl(model, record, out, cpp="done_coefficient")
    report = json.loads((out / "export.json").read_text())
    graph = report["graph"]
    where = _position(graph)
    for i, layer in enumerate(graph["layers"]):  # topological: producers first
        assert all(src == "input" or where[src] < i for src in layer["inputs"]), layer["name"]
    for listing in (
        [x["name"] for x in report["runtime_layers"]],
        list(json.loads((out / "config.json").read_text())),
        graph["outputs"],
    ):
        assert [where[n] for n in listing] == sorted(where[n] for n in listing), listing
    # execution order, not the model's [logits, aux]: the class's public members follow it
    assert graph["outputs"] == ["aux", "logits"]
    assert where["c3"] < where["c4"] < where["cat"]  # Concatenate's input order
    # the model class builds and calls in that order, outputs public in that order
    text = (out / "done_model.hpp").read_text()
    built = re.findall(r"this->(\w+)\.build\(", text)
    assert built == [layer["name"] for layer in graph["layers"]]
    public = text[text.index("public:") :]
    assert re.findall(r"dl::layer::\w+<\w+> (\w+);", public) == ["aux", "logits"]


def _concat_layers(axis: int) -> tuple[list[SourceLayer], CalibrationStats]:
    kernel = np.random.default_rng(0).uniform(-1, 1, (1, 1, 2, 2)).astype(np.float32)
    layers = [
        SourceLayer("in", "input", attrs={"shape": (4, 4, 2)}),
        SourceLayer("a", "conv2d", ["in"], "Conv2D", {"kernel": kernel}, {"padding": "valid"}),
        SourceLayer("b", "conv2d", ["in"], "Conv2D", {"kernel": -kernel}, {"padding": "valid"}),
        SourceLayer("cat", "runtime", ["a", "b"], "Concatenate", attrs={"axis": axis}),
    ]
    layers[-1].attrs["model_output"] = True
    one = TensorRange(-1.0, 1.0)
    stats = CalibrationStats(layers={n: LayerStats("Layer", one, one) for n in "ab"})
    return layers, stats


@pytest.mark.parametrize(("axis", "chip"), [(3, 2), (-1, -1), (1, 0)])
def test_concat_constructor_takes_the_chips_axis(axis, chip):
    # a framework axis of (N, H, W, C) counts the batch axis; the chip's tensors are HWC
    layers, stats = _concat_layers(axis)
    result = export_layers(layers, None, stats=stats)
    (item,) = result.runtime
    assert item.cpp == f'dl::layer::Concat<int8_t>({chip}, "cat")'
    assert result.graph["layers"][-1]["attrs"]["axis"] == chip
    x = np.random.default_rng(1).uniform(-1, 1, (3, 4, 4, 2)).astype(np.float32)
    res = simulate_chip(result, x)
    want = np.concatenate([res["a"].values, res["b"].values], axis=chip + 1 if chip >= 0 else -1)
    assert np.array_equal(res["cat"].values, want)


def test_concat_on_the_batch_axis_has_no_constructor():
    layers, stats = _concat_layers(0)
    result = export_layers(layers, None, stats=stats)
    assert result.runtime[0].cpp is None
    assert result.graph is None and "Concat on the batch axis" in result.graph_error


def test_set_cpp_on_a_hand_made_set_writes_convert_py_text(tmp_path, capsys):
    # ESP-DL's tutorial set (no export.json): the coefficient files, byte for byte the tool's
    argv = ["export-espdl", "--set", str(DATA / "espdl_v1_tutorial"), "--cpp", "mnist_coefficient"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "model class not written" in err and "--model-class --graph" in err
    golden = DATA / "espdl_v1_golden" / "text" / "tutorial.esp32.q0"
    for name in ("mnist_coefficient.cpp", "mnist_coefficient.hpp"):
        assert (tmp_path / "o" / name).read_bytes() == (golden / name).read_bytes()
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "mnist_coefficient.cpp",
        "mnist_coefficient.hpp",
    ]


def test_set_cpp_on_an_export_equals_the_export_with_cpp(trained, tmp_path, capsys):
    model, record, x, _ = trained
    with_cpp, plain = tmp_path / "with", tmp_path / "plain"
    opts = {"granularity": "per-channel", "target": "esp32s3"}
    export_espdl(model, record, with_cpp, cpp="done_coefficient", **opts)
    export_espdl(model, record, plain, **opts)
    # no --granularity: the set's own (its export.json says per-channel)
    argv = ["export-espdl", "--set", str(plain), "--cpp", "done_coefficient", "--target", "esp32s3"]
    assert main(argv) == 0, capsys.readouterr().err
    files = ["done_coefficient.cpp", "done_coefficient.hpp", "done_model.hpp", "app_main.cpp"]
    for name in files:
        assert (plain / name).read_bytes() == (with_cpp / name).read_bytes(), name
    # the set is the chip's input too: same integers as the export it came from
    a, b = simulate_chip(plain, x[:8]), simulate_chip(load_network(with_cpp), x[:8])
    assert np.array_equal(a.output.values, b.output.values)

    assert main(argv) == 2  # files exist now
    assert "already exist: pass --overwrite" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--preview", "--cpp", "n"], "--preview writes nothing"),
        (["--cpp", "n", "--model", "m.keras"], "--model would be ignored"),
        ([], "use it with --preview (print the exponents) or --cpp NAME"),
        (["--cpp", "app_main"], "would overwrite app_main.cpp"),
    ],
)
def test_set_options_that_would_be_ignored_are_refused(tmp_path, capsys, extra, message):
    argv = ["export-espdl", "--set", str(DATA / "espdl_v1_tutorial"), *extra]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_preview_with_cpp_is_refused_for_a_model_too(trained, tmp_path, capsys):
    model, record, _, _ = trained
    path = tmp_path / "m.keras"
    model.save(path)
    argv = ["export-espdl", "--model", str(path), "--record", str(record), "--preview"]
    assert main([*argv, "--cpp", "n"]) == 2
    assert "--preview writes nothing" in capsys.readouterr().err
