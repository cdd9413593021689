"""``replace_relu6``: a copy of a Keras model with every ReLU6 a plain ReLU, for ESP-DL v1.

ESP-DL v1 has no clip, so the exporter refuses ReLU6 (``ReLU(max_value=6)``,
``Activation("relu6")``, ``activation="relu6"`` on a Conv2D / DepthwiseConv2D / Dense...).
The documented path (docs/espdl-export.md, "ReLU6 models"): replace it with ReLU, fine-tune
briefly with the calibration callback in that ``fit`` (the network re-learns to live without
the clip; the callback records the new ranges), then export. Names and weights are kept, so
records, sidecars and export files name the same layers as the original model.

Example:
    >>> import keras
    >>> x = keras.Input((4, 4, 3), name="img")
    >>> y = keras.layers.Conv2D(2, 1, name="c")(x)
    >>> y = keras.layers.ReLU(6.0, name="r6")(y)
    >>> relu = replace_relu6(keras.Model(x, y))
    >>> relu.get_layer("r6").max_value is None, relu.get_layer("c").name
    (True, 'c')
"""

from __future__ import annotations

import logging
from typing import Any

import keras

from amct_bridge.errors import AmctBridgeError
from amct_bridge.espdl.plan import hard_sigmoid_relu6

log = logging.getLogger(__name__)

__all__ = ["relu6_layers", "replace_relu6"]


def _relu6_fix(layer: Any) -> dict | None:
    """The config of ``layer`` with its ReLU6 made a ReLU, or None when it has no ReLU6."""
    config = layer.get_config()
    if isinstance(layer, keras.layers.ReLU):
        top = config.get("max_value")
        plain = float(config.get("negative_slope") or 0) == 0 and not config.get("threshold")
        if top is not None and float(top) == 6.0 and plain:
            return {**config, "max_value": None}
        return None
    if config.get("activation") == "relu6":  # Activation("relu6"), Conv2D(activation="relu6")
        return {**config, "activation": "relu"}
    return None


def relu6_layers(model: keras.Model) -> list[str]:
    """Names of the layers of ``model`` (nested models: ``"outer/inner"``) that compute ReLU6.

    Example:
        >>> import keras
        >>> x = keras.Input((3,))
        >>> m = keras.Model(x, keras.layers.Dense(2, activation="relu6", name="fc")(x))
        >>> relu6_layers(m)
        ['fc']
    """
    found = []
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            found += [f"{layer.name}/{name}" for name in relu6_layers(layer)]
        elif _relu6_fix(layer) is not None:
            found.append(layer.name)
    return found


def _named_inputs(model: keras.Model) -> Any:
    """New input tensors named like ``model``'s input layers (clone_model names them after
    the tensors, ``keras_tensor_3``...), in the structure of ``model.input``."""
    if isinstance(model, keras.Sequential):
        return None  # Sequential clones keep their InputLayer
    try:
        structure = model.input
    except (AttributeError, ValueError):
        return None  # not a functional model: clone_model says why
    return keras.tree.map_structure(
        lambda t: keras.Input(
            batch_shape=t.shape, dtype=t.dtype, name=t._keras_history.operation.name
        ),
        structure,
    )


def replace_relu6(model: keras.Model) -> keras.Model:
    """A copy of ``model`` with every ReLU6 replaced by ReLU; same layer names and weights.

    Handles ``ReLU(max_value=6)`` (e.g. every ReLU6 of ``keras.applications.MobileNetV2``),
    ``Activation("relu6")`` and a layer's own ``activation="relu6"``, in nested models too.
    A ReLU6 inside a hard sigmoid (``relu6(x + 3) / 6``, MobileNetV3) is kept, with a warning:
    there the clip is the function, and ReLU would change it (export it with ESP-DL v3,
    ``format="espdl"``).
    The copy is not compiled: compile it, fine-tune it briefly with
    :class:`~amct_bridge.keras.QuantCalibration` in that ``fit`` (``on="validation"`` with
    ``validation_data`` calibrates the final weights in inference mode), then export it with
    :func:`~amct_bridge.keras.export_espdl`. ``model`` itself is left untouched.

    Raises:
        AmctBridgeError: the model cannot be cloned (a subclassed model, or a custom layer
            without ``get_config``); the message names the model.

    Example:
        >>> import keras
        >>> x = keras.Input((3,))
        >>> m = keras.Model(x, keras.layers.Activation("relu6", name="a")(x))
        >>> relu = replace_relu6(m)
        >>> relu.get_layer("a").get_config()["activation"], relu6_layers(relu)
        ('relu', [])
    """
    if not isinstance(model, keras.Model):
        raise AmctBridgeError(f"replace_relu6: expected a keras.Model, got {type(model).__name__}")

    from amct_bridge.keras.espdl_weights import source_layers  # the exporter's view of the model

    try:
        kept = {name.split("/")[-1] for name in hard_sigmoid_relu6(source_layers(model))}
    except Exception as err:  # noqa: BLE001 - a model the exporter cannot read: clone says why
        log.debug("replace_relu6: no hard sigmoid search (%s)", err)
        kept = set()
    if kept:
        log.warning(
            "replace_relu6: %d ReLU6 layers inside a hard sigmoid keep their clip (ReLU would "
            "change the function): %s",
            len(kept),
            ", ".join(sorted(kept)),
        )

    def clone(layer: Any) -> Any:
        fixed = None if layer.name in kept else _relu6_fix(layer)
        return layer.__class__.from_config(fixed if fixed is not None else layer.get_config())

    try:
        copy = keras.models.clone_model(
            model, _named_inputs(model), clone_function=clone, recursive=True
        )
    except (ValueError, TypeError, NotImplementedError) as err:
        raise AmctBridgeError(
            f"replace_relu6: cannot copy model {model.name!r} ({err}); only functional and "
            "Sequential models whose layers have get_config() can be copied"
        ) from None
    copy.set_weights(model.get_weights())  # same structure, same weight order
    return copy
