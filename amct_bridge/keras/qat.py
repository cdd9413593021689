"""Quantization-aware training (QAT) for Keras ``fit``, writing AMCT's QAT record.

Workflow (AMCT's create_quant_retrain_model / save_quant_retrain_model, in Keras terms)::

    qat = quantize_aware(model, dst_type="INT4")     # a new model; `model` is not modified
    qat.compile(optimizer="adam", loss=..., metrics=[...])
    qat.fit(x, y, epochs=3)                          # fake-quantized forward, STE backward
    save_qat_record(qat, "record.txt")               # scale_d/offset_d, scale_w/offset_w, dst_type
    deployable = strip_qat(qat)                      # plain Keras model with the trained weights

In the forward pass every quantizable layer (Conv2D, DepthwiseConv2D, Conv2DTranspose, Dense,
SeparableConv2D, AveragePooling2D) sees

* its input fake-quantized with the activation range [lo, hi] (asymmetric AMCT factors unless
  ``activation_offset=False``): ``activation_range="ema"`` tracks each training batch's min/max with
  an exponential moving average (``ema_decay``); ``"learned"`` starts from the first batch's
  min/max and trains lo/hi by gradient descent (LSQ-style gradients through the scale);
* its kernels fake-quantized with ARQ (symmetric; per output channel for convolutions when
  ``channel_wise``, one scale for Dense), recomputed from the current kernel at every step.

Rounding uses the straight-through estimator; values clipped by the range get no gradient.
``dst_type`` "INT8" or "INT4" sets the bit width of both. With ``fold_batchnorm`` (default) a
BatchNormalization that directly follows a quantized layer is folded into it before training (its
moving statistics frozen into the kernel and bias, the BN replaced by a FoldedBatchNorm identity
layer of the same name), so the trained kernel is the deployed kernel and the record needs no
fusion; otherwise the layer's record carries ``skip_fusion: true``.

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="fc")])
    >>> qat = quantize_aware(m, dst_type="INT4")
    >>> qat.compile(optimizer="sgd", loss="mse")
    >>> _ = qat.fit(np.ones((8, 4)), np.zeros((8, 3)), verbose=0)
    >>> qat_record(qat).layers["fc"].dst_type
    'INT4'
"""

from __future__ import annotations

import os

import keras
import numpy as np
from keras import ops

from amct_bridge.errors import QuantError
from amct_bridge.keras.fake_quant import (
    arq_fake_quant,
    arq_scale,
    fake_quant_range,
    finish,
    layer_spec,
)
from amct_bridge.keras.rewrite import (
    batchnorm_after,
    clone_with,
    copy_weights,
    plain_copy,
    quantizable_layers,
)
from amct_bridge.quant.factors import activation_factors, bits_of
from amct_bridge.quant.fold import fold_batchnorm
from amct_bridge.records.model import LayerFactors, Record

RANGE_MODES = ("ema", "learned")


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
        if dst_type not in ("INT8", "INT4"):
            raise QuantError(f"dst_type must be 'INT8' or 'INT4', got {dst_type!r}")
        if activation_range not in RANGE_MODES:
            raise QuantError(
                f"activation_range must be one of {RANGE_MODES}, got {activation_range!r}"
            )
        if not 0.0 <= ema_decay < 1.0:
            raise QuantError(f"ema_decay must be in [0, 1), got {ema_decay}")
        self.dst_type = dst_type
        self.bits = bits_of(dst_type)
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
        self.ranges = {}
        for name in names:
            # "mean": under tf.distribute each replica tracks its own batches and the kept range
            # is the replicas' mean (like BatchNormalization's moving statistics).
            lo, hi = (
                self.add_weight(
                    name=f"{name}_{end}",
                    shape=(),
                    initializer="zeros",
                    trainable=trainable,
                    aggregation="mean",
                    autocast=False,  # factors stay float32 under mixed precision
                )
                for end in ("min", "max")
            )
            seen = self.add_weight(
                name=f"{name}_seen",
                shape=(),
                initializer="zeros",
                trainable=False,
                aggregation="only_first_replica",
                autocast=False,  # factors stay float32 under mixed precision
            )
            self.ranges[name] = (lo, hi, seen)

    def call(self, inputs, training=None):
        x = self._quantize_activation(inputs, "input", training)
        if self.spec.op is None:  # average pooling: input only
            return self.layer(x)
        cw = self.channel_wise and self.spec.channel_wise
        kernels = {
            attr: arq_fake_quant(getattr(self.layer, attr), layout, self.bits, channel_wise=cw)
            for attr, layout in self.spec.kernels
        }
        mid = lambda y: self._quantize_activation(y, "mid", training)  # noqa: E731
        return finish(self.layer, self.spec.op(self.layer, x, kernels, mid))

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
        batch_lo = ops.stop_gradient(ops.cast(ops.min(x), "float32"))  # mixed precision too
        batch_hi = ops.stop_gradient(ops.cast(ops.max(x), "float32"))
        first = seen <= 0
        if self.activation_range == "ema":
            d = self.ema_decay
            lo = ops.where(first, batch_lo, d * lo_var + (1 - d) * batch_lo)
            hi = ops.where(first, batch_hi, d * hi_var + (1 - d) * batch_hi)
            lo_var.assign(lo)
            hi_var.assign(hi)
        else:  # learned: initialise from the first batch, then only gradients move the range
            lo = ops.where(first, batch_lo, lo_var)
            hi = ops.where(first, batch_hi, hi_var)
            lo_var.assign(ops.stop_gradient(lo))
            hi_var.assign(ops.stop_gradient(hi))
            lo, hi = (
                lo_var + ops.stop_gradient(lo - lo_var),
                hi_var + ops.stop_gradient(hi - hi_var),
            )
        seen.assign(1.0)
        return lo, hi

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
        """Record entries of this layer (one per part; SeparableConv2D has two), keyed."""
        entries = {}
        attrs = [attr for attr, _ in self.spec.kernels]
        parts = list(zip(("input", "mid"), attrs, strict=False))
        for i, (name, attr) in enumerate(parts or [("input", None)]):
            lo, hi, seen = (float(np.asarray(v)) for v in self.ranges[name])
            if seen <= 0:
                raise QuantError(
                    f"layer {key!r}: its {name} range was never observed; run fit on data first"
                )
            scale_d, offset_d = activation_factors(
                lo, hi, self.bits, symmetric=not self.activation_offset, name=f"{key} {name}"
            )
            f = LayerFactors(scale_d=scale_d, offset_d=offset_d, dst_type=self.dst_type)
            if attr is not None:
                layout = dict(self.spec.kernels)[attr]
                cw = self.channel_wise and self.spec.channel_wise
                scale = arq_scale(getattr(self.layer, attr), layout, self.bits, channel_wise=cw)
                f.scale_w = [float(s) for s in np.asarray(scale, np.float32).reshape(-1)]
                f.offset_w = [0] * len(f.scale_w)
                if self.skip_fusion and attr == self.spec.kernels[-1][0]:
                    f.skip_fusion = True
            entries[self.spec.key(key, i)] = f
        return entries


def quantize_aware(
    model: keras.Model,
    dst_type: str = "INT8",
    *,
    activation_range: str = "ema",
    ema_decay: float = 0.99,
    activation_offset: bool = True,
    channel_wise: bool = True,
    skip_layers: tuple[str, ...] | list[str] = (),
    fold_batchnorm: bool = True,
) -> keras.Model:
    """A trainable copy of ``model`` with fake-quantized inputs and kernels (module docstring).

    Args:
        model: a built Sequential or functional model (nested models allowed). Not modified.
        dst_type: "INT8" (default) or "INT4": bit width of activations and weights.
        activation_range: "ema" (default) or "learned".
        ema_decay: EMA momentum for ``activation_range="ema"`` (default 0.99).
        activation_offset: asymmetric activation factors (AMCT default True).
        channel_wise: per-output-channel weight scales for convolutions (AMCT default True).
        skip_layers: record keys (Keras layer names, "outer/inner") of layers to leave float.
        fold_batchnorm: fold a BatchNormalization following a quantized layer into it (default).

    Returns:
        An uncompiled ``keras.Model``; compile and ``fit`` it, then :func:`save_qat_record`.

    Raises:
        QuantError: bad option, unknown name in ``skip_layers``, or no quantizable layer.

    Example:
        >>> qat = quantize_aware(model, dst_type="INT4", skip_layers=["logits"])  # doctest: +SKIP
    """
    QATQuant(keras.layers.Dense(1), dst_type, activation_range, ema_decay)  # validate options
    layers = quantizable_layers(model)
    unknown = sorted(set(skip_layers) - set(layers))
    if unknown:
        raise QuantError(
            f"skip_layers names no quantizable layer of {model.name!r}: {unknown}; "
            f"quantizable layers: {sorted(layers)}"
        )
    chosen = {k for k in layers if k not in set(skip_layers)}
    if not chosen:
        raise QuantError(f"model {model.name!r} has no quantizable layer to train")
    bns = {k: bn for k, bn in batchnorm_after(model).items() if k in chosen}
    folded = {id(bn) for bn in bns.values()} if fold_batchnorm else set()
    options = dict(
        dst_type=dst_type,
        activation_range=activation_range,
        ema_decay=ema_decay,
        activation_offset=activation_offset,
        channel_wise=channel_wise,
    )

    def make_layer(key, layer):
        if id(layer) in folded:
            return FoldedBatchNorm(name=layer.name)
        if key not in chosen:
            return plain_copy(layer)
        config = layer.get_config()
        if fold_batchnorm and key in bns:
            config["use_bias"] = True
        skip = True if key in bns and not fold_batchnorm else None
        inner = layer.__class__.from_config(config)
        return QATQuant(inner, skip_fusion=skip, name=layer.name, **options)

    clone, pairs = clone_with(model, make_layer)
    for key, (orig, new) in pairs.items():
        if isinstance(new, QATQuant) and key in bns and fold_batchnorm:
            _fold_into(orig, new.layer, bns[key], key)
        elif isinstance(new, QATQuant):
            copy_weights(orig, new.layer)
        elif orig.weights and id(orig) not in folded:
            copy_weights(orig, new)
    return clone


def _fold_into(src: keras.layers.Layer, dst: keras.layers.Layer, bn, key: str) -> None:
    """Set ``dst`` (src's class, with a bias) to ``src`` followed by the inference-mode ``bn``."""
    spec = layer_spec(src)
    for attr, _ in spec.kernels[:-1]:  # a separable conv's depthwise kernel is not scaled
        getattr(dst, attr).assign(getattr(src, attr))
    attr, layout = spec.kernels[-1]
    kernel, bias = fold_batchnorm(
        np.asarray(getattr(src, attr)),
        None if getattr(src, "bias", None) is None else np.asarray(src.bias),
        np.asarray(bn.gamma) if bn.scale else None,
        np.asarray(bn.beta) if bn.center else None,
        np.asarray(bn.moving_mean),
        np.asarray(bn.moving_variance),
        bn.epsilon,
        layout,
        name=key,
    )
    getattr(dst, attr).assign(kernel)
    dst.bias.assign(bias)


def _qat_layers(model: keras.Model, prefix: str = "") -> dict[str, QATQuant]:
    found = {}
    for layer in model.layers:
        if isinstance(layer, QATQuant):
            found[prefix + layer.name] = layer
        elif isinstance(layer, keras.Model):
            found.update(_qat_layers(layer, f"{prefix}{layer.name}/"))
    return found


def qat_record(qat_model: keras.Model) -> Record:
    """The AMCT QAT record (inner flavor) of a trained :func:`quantize_aware` model.

    Each quantized layer gets scale_d/offset_d (from its learned or EMA input range),
    scale_w/offset_w (ARQ of its current kernel) and dst_type; keys are Keras layer names.

    Raises:
        QuantError: the model has no QAT layer, or a layer never saw a training batch.

    Example:
        >>> rec = qat_record(qat)  # doctest: +SKIP
    """
    layers = _qat_layers(qat_model)
    if not layers:
        raise QuantError(f"model {qat_model.name!r} has no QAT layer: use quantize_aware(model)")
    record = Record(flavor="inner")
    for key, layer in layers.items():
        record.layers.update(layer.factors(key))
    return record


def save_qat_record(qat_model: keras.Model, path: str | os.PathLike) -> Record:
    """Write :func:`qat_record` to ``path`` (AMCT text format, atomically) and return it.

    Example:
        >>> save_qat_record(qat, "qat_record.txt")  # doctest: +SKIP
    """
    from amct_bridge.errors import ValidationError
    from amct_bridge.records import save, validate

    record = qat_record(qat_model)
    problems = validate(record)
    if problems:
        raise ValidationError(problems)
    save(record, path)
    return record


def strip_qat(qat_model: keras.Model) -> keras.Model:
    """A plain float copy of a QAT model with its trained weights (QAT wrappers removed).

    Folded BatchNormalization layers stay Identity layers; ``simulate(strip_qat(qat),
    qat_record(qat))`` computes what the QAT model computes in inference.

    Example:
        >>> deployable = strip_qat(qat)  # doctest: +SKIP
    """

    def make_layer(key, layer):
        return plain_copy(layer.layer if isinstance(layer, QATQuant) else layer)

    clone, pairs = clone_with(qat_model, make_layer)
    for orig, new in pairs.values():
        src = orig.layer if isinstance(orig, QATQuant) else orig
        if src.weights:
            copy_weights(src, new)
    return clone
