"""A functional CNN with a shared Conv2D (called on two branches), a SeparableConv2D, a
Concatenate and a Dense(softmax) head: ESP-DL v3 refused it ("layer called more than once"),
although a v3 graph can hold two Conv nodes with the same weights. Each call is now its own
Conv (``shared``, ``shared@1``, the graph IR's names), with the layer's one record entry and
sidecar ranges. v1 still refuses it: its C++ layer objects hold one output each."""

import keras
import numpy as np
import pytest

from amct_bridge.errors import ExportError
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.keras import calibrate, evaluate_espdl, export_espdl

L = keras.layers


def _model():
    keras.utils.set_random_seed(0)
    inp = keras.Input((12, 12, 3), name="img")
    a = L.ReLU(name="r1")(L.BatchNormalization(name="bn1")(L.Conv2D(8, 3, name="c1")(inp)))
    b = L.SeparableConv2D(8, 3, padding="same", activation="relu", name="sep")(a)
    shared = L.Conv2D(8, 1, activation="relu", name="shared")
    cat = L.Concatenate(name="cat")([shared(a), shared(b)])
    g = L.GlobalAveragePooling2D(name="gap")(cat)
    return keras.Model(inp, L.Dense(4, activation="softmax", name="head")(g)), shared


def _snr(ref, got):
    return 10 * np.log10((ref**2).sum() / ((ref - got) ** 2).sum())


def test_a_shared_conv_exports_to_v3_as_two_convs(tmp_path):
    model, shared = _model()
    xs = np.random.default_rng(0).uniform(0, 1, (32, 12, 12, 3)).astype("float32")
    calibrate(model, xs, tmp_path / "r.txt", algorithm="minmax")
    with pytest.raises(ExportError, match="'shared@1': layer called more than once"):
        export_espdl(model, tmp_path / "r.txt", tmp_path / "v1")

    out = tmp_path / "m.espdl"
    res = export_espdl(model, tmp_path / "r.txt", out, format="espdl", target="esp32s3")
    status = {x.name: x.status for x in res.layers}
    assert status["shared"] == status["shared@1"] == "exported"
    espdl = read_espdl(out)
    inits = espdl.initializers
    assert np.array_equal(inits["shared/filter"].data, inits["shared@1/filter"].data)

    # independent: the float second call from Keras' own node, the input quantized by hand
    # (esp32s3 rounds half up)
    e_in = espdl.inputs[0].exponents[0]
    q = np.clip(np.floor(xs * 2.0**-e_in + 0.5), -128, 127).astype(np.int8)
    sim = simulate_espdl(espdl, q)
    probe = keras.Model(model.input, [shared._inbound_nodes[1].output_tensors[0], model.output])
    second, probs = probe.predict(xs, verbose=0)
    got = sim.values["shared@1"] * 2.0 ** sim.exponents["shared@1"]
    assert _snr(second, got) > 20
    assert _snr(probs, sim.outputs["head"]) > 20

    ev = evaluate_espdl(out, model, xs, np.argmax(probs, axis=1))
    rows = {r.source: r for r in ev.layers}
    assert abs(rows["shared@1"].snr_db - _snr(second, got)) < 0.5
