"""Classifier heads and what espdl-eval scores (issue 23 §1, §2).

- A final softmax / sigmoid (``Dense(activation="softmax")``, a ``Softmax`` layer,
  ``Activation("softmax")``, a sigmoid head) is exported linear, listed as left to the host in
  export.json and on the CLI, and the chip's arg max equals the float model's on a test set
  (compared here with Keras' own prediction).
- espdl-eval scores only a chip output that computes the model's output: a skipped last layer is
  run in float on the host from the chip's output (recomputed here with numpy), or the accuracy
  is "n/a" with the reason, never a number of the wrong tensor.
- Every chip layer gets a row of the per-layer table: a SeparableConv2D's two parts and a layer
  inside a nested model, their SNR recomputed from independent Keras references.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from amct_bridge.cli import main
from amct_bridge.espdl.evaluation import evaluate_export, format_evaluation, snr_db
from amct_bridge.espdl.v1.chip import simulate_chip
from amct_bridge.keras import calibrate, export_espdl
from amct_bridge.keras.espdl_eval import evaluate_espdl

L = keras.layers


def _blobs(n: int, seed: int, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """8x8 images: class k has a bright 3x3 blob in region k, plus noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.normal(0, 0.3, (n, 8, 8, 1)).astype("float32")
    spots = [(1, 1), (1, 5), (5, 3), (5, 0)]
    for i, k in enumerate(y):
        r, c = spots[k]
        x[i, r : r + 3, c : c + 3, 0] += 1.5
    return x, y


def _head_model(head: str) -> keras.Model:
    classes = 1 if head == "sigmoid" else 3
    x = keras.Input((8, 8, 1), name="img")
    a = L.Conv2D(8, 3, padding="same", activation="relu", name="c1")(x)
    a = L.MaxPooling2D(2, name="mp")(a)
    a = L.Conv2D(8, 3, padding="same", activation="relu", name="c2")(a)
    a = L.GlobalAveragePooling2D(name="gap")(a)
    if head == "fused":
        y = L.Dense(classes, activation="softmax", name="fc")(a)
    elif head == "softmax_layer":
        y = L.Softmax(name="sm")(L.Dense(classes, name="fc")(a))
    elif head == "activation":
        y = L.Activation("softmax", name="sm")(L.Dense(classes, name="fc")(a))
    else:
        y = L.Dense(1, activation="sigmoid", name="fc")(a)
    return keras.Model(x, y)


def _trained(head: str):
    keras.utils.set_random_seed(3)
    model = _head_model(head)
    x, y = _blobs(400, 0, 3)
    x_test, y_test = _blobs(200, 1, 3)
    if head == "sigmoid":  # two classes: region 0 or not
        y, y_test = (y == 0).astype("int64"), (y_test == 0).astype("int64")
        loss = "binary_crossentropy"
    else:
        loss = "sparse_categorical_crossentropy"
    if head in ("softmax_layer", "activation", "fused", "sigmoid"):
        model.compile(keras.optimizers.Adam(0.01), loss)
        model.fit(x, y, epochs=6, batch_size=32, verbose=0)
    return model, x, x_test, y_test


@pytest.mark.parametrize("head", ["fused", "softmax_layer", "activation", "sigmoid"])
def test_classifier_head_is_left_to_the_host_and_keeps_the_arg_max(head, tmp_path, capsys):
    model, x, x_test, y_test = _trained(head)
    record = tmp_path / "r.txt"
    calibrate(model, x[:128], record, algorithm="minmax")
    model_path = tmp_path / "m.keras"
    model.save(model_path)
    out = tmp_path / "espdl"
    argv = ["export-espdl", "--model", str(model_path), "--record", str(record)]
    assert main([*argv, "--out", str(out)]) == 0  # no --skip-unsupported needed
    printed = capsys.readouterr().out
    layer = "fc" if head in ("fused", "sigmoid") else "sm"
    function = "sigmoid" if head == "sigmoid" else "softmax"
    assert f"left to the host: {function} of layer {layer!r}" in printed
    assert "skipped:" not in printed
    report = json.loads((out / "export.json").read_text())
    assert report["skipped"] == []
    (host,) = report["host"]
    assert (host["layer"], host["function"], host["reads"]) == (layer, function, "fc")
    assert report["graph"]["outputs"] == ["fc"] and report["graph"]["host"][0]["chip"] == "fc"
    config = json.loads((out / "config.json").read_text())
    assert "activation" not in config["fc"]  # exported linear: the chip computes the logits

    # the chip's prediction is the float model's on the test set (Keras' own arg max)
    chip = simulate_chip(out, x_test).output.to_float().reshape(len(x_test), -1)
    float_out = model.predict(x_test, verbose=0)
    if head == "sigmoid":
        assert np.array_equal(chip[:, 0] > 0, float_out[:, 0] > 0.5)
    else:
        assert np.array_equal(chip.argmax(axis=1), float_out.argmax(axis=1))
    float_acc = float(np.mean((float_out[:, 0] > 0.5) == y_test)) if head == "sigmoid" else None
    if float_acc is None:
        float_acc = float(np.mean(float_out.argmax(axis=1) == y_test))
    assert float_acc > 0.9  # trained: the arg max means something

    # espdl-eval scores the logits with the function applied on the host: the same accuracy
    np.savez(tmp_path / "test.npz", x=x_test, y=y_test)
    ev_argv = ["espdl-eval", "--export", str(out), "--model", str(model_path)]
    assert main([*ev_argv, "--data", str(tmp_path / "test.npz")]) == 0
    text = capsys.readouterr().out
    figures = {k: v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines()[1:4])}
    assert float(figures["float accuracy"]) == pytest.approx(float_acc)
    assert float(figures["chip accuracy"].split()[0]) == pytest.approx(float_acc)
    assert f"{function} is applied on the host" in figures["chip accuracy"]
    rows = {ln.split()[0]: ln for ln in text.splitlines() if ln.startswith("fc ")}
    assert "fc" in rows  # compared with the function applied: a real SNR
    snr = float(rows["fc"].split()[3])
    assert snr > 15


def _skipped_head_model() -> keras.Model:
    keras.utils.set_random_seed(5)
    x = keras.Input((8, 8, 1), name="img")
    a = L.Conv2D(6, 3, activation="relu", name="c1")(x)
    a = L.GlobalAveragePooling2D(name="gap")(a)
    a = L.Dense(8, name="fc2")(a)
    return keras.Model(x, L.Dense(3, activation="tanh", name="pred")(a))  # no tanh on the chip


def test_a_skipped_output_is_run_on_the_host_or_scored_n_a(tmp_path):
    model = _skipped_head_model()
    x, _ = _blobs(64, 2)
    y = model.predict(x, verbose=0).argmax(axis=1)
    record = tmp_path / "r.txt"
    calibrate(model, x, record, algorithm="minmax")
    out = tmp_path / "espdl"
    res = export_espdl(model, record, out, skip_unsupported=True)
    assert [p.layer for p in res.skipped] == ["pred"] and res.graph["outputs"] == ["fc2"]

    # Keras: the chip computes fc2, the host runs 'pred' in float from it
    ev = evaluate_espdl(out, model, x, y)
    fc2 = simulate_chip(out, x)["fc2"].to_float().reshape(len(x), -1)
    w, b = (np.asarray(v) for v in model.get_layer("pred").get_weights())
    independent = np.tanh(fc2 @ w.astype(np.float64) + b)
    assert ev.chip_acc == float(np.mean(independent.argmax(axis=1) == y))
    assert "then the layers after it to the model output 'pred' run in float" in ev.chip_note
    assert ev.chip_acc > 0.8  # the 8 features of fc2 scored as classes gave ~1/3 before

    # without a host to run it: n/a with the reason, no number
    flt = model.predict(x, verbose=0)
    ev = evaluate_export(out, x, y, float_scores=flt, output="pred")
    assert ev.chip_acc is None
    text = format_evaluation(ev)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("chip accuracy")]
    assert line.startswith("chip accuracy:       n/a (the model output 'pred' (Dense) was skipped")
    assert "the chip's output 'fc2' is its input, not the model's output" in line
    # nor when the model's output layer is not known and one was skipped
    assert evaluate_export(out, x, y, float_scores=flt).chip_acc is None


def test_every_chip_layer_gets_a_row_separable_and_nested(tmp_path):
    keras.utils.set_random_seed(0)
    xi = keras.Input((4, 4, 4))
    inner = keras.Model(xi, L.Conv2D(4, 1, activation="relu", name="inner_conv")(xi), name="block")
    x = keras.Input((8, 8, 1), name="img")
    a = L.Conv2D(4, 3, activation="relu", padding="same", name="c1")(x)
    a = L.SeparableConv2D(4, 3, padding="same", activation="relu", name="sep")(a)
    a = L.MaxPooling2D(2, name="mp")(a)
    a = inner(a)
    a = L.GlobalAveragePooling2D(name="gap")(a)
    model = keras.Model(x, L.Dense(3, name="fc")(a))
    data, _ = _blobs(32, 4)
    y = model.predict(data, verbose=0).argmax(axis=1)
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    out = tmp_path / "espdl"
    export_espdl(model, record, out)
    ev = evaluate_espdl(out, model, data, y)
    chip = simulate_chip(out, data)
    rows = {e.name: e for e in ev.layers}
    assert set(rows) == set(chip.layers) and ev.not_compared == []
    assert rows["sep_depthwise"].source == "sep/depthwise"
    assert rows["block_inner_conv"].source == "block/inner_conv"
    # independent references: Keras layers built here with the model's kernels
    probe = keras.Model(model.inputs, [model.get_layer(n).output for n in ("c1", "mp")])
    c1, mp = probe.predict(data, verbose=0)
    sep = model.get_layer("sep")
    dw = L.DepthwiseConv2D(3, padding="same", use_bias=False)
    dw.build(c1.shape)
    dw.set_weights([np.asarray(sep.depthwise_kernel)])
    ref = {"sep_depthwise": np.asarray(dw(c1)), "block_inner_conv": inner.predict(mp, verbose=0)}
    for name, value in ref.items():
        got = chip[name].to_float().reshape(value.shape)
        assert rows[name].snr_db == pytest.approx(snr_db(value, got), abs=0.05), name
        assert rows[name].snr_db > 15


def test_a_final_layer_computing_nothing_is_scored_through_its_input(tmp_path):
    """A Dropout at the end computes nothing: the chip layer before it is the model output,
    scored as it is (no host run needed, nothing "n/a")."""
    keras.utils.set_random_seed(6)
    x = keras.Input((8, 8, 1), name="img")
    a = L.GlobalAveragePooling2D(name="gap")(L.Conv2D(4, 3, activation="relu", name="c1")(x))
    model = keras.Model(x, L.Dropout(0.3, name="drop")(L.Dense(3, name="fc")(a)))
    data, _ = _blobs(32, 7)
    y = model.predict(data, verbose=0).argmax(axis=1)
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    out = tmp_path / "espdl"
    res = export_espdl(model, record, out)
    assert {"layer": "drop", "chip": "fc"} in res.graph["model_outputs"]
    flt = model.predict(data, verbose=0)
    ev = evaluate_export(out, data, y, float_scores=flt, output="drop")  # no host runner
    chip = simulate_chip(out, data)["fc"].to_float().reshape(len(data), -1)
    assert ev.chip_acc == float(np.mean(chip.argmax(axis=1) == y)) and ev.chip_note == ""
