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

from amct_bridge.calibration.qat import call_sites, shared_layers, write_qat_outputs
from amct_bridge.errors import QuantError
from amct_bridge.keras.layers import is_activation, is_batch_norm, is_runtime
from amct_bridge.keras.qat.fake_quant import layer_spec
from amct_bridge.keras.qat.layers import RANGE_MODES, FoldedBatchNorm, QATObserve, QATQuant
from amct_bridge.keras.qat.sidecar import qat_stats
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
    init_record: Record | str | os.PathLike | None = None,
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
        init_record: a PTQ record (path or Record, Keras-keyed): its scale_d / offset_d set the
            starting input ranges, so the first training step already quantizes with
            calibrated ranges (AMCT's ``UlqInitializer(record)``); layers it omits start from
            their first batch.

    Returns:
        An uncompiled ``keras.Model``; compile and ``fit`` it, then :func:`save_qat_record`.

    Raises:
        QuantError: bad option, unknown name in ``skip_layers``, or no quantizable layer.
        RecordError: an ``init_record`` key names no quantized layer part of the QAT model.

    Example:
        >>> qat = quantize_aware(model, dst_type="INT4", skip_layers=["logits"])  # doctest: +SKIP
    """
    check_options(dst_type, activation_range, ema_decay)
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
        sites = call_sites(extract_graph(model))  # layer key -> its nodes' names, if several
    except GraphError:
        sites = {}  # an unbuilt or subclassed model: clone_with below says why it cannot
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
        activation_offset=activation_offset,
        channel_wise=channel_wise,
    )

    def make_layer(key, layer):
        if id(layer) in folded:
            return FoldedBatchNorm(name=layer.name)
        n = len(sites.get(key, [key]))
        # its output range goes to the sidecar (a skip_layers layer too: the export needs it)
        if key not in chosen and (_observed(layer) or key in layers):
            return QATObserve(plain_copy(layer), ema_decay=ema_decay, sites=n, name=layer.name)
        if key not in chosen:
            return plain_copy(layer)
        config = layer.get_config()
        if fold_batchnorm and key in bns:
            config["use_bias"] = True
        skip = True if key in bns and not fold_batchnorm else None
        inner = layer.__class__.from_config(config)
        return QATQuant(inner, skip_fusion=skip, sites=n, name=layer.name, **options)

    clone, pairs = clone_with(model, make_layer)
    for key, (orig, new) in pairs.items():
        if isinstance(new, QATQuant) and key in bns and fold_batchnorm:
            _fold_into(orig, new.layer, bns[key], key)
        elif isinstance(new, (QATQuant, QATObserve)):
            copy_weights(orig, new.layer)
        elif orig.weights and id(orig) not in folded:
            copy_weights(orig, new)
    if init_record is not None:
        _init_ranges(clone, init_record)
    return clone


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
    for key, layer in layers.items():
        record.layers.update(layer.factors(key))
    return record


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
