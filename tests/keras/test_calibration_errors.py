"""Bad input gives a clear CalibrationError, writes nothing and leaves the model untouched."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from calib_models import images, sequential_model

from amct_bridge.errors import CalibrationError
from amct_bridge.keras import QuantCalibration


def _untouched(model):
    return not [layer.name for layer in model.layers if "call" in vars(layer)]


def test_unknown_skip_layer_is_named_with_suggestion(tmp_path):
    model = sequential_model()
    cb = QuantCalibration(tmp_path / "r.txt", skip_layers=["fc1"])
    with pytest.raises(CalibrationError, match=r"skip_layers: no layer named 'fc1'.*'fc'"):
        model.predict(images(8), verbose=0, callbacks=[cb])
    assert not (tmp_path / "r.txt").exists() and _untouched(model)


def test_model_without_quantizable_layer(tmp_path):
    inp = keras.Input((4,))
    model = keras.Model(inp, keras.layers.ReLU(name="r")(inp), name="plain")
    with pytest.raises(CalibrationError, match="model 'plain' has no quantizable layer"):
        model.predict(np.ones((4, 4)), verbose=0, callbacks=[QuantCalibration(tmp_path / "r.txt")])
    assert not (tmp_path / "r.txt").exists()


def test_zero_batches_writes_nothing(tmp_path):
    model = sequential_model()
    model.compile(loss="mse")
    cb = QuantCalibration(tmp_path / "r.txt", on="validation")  # but fit gets no validation data
    with pytest.raises(CalibrationError, match="no calibration batch was seen"):
        model.fit(images(8), np.zeros((8, 5)), epochs=1, verbose=0, callbacks=[cb])
    assert not (tmp_path / "r.txt").exists() and _untouched(model)


@pytest.mark.filterwarnings("ignore:Your input ran out of data")
def test_empty_dataset_writes_nothing(tmp_path):
    model = sequential_model()
    empty = tf.data.Dataset.from_tensor_slices(images(8)).take(0).batch(4)
    with pytest.raises(CalibrationError, match="no calibration batch was seen"):
        model.predict(empty, verbose=0, callbacks=[QuantCalibration(tmp_path / "r.txt")])
    assert not (tmp_path / "r.txt").exists() and _untouched(model)


def test_nan_activation_names_layer_and_batch(tmp_path):
    model = sequential_model()
    x = images(16)
    x[10, 2, 2, 0] = np.nan  # batch 1 with batch_size 8
    path = tmp_path / "r.txt"
    path.write_text("old record\n")
    cb = QuantCalibration(path, algorithm="minmax")
    with pytest.raises(CalibrationError, match=r"layer 'c1': input of batch 1 contains NaN or Inf"):
        model.predict(x, batch_size=8, verbose=0, callbacks=[cb])
    assert path.read_text() == "old record\n"  # never a partial record
    assert _untouched(model)


def test_inf_after_a_layer_is_named(tmp_path):
    inp = keras.Input((3,))
    h = keras.layers.Dense(3, name="fc1", kernel_initializer="ones")(inp)
    out = keras.layers.Dense(2, name="fc2")(keras.layers.Activation("exponential", name="e")(h))
    model = keras.Model(inp, out)
    x = np.full((4, 3), 100.0, "float32")  # exp(300) overflows float32
    with pytest.raises(CalibrationError, match=r"layer 'e': output of batch 0"):
        model.predict(
            x, verbose=0, callbacks=[QuantCalibration(tmp_path / "r.txt", algorithm="minmax")]
        )


def test_inf_after_a_folded_bn_names_the_bn(tmp_path):
    """c1's BN is folded: c1's output is observed after the BN, and the message says so."""
    model = sequential_model()
    model.get_layer("bn1").gamma.assign(np.full(4, 3e38, "float32"))  # overflows to inf
    with pytest.raises(
        CalibrationError, match=r"layer 'c1': output \(after its folded 'bn1'\) of batch 0"
    ):
        model.predict(
            images(8), verbose=0, callbacks=[QuantCalibration(tmp_path / "r.txt", algorithm="hfmg")]
        )
    assert _untouched(model)


@pytest.mark.parametrize("where", ["missing-dir/r.txt", "."])
def test_unwritable_record_path_fails_at_construction(tmp_path, where):
    with pytest.raises(CalibrationError, match="cannot write output"):
        QuantCalibration(tmp_path / where)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"algorithm": "kl"}, "algorithm must be one of"),
        ({"flavor": "mindspore"}, "flavor must be one of"),
        ({"batch_num": 0}, "batch_num must be >= 1"),
        ({"act_type": "INT4"}, "act_type must be INT8 or INT16"),
        ({"migration_strength": 1.0}, r"migration_strength must be in \[0.2, 0.8\]"),
        ({"on": "test"}, "on must be one of"),
        ({"migration_strength": 0.5, "flavor": "tf"}, "DMQ .* needs flavor 'inner'"),
    ],
)
def test_bad_options(tmp_path, kwargs, message):
    with pytest.raises(CalibrationError, match=message):
        QuantCalibration(tmp_path / "r.txt", **kwargs)
