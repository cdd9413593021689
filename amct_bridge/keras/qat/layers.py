"""The QAT Keras layers: :class:`QATQuant` (fake-quantizing wrapper), :class:`QATObserve`
(output-range tracking wrapper) and :class:`FoldedBatchNorm`.

:func:`amct_bridge.keras.qat.quantize_aware` puts them into a copy of the model; each
:class:`QATQuant` fake-quantizes its layer's input and kernels while training and turns its
trained ranges into record entries (:meth:`QATQuant.factors`). All three are registered Keras
serializables (package "amct_bridge"), so a saved QAT model loads back.

Example:
    >>> import keras
    >>> QATQuant(keras.layers.Dense(2), dst_type="INT4", name="fc").dst_type
    'INT4'
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from amct_bridge.errors import QuantError
from amct_bridge.keras.qat.fake_quant import (
    arq_fake_quant,
    fake_quant_range,
    finish,
    layer_spec,
)
from amct_bridge.quant.qat import RANGE_MODES, check_options, layer_factors
from amct_bridge.records.model import LayerFactors

__all__ = ["RANGE_MODES", "FoldedBatchNorm", "QATObserve", "QATQuant"]


@keras.saving.register_keras_serializable(package="amct_bridge")
class FoldedBatchNorm(keras.layers.Layer):
    """Identity that stands where a BatchNormalization was folded into the preceding layer.

    It accepts BatchNormalization's call arguments, so the model graph is unchanged.

    Example:
        >>> FoldedBatchNorm(name="bn1")(np.float32([1.0, 2.0])).numpy().tolist()
        [1.0, 2.0]
    """

    def call(self, inputs, training=None, mask=None):
        return inputs

    def compute_output_shape(self, input_shape):
        return input_shape


def add_range_weights(layer: keras.layers.Layer, name: str, *, trainable: bool) -> tuple:
    """``(lo, hi, seen)`` variables of one tracked tensor of ``layer`` (``seen``: batches seen).

    Example:
        >>> # used by QATQuant.build and QATObserve.build
    """
    # "mean": under tf.distribute each replica tracks its own batches and the kept range is
    # the replicas' mean (like BatchNormalization's moving statistics).
    lo, hi = (
        layer.add_weight(
            name=f"{name}_{end}",
            shape=(),
            initializer="zeros",
            trainable=trainable,
            aggregation="mean",
            autocast=False,  # factors stay float32 under mixed precision
        )
        for end in ("min", "max")
    )
    seen = layer.add_weight(
        name=f"{name}_seen",
        shape=(),
        initializer="zeros",
        trainable=False,
        aggregation="only_first_replica",
        autocast=False,
    )
    return lo, hi, seen


def track_ema(x, lo_var, hi_var, seen, decay: float):
    """Move ``[lo_var, hi_var]`` towards ``x``'s min/max (EMA; the first batch sets it).

    Returns the new (lo, hi); ``seen`` counts the batches.

    Example:
        >>> # see QATQuant: range <- d * range + (1 - d) * batch
    """
    batch_lo = ops.stop_gradient(ops.cast(ops.min(x), "float32"))  # mixed precision too
    batch_hi = ops.stop_gradient(ops.cast(ops.max(x), "float32"))
    first = seen <= 0
    lo = ops.where(first, batch_lo, decay * lo_var + (1 - decay) * batch_lo)
    hi = ops.where(first, batch_hi, decay * hi_var + (1 - decay) * batch_hi)
    lo_var.assign(lo)
    hi_var.assign(hi)
    seen.assign(seen + 1.0)
    return lo, hi


@keras.saving.register_keras_serializable(package="amct_bridge")
class QATObserve(keras.layers.Wrapper):
    """Runs its layer unchanged and, while training, tracks an EMA of the output's min/max.

    :func:`~amct_bridge.keras.qat.quantize_aware` wraps activations (ReLU...), runtime layers
    (Add, Concatenate, pools) and unfolded BatchNormalization in it: the QAT sidecar needs their
    output ranges for the ESP-DL export. :func:`~amct_bridge.keras.qat.strip_qat` unwraps them.

    Example:
        >>> QATObserve(keras.layers.ReLU(), name="relu").name
        'relu'
    """

    def __init__(self, layer, ema_decay=0.99, **kwargs):
        super().__init__(layer, **kwargs)
        self.ema_decay = float(ema_decay)

    def build(self, input_shape=None):
        super().build(input_shape)
        self.output_range = add_range_weights(self, "output", trainable=False)

    def call(self, inputs, training=None, **kwargs):
        y = self.layer(inputs, training=training, **kwargs)
        if training:
            track_ema(y, *self.output_range, self.ema_decay)
        return y

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(input_shape)

    def get_config(self):
        return {**super().get_config(), "ema_decay": self.ema_decay}


@keras.saving.register_keras_serializable(package="amct_bridge")
class QATQuant(keras.layers.Wrapper):
    """Fake-quantizes a layer's input and kernels while training (see the module docstring).

    Args:
        layer: the wrapped quantizable layer (trained as usual).
        dst_type: "INT8" or "INT4".
        activation_range: "ema" (moving average of batch min/max) or "learned" (trainable lo/hi).
        ema_decay: momentum of the EMA, default 0.99.
        activation_offset: asymmetric activations (AMCT default True); False: symmetric.
        channel_wise: per-output-channel weight scales where AMCT allows them.
        skip_fusion: written to the record (a BN follows that was not folded).

    Example:
        >>> import keras
        >>> QATQuant(keras.layers.Dense(2), dst_type="INT4", name="fc").bits
        4
    """

    def __init__(
        self,
        layer,
        dst_type="INT8",
        activation_range="ema",
        ema_decay=0.99,
        activation_offset=True,
        channel_wise=True,
        skip_fusion=None,
        **kwargs,
    ):
        super().__init__(layer, **kwargs)
        self.bits = check_options(dst_type, activation_range, ema_decay)
        self.dst_type = dst_type
        self.activation_range = activation_range
        self.ema_decay = float(ema_decay)
        self.activation_offset = bool(activation_offset)
        self.channel_wise = bool(channel_wise)
        self.skip_fusion = skip_fusion
        self.spec = layer_spec(layer)
        if self.spec is None:
            raise QuantError(f"layer {layer.name!r} ({type(layer).__name__}) is not quantizable")

    def build(self, input_shape=None):
        super().build(input_shape)
        trainable = self.activation_range == "learned"
        names = ["input"] + (
            ["mid"] if isinstance(self.layer, keras.layers.SeparableConv2D) else []
        )
        self.ranges = {name: add_range_weights(self, name, trainable=trainable) for name in names}
        # The output range is only observed (EMA, never a clip): the ESP-DL export needs it in
        # the sidecar (a chain output feeding an Add, the model output); see qat.sidecar.
        self.output_range = add_range_weights(self, "output", trainable=False)

    def call(self, inputs, training=None):
        x = self._quantize_activation(inputs, "input", training)
        if self.spec.op is None:  # average pooling: input only
            y = self.layer(x)
        else:
            cw = self.channel_wise and self.spec.channel_wise
            kernels = {
                attr: arq_fake_quant(getattr(self.layer, attr), layout, self.bits, channel_wise=cw)
                for attr, layout in self.spec.kernels
            }
            mid = lambda v: self._quantize_activation(v, "mid", training)  # noqa: E731
            y = finish(self.layer, self.spec.op(self.layer, x, kernels, mid))
        if training:
            track_ema(y, *self.output_range, self.ema_decay)
        return y

    def _quantize_activation(self, x, name, training):
        lo_var, hi_var, seen = self.ranges[name]
        if training:
            lo, hi = self._update_range(x, lo_var, hi_var, seen)
        else:
            lo, hi = lo_var, hi_var
        y = fake_quant_range(x, lo, hi, self.bits, symmetric=not self.activation_offset)
        # Before any training batch the range is unknown: pass the input through unchanged.
        return ops.where(ops.logical_or(seen > 0, bool(training)), y, x)

    def _update_range(self, x, lo_var, hi_var, seen):
        if self.activation_range == "ema":
            return track_ema(x, lo_var, hi_var, seen, self.ema_decay)
        # learned: initialise from the first batch, then only gradients move the range
        first = seen <= 0
        lo = ops.where(first, ops.stop_gradient(ops.cast(ops.min(x), "float32")), lo_var)
        hi = ops.where(first, ops.stop_gradient(ops.cast(ops.max(x), "float32")), hi_var)
        lo_var.assign(ops.stop_gradient(lo))
        hi_var.assign(ops.stop_gradient(hi))
        seen.assign(seen + 1.0)  # a batch counter (the sidecar's "batches")
        return lo_var + ops.stop_gradient(lo - lo_var), hi_var + ops.stop_gradient(hi - hi_var)

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(input_shape)

    def get_config(self):
        return {
            **super().get_config(),
            "dst_type": self.dst_type,
            "activation_range": self.activation_range,
            "ema_decay": self.ema_decay,
            "activation_offset": self.activation_offset,
            "channel_wise": self.channel_wise,
            "skip_fusion": self.skip_fusion,
        }

    def factors(self, key: str) -> dict[str, LayerFactors]:
        """Record entries of this layer (one per part; SeparableConv2D has two), keyed
        (:func:`amct_bridge.quant.qat.layer_factors`)."""
        entries = {}
        attrs = [attr for attr, _ in self.spec.kernels]
        parts = list(zip(("input", "mid"), attrs, strict=False))
        cw = self.channel_wise and self.spec.channel_wise
        for i, (name, attr) in enumerate(parts or [("input", None)]):
            lo, hi, seen = (float(np.asarray(v)) for v in self.ranges[name])
            layout = dict(self.spec.kernels).get(attr)
            entries[self.spec.key(key, i)] = layer_factors(
                key,
                lo,
                hi,
                seen,
                self.bits,
                None if attr is None else np.asarray(getattr(self.layer, attr), np.float32),
                layout,
                channel_wise=cw,
                symmetric=not self.activation_offset,
                skip_fusion=bool(self.skip_fusion) and attr == self.spec.kernels[-1][0],
                part=name,
            )
        return entries
