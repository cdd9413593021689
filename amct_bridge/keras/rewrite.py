"""Rewrite a Keras model into a copy with some layers replaced (used by simulate and QAT).

Layers are addressed by record keys: the Keras layer name, nested models joined with "/"
("outer/inner"). The original model is never modified: the copy has its own layers and variables.

Example:
    >>> import keras
    >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="d")])
    >>> sorted(layer_keys(m).values())
    ['d']
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np

from amct_bridge.errors import QuantError
from amct_bridge.keras.plan import batchnorm_chains, walk_layers
from amct_bridge.keras.qat.fake_quant import layer_spec


def layer_keys(model: keras.Model, prefix: str = "") -> dict[int, str]:
    """Map ``id(layer)`` -> record key for every layer of ``model``, nested models included.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, name="fc")])
        >>> list(layer_keys(m).values())
        ['fc']
    """
    keys: dict[int, str] = {}
    for layer in model.layers:
        key = prefix + layer.name
        keys[id(layer)] = key
        if isinstance(layer, keras.Model):
            keys.update(layer_keys(layer, key + "/"))
    return keys


def quantizable_layers(model: keras.Model) -> dict[str, keras.layers.Layer]:
    """Record key -> layer for every layer of ``model`` that ``layer_spec`` quantizes.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, name="fc"),
        ...                       keras.layers.ReLU(name="r")])
        >>> list(quantizable_layers(m))
        ['fc']
    """
    # Same keys as the calibration callback writes (walk_layers: a shared layer's first key).
    return {key: x for key, x in walk_layers(model).items() if layer_spec(x) is not None}


def batchnorm_after(model: keras.Model) -> dict[str, keras.layers.BatchNormalization]:
    """Record key of each quantizable layer with a BN AMCT folds into it -> that BN.

    These are the Conv+BN pairs whose fused weights scale_w describes (unless skip_fusion);
    the rule is calibration's own (:func:`amct_bridge.keras.plan.batchnorm_chains`), so
    simulate and QAT fold exactly where the callback did.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 1, name="c"),
        ...                       keras.layers.BatchNormalization(name="bn")])
        >>> {k: bn.name for k, bn in batchnorm_after(m).items()}
        {'c': 'bn'}
    """
    return {key: bn for key, (_, bn) in batchnorm_chains(model).items()}


def bn_scale(bn: keras.layers.BatchNormalization) -> np.ndarray:
    """Per-channel factor ``gamma / sqrt(moving_variance + epsilon)`` a BN multiplies by."""
    var = np.asarray(bn.moving_variance, dtype=np.float64)
    gamma = np.asarray(bn.gamma, dtype=np.float64) if bn.scale else np.ones_like(var)
    return gamma / np.sqrt(var + bn.epsilon)


def clone_with(
    model: keras.Model, make_layer: Callable[[str, keras.layers.Layer], keras.layers.Layer]
) -> tuple[keras.Model, dict[str, tuple[keras.layers.Layer, keras.layers.Layer]]]:
    """Clone ``model`` (nested models too); ``make_layer(key, original)`` builds each new layer.

    Returns the clone and ``key -> (original layer, new layer)``. Weights are NOT copied: the
    caller copies them (:func:`copy_weights`) once the clone is built, possibly transformed.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, name="fc")])
        >>> c, pairs = clone_with(m, lambda key, l: l.__class__.from_config(l.get_config()))
        >>> list(pairs), c.layers[0] is m.layers[0]
        (['fc'], False)
    """
    if not model.built:
        raise QuantError(f"model {model.name!r} is not built: call it on data or give it an Input")
    if not isinstance(model, (keras.Sequential,)) and not _is_functional(model):
        raise QuantError(
            f"model {model.name!r} ({type(model).__name__}) is a subclassed model; only "
            "Sequential and functional models (nested ones too) can be rewritten"
        )
    keys = layer_keys(model)
    pairs: dict[str, tuple[keras.layers.Layer, keras.layers.Layer]] = {}

    def clone_function(layer: keras.layers.Layer) -> keras.layers.Layer:
        key = keys.get(id(layer))
        if key is None:  # a raw op (x + y, keras.ops.*): stateless, copied as Keras copies it
            return layer.__class__.from_config(layer.get_config())
        new = make_layer(key, layer)
        pairs[key] = (layer, new)
        return new

    clone = keras.models.clone_model(model, clone_function=clone_function, recursive=True)
    return clone, pairs


def _is_functional(model: keras.Model) -> bool:
    from keras.src.models.functional import Functional  # Keras 3 has no public alias

    return isinstance(model, Functional)


def plain_copy(layer: keras.layers.Layer) -> keras.layers.Layer:
    """A new layer of the same class and config (unbuilt, fresh weights)."""
    return layer.__class__.from_config(layer.get_config())


def copy_weights(src: keras.layers.Layer, dst: keras.layers.Layer) -> None:
    """Copy all weights of ``src`` into ``dst`` (same class and config)."""
    dst.set_weights(src.get_weights())
