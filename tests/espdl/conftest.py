"""Shared fixtures of the ESP-DL exporter tests."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from espdl_stats import layer_activations, sidecar_from


@pytest.fixture(scope="session")
def mobilenet():
    """MobileNetV2 (alpha 0.35, 96x96, weights=None), 2 random images, their activations."""
    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(
        input_shape=(96, 96, 3), alpha=0.35, weights=None, classes=10, classifier_activation=None
    )
    data = np.random.default_rng(0).uniform(-1, 1, (2, 96, 96, 3)).astype("float32")
    acts = layer_activations(model, data)
    return model, data, acts, sidecar_from(acts)
