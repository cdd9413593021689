"""simulate() of DMQ records (tensor_balance_factor) runs what AMCT runs (issue 14, bug 1).

AMCT divides a DMQ layer's input by the factor per input channel before quantizing it with
scale_d/offset_d, and multiplies the (BN-fused) kernel by it per input channel before ARQ.
Ignoring the factors quantizes the raw input with the balanced input's scale (badly clipped).
"""

import keras
import numpy as np
import pytest
from sklearn.datasets import load_digits
from test_simulate import act_factors, arq, conv2d, depthwise, fq_weights, np_fq, relu

from amct_bridge.errors import RecordError
from amct_bridge.keras.calibrate import calibrate
from amct_bridge.keras.simulate import simulate
from amct_bridge.records import LayerFactors, PruneNode, PruneRecord, Record


# --- a hand-made DMQ record against a numpy forward ----------------------------------------------
def tiny_model():
    """Conv(3x3, 2->3)+BN+ReLU -> DepthwiseConv(2x2, x2) -> Flatten -> Dense(4)."""
    x = keras.Input((6, 6, 2))
    y = keras.layers.Conv2D(3, 3, name="conv")(x)
    y = keras.layers.ReLU(name="relu")(keras.layers.BatchNormalization(name="bn")(y))
    y = keras.layers.DepthwiseConv2D(2, depth_multiplier=2, name="dw")(y)
    y = keras.layers.Dense(4, name="fc")(keras.layers.Flatten(name="flat")(y))
    model = keras.Model(x, y, name="tiny")
    rng = np.random.default_rng(3)
    model.set_weights([rng.normal(0, 0.5, w.shape).astype("float32") for w in model.get_weights()])
    model.get_layer("bn").set_weights(
        [np.float32(v) for v in ([1.5, -0.7, 0.3], [0.1, -0.2, 0.3], [0.2, 0, -0.1], [0.5, 2, 0.1])]
    )
    return model


def dmq_reference(model, x, factors):
    """AMCT's DMQ forward in numpy (BN folded into conv as deployed); also returns the record.

    ``factors`` maps key -> tensor_balance_factor. Activation factors are computed on the
    balanced input ``x / f``, ARQ scales on the balanced kernel ``W * f``.
    """
    w = {layer.name: layer.get_weights() for layer in model.layers}
    gamma, beta, mean, var = w["bn"]
    k = gamma / np.sqrt(var + np.float32(1e-3))
    conv_kernel, conv_bias = w["conv"][0] * k, (w["conv"][1] - mean) * k + beta
    rec = Record()

    def layer(key, inp, kernel, axis, in_axis):
        f = np.float32(factors[key])
        shape = [1] * kernel.ndim
        shape[in_axis] = -1
        xb = (inp / f).astype(np.float32)
        wb = (kernel * f.reshape(shape)).astype(np.float32)
        scale_d, offset_d = act_factors(xb)
        per = wb.reshape(wb.shape[:2] + (-1,)) if axis == "hwcm" else wb
        scale_w = arq(per, 2 if axis == "hwcm" else axis)
        rec.layers[key] = LayerFactors(
            scale_d=scale_d,
            offset_d=offset_d,
            scale_w=scale_w.tolist(),
            offset_w=[0] * len(scale_w),
            tensor_balance_factor=f.tolist(),
        )
        wq = fq_weights(per, scale_w, 2 if axis == "hwcm" else axis).reshape(wb.shape)
        return np_fq(xb, scale_d, offset_d, 8), wq

    xq, wq = layer("conv", x, conv_kernel, 3, 2)
    h = relu(conv2d(xq, wq, conv_bias))
    hq, dq = layer("dw", h, w["dw"][0], "hwcm", 2)
    d = depthwise(hq, dq, w["dw"][1]).reshape(len(x), -1)
    dq_, fq_ = layer("fc", d, w["fc"][0], None, 0)
    return dq_ @ fq_ + w["fc"][1], rec


def test_dmq_record_simulates_as_a_numpy_forward():
    model = tiny_model()
    x = np.random.default_rng(4).uniform(-1, 1, (8, 6, 6, 2)).astype("float32")
    rng = np.random.default_rng(5)
    # Factors far from 1 so that ignoring any of them (input or kernel) changes the output.
    factors = {
        "conv": [4.0, 0.125],
        "dw": rng.uniform(0.1, 8, 3).astype("float32").tolist(),
        "fc": rng.uniform(0.1, 8, 3 * 3 * 6).astype("float32").tolist(),
    }
    want, rec = dmq_reference(model, x, factors)
    got = simulate(model, rec).predict(x, verbose=0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_dmq_simulated_model_saves_and_loads(tmp_path):
    model = tiny_model()
    x = np.random.default_rng(6).uniform(-1, 1, (4, 6, 6, 2)).astype("float32")
    _, rec = dmq_reference(model, x, {"conv": [2.0, 0.5], "dw": [1, 3, 0.5], "fc": [1.5] * 54})
    sim = simulate(model, rec)
    sim.save(tmp_path / "sim.keras")
    again = keras.saving.load_model(tmp_path / "sim.keras")
    np.testing.assert_array_equal(again.predict(x, verbose=0), sim.predict(x, verbose=0))


@pytest.mark.parametrize(
    "factors,message",
    [
        ([1.0, 2.0, 3.0], r"tensor_balance_factor's length 3 should be equal .* conv: 2 \(Cin\)"),
        ([1.0, 0.0], "tensor_balance_factor must be finite and > 0"),
    ],
)
def test_bad_balance_factors_name_the_layer(factors, message):
    lf = LayerFactors(scale_d=0.1, offset_d=0, tensor_balance_factor=factors)
    with pytest.raises(RecordError, match="'conv'.*" + message):
        simulate(tiny_model(), Record({"conv": lf}))


def test_record_without_quantization_factors_is_refused():
    """A prune-only record would give a float copy that looks quantized: refuse it (bug 4)."""
    prune = Record(
        {"conv": LayerFactors(prune_producer=["conv"])},
        prune_records=[PruneRecord([PruneNode.channel("conv", "Conv2D", 0, 3)], [])],
    )
    with pytest.raises(
        RecordError, match=r"no quantization factors \(1 layer entry .* and 1 prune record\)"
    ):
        simulate(tiny_model(), prune)
    with pytest.raises(RecordError, match="no quantization factors"):
        simulate(tiny_model(), Record())


# --- accuracy on a residual CNN trained briefly on the digits ------------------------------------
def residual_cnn():
    """Conv+BN+ReLU, a residual Conv+BN block (Add), a strided Conv, Dense: about 3k params."""
    i = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(8, 3, padding="same", name="conv1")(i)
    h = keras.layers.ReLU(name="relu1")(keras.layers.BatchNormalization(name="bn1")(h))
    r = keras.layers.BatchNormalization(name="bn2")(
        keras.layers.Conv2D(8, 3, padding="same", name="conv2")(h)
    )
    h = keras.layers.ReLU(name="relu2")(keras.layers.Add(name="add")([h, r]))
    h = keras.layers.Conv2D(16, 3, strides=2, activation="relu", name="conv3")(h)
    return keras.Model(i, keras.layers.Dense(10, name="fc")(keras.layers.Flatten()(h)))


@pytest.fixture(scope="module")
def trained():
    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    keras.utils.set_random_seed(0)
    model = residual_cnn()
    model.compile(
        "adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    model.fit(x[:1300], data.target[:1300], epochs=20, batch_size=32, verbose=0)
    return model, x, data.target


def accuracy(model, x, y):
    return float((model.predict(x, verbose=0).argmax(-1) == y).mean())


@pytest.mark.parametrize("strength", [0.2, 0.5, 0.8])
def test_dmq_accuracy_is_within_a_point_of_plain_int8(trained, strength, tmp_path):
    model, x, y = trained
    xt, yt = x[1300:], y[1300:]
    plain = calibrate(model, x[:256], tmp_path / "plain.txt")
    dmq = calibrate(model, x[:256], tmp_path / "dmq.txt", migration_strength=strength)
    assert all(f.tensor_balance_factor for f in dmq.layers.values())
    float_acc, int8 = accuracy(model, xt, yt), accuracy(simulate(model, plain), xt, yt)
    got = accuracy(simulate(model, dmq), xt, yt)
    print(f"float {float_acc:.3f}  INT8 {int8:.3f}  DMQ({strength}) {got:.3f}")
    assert float_acc > 0.9  # trained enough for the comparison to mean something
    assert abs(got - int8) <= 0.01


def test_separable_conv_balances_both_parts():
    """sep/depthwise divides the layer input, sep/pointwise the depthwise output."""
    x_in = keras.Input((5, 5, 2))
    model = keras.Model(
        x_in, keras.layers.SeparableConv2D(3, 2, depth_multiplier=2, name="sep")(x_in)
    )
    rng = np.random.default_rng(7)
    model.set_weights([rng.normal(0, 0.5, w.shape).astype("float32") for w in model.get_weights()])
    dw, pw, bias = model.get_layer("sep").get_weights()
    x = rng.uniform(-1, 1, (4, 5, 5, 2)).astype("float32")
    f_dw, f_pw = np.float32([3.0, 0.25]), rng.uniform(0.2, 5, 4).astype("float32")
    xb = x / f_dw
    s_dw, o_dw = act_factors(xb)
    kd = (dw * f_dw.reshape(1, 1, 2, 1)).astype(np.float32)
    sw_dw = arq(kd.reshape(2, 2, -1), 2)
    mid = depthwise(
        np_fq(xb, s_dw, o_dw, 8), fq_weights(kd.reshape(2, 2, -1), sw_dw, 2).reshape(kd.shape), 0
    )
    mb = mid / f_pw
    s_pw, o_pw = act_factors(mb)
    kp = (pw * f_pw.reshape(1, 1, 4, 1)).astype(np.float32)
    sw_pw = arq(kp, 3)
    want = conv2d(np_fq(mb, s_pw, o_pw, 8), fq_weights(kp, sw_pw, 3), bias)
    rec = Record(
        {
            "sep/depthwise": LayerFactors(
                scale_d=s_dw,
                offset_d=o_dw,
                scale_w=sw_dw.tolist(),
                offset_w=[0] * 4,
                tensor_balance_factor=f_dw.tolist(),
            ),
            "sep/pointwise": LayerFactors(
                scale_d=s_pw,
                offset_d=o_pw,
                scale_w=sw_pw.tolist(),
                offset_w=[0] * 3,
                tensor_balance_factor=f_pw.tolist(),
            ),
        }
    )
    got = simulate(model, rec).predict(x, verbose=0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
