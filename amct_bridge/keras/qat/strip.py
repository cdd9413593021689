"""QAT model -> plain Keras model: the QAT wrappers removed, folded BatchNormalizations gone.

:func:`strip_qat` rebuilds the model's graph with each :class:`QATQuant` / :class:`QATObserve`
replaced by a plain copy of its layer (same class, config, name and trained weights) and each
:class:`FoldedBatchNorm` dropped from the graph (its reader reads the folded layer directly):
the BN's statistics already live in the kernel and bias. The result holds only stock Keras
layers, so its ``.keras`` file loads with ``keras.saving.load_model`` in a program that never
imports amct_bridge, and the ESP-DL exporter sees a plain Conv/Dense (+ bias) chain.

Example:
    >>> import keras
    >>> from amct_bridge.keras.qat import quantize_aware
    >>> x = keras.Input((4, 4, 1))
    >>> y = keras.layers.BatchNormalization(name="bn")(keras.layers.Conv2D(2, 1, name="c")(x))
    >>> plain = strip_qat(quantize_aware(keras.Model(x, y)))
    >>> [layer.name for layer in plain.layers[1:]], plain.get_layer("c").use_bias
    (['c'], True)
"""

from __future__ import annotations

import keras

from amct_bridge.errors import QuantError
from amct_bridge.keras.qat.layers import FoldedBatchNorm, QATObserve, QATQuant
from amct_bridge.keras.rewrite import plain_copy

__all__ = ["strip_qat"]


def strip_qat(qat_model: keras.Model) -> keras.Model:
    """A plain float copy of a QAT model with its trained weights and no folded BN.

    Each QAT wrapper becomes its plain layer (trained weights, same name); a folded
    BatchNormalization (a ``FoldedBatchNorm`` identity in the QAT model) is removed, its
    statistics being already in the preceding layer's kernel and bias. The copy computes the
    QAT model's float (not fake-quantized) function, holds only stock Keras layers (it saves
    and loads without amct_bridge), and ``simulate(strip_qat(qat), qat_record(qat))`` computes
    what the QAT model computes in inference. It is not compiled: no optimizer, loss or
    optimizer state of the QAT model comes along (compile it to train it further). The QAT
    model is not modified.

    Raises:
        QuantError: a subclassed model (only Sequential and functional models are rebuilt).

    Example:
        >>> deployable = strip_qat(qat)  # doctest: +SKIP
        >>> deployable.save("deploy.keras")  # doctest: +SKIP
    """
    pairs: list[tuple[keras.layers.Layer, keras.layers.Layer]] = []
    stripped = _strip(qat_model, pairs)
    for src, dst in pairs:
        dst.set_weights(src.get_weights())
    return stripped


def _unwrap(layer: keras.layers.Layer) -> keras.layers.Layer:
    return layer.layer if isinstance(layer, (QATQuant, QATObserve)) else layer


def _strip(model: keras.Model, pairs: list) -> keras.Model:
    """Rebuild ``model`` (recursing into nested models); weights to copy go to ``pairs``."""

    def clone(layer: keras.layers.Layer) -> keras.layers.Layer:
        if isinstance(layer, keras.Model):
            return _strip(layer, pairs)
        src = _unwrap(layer)
        new = plain_copy(src)
        if src.weights:
            pairs.append((src, new))
        return new

    if isinstance(model, keras.Sequential):
        kept = [clone(x) for x in model.layers if not isinstance(x, FoldedBatchNorm)]
        spec = model.inputs[0]
        inp = keras.Input(batch_shape=spec.shape, dtype=spec.dtype)
        return keras.Sequential([inp, *kept], name=model.name)

    def call(op, *args, **kwargs):
        if isinstance(op, FoldedBatchNorm):  # the folded layer's output is the BN's output
            return args[0]
        return op(*args, **kwargs)

    try:
        stripped = keras.models.clone_model(model, clone_function=clone, call_function=call)
    except ValueError as err:
        raise QuantError(
            f"model {model.name!r} ({type(model).__name__}) cannot be rebuilt without its QAT "
            f"layers: {err}"
        ) from None
    if stripped.compiled:
        # clone_model compiles the clone like a compiled original: a new optimizer from the QAT
        # model's compile config, whose slots would then be saved with the deployable model.
        # A model over the same layers is not compiled: weights only.
        # (input and output keep the structure: a one-input model stays one-input, whose
        # predict(x) Keras would otherwise warn about as a structure mismatch)
        stripped = keras.Model(stripped.input, stripped.output, name=model.name)
    return stripped
