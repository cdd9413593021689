"""``espdl-eval --format espdl`` (issue 33 §3, §4): a ``.espdl`` file another tool made
(esp-ppq), whose tensor names are no layer of the Keras model, is compared where it can be (the
model output) and the rest is listed as "not compared" (it crashed: ``internal error:
ValueError: outputs argument cannot be empty``); each row is labelled by the operator that
computes it (a GlobalAveragePooling2D's row said ``Flatten``), and a float32 row has no
exponent (it showed ``exp 0``)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import keras
import numpy as np

from amct_bridge.cli import main
from amct_bridge.espdl.v3.evaluation import quantize_input
from amct_bridge.espdl.v3.reader import read_espdl
from amct_bridge.espdl.v3.simulate import simulate_espdl
from amct_bridge.keras import calibrate, evaluate_espdl, export_espdl

DATA = Path(__file__).parent.parent / "data" / "espdl_v3"
GEMM = DATA / "test_apps_esp32s3_Gemm_linear_ishap_1_16_kshap_16_16_relu_s8.espdl"
TUTORIAL = DATA / "tutorial_how_to_run_model_main_models_s3_model.espdl"


def _snr(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64).reshape(ref.shape)
    return 10 * math.log10(np.sum(ref**2) / np.sum((ref - got) ** 2))


def test_a_file_esp_ppq_made_is_compared_by_its_output(tmp_path, capsys):
    espdl = read_espdl(GEMM)
    (gemm,) = espdl.nodes
    weight, bias = (espdl.initializers[name] for name in gemm.inputs[1:])
    # 16 outputs fill one block of 16: the file's bytes are the (in, out) kernel in order
    kernel = np.ldexp(weight.data.reshape(16, 16).astype(np.float64), weight.exponents[0])
    keras.utils.set_random_seed(0)
    x_in = keras.Input((16,), name="features")  # no name is one of the file's tensors
    model = keras.Model(x_in, keras.layers.Dense(16, activation="relu", name="other")(x_in))
    model.get_layer("other").set_weights(
        [kernel.astype(np.float32), np.ldexp(bias.data.astype(np.float64), bias.exponents[0])]
    )
    # inputs whose outputs stay inside the file's output range (exponent -8: below 0.5)
    x = np.random.default_rng(0).uniform(-0.25, 0.25, (48, 16)).astype(np.float32)
    ref = model.predict(x, verbose=0)
    np.savez(tmp_path / "val.npz", x=x, y=ref.argmax(axis=1))
    model.save(tmp_path / "m.keras")
    argv = ["espdl-eval", "--export", str(GEMM), "--model", str(tmp_path / "m.keras")]
    assert main([*argv, "--data", str(tmp_path / "val.npz")]) == 0
    out = capsys.readouterr().out
    row = re.search(r"^4 +Gemm +-8 +([\d.]+) .*\(the model's output\)$", out, re.M)
    assert row, out
    # independent: the simulator's output of the file against the Keras model's
    ints = quantize_input(espdl, x, "esp32s3")
    got = np.ldexp(simulate_espdl(espdl, ints, "esp32s3").values["4"].astype(np.float64), -8)
    assert float(row.group(1)) == round(_snr(ref, got), 1)
    assert _snr(ref, got) > 25  # the same weights: the comparison is of the right tensors
    assert re.search(r"^chip accuracy: +[\d.]+ \(esp32s3, bit-exact simulator\)$", out, re.M)


def test_tensors_without_a_counterpart_are_listed_as_not_compared(tmp_path):
    keras.utils.set_random_seed(0)
    x_in = keras.Input((1,), name="value")
    h = keras.layers.Dense(64, activation="relu", name="a")(x_in)
    h = keras.layers.Dense(64, activation="relu", name="b")(h)
    model = keras.Model(x_in, keras.layers.Dense(1, name="c")(h))
    x = np.random.default_rng(0).uniform(-1, 1, (32, 1)).astype(np.float32)
    y = (model.predict(x, verbose=0)[:, 0] > 0.5).astype(np.int64)
    ev = evaluate_espdl(TUTORIAL, model, x, y)
    espdl = read_espdl(TUTORIAL)
    out = espdl.outputs[0].name  # '11'
    hidden = [v.name for v in espdl.value_info if v.name not in (out, espdl.inputs[0].name)]
    assert len(hidden) == 2
    assert [row.name for row in ev.layers] == [out]
    assert ev.layers[0].source == "(the model's output)"
    assert sorted(ev.not_compared) == sorted(
        f"{name}: no layer {name!r} in the Keras model" for name in hidden
    )
    ints = quantize_input(espdl, x, "esp32s3")
    got = np.ldexp(
        simulate_espdl(espdl, ints, "esp32s3").values[out].astype(np.float64),
        espdl.outputs[0].exponent,
    )
    assert ev.layers[0].snr_db == _snr(model.predict(x, verbose=0), got)


def test_rows_are_labelled_by_the_operator_and_float_rows_have_no_exponent(tmp_path, capsys):
    keras.utils.set_random_seed(0)
    x_in = keras.Input((8, 8, 3), name="img")
    c = keras.layers.Conv2D(8, 3, activation="relu", name="c1")(x_in)
    a = keras.layers.GlobalAveragePooling2D(name="gap")(c)
    b = keras.layers.Flatten(name="flat")(keras.layers.MaxPooling2D(3, name="mp")(c))
    s = keras.layers.Add(name="add")([a, keras.layers.Dense(8, name="fb")(b)])
    model = keras.Model(x_in, keras.layers.Softmax(name="sm")(keras.layers.Dense(4, name="fc")(s)))
    x = np.random.default_rng(0).uniform(0, 1, (32, 8, 8, 3)).astype("float32")
    calibrate(model, x, tmp_path / "r.txt", algorithm="minmax")
    export_espdl(model, tmp_path / "r.txt", tmp_path / "m.espdl", format="espdl")
    model.save(tmp_path / "m.keras")
    np.savez(tmp_path / "val.npz", x=x, y=model.predict(x, verbose=0).argmax(axis=1))
    argv = ["espdl-eval", "--export", str(tmp_path / "m.espdl"), "--model"]
    assert main([*argv, str(tmp_path / "m.keras"), "--data", str(tmp_path / "val.npz")]) == 0
    rows = {
        line.split()[0]: line.split()[1:3]
        for line in capsys.readouterr().out.splitlines()
        if line.split() and line.split()[0] in ("c1", "gap", "flat", "sm")
    }
    # independent: the file's own graph and types
    espdl = read_espdl(tmp_path / "m.espdl")
    producer = {o: n for n in espdl.nodes for o in n.outputs}
    assert producer["gap"].op_type == "Flatten"  # GlobalAveragePool, then a made-up Flatten
    assert producer[producer["gap"].inputs[0]].op_type == "GlobalAveragePool"
    assert rows["gap"][0] == "GlobalAveragePool"
    assert rows["flat"][0] == producer["flat"].op_type == "Flatten"  # the model's own Flatten
    assert rows["c1"] == ["Conv", str(next(v for v in espdl.value_info if v.name == "c1").exponent)]
    assert next(v for v in espdl.outputs if v.name == "sm").elem_type == 1  # float32
    assert rows["sm"] == ["Softmax", "-"]
