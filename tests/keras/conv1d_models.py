"""Issue 33's 1-D model (Conv1D -> DepthwiseConv1D -> Conv1D -> GlobalAveragePooling1D -> Dense)
and its 2-D twin of height 1 with the same weights, for the Keras and ESP-DL tests."""

from __future__ import annotations

import keras
import numpy as np

#: (W, C) of one sample.
SHAPE = (32, 4)


def conv1d_net(seed: int = 0, *, separable: bool = False, bn: bool = False) -> keras.Model:
    """The issue's model: input (32, 4), 8 filters; ``separable`` adds a SeparableConv1D
    ``sep`` after ``dw``, ``bn`` a BatchNormalization ``bn`` after ``c2`` (folded into it)."""
    keras.utils.set_random_seed(seed)
    x = keras.Input(SHAPE, name="x")
    h = keras.layers.Conv1D(8, 3, padding="same", activation="relu", name="c1")(x)
    h = keras.layers.DepthwiseConv1D(3, padding="same", activation="relu", name="dw")(h)
    if separable:
        h = keras.layers.SeparableConv1D(8, 3, padding="same", activation="relu", name="sep")(h)
    if bn:
        h = keras.layers.Conv1D(8, 3, padding="same", name="c2")(h)
        h = keras.layers.BatchNormalization(name="bn")(h)
        h = keras.layers.ReLU(name="r2")(h)
    else:
        h = keras.layers.Conv1D(8, 3, padding="same", activation="relu", name="c2")(h)
    h = keras.layers.GlobalAveragePooling1D(name="gap")(h)
    y = keras.layers.Dense(4, name="fc")(h)
    model = keras.Model(x, y, name="net1d")
    if bn:  # statistics away from the identity, so the fold is visible
        rng = np.random.default_rng(seed)
        layer = model.get_layer("bn")
        layer.set_weights([rng.uniform(0.5, 2.0, w.shape).astype("float32") for w in layer.weights])
    return model


def height1_twin(model: keras.Model) -> keras.Model:
    """The same network with 2-D layers of height 1 on (1, 32, 4) inputs and the same weights:
    what AMCT's Conv2D rules quantize."""
    x = keras.Input((1, *SHAPE), name="x")
    h = keras.layers.Conv2D(8, (1, 3), padding="same", activation="relu", name="c1")(x)
    h = keras.layers.DepthwiseConv2D((1, 3), padding="same", activation="relu", name="dw")(h)
    h = keras.layers.Conv2D(8, (1, 3), padding="same", activation="relu", name="c2")(h)
    h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
    y = keras.layers.Dense(4, name="fc")(h)
    twin = keras.Model(x, y, name="net2d")
    for name in ("c1", "dw", "c2", "fc"):
        weights = model.get_layer(name).get_weights()
        twin.get_layer(name).set_weights([w[None] if w.ndim == 3 else w for w in weights])
    return twin


def samples(n: int, seed: int = 1) -> np.ndarray:
    """``n`` inputs of the model, standard normal."""
    return np.random.default_rng(seed).normal(size=(n, *SHAPE)).astype("float32")


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    """10 log10 of the reference's energy over the error's."""
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64).reshape(ref.shape)
    return float(10 * np.log10((ref**2).sum() / max(((ref - got) ** 2).sum(), 1e-30)))
