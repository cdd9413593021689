"""Quantization-aware training (QAT) for Keras ``fit``, writing AMCT's QAT record.

Workflow (AMCT's create_quant_retrain_model / save_quant_retrain_model, in Keras terms)::

    qat = quantize_aware(model, dst_type="INT4")     # a new model; `model` is not modified
    qat.compile(optimizer="adam", loss=..., metrics=[...])
    qat.fit(x, y, epochs=3)                          # fake-quantized forward, STE backward
    save_qat_record(qat, "record.txt")               # scale_d/offset_d, scale_w/offset_w, dst_type
                                                     # + record.txt.calib.json (qat.sidecar)
    deployable = strip_qat(qat)                      # plain Keras model, BN folded away (qat.strip)
    export_espdl(deployable, "record.txt", "out")    # ESP-DL v1 (amct_bridge.keras.export_espdl)

In the forward pass every quantizable layer (Conv2D, DepthwiseConv2D, Conv2DTranspose, Dense,
SeparableConv2D, AveragePooling2D, and the 1-D convs Conv1D, DepthwiseConv1D, SeparableConv1D)
sees

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
fusion; otherwise the layer's record carries ``skip_fusion: true``. Activations, runtime layers
(Add, Concatenate, pools) and unfolded BNs are wrapped in a QATObserve that tracks their output
range for the sidecar the ESP-DL export reads. A layer called at several nodes of the model
(one ReLU layer used twice) keeps a range per node, named ``relu``, ``relu@1``... in the sidecar
as in the calibration sidecar (:mod:`amct_bridge.keras.qat.layers`).

``power_of_two=True`` trains with ESP-DL's format instead (docs/qat.md, "Power-of-two QAT"):
every tensor the chip holds gets one symmetric int8 quantizer with scale ``2^e``, ``e`` from a
learned threshold (TQT) or the EMA, placed by :func:`amct_bridge.calibration.qat.pow2_plan`;
kernels per tensor at the export's own exponent. The record and sidecar then carry ranges
whose export exponents are exactly the trained ones.

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

import logging
import os

import keras
import numpy as np

from amct_bridge.calibration.plan import preactivation_layers
from amct_bridge.calibration.qat import (
    call_sites,
    pow2_factors,
    pow2_plan,
    refuse_shared_sites,
    shared_layers,
    write_qat_outputs,
)
from amct_bridge.errors import QuantError
from amct_bridge.keras.layers import class_name, is_activation, is_batch_norm, is_runtime
from amct_bridge.keras.plan import walk_layers
from amct_bridge.keras.qat.fake_quant import layer_spec
from amct_bridge.keras.qat.layers import RANGE_MODES, FoldedBatchNorm, QATObserve, QATQuant
from amct_bridge.keras.qat.sidecar import input_quantizer, pow2_quantizers, qat_stats
from amct_bridge.keras.qat.strip import strip_qat
from amct_bridge.keras.rewrite import (
    batchnorm_after,
    clone_with,
    copy_weights,
    plain_copy,
    quantizable_layers,
)
from amct_bridge.quant.factors import bits_of
from amct_bridge.quant.fold import fold_batchnorm
from amct_bridge.quant.qat import check_options, record_range
from amct_bridge.records.model import Record

log = logging.getLogger(__name__)

__all__ = [
    "RANGE_MODES",
    "FoldedBatchNorm",
    "QATObserve",
    "QATQuant",
    "link_quantizers",
    "qat_record",
    "qat_stats",
    "quantize_aware",
    "save_qat_record",
    "strip_qat",
]


def _warn_float_layers(model: keras.Model, quantizable: set[str]) -> None:
    """As calibration does: name the layers with weights that train float (no QAT wrapper,
    not a BatchNormalization folded into one), e.g. a Conv3D (issue 33)."""
    from amct_bridge.calibration.plan import unquantized_layers, warn_unquantized
    from amct_bridge.keras.layers import QUANTIZABLE
    from amct_bridge.keras.plan import describe_model

    desc = describe_model(model)
    warn_unquantized(unquantized_layers(desc, quantizable), tuple(QUANTIZABLE))


#: Keras layers power-of-two QAT observes besides the calibration's (their outputs are chip
#: tensors with an exponent of their own: the SE block's gating, a difference).
POW2_OBSERVED: frozenset[str] = frozenset({"Multiply", "Subtract"})


def quantize_aware(
    model: keras.Model,
    dst_type: str = "INT8",
    *,
    activation_range: str | None = None,
    ema_decay: float = 0.99,
    activation_offset: bool = True,
    channel_wise: bool = True,
    skip_layers: tuple[str, ...] | list[str] = (),
    fold_batchnorm: bool = True,
    init_record: Record | str | os.PathLike | None = None,
    power_of_two: bool = False,
) -> keras.Model:
    """A trainable copy of ``model`` with fake-quantized inputs and kernels (module docstring).

    Args:
        model: a built Sequential or functional model (nested models allowed). Not modified.
        dst_type: "INT8" (default) or "INT4": bit width of activations and weights.
        activation_range: "ema" or "learned"; default "ema", "learned" with ``power_of_two``.
        ema_decay: EMA momentum for ``activation_range="ema"`` (default 0.99).
        activation_offset: asymmetric activation factors (AMCT default True).
        channel_wise: per-output-channel weight scales for convolutions (AMCT default True).
        skip_layers: record keys (Keras layer names, "outer/inner") of layers to leave float.
        fold_batchnorm: fold a BatchNormalization following a quantized layer into it (default).
        init_record: a PTQ record (path or Record, Keras-keyed): its scale_d / offset_d set the
            starting input ranges, so the first training step already quantizes with
            calibrated ranges (AMCT's ``UlqInitializer(record)``); layers it omits start from
            their first batch. With ``power_of_two`` its sidecar (``<record>.calib.json``, if
            there) also starts every output threshold at its calibrated range.
        power_of_two: train with ESP-DL's power-of-two format (docs/qat.md): symmetric int8,
            scale ``2^e`` with ``e = ceil(log2 t - log2 127)`` of a threshold ``t`` per tensor
            (TQT: ``log2 t`` trained through the straight-through ceil, or set from the EMA
            with ``activation_range="ema"``), at every tensor the chip holds (layer inputs,
            outputs, activations, Add / Multiply / pools), kernels per tensor at the export's
            automatic exponent, rounding half up (esp32s3, C kernels). ``activation_offset``
            and ``channel_wise`` do not apply. The ESP-DL export then reproduces the trained
            quantization.

    Returns:
        An uncompiled ``keras.Model``; compile and ``fit`` it, then :func:`save_qat_record`.

    Raises:
        QuantError: bad option, unknown name in ``skip_layers``, or no quantizable layer.
        RecordError: an ``init_record`` key names no quantized layer part of the QAT model.

    Example:
        >>> qat = quantize_aware(model, dst_type="INT4", skip_layers=["logits"])  # doctest: +SKIP
    """
    if activation_range is None:
        activation_range = "learned" if power_of_two else "ema"
    check_options(dst_type, activation_range, ema_decay, power_of_two=power_of_two)
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
    _warn_float_layers(model, set(layers))
    from amct_bridge.errors import GraphError
    from amct_bridge.keras.graph import extract_graph

    try:
        graph = extract_graph(model)
    except GraphError:
        graph = None  # an unbuilt or subclassed model: clone_with below says why it cannot
    sites = call_sites(graph)  # layer key -> its nodes' names, if several
    shared_quantized = shared_layers(sites, sorted(chosen))
    if shared_quantized:
        log.warning(
            "quantize_aware(%s): quantized layer(s) %s called at several nodes: every node's "
            "input is fake-quantized with one range (an AMCT record holds one scale_d / "
            "offset_d per layer, which simulate applies at every node; %s), each node's "
            "output range is kept apart in the sidecar; ESP-DL v1 refuses a layer called more "
            "than once (give each node a layer of its own), ESP-DL v3 exports one layer per node",
            model.name,
            ", ".join(shared_quantized),
            "the union of the nodes' own EMAs"
            if activation_range == "ema"
            else "one learned range, started at the union of the first step's nodes",
        )
    bns = {k: bn for k, bn in batchnorm_after(model).items() if k in chosen}
    folded = {id(bn) for bn in bns.values()} if fold_batchnorm else set()
    options = dict(
        dst_type=dst_type,
        activation_range=activation_range,
        ema_decay=ema_decay,
        activation_offset=activation_offset and not power_of_two,
        channel_wise=channel_wise and not power_of_two,
    )

    everything = walk_layers(model)
    observed = {
        k
        for k, layer in everything.items()
        if k not in chosen
        and id(layer) not in folded
        and (_observed(layer) or k in layers or (power_of_two and _pow2_observed(layer)))
    }
    # the layers whose output before a fused softmax / sigmoid QAT tracks, as calibration does
    logits = {} if graph is None else preactivation_layers(graph, chosen)
    roles = {}
    if power_of_two:
        folded_keys = {k for k, layer in everything.items() if id(layer) in folded}
        roles = _pow2_roles(model, graph, chosen, observed, folded_keys, sites, activation_range)

    def make_layer(key, layer):
        if id(layer) in folded:
            return FoldedBatchNorm(name=layer.name)
        n = len(sites.get(key, [key]))
        # its output range goes to the sidecar (a skip_layers layer too: the export needs it)
        if key in observed:
            return QATObserve(
                plain_copy(layer), ema_decay=ema_decay, sites=n, name=layer.name,
                **roles.get(key, {}),
            )  # fmt: skip
        if key not in chosen:
            return plain_copy(layer)
        config = layer.get_config()
        if fold_batchnorm and key in bns:
            config["use_bias"] = True
        skip = True if key in bns and not fold_batchnorm else None
        inner = layer.__class__.from_config(config)
        extra = roles.get(key, {})
        return QATQuant(
            inner, skip_fusion=skip, sites=n, name=layer.name, preactivation=logits.get(key),
            **options, **extra,
        )  # fmt: skip

    clone, pairs = clone_with(model, make_layer)
    for key, (orig, new) in pairs.items():
        if isinstance(new, QATQuant) and key in bns and fold_batchnorm:
            _fold_into(orig, new.layer, bns[key], key)
        elif isinstance(new, (QATQuant, QATObserve)):
            copy_weights(orig, new.layer)
        elif orig.weights and id(orig) not in folded:
            copy_weights(orig, new)
    if init_record is not None:
        if power_of_two:
            _init_pow2(clone, init_record)
        else:
            _init_ranges(clone, init_record)
    if power_of_two:
        link_quantizers(clone)
    return clone


def link_quantizers(qat_model: keras.Model) -> keras.Model:
    """Give each power-of-two QAT layer whose input another layer quantizes (``input_source``)
    that quantizer's threshold, so its bias is rounded to the chip's grid ``e_in + e_w``.
    :func:`quantize_aware` does it; a QAT model loaded from ``.keras`` needs it again before
    it trains or predicts (unlinked, its biases stay float: within a step's fraction
    ``2^-(mac_shift+1)`` of the chip's). Returns the model.

    Example:
        >>> # qat = link_quantizers(keras.saving.load_model("qat.keras"))
    """
    quantizers = pow2_quantizers(qat_model)
    for layer in _qat_layers(qat_model).values():
        if layer.power_of_two and layer.input_source is not None:
            # not tracked as this layer's weight: it is the producer's
            object.__setattr__(layer, "_source_log2t", quantizers[layer.input_source][0])
    return qat_model


def _pow2_roles(model, graph, chosen, observed, folded_keys, sites, activation_range) -> dict:
    """Per layer key, the power-of-two options of its wrapper (:func:`pow2_plan`'s roles);
    refuses what one exponent per layer cannot train."""
    if graph is None:
        raise QuantError(
            f"power_of_two: model {model.name!r} has no graph (subclassed?): the quantizers "
            "are placed along the graph"
        )
    plan = pow2_plan(graph, chosen, observed, identity=folded_keys)
    note = plan.preactivation_note("Activation layer")
    if note:
        log.warning("quantize_aware(%s, power_of_two=True): %s", model.name, note)
    roles: dict[str, dict] = {}
    for key in sorted(chosen | observed):
        nodes = sites.get(key, [key])
        own = [n for n in nodes if plan.source.get(n) == n]
        if len(nodes) > 1 and (key in chosen or own):
            refuse_shared_sites(key, nodes, "layer", "node", "node")
        if key in chosen:
            roles[key] = dict(
                power_of_two=True,
                input_source=plan.input_source.get(key),
                quantize_output=plan.source.get(key) == key,
            )
        else:
            roles[key] = dict(
                quantize_output=bool(own),
                requantize=key in plan.requantize,
                activation_range=activation_range,
                sources=[plan.source.get(n) for n in nodes],
            )
    return roles


def _init_ranges(qat_model: keras.Model, init_record: Record | str | os.PathLike) -> None:
    """Each quantized part's input range from the record's scale_d / offset_d."""
    from amct_bridge.errors import RecordError
    from amct_bridge.records import load

    record = init_record if isinstance(init_record, Record) else load(init_record)
    parts = {}
    for key, layer in _qat_layers(qat_model).items():
        for i, name in enumerate(layer.ranges):  # "input", then "mid" (separable)
            parts[layer.spec.key(key, i)] = layer.ranges[name]
    unknown = [k for k in record.layers if k not in parts]
    if unknown:
        raise RecordError(
            f"init_record: keys name no quantized layer of {qat_model.name!r}: {unknown}; "
            f"quantized: {list(parts)}"
        )
    for key, f in record.layers.items():
        if f.scale_d is None or f.offset_d is None:
            continue
        bits = bits_of(f.dst_type or f.act_type or "INT8")
        lo, hi = record_range(f.scale_d, f.offset_d, bits)
        lo_var, hi_var, seen = parts[key]  # every node's range, for a layer at several
        lo_var.assign(np.full(lo_var.shape, lo, np.float32))
        hi_var.assign(np.full(hi_var.shape, hi, np.float32))
        seen.assign(np.full(seen.shape, 1.0, np.float32))


def _init_pow2(qat_model: keras.Model, init_record: Record | str | os.PathLike) -> None:
    """Power-of-two thresholds from a PTQ record (each quantized part's input: the range its
    scale_d / offset_d encode) and its sidecar when there is one (every quantized output: its
    calibrated output range), as TQT starts from a calibration."""
    from amct_bridge.errors import RecordError
    from amct_bridge.keras.qat.layers import track_start
    from amct_bridge.records import load
    from amct_bridge.records.calibration import load_stats, sidecar_path

    record = init_record if isinstance(init_record, Record) else load(init_record)
    quantizers = pow2_quantizers(qat_model)
    parts = {}
    for key, layer in _qat_layers(qat_model).items():
        for i in range(len(layer.ranges)):  # "input", then "mid" (separable)
            own = input_quantizer(key, layer, quantizers) if i == 0 else quantizers[f"{key}:mid"]
            parts[layer.spec.key(key, i)] = own
    unknown = [k for k in record.layers if k not in parts]
    if unknown:
        raise RecordError(
            f"init_record: keys name no quantized layer of {qat_model.name!r}: {unknown}; "
            f"quantized: {list(parts)}"
        )
    if not isinstance(init_record, Record) and os.path.exists(sidecar_path(init_record)):
        for node, entry in load_stats(sidecar_path(init_record)).layers.items():
            if node in quantizers and entry.output is not None:
                track_start(*quantizers[node], entry.output.min, entry.output.max)
    for key, f in record.layers.items():
        if f.scale_d is not None and f.offset_d is not None:
            lo, hi = record_range(
                f.scale_d, f.offset_d, bits_of(f.dst_type or f.act_type or "INT8")
            )
            track_start(*parts[key], lo, hi)


def _pow2_observed(layer: keras.layers.Layer) -> bool:
    return class_name(layer) in POW2_OBSERVED


def _observed(layer: keras.layers.Layer) -> bool:
    """Layers whose output range the ESP-DL export needs: activations, runtime layers (Add,
    Concatenate, pools) and BatchNormalization (when not folded), as the calibration sidecar."""
    return (is_activation(layer) or is_runtime(layer) or is_batch_norm(layer)) and not isinstance(
        layer, keras.Model
    )


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
    quantizers = pow2_quantizers(qat_model) if any(x.power_of_two for x in layers.values()) else {}
    for key, layer in layers.items():
        if layer.power_of_two:
            record.layers.update(_pow2_factors(key, layer, quantizers))
        else:
            record.layers.update(layer.factors(key))
    return record


def _pow2_factors(key: str, layer: QATQuant, quantizers: dict) -> dict:
    """Record entries of a power-of-two QAT layer (a separable conv: two parts)."""
    from amct_bridge.keras.qat.layers import exponent_of

    inputs = [input_quantizer(key, layer, quantizers)]
    if "mid" in layer.ranges:
        inputs.append(quantizers[f"{key}:mid"])
    attrs = [attr for attr, _ in layer.spec.kernels] or [None]
    entries = {}
    for i, ((log2t, rng), attr) in enumerate(zip(inputs, attrs, strict=True)):
        kernel = None if attr is None else np.asarray(getattr(layer.layer, attr), np.float32)
        seen = float(np.max(np.asarray(rng[2])))  # batches its quantizer saw
        entries[layer.spec.key(key, i)] = pow2_factors(
            key,
            exponent_of(log2t),
            seen,
            kernel,
            skip_fusion=bool(layer.skip_fusion) and attr == layer.spec.kernels[-1][0],
            part="mid" if i else "input",
        )
    return entries


def save_qat_record(qat_model: keras.Model, path: str | os.PathLike) -> Record:
    """Write :func:`qat_record` to ``path`` and its calibration sidecar next to it; return it.

    The sidecar (``<path>.calib.json``, :func:`qat_stats`) holds the ranges the ESP-DL export
    reads (each quantized layer's input and output, folded BNs, activations, Add / Concatenate /
    pools). Both are built and validated in memory first, then written as one set (temp files,
    then renamed together), so a failure leaves both previous files.

    Example:
        >>> save_qat_record(qat, "qat_record.txt")  # doctest: +SKIP
        >>> export_espdl(strip_qat(qat), "qat_record.txt", "espdl_out")  # doctest: +SKIP
    """
    record = qat_record(qat_model)
    return write_qat_outputs(record, qat_stats(qat_model), path, what=f"model {qat_model.name!r}")
