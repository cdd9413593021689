"""Keras QAT of a Conv2DTranspose with output_padding: the QAT layer computes Keras' own
Conv2DTranspose (output_padding included: computed rows, as Keras defines them) on the
fake-quantized input and kernel, the record's factors recomputed in numpy; strip_qat +
simulate reproduce the QAT model (1e-4)."""

import keras
import numpy as np
import pytest

from amct_bridge.keras.qat import qat_record, quantize_aware, save_qat_record, strip_qat
from amct_bridge.keras.simulate import simulate
from amct_bridge.quant import qat as core
from amct_bridge.records import load, validate

L = keras.layers


@pytest.mark.parametrize("padding, output_padding", [("valid", 1), ("same", (1, 0))])
def test_conv2d_transpose_output_padding(padding, output_padding, tmp_path):
    keras.utils.set_random_seed(0)
    x_in = keras.Input((4, 4, 2))
    a = L.Conv2D(2, 3, padding="same", activation="relu", name="conv")(x_in)
    up = L.Conv2DTranspose(
        3, 3, strides=2, padding=padding, output_padding=output_padding, name="up"
    )
    y = up(a)
    model = keras.Model(x_in, L.Dense(2, name="fc")(L.Flatten(name="flat")(y)))
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (16, 4, 4, 2)).astype("float32")
    qat = quantize_aware(model, "INT8")
    qat.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    qat.fit(x, rng.normal(0, 1, (16, 2)).astype("float32"), batch_size=8, epochs=2, verbose=0)
    rec = save_qat_record(qat, tmp_path / "qat.txt")
    assert validate(rec) == [] and list(load(tmp_path / "qat.txt").layers) == ["conv", "up", "fc"]

    # the QAT "up" layer = Keras' Conv2DTranspose on numpy fake-quantized input and kernel
    q_up = qat.get_layer("up")
    lo, hi = (float(np.asarray(v)) for v in q_up.ranges["input"][:2])
    kernel, bias = (np.asarray(w) for w in strip_qat(qat).get_layer("up").get_weights())
    sub = keras.Model(qat.input, [qat.get_layer("conv").output, q_up.output])
    a_val, got = (np.asarray(v) for v in sub.predict(x, verbose=0))
    ref = L.Conv2DTranspose.from_config(model.get_layer("up").get_config())
    ref.build((None, 4, 4, 2))
    ref.set_weights([core.arq_fake_quant(kernel, "HWOI", 8), bias])
    want = np.asarray(ref(core.fake_quant_range(a_val, lo, hi, 8)))
    pad = (output_padding,) * 2 if isinstance(output_padding, int) else output_padding
    crop = 0 if padding == "valid" else 2 * (3 // 2)  # Keras: (in-1)*s + k - 2*pad + out_pad
    size = [(4 - 1) * 2 + 3 - crop + p for p in pad]
    assert got.shape == want.shape == (16, *size, 3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    f = qat_record(qat).layers["up"]
    assert len(f.scale_w) == 3  # per output channel

    # strip -> simulate reproduces the QAT model
    plain = strip_qat(qat)
    assert plain.get_layer("up").output_padding == pad
    np.testing.assert_allclose(
        simulate(plain, tmp_path / "qat.txt").predict(x, verbose=0),
        qat.predict(x, verbose=0),
        rtol=1e-4,
        atol=1e-4,
    )
