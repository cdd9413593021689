"""Keras LayerNormalization -> the v3 runtime's LayerNormalization
(dl_module_layer_normalization.hpp).

The simulator follows the module's integer path in float32, operation by operation; checked
here on a hand-worked example. Exported Keras models follow Keras: s16 within 1 % of the output
range, s8 within the error the exponents allow (stated in the test). Layers the runtime cannot
compute (rms_scaling, axes that are not trailing) are refused by name."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras import layers as L

from amct_bridge.errors import ExportError
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.espdl.v3.model import EspdlModel, Node, Tensor, ValueInfo
from amct_bridge.espdl.v3.simulate import sqrt_newton
from amct_bridge.keras import calibrate, export_espdl


def test_hand_worked_layer_norm():
    # x = [1, 2, 3, 4] at 2^0: mean 2.5, var (2.25 + .25 + .25 + 2.25) / 4 = 1.25,
    # 1/sqrt(1.25 + 1e-5) = 0.894423; normalized -1.341635, -0.447212, 0.447212, 1.341635;
    # gamma 64 * 2^-6 = 1; at 2^-5: x32 = -42.93, -14.31, 14.31, 42.93 -> -43, -14, 14, 43
    g = Tensor("g", np.int8([64, 64, 64, 64]), [-6])
    b = Tensor("b", np.int8([0, 0, 16, 0]), [-4])  # beta [0, 0, 1, 0]: +32 at 2^-5
    node = Node("ln", "LayerNormalization", ["x", "g", "b"], ["ln"])
    node.attributes.update({"axis": -1, "epsilon": 1e-5, "quant_type": "S8"})
    m = EspdlModel(
        [node],
        {"g": g, "b": b},
        inputs=[ValueInfo("x", [1, 4], 3, [0])],
        outputs=[ValueInfo("ln", [1, 4], 3, [-5])],
        metadata={"target": "c"},
    )
    out = simulate_espdl(m, np.int8([[1, 2, 3, 4], [4, 3, 2, 1]])).outputs["ln"]
    assert out.tolist() == [[-43, -14, 46, 43], [43, 14, 18, -43]]
    assert sqrt_newton(np.float32([1.25001]))[0] == pytest.approx(np.sqrt(1.25001), rel=1e-6)


def _model(center=True, scale=True, **kw) -> keras.Model:
    x = keras.Input((4, 4, 3), name="x")
    c = L.Conv2D(8, 3, padding="same", name="c")(x)
    n = L.LayerNormalization(name="ln", center=center, scale=scale, **kw)(c)
    model = keras.Model(x, L.Dense(3, name="fc")(n))
    rng = np.random.default_rng(1)
    if scale or center:
        weights = [rng.uniform(0.5, 1.5, 8) if scale else None, rng.uniform(-0.5, 0.5, 8)]
        model.get_layer("ln").set_weights([w for w in weights if w is not None][: scale + center])
    return model


@pytest.mark.parametrize(
    ("target", "feature_type"), [("esp32s3", "s16"), ("esp32p4", "s8"), ("c", "s8")]
)
def test_keras_layer_norm_exports_and_follows_keras(tmp_path, target, feature_type):
    model = _model(epsilon=1e-3)
    data = np.random.default_rng(0).uniform(-1, 1, (16, 4, 4, 3)).astype("float32")
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    out = tmp_path / "m.espdl"
    res = export_espdl(model, record, out, format="espdl", target=target,
                       feature_type=feature_type, test_input=data)  # fmt: skip
    assert {r.name: r.status for r in res.layers}["ln"] == "exported"
    back = read_espdl(out)
    ln = next(n for n in back.nodes if n.op_type == "LayerNormalization")
    assert ln.name == "ln" and ln.attributes["axis"] == 3
    assert ln.attributes["epsilon"] == pytest.approx(1e-3)
    sim = simulate_espdl(back, None)  # the embedded test values are our simulator's
    for t in back.test_outputs:
        np.testing.assert_array_equal(sim.outputs[t.name], t.data)
    bits = 8 if feature_type == "s8" else 16
    step = 2.0 ** back.inputs[0].exponent
    q = np.clip(np.floor(data / step + 0.5), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    dtype = np.int8 if bits == 8 else np.int16
    res = simulate_espdl(back, q.astype(dtype))
    xq = (q * step).astype("float32")
    probe = keras.Model(model.inputs, model.get_layer("ln").output)
    want = probe.predict(xq, verbose=0)
    got = res.values["ln"] * 2.0 ** back.value("ln").exponent
    if bits == 16:
        assert np.abs(got - want).max() <= 0.01 * np.ptp(want)
    else:
        # what the exponents allow: the conv output's rounding (half a step, times the
        # largest 1/std times gamma), gamma's and beta's rounding, and the output's half step
        e_c, e_o = back.value("c").exponent, back.value("ln").exponent
        e_g, e_b = (back.initializers[f"ln/{k}"].exponents[0] for k in ("gamma", "beta"))
        conv = keras.Model(model.inputs, model.get_layer("c").output).predict(xq, verbose=0)
        inv_std = 1 / np.sqrt(conv.var(axis=-1) + 1e-3).min()
        gamma = np.abs(model.get_layer("ln").gamma.numpy()).max()
        bound = 2.0**e_c * inv_std * gamma + 2.0 ** (e_g - 1) * np.sqrt(8) + 2.0 ** (e_b - 1)
        bound += 2.0 ** (e_o - 1)
        assert np.abs(got - want).max() <= bound
    fc = res.outputs["fc"] * 2.0 ** back.value("fc").exponent
    ref = model.predict(xq, verbose=0)
    assert np.abs(fc - ref).max() <= (0.01 if bits == 16 else 0.1) * np.ptp(ref)


def test_layer_norm_without_gamma_or_beta(tmp_path):
    model = _model(center=False, scale=False)
    data = np.random.default_rng(0).uniform(-1, 1, (8, 4, 4, 3)).astype("float32")
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    out = tmp_path / "m.espdl"
    export_espdl(model, record, out, format="espdl", target="c", feature_type="s16")
    back = read_espdl(out)
    ln = next(n for n in back.nodes if n.op_type == "LayerNormalization")
    assert ln.inputs == ["c"]
    q = np.round(data / 2.0 ** back.inputs[0].exponent).astype(np.int16)
    got = simulate_espdl(back, q).values["ln"] * 2.0 ** back.value("ln").exponent
    xq = (q * 2.0 ** back.inputs[0].exponent).astype("float32")
    want = keras.Model(model.inputs, model.get_layer("ln").output).predict(xq, verbose=0)
    assert np.abs(got - want).max() <= 0.01 * np.ptp(want)


@pytest.mark.parametrize(
    ("kw", "why"),
    [({"rms_scaling": True}, "rms_scaling"), ({"axis": 1}, "trailing axes")],
)
def test_layer_norm_the_runtime_cannot_compute_is_refused(tmp_path, kw, why):
    model = _model(center=False, scale=False, **kw)
    record = tmp_path / "r.txt"
    calibrate(model, np.ones((2, 4, 4, 3), "float32"), record, algorithm="minmax")
    with pytest.raises(ExportError, match=rf"layer 'ln' \(LayerNormalization\).*{why}"):
        export_espdl(model, record, tmp_path / "m.espdl", format="espdl", target="c")
