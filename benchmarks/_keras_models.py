"""The Keras set-up the ESP-DL benchmarks share (bench_espdl_chip.py, bench_espdl_v3.py):
a seeded random batch, a seeded ``keras.applications`` model (weights=None) and BatchNorm
statistics randomised so the activations of an untrained network do not vanish.

Example:
    >>> random_batch(2, 8).shape
    (2, 8, 8, 3)
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402


def random_batch(batch: int, size: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    """``batch`` uniform random ``size x size x 3`` float32 images in [low, high) (seed 0).

    Example:
        >>> x = random_batch(4, 2, 0, 255); x.dtype, bool(x.min() >= 0)
        (dtype('float32'), True)
    """
    data = np.random.default_rng(0).uniform(low, high, (batch, size, size, 3))
    return data.astype("float32")


def application(name: str, size: int, **kwargs) -> keras.Model:
    """``keras.applications.<name>`` at ``size x size x 3``, weights=None, built after
    ``keras.utils.set_random_seed(0)`` (the same weights every run); ``kwargs`` go to it.

    Example:
        >>> application("MobileNetV2", 32, alpha=0.35, classes=10).output.shape
        (None, 10)
    """
    keras.utils.set_random_seed(0)
    build = getattr(keras.applications, name)
    return build(input_shape=(size, size, 3), weights=None, **kwargs)


def randomize_bn(model: keras.Model) -> None:
    """Every BatchNormalization gets seeded random gamma, beta, mean and variance (an untrained
    network's 1 / 0 / 0 / 1 would let the activations shrink towards 0 layer after layer).

    Example:
        >>> x = keras.Input((4,)); bn = keras.layers.BatchNormalization()
        >>> m = keras.Model(x, bn(x)); randomize_bn(m); bool(bn.get_weights()[0][0] != 1)
        True
    """
    rng = np.random.default_rng(1)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.set_weights(
                [
                    rng.uniform(0.5, 1.5, c),
                    rng.normal(0, 0.1, c),
                    rng.normal(0, 0.1, c),
                    rng.uniform(0.5, 1.5, c),
                ]
            )
