"""Calibration plan of a Keras model: the Keras half of :mod:`amct_bridge.calibration.plan`.

:func:`describe_model` turns a Keras model into the core's
:class:`~amct_bridge.calibration.layers.ModelDesc` (leaf layers by key via :func:`walk_layers`,
the graph IR of :func:`amct_bridge.keras.graph.extract_graph_and_operations` for Functional /
Sequential models, raw ops such as ``x + y``); :func:`make_plan` and :func:`batchnorm_chains` run
the core's rules on it. :class:`Target`, :class:`Plan` and :func:`observer_settings` are the
core's.

Example:
    >>> import keras
    >>> from amct_bridge.config import QuantConfig
    >>> x = keras.Input((8, 8, 3))
    >>> y = keras.layers.Conv2D(4, 3, use_bias=False, name="c1")(x)
    >>> y = keras.layers.BatchNormalization(name="bn1")(y)
    >>> y = keras.layers.ReLU(name="r1")(y)
    >>> plan = make_plan(keras.Model(x, y), QuantConfig())
    >>> [(t.key, t.bn.name if t.bn else None) for t in plan.targets]
    [('c1', 'bn1'), ('r1', None)]
"""

from __future__ import annotations

import keras

from amct_bridge.calibration import plan as core
from amct_bridge.calibration.layers import ModelDesc
from amct_bridge.calibration.plan import Plan, Target, observer_settings
from amct_bridge.config import QuantConfig
from amct_bridge.errors import CalibrationError, GraphError
from amct_bridge.keras import layers as registry
from amct_bridge.keras.graph import extract_graph_and_operations

__all__ = [
    "Plan",
    "Target",
    "batchnorm_chains",
    "describe_model",
    "make_plan",
    "refuse_qat_model",
    "observer_settings",
    "walk_layers",
]


def walk_layers(model, prefix: str = "") -> dict[str, object]:
    """Every leaf layer of ``model`` by key (nested models: "outer/inner"), in layer order.

    Example:
        >>> import keras
        >>> d = keras.layers.Dense(2, name="d")
        >>> inner = keras.Sequential([keras.Input((2,)), d], name="in")
        >>> outer = keras.Sequential([keras.Input((2,)), inner])
        >>> list(walk_layers(outer))
        ['in/d']
    """
    out: dict[str, object] = {}
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            out.update(walk_layers(layer, f"{prefix}{layer.name}/"))
        else:
            out.setdefault(prefix + layer.name, layer)
    return out


def describe_model(model) -> ModelDesc:
    """The core's view of ``model``: layer descriptors, graph IR (None when subclassed).

    Example:
        >>> import keras
        >>> x = keras.Input((4,), name="x")
        >>> m = describe_model(keras.Model(x, keras.layers.Dense(2, name="fc")(x)))
        >>> list(m.layers), [n.kind for n in m.graph], m.layers["fc"].parts[0].layout
        (['x', 'fc'], ['Dense'], 'IO')
    """
    layers = {key: registry.describe(key, layer) for key, layer in walk_layers(model).items()}
    try:
        graph, objects = extract_graph_and_operations(model)
    except GraphError:  # subclassed model: no call graph
        graph, objects = None, {}
    operations = {
        key: registry.describe(key, obj) for key, obj in objects.items() if key not in layers
    }
    foldable = tuple(k for k, parts in registry.QUANTIZABLE.items() if parts[-1].foldable)
    return ModelDesc(
        model.name,
        layers,
        graph,
        operations,
        foldable_kinds=foldable,
        batch_norm_kinds=tuple(registry.BATCH_NORMS),
        quantizable_kinds=tuple(registry.QUANTIZABLE),
    )


def make_plan(model, config: QuantConfig) -> Plan:
    """Resolve the calibration targets of the Keras ``model`` under ``config``.

    Raises CalibrationError for unknown skip_layers / skip_fusion_layers names and when nothing
    is left to quantize.

    Example:
        >>> # see the module docstring
    """
    refuse_qat_model(model)
    return core.make_plan(describe_model(model), config)


def refuse_qat_model(model) -> None:
    """Calibrating a :func:`~amct_bridge.keras.qat.quantize_aware` model: its quantized layers
    are wrapped, so the core found "no quantizable layer left", which misled; say what it is.

    Example:
        >>> refuse_qat_model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    """
    qat = _qat_wrappers(model)
    if qat:
        raise CalibrationError(
            f"model {model.name!r} is a QAT model (quantize_aware; QATQuant layers such as "
            f"{qat[0]!r}): its record is written by save_qat_record(qat, path) from the ranges "
            "it learned; calibrate the float model, or strip_qat(qat) for a plain one"
        )


def _qat_wrappers(model, prefix: str = "") -> list[str]:
    """Keys of the QATQuant layers of ``model`` (nested models too), by class name: the QAT
    package imports this one."""
    found = []
    for layer in getattr(model, "layers", []):
        if type(layer).__name__ == "QATQuant":
            found.append(prefix + layer.name)
        elif isinstance(layer, keras.Model):
            found += _qat_wrappers(layer, f"{prefix}{layer.name}/")
    return found


def batchnorm_chains(model) -> dict[str, tuple[str, object]]:
    """Layer key -> (BN key, BN layer) for every BatchNormalization AMCT folds into that layer.

    The core's rule (:func:`amct_bridge.calibration.plan.batchnorm_chains`), shared by
    calibration, simulate and QAT. Subclassed models have no call graph, hence no fusion.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 1, name="c"),
        ...                       keras.layers.BatchNormalization(name="bn")])
        >>> {k: bn_key for k, (bn_key, _) in batchnorm_chains(m).items()}
        {'c': 'bn'}
    """
    chains = core.batchnorm_chains(describe_model(model))
    return {key: (bn_key, bn.handle) for key, (bn_key, bn) in chains.items()}
