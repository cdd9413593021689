"""The QAT Keras layers: :class:`QATQuant` (fake-quantizing wrapper), :class:`QATObserve`
(output-range tracking wrapper) and :class:`FoldedBatchNorm`.

:func:`amct_bridge.keras.qat.quantize_aware` puts them into a copy of the model; each
:class:`QATQuant` fake-quantizes its layer's input and kernels while training and turns its
trained ranges into record entries (:meth:`QATQuant.factors`). All three are registered Keras
serializables (package "amct_bridge"), so a saved QAT model loads back.

A layer called at several nodes of a functional model (one ReLU layer used twice) is one
wrapper called at each node; with ``sites = n`` (its node count in the model graph) its range
weights hold one value per node (shape ``[n]``), a ``calls`` counter picks the node of each call
(``calls mod n``: the model runs its nodes in the graph's order) and only that entry moves, so
every node keeps its own range, named ``relu``, ``relu@1``... as the calibration sidecar names
them. A quantized layer at several nodes keeps a range per node too but clips every node at
their union (``learned``: one range): the record holds one scale_d / offset_d per layer.

With ``power_of_two=True`` (docs/qat.md, "Power-of-two QAT") a tensor's quantizer is a
threshold ``t`` (a ``<tensor>_log2t`` weight holding ``log2 t``; trainable, TQT, or set from the
EMA) whose exponent ``ceil(log2 t - log2 127)`` gives the scale ``2^e``; :class:`QATQuant`
quantizes its input (unless ``input_source`` names the node whose quantizer already did),
its kernels (per tensor, the export's exponent) and its output; :class:`QATObserve` quantizes
its output when ``quantize_output`` (requantizing an Add's inputs first when ``requantize``).

Example:
    >>> import keras
    >>> QATQuant(keras.layers.Dense(2), dst_type="INT4", name="fc").dst_type
    'INT4'
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from amct_bridge.calibration.qat import layer_factors, union_range
from amct_bridge.errors import QuantError
from amct_bridge.keras.qat.fake_quant import (
    arq_fake_quant,
    fake_quant_pow2,
    fake_quant_range,
    finish,
    layer_spec,
    log2_of_absmax,
    threshold_exponent,
    weight_exponent,
)
from amct_bridge.quant.qat import RANGE_MODES, THRESHOLD_WARMUP, check_options
from amct_bridge.quant.qat import threshold_exponent as _exponent
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


def add_range_weights(
    layer: keras.layers.Layer, name: str, *, trainable: bool, sites: int = 1
) -> tuple:
    """``(lo, hi, seen)`` variables of one tracked tensor of ``layer`` (``seen``: batches seen):
    scalars, or one value per node (shape ``[sites]``) for a layer called at several nodes.

    Example:
        >>> # used by QATQuant.build and QATObserve.build
    """
    shape = () if sites <= 1 else (int(sites),)
    # "mean": under tf.distribute each replica tracks its own batches and the kept range is
    # the replicas' mean (like BatchNormalization's moving statistics).
    lo, hi = (
        layer.add_weight(
            name=f"{name}_{end}",
            shape=shape,
            initializer="zeros",
            trainable=trainable,
            aggregation="mean",
            autocast=False,  # factors stay float32 under mixed precision
        )
        for end in ("min", "max")
    )
    seen = layer.add_weight(
        name=f"{name}_seen",
        shape=shape,
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


def track_ema_site(x, lo_var, hi_var, seen, hot, decay: float):
    """:func:`track_ema` of the node whose one-hot bool mask is ``hot`` in per-node variables
    ``[n]`` (the same float32 arithmetic on that entry; the others unchanged). Returns the new
    ``(lo, hi)`` vectors.

    Example:
        >>> # see QATObserve with sites > 1
    """
    batch_lo = ops.stop_gradient(ops.cast(ops.min(x), "float32"))
    batch_hi = ops.stop_gradient(ops.cast(ops.max(x), "float32"))
    pick = lambda v: ops.sum(ops.where(hot, v, ops.zeros_like(v)))  # noqa: E731 (exact)
    first = pick(seen) <= 0
    lo = ops.where(first, batch_lo, decay * pick(lo_var) + (1 - decay) * batch_lo)
    hi = ops.where(first, batch_hi, decay * pick(hi_var) + (1 - decay) * batch_hi)
    lo_all = ops.where(hot, lo, lo_var)
    hi_all = ops.where(hot, hi, hi_var)
    lo_var.assign(lo_all)
    hi_var.assign(hi_all)
    seen.assign(seen + ops.cast(hot, "float32"))
    return lo_all, hi_all


def add_call_counter(layer: keras.layers.Layer, sites: int):
    """The call counter of a layer called at ``sites`` nodes, None for one node.

    Example:
        >>> # used by QATQuant.build and QATObserve.build
    """
    if sites <= 1:
        return None
    return layer.add_weight(
        name="calls",
        shape=(),
        dtype="int32",
        initializer="zeros",
        trainable=False,
        aggregation="only_first_replica",
    )


def next_site(counter, sites: int):
    """``(node index, its one-hot bool mask)`` of this call; counts the call."""
    calls = ops.convert_to_tensor(counter)
    site = ops.mod(calls, sites)
    counter.assign(calls + 1)
    return site, ops.equal(ops.arange(sites, dtype="int32"), site)


def range_values(variables) -> list[tuple[float, float, float]]:
    """``(lo, hi, seen)`` per node (one row for scalar variables).

    Example:
        >>> range_values([np.float32(0.0), np.float32(2.0), np.float32(3.0)])
        [(0.0, 2.0, 3.0)]
    """
    lo, hi, seen = (np.atleast_1d(np.asarray(v, np.float64)) for v in variables)
    return [(float(a), float(b), float(c)) for a, b, c in zip(lo, hi, seen, strict=True)]


def add_threshold_weight(layer: keras.layers.Layer, name: str, *, trainable: bool):
    """The ``log2 t`` weight of one power-of-two quantizer of ``layer`` (``<name>_log2t``).

    Example:
        >>> # used by QATQuant.build and QATObserve.build with power_of_two
    """
    return layer.add_weight(
        name=f"{name}_log2t",
        shape=(),
        initializer="zeros",
        trainable=trainable,
        aggregation="mean",
        autocast=False,
    )


def track_pow2(x, lo_var, hi_var, seen, log2t, decay: float, learned: bool):
    """One training step of a power-of-two quantizer: the EMA of ``x``'s min/max moves (the
    sidecar's ``observed_min`` / ``observed_max``) and ``log2 t`` is, learned, the mean of
    the first ``THRESHOLD_WARMUP`` batches' ``log2 max|x|`` then the trained weight (its
    gradient flows back through the returned value), or, ``ema``, ``log2`` of the EMA's
    ``max(|lo|, |hi|)``. Returns ``log2 t``.

    Example:
        >>> # see QATQuant with power_of_two
    """
    n = ops.cast(seen, "float32")  # batches seen before this one
    batch_t = log2_of_absmax(ops.min(x), ops.max(x))
    lo, hi = track_ema(x, lo_var, hi_var, seen, decay)
    if not learned:
        t = log2_of_absmax(lo, hi)
        log2t.assign(t)
        return t
    # the running mean of the first batches' log2 max|x| (THRESHOLD_WARMUP), then trained
    t = ops.where(n < THRESHOLD_WARMUP, log2t + (batch_t - log2t) / (n + 1.0), log2t)
    log2t.assign(ops.stop_gradient(t))
    return log2t + ops.stop_gradient(t - log2t)


def track_start(log2t, variables, lo: float, hi: float) -> None:
    """Start a power-of-two quantizer at the range ``[lo, hi]`` (``init_record``): ``log2 t``
    from its absolute maximum, the EMA at it, counted as the threshold's warm-up batches (the
    calibration is its start).

    Example:
        >>> # quantize_aware(model, power_of_two=True, init_record="ptq.txt")
    """
    from amct_bridge.quant.qat import log2_threshold

    log2t.assign(np.float32(log2_threshold(lo, hi)))
    lo_var, hi_var, seen = variables
    lo_var.assign(np.full(lo_var.shape, lo, np.float32))
    hi_var.assign(np.full(hi_var.shape, hi, np.float32))
    seen.assign(np.full(seen.shape, float(THRESHOLD_WARMUP), np.float32))


def exponent_of(log2t) -> int:
    """The exponent a ``log2 t`` weight gives (float32 arithmetic, as the graph computes it).

    Example:
        >>> exponent_of(np.float32(np.log2(6.0)))
        -4
    """
    return _exponent(float(np.asarray(log2t)))


def quantize_pow2(
    x,
    variables,
    log2t,
    training,
    *,
    decay: float,
    learned: bool,
    bits: int = 8,
    with_exponent: bool = False,
):
    """``x`` fake-quantized by one power-of-two quantizer (``variables``: its EMA ``(lo, hi,
    seen)``); in inference before any training step ``x`` passes unchanged. With
    ``with_exponent``: ``(y, e)``, ``e`` a constant for the gradient (a bias's grid).

    Example:
        >>> # see QATQuant / QATObserve with power_of_two
    """
    if training:
        e = threshold_exponent(track_pow2(x, *variables, log2t, decay, learned), bits)
        y = fake_quant_pow2(x, e, bits)
    else:
        e = threshold_exponent(log2t, bits)
        y = ops.where(variables[2] > 0, fake_quant_pow2(x, e, bits), x)
    return (y, ops.stop_gradient(e)) if with_exponent else y


@keras.saving.register_keras_serializable(package="amct_bridge")
class QATObserve(keras.layers.Wrapper):
    """Runs its layer unchanged and, while training, tracks an EMA of the output's min/max.

    :func:`~amct_bridge.keras.qat.quantize_aware` wraps activations (ReLU...), runtime layers
    (Add, Concatenate, pools) and unfolded BatchNormalization in it: the QAT sidecar needs their
    output ranges for the ESP-DL export. :func:`~amct_bridge.keras.qat.strip_qat` unwraps them.

    Power-of-two QAT (``quantize_output``, one call site): the output is fake-quantized with
    a learned (``activation_range="learned"``) or EMA threshold; ``requantize`` (Add,
    Subtract, Concatenate) fake-quantizes each input at the output's exponent first, as the
    chip requantizes them. ``sources``: per call site, the node whose quantizer holds this
    layer's output values (a ReLU after a conv: the conv), for the sidecar.

    Example:
        >>> QATObserve(keras.layers.ReLU(), name="relu").name
        'relu'
    """

    def __init__(
        self,
        layer,
        ema_decay=0.99,
        sites=1,
        quantize_output=False,
        requantize=False,
        activation_range="ema",
        sources=None,
        **kwargs,
    ):
        super().__init__(layer, **kwargs)
        self.ema_decay = float(ema_decay)
        self.sites = int(sites)
        self.quantize_output = bool(quantize_output)
        self.requantize = bool(requantize)
        self.activation_range = activation_range
        self.sources = None if sources is None else list(sources)
        if self.quantize_output and self.sites > 1:
            raise QuantError(f"layer {layer.name!r}: power-of-two quantizer at several nodes")

    def build(self, input_shape=None):
        super().build(input_shape)
        self.output_range = add_range_weights(self, "output", trainable=False, sites=self.sites)
        self.calls = add_call_counter(self, self.sites)
        if self.quantize_output:
            learned = self.activation_range == "learned"
            self.output_log2t = add_threshold_weight(self, "output", trainable=learned)

    def call(self, inputs, training=None, **kwargs):
        if self.quantize_output:
            return self._call_pow2(inputs, training, **kwargs)
        y = self.layer(inputs, training=training, **kwargs)
        if training and self.sites > 1:
            _, hot = next_site(self.calls, self.sites)
            track_ema_site(y, *self.output_range, hot, self.ema_decay)
        elif training:
            track_ema(y, *self.output_range, self.ema_decay)
        return y

    def _call_pow2(self, inputs, training, **kwargs):
        y = self.layer(inputs, training=training, **kwargs)
        learned = self.activation_range == "learned"
        if training:
            t = track_pow2(y, *self.output_range, self.output_log2t, self.ema_decay, learned)
        else:
            t = self.output_log2t
        e = threshold_exponent(t)
        if self.requantize and isinstance(inputs, (list, tuple)):
            # the chip's RequantizeLinear: each input at the output's exponent, then the op
            y = self.layer([fake_quant_pow2(v, e) for v in inputs], training=training, **kwargs)
        out = fake_quant_pow2(y, e)
        return out if training else ops.where(self.output_range[2] > 0, out, y)

    def exponent(self) -> int:
        """The power-of-two exponent of the output (``quantize_output``).

        Example:
            >>> # qat.get_layer("swish").exponent()
        """
        return exponent_of(self.output_log2t)

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(input_shape)

    def get_config(self):
        return {
            **super().get_config(),
            "ema_decay": self.ema_decay,
            "sites": self.sites,
            "quantize_output": self.quantize_output,
            "requantize": self.requantize,
            "activation_range": self.activation_range,
            "sources": self.sources,
        }


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
        sites: nodes of the model that call this layer (module docstring): each keeps its own
            output EMA and (``ema``) input EMA; every node clips at the union of the input
            EMAs (``learned``: one range, started at the union of the first step's nodes).
        power_of_two: ESP-DL's power-of-two format (module docstring): symmetric int8,
            thresholds learned (``learned``) or from the EMA, kernels per tensor.
        input_source: power_of_two: the node whose quantizer already quantized this layer's
            input (it then passes as it is), None: this layer quantizes it.
        quantize_output: power_of_two: quantize the output too (off for a Softmax nobody
            reads: float on the chip).
        preactivation: the layer's fused activation (``"softmax"``, ``"sigmoid"``...) when the
            output before it is tracked too (EMA, one node only): the sidecar's
            ``preactivation``, a classifier's logits, which the ESP-DL exports quantize.

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
        sites=1,
        power_of_two=False,
        input_source=None,
        quantize_output=True,
        preactivation=None,
        **kwargs,
    ):
        super().__init__(layer, **kwargs)
        self.sites = int(sites)
        self.preactivation = preactivation or None
        if self.preactivation and self.sites > 1:
            raise QuantError(f"layer {layer.name!r}: a pre-activation range at several nodes")
        self.site_input = self.sites > 1 and activation_range == "ema"
        self.bits = check_options(
            dst_type, activation_range, ema_decay, power_of_two=bool(power_of_two)
        )
        self.power_of_two = bool(power_of_two)
        self.input_source = input_source
        self.quantize_output = bool(quantize_output)
        if self.power_of_two and self.sites > 1:
            raise QuantError(f"layer {layer.name!r}: power_of_two at several nodes")
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
        ranges_trainable = trainable and not self.power_of_two  # power of two: log2t instead
        # a separable conv (1-D or 2-D: two kernels) also clips its depthwise output
        names = ["input"] + (["mid"] if len(self.spec.kernels) > 1 else [])
        per_site = self.sites if self.site_input else 1
        self.ranges = {
            name: add_range_weights(self, name, trainable=ranges_trainable, sites=per_site)
            for name in names
        }
        # The output range is only observed (EMA, never a clip): the ESP-DL export needs it in
        # the sidecar (a chain output feeding an Add, the model output); see qat.sidecar.
        self.output_range = add_range_weights(self, "output", trainable=False, sites=self.sites)
        self.calls = add_call_counter(self, self.sites)
        if self.preactivation:  # the output before the fused activation: observed (EMA)
            self.preactivation_range = add_range_weights(self, "preactivation", trainable=False)
        if self.power_of_two:  # EMAs above stay (sidecar, batches); thresholds besides
            own = names if self.input_source is None else names[1:]  # else its producer's
            tracked = own + (["output"] if self.quantize_output else [])
            self.log2t = {n: add_threshold_weight(self, n, trainable=trainable) for n in tracked}

    def call(self, inputs, training=None):
        if self.power_of_two:
            return self._call_pow2(inputs, training)
        site = hot = None
        if training and self.sites > 1:
            site, hot = next_site(self.calls, self.sites)
        x = self._quantize_activation(inputs, "input", training, site, hot)
        if self.spec.op is None:  # average pooling: input only
            y = self.layer(x)
        else:
            cw = self.channel_wise and self.spec.channel_wise
            kernels = {
                attr: arq_fake_quant(getattr(self.layer, attr), layout, self.bits, channel_wise=cw)
                for attr, layout in self.spec.kernels
            }
            mid = lambda v: self._quantize_activation(v, "mid", training, site, hot)  # noqa: E731
            y = finish(self.layer, self.spec.op(self.layer, x, kernels, mid), None,
                       self._observer(training))  # fmt: skip
        if training and hot is not None:
            track_ema_site(y, *self.output_range, hot, self.ema_decay)
        elif training:
            track_ema(y, *self.output_range, self.ema_decay)
        return y

    def _call_pow2(self, inputs, training):
        learned = self.activation_range == "learned"
        grid = {}  # exponent of each quantized input ("input", "mid"), for the bias

        def quantize(v, name):
            y, grid[name] = quantize_pow2(
                v, self.ranges[name], self.log2t[name], training,
                decay=self.ema_decay, learned=learned, with_exponent=True,
            )  # fmt: skip
            return y

        if self.input_source is None:
            x = quantize(inputs, "input")
        else:  # already on its producer's grid: only its EMA (the sidecar's observed range)
            if training:
                track_ema(inputs, *self.ranges["input"], self.ema_decay)
            x = inputs
            source = getattr(self, "_source_log2t", None)  # link_quantizers
            if source is not None:
                grid["input"] = ops.stop_gradient(threshold_exponent(source))
        if self.spec.op is None:  # average pooling
            y = self.layer(x)
        else:
            kernels, e_w = {}, None
            for attr, _ in self.spec.kernels:
                kernel = getattr(self.layer, attr)
                e_w = weight_exponent(kernel)
                kernels[attr] = fake_quant_pow2(kernel, e_w)
            y = self.spec.op(self.layer, x, kernels, lambda v: quantize(v, "mid"))
            e_in = grid.get("mid" if "mid" in self.ranges else "input")
            bias_exponent = None if e_in is None else e_in + e_w
            y = finish(self.layer, y, bias_exponent, self._observer(training))
        if self.quantize_output:
            return quantize_pow2(
                y, self.output_range, self.log2t["output"], training,
                decay=self.ema_decay, learned=learned,
            )  # fmt: skip
        if training:
            track_ema(y, *self.output_range, self.ema_decay)
        return y

    def _observer(self, training):
        """What :func:`~amct_bridge.keras.qat.fake_quant.finish` calls on the output before the
        activation: its EMA while training with ``preactivation``, else None."""
        if not (training and self.preactivation):
            return None
        return lambda pre: track_ema(pre, *self.preactivation_range, self.ema_decay)

    def preactivation_values(self) -> tuple[float, float, float] | None:
        """``(lo, hi, seen)`` of the output before the fused activation (EMA), None when not
        tracked (no ``preactivation``).

        Example:
            >>> # lo, hi, seen = qat.get_layer("head").preactivation_values()
        """
        if not self.preactivation:
            return None
        return range_values(self.preactivation_range)[0]

    def exponent(self, name: str) -> int:
        """The power-of-two exponent tensor ``name`` ("input", "mid", "output") is quantized at
        (:func:`amct_bridge.quant.qat.threshold_exponent` of its ``log2 t``).

        Example:
            >>> # qat.get_layer("conv").exponent("output")
        """
        return exponent_of(self.log2t[name])

    def _quantize_activation(self, x, name, training, site=None, hot=None):
        lo_var, hi_var, seen = self.ranges[name]
        if training and hot is not None and self.site_input:
            # the union below (a node not seen yet holds 0, inside the widening to 0 anyway)
            lo, hi = track_ema_site(x, lo_var, hi_var, seen, hot, self.ema_decay)
        elif training and hot is not None:
            lo, hi = self._update_learned_sites(x, lo_var, hi_var, seen, site, name)
        elif training:
            lo, hi = self._update_range(x, lo_var, hi_var, seen)
        else:
            lo, hi = lo_var, hi_var
        if self.site_input:  # every node clips at the union of the nodes' EMAs
            lo, hi, seen = ops.min(lo), ops.max(hi), ops.max(seen)
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

    def _update_learned_sites(self, x, lo_var, hi_var, seen, site, name):
        """One learned range for every node: the first step's nodes set it (their union, the
        first node's "mid" for a separable conv), then gradients; ``seen`` counts steps."""
        batch_lo = ops.stop_gradient(ops.cast(ops.min(x), "float32"))
        batch_hi = ops.stop_gradient(ops.cast(ops.max(x), "float32"))
        first = seen <= 0
        # the counter was already moved for this call: calls <= sites in the first step
        widen = ops.logical_and(
            ops.logical_and(site > 0, ops.convert_to_tensor(self.calls) <= self.sites), seen <= 1
        )
        lo = ops.where(first, batch_lo, ops.where(widen, ops.minimum(lo_var, batch_lo), lo_var))
        hi = ops.where(first, batch_hi, ops.where(widen, ops.maximum(hi_var, batch_hi), hi_var))
        lo_var.assign(ops.stop_gradient(lo))
        hi_var.assign(ops.stop_gradient(hi))
        seen.assign(seen + ops.cast(site == 0, "float32"))
        return lo_var + ops.stop_gradient(lo - lo_var), hi_var + ops.stop_gradient(hi - hi_var)

    def input_clip(self, name: str = "input") -> tuple[float, float, float]:
        """``(lo, hi, seen)`` the layer clips tensor ``name`` at (several nodes: the union of
        their EMAs).

        Example:
            >>> # lo, hi, seen = qat.get_layer("fc").input_clip()
        """
        return union_range(range_values(self.ranges[name]))

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
            "sites": self.sites,
            "power_of_two": self.power_of_two,
            "input_source": self.input_source,
            "quantize_output": self.quantize_output,
            "preactivation": self.preactivation,
        }

    def factors(self, key: str) -> dict[str, LayerFactors]:
        """Record entries of this layer (one per part; a separable conv has two), keyed
        (:func:`amct_bridge.calibration.qat.layer_factors`)."""
        entries = {}
        attrs = [attr for attr, _ in self.spec.kernels]
        parts = list(zip(("input", "mid"), attrs, strict=False))
        cw = self.channel_wise and self.spec.channel_wise
        for i, (name, attr) in enumerate(parts or [("input", None)]):
            lo, hi, seen = self.input_clip(name)
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
