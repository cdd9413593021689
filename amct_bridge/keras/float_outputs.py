"""Float outputs of a Keras model's layers by record key, for comparing with the chip: the
ESP-DL evaluation (:mod:`amct_bridge.keras.espdl_eval`) and the exponent search of the export
(:mod:`amct_bridge.keras.espdl_weights`) both read them.

Example:
    >>> callable(float_outputs)
    True
"""

from __future__ import annotations

import keras
import numpy as np

from amct_bridge.keras.simulate import forward_batches

__all__ = ["float_outputs", "output_of"]


def float_outputs(
    model,
    x: np.ndarray,
    names: list[str],
    batch: int,
    reasons: dict[str, str] | None = None,
    linear: frozenset[str] | set[str] = frozenset(),
) -> dict[str, np.ndarray]:
    """Float outputs of the record keys ``names`` (nested ``outer/inner``, ``sep/...`` parts);
    why a name has none goes to ``reasons`` (if given); when no name is a layer of the model
    (an ``.espdl`` file another tool made, with its own tensor names) the result is empty.
    Top-level layers in ``linear`` give
    their output before their own ``activation`` (a classifier head whose softmax is left to
    the host: the chip computes its logits).

    Example:
        >>> x = keras.Input((2,)); y = keras.layers.Dense(1, name="fc", use_bias=False)(x)
        >>> m = keras.Model(x, y); m.get_layer("fc").set_weights([np.ones((2, 1))])
        >>> float_outputs(m, np.float32([[1, 2]]), ["fc"], 8)["fc"].tolist()
        [[3.0]]
    """
    reasons = {} if reasons is None else reasons
    top: dict[str, list[str]] = {}  # outermost layer -> the names inside it
    for name in names:
        top.setdefault(name.split("/")[0], []).append(name)
    tensors, wanted = {}, {}
    for head, keys in top.items():
        call = _call_output(model, head)  # "shared@1": the second call of a shared layer
        if call is not None and keys == [head]:
            tensors[head] = call
            continue
        try:
            layer = model.get_layer(head)
        except ValueError:
            for key in keys:  # "/Relu_output_0" (another tool's tensor): no head, the name
                reasons[key] = f"no layer {head or key!r} in the Keras model"
            continue
        if isinstance(layer, keras.Model) and any("/" in k for k in keys):
            tensors[head + "/<input>"] = _outer_input(layer)
            wanted[head] = keys
        for key in keys:
            if key == head and key in linear:
                tensors[head + "/<input>"] = layer.input
                wanted.setdefault(head, []).append(key)
            elif key == head:
                tensors[key] = output_of(layer)
            elif key == f"{head}/pointwise":  # the layer's output (activation included)
                tensors[key] = layer.output
            elif key == f"{head}/depthwise":
                tensors[head + "/<input>"] = layer.input
                wanted.setdefault(head, []).append(key)
    if not tensors:  # no name is a layer here (a file another tool made): nothing to run
        return {}
    inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs  # as the model is called
    probe = keras.Model(inputs, list(tensors.values()))
    found = dict(zip(tensors, forward_batches(probe, [x], batch), strict=True))
    for head, keys in wanted.items():
        layer, given = model.get_layer(head), found.pop(head + "/<input>")
        if isinstance(layer, keras.Model):
            inner = [k.split("/", 1)[1] for k in keys if "/" in k]
            got = float_outputs(layer, given, inner, batch, inner_reasons := {})
            found.update({f"{head}/{k}": v for k, v in got.items()})
            reasons.update({f"{head}/{k}": v for k, v in inner_reasons.items()})
        if head in keys and head in linear:
            found[head] = _linear_part(layer, given)
        if f"{head}/depthwise" in keys:  # SeparableConv2D: from its input and its kernel
            found[f"{head}/depthwise"] = _depthwise_part(layer, given)
    return {k: found[k] for k in names if k in found}


def _call_output(model, name: str):
    """The output of call ``k`` of a shared layer (``name`` = ``layer@k``, the graph IR's
    names: the model's calls in ``_nodes_by_depth`` order), or None."""
    base, _, k = name.rpartition("@")
    if not base or not k.isdigit() or not hasattr(model, "_nodes_by_depth"):
        return None
    calls = [
        node
        for depth in sorted(model._nodes_by_depth, reverse=True)
        for node in model._nodes_by_depth[depth]
        if getattr(node.operation, "name", None) == base and not node.is_input
    ]
    return calls[int(k)].output_tensors[0] if int(k) < len(calls) else None


def output_of(layer):
    """The layer's output in the model calling it (a nested model's ``output`` is its inner
    graph's tensor).

    Example:
        >>> x = keras.Input((2,)); m = keras.Model(x, keras.layers.Dense(1, name="fc")(x))
        >>> output_of(m.get_layer("fc")) is m.outputs[0]
        True
    """
    if isinstance(layer, keras.Model):
        return layer._inbound_nodes[0].output_tensors[0]
    return layer.output


def _outer_input(nested: keras.Model):
    """The tensor a nested model reads in the model that calls it (its first call)."""
    node = nested._inbound_nodes[0]
    tensors = node.input_tensors
    return tensors[0] if len(tensors) == 1 else list(tensors)


def _linear_part(layer, x: np.ndarray) -> np.ndarray:
    """The layer's output without its own activation: a copy with ``activation="linear"``
    and the layer's weights, called on its float input (the model is not touched)."""
    twin = type(layer).from_config({**layer.get_config(), "activation": "linear"})
    twin.build(layer.input.shape)
    twin.set_weights(layer.get_weights())
    return np.asarray(keras.ops.convert_to_numpy(twin(keras.ops.convert_to_tensor(x))))


def _depthwise_part(layer, x: np.ndarray) -> np.ndarray:
    """A SeparableConv2D's depthwise output (what ESP-DL's first part computes, no bias)."""
    out = keras.ops.depthwise_conv(
        keras.ops.convert_to_tensor(x),
        layer.depthwise_kernel,
        strides=layer.strides,
        padding=layer.padding,
        dilation_rate=layer.dilation_rate,
    )
    return np.asarray(keras.ops.convert_to_numpy(out))
