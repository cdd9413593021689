"""strip_qat of a compiled QAT model rebuilt it as ``keras.Model(inputs, outputs)``, lists: a
one-input model became a model of a one-element input list, and every call on the deployable
model with a NumPy batch (its saved ``.keras`` too; espdl-eval's float run on it) printed Keras'
"UserWarning: The structure of `inputs` doesn't match the expected structure. Expected:
['img']". The input and output structure is now the QAT model's."""

import warnings

import keras
import numpy as np

from amct_bridge.keras.qat import quantize_aware, strip_qat

L = keras.layers


def _stripped(model, xs, ys):
    qat = quantize_aware(model)
    qat.compile(optimizer="sgd", loss="mse")
    qat.fit(xs, ys, epochs=1, verbose=0)
    return strip_qat(qat)


def test_a_one_input_model_stays_one_input(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 3), name="img")
    model = keras.Model(inp, L.Dense(2, name="fc")(L.Flatten()(L.Conv2D(3, 3, name="c")(inp))))
    xs = np.random.default_rng(0).uniform(0, 1, (8, 6, 6, 3)).astype("float32")
    plain = _stripped(model, xs, np.zeros((8, 2)))
    plain.save(tmp_path / "d.keras")
    for m in (plain, keras.saving.load_model(tmp_path / "d.keras")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = m(xs)  # a NumPy batch, as espdl-eval and users call it
        assert not [w for w in caught if "structure" in str(w.message)]
        assert tuple(out.shape) == (8, 2)
        assert isinstance(m.predict(xs, verbose=0), np.ndarray)


def test_two_outputs_keep_their_list(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((4,), name="x")
    h = L.Dense(3, name="h")(inp)
    model = keras.Model(inp, [L.Dense(1, name="a")(h), L.Dense(2, name="b")(h)])
    xs = np.random.default_rng(0).uniform(0, 1, (8, 4)).astype("float32")
    plain = _stripped(model, xs, [np.zeros((8, 1)), np.zeros((8, 2))])
    out = plain.predict(xs, verbose=0)
    assert isinstance(out, list) and [o.shape for o in out] == [(8, 1), (8, 2)]
