"""Export a calibrated model as one ESP-DL v3 ``.espdl`` file (framework-free core).

Input: the model as :class:`~amct_bridge.espdl.source.SourceLayer` list (an adapter's
``source_layers``), the AMCT record and the calibration sidecar. Output: an
:class:`~amct_bridge.espdl.v3.model.EspdlModel`, written atomically with
:func:`~amct_bridge.espdl.v3.writer.write_espdl`, with embedded test values computed by
:func:`~amct_bridge.espdl.v3.simulate.simulate_espdl`.

What happens to each layer (:class:`V3Layer`, nothing vanishes) is decided by one table,
:data:`amct_bridge.espdl.v3.lowering.registry.LOWERINGS`: per layer kind the lowering function
that writes its nodes and the v3 op types it may write (docs/espdl-v3.md's mapping table is
tested against it). The lowerings live in :mod:`amct_bridge.espdl.v3.lowering` by family
(conv chains and transposed convs, activations and tables, arithmetic, pools, shape ops,
normalizations, matrix products); a layer no entry takes is refused with its reason in v3
terms (ExportError unless ``skip_unsupported``). This module plans the conv chains (a
following BatchNormalization folds in, a ReLU fuses as ``activation: Relu``, a ZeroPadding2D
read only by a "valid" conv becomes its pads), runs the lowerings in order and embeds the
test values.

Exponents (docs/espdl-v3.md): a tensor's exponent is the smallest power of two whose
symmetric int8/int16 range covers its calibrated range (the v1 rules and code,
:class:`~amct_bridge.espdl.exponents.ExponentFinder`). Add, Sub and Concat need one exponent
on all inputs and the output (the kernels add integers as they are): an input at another
exponent goes through a ``RequantizeLinear`` node. Weights are per tensor (auto exponent),
biases INT32 (INT64 for s16) at ``e_in + e_w``, and ``mac_shift = e_out - e_w - e_in >= 0``
is kept by raising ``e_out`` where needed (:func:`~amct_bridge.espdl.v3.exponents.keep_mac_shift`).

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
    >>> layers = [SourceLayer("x", "input", attrs={"shape": (4,)}),
    ...           SourceLayer("fc", "dense", ["x"], "Dense",
    ...                       {"kernel": np.full((4, 2), 0.5, np.float32)},
    ...                       {"model_output": True})]
    >>> st = CalibrationStats(layers={"fc": LayerStats("Dense", TensorRange(0, 1),
    ...                                                TensorRange(-2, 2))})
    >>> res = export_layers_v3(layers, None, stats=st, target="c")
    >>> [(n.op_type, n.name) for n in res.model.nodes], res.exponents["fc"][0]
    ([('Gemm', 'fc')], -5)
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.checks import (
    check_record_keys,
    check_sidecar_model,
    sidecar_of_another_record,
)
from amct_bridge.espdl.exponent_search import Tuning
from amct_bridge.espdl.plan import Chain, Problem, consumers_map
from amct_bridge.espdl.source import WEIGHT_OPS, ZERO_PADDING_KINDS, SourceLayer, zero_padding
from amct_bridge.espdl.v3.lowering import Emitter, V3Layer, chain_head, lowering_for, no_lowering
from amct_bridge.espdl.v3.lowering.activation import ACTIVATION_OPS, CELL_ACTIVATIONS
from amct_bridge.espdl.v3.lowering.conv import lower_input
from amct_bridge.espdl.v3.model import EspdlModel, Tensor
from amct_bridge.espdl.v3.simulate import TARGETS, simulate_espdl
from amct_bridge.espdl.v3.writer import write_espdl
from amct_bridge.espdl.writer import check_output_path
from amct_bridge.records.calibration import CalibrationStats
from amct_bridge.records.model import Record

__all__ = [
    "ACTIVATION_OPS",
    "CELL_ACTIVATIONS",
    "FEATURE_TYPES",
    "V3Layer",
    "V3ExportResult",
    "check_layer_bits",
    "export_layers_v3",
    "check_options_v3",
]

#: feature_type -> element bits.
FEATURE_TYPES = {"s8": 8, "s16": 16}
_DTYPES = {3: np.dtype(np.int8), 5: np.dtype(np.int16)}
#: feature_type="auto" without calibration data.
AUTO_NEEDS_DATA = (
    "feature_type='auto' picks the int16 layers on calibration data (the simulated chip "
    "against the float model): pass calibration_data= (adapters' export_espdl) / --data "
    "(export-espdl), or choose s8 or s16"
)


def check_options_v3(target: str, feature_type: str) -> int:
    """Refuse a target or feature type the v3 export does not know; returns the bits.

    Example:
        >>> check_options_v3("esp32s4", "s8")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: target 'esp32s4': expected one of esp32s3, esp32p4, c ...
    """
    if target not in TARGETS:
        import difflib

        close = difflib.get_close_matches(str(target), TARGETS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ExportError(
            f"target {target!r}: expected one of {', '.join(TARGETS)}{hint} (c: the generic "
            "C kernels of esp32, esp32s2, c3, c6 and the other chips)"
        )
    if feature_type == "auto":  # mixed precision (amct_bridge.espdl.v3.mixed) reached here:
        raise ExportError(AUTO_NEEDS_DATA)  # no calibration data
    if feature_type not in FEATURE_TYPES:
        raise ExportError(f"feature_type {feature_type!r}: expected one of s8, s16")
    return FEATURE_TYPES[feature_type]


@dataclass
class V3ExportResult:
    """The exported model, every layer's fate, tensor exponents with their source, notes.

    Example:
        >>> r = V3ExportResult(None, "c", "s8", EspdlModel([], {}), [V3Layer("d", "Dropout",
        ...                    "passthrough")])
        >>> r.skipped, r.warnings
        ([], [])
    """

    path: Path | None
    target: str
    feature_type: str
    model: EspdlModel
    layers: list[V3Layer]
    exponents: dict[str, tuple[int, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: source layer -> the tensor holding its output (a conv chain: under its last member)
    tensors: dict[str, str] = field(default_factory=dict)
    #: mixed precision: the layers (conv chains by head) at another width than feature_type
    layer_bits: dict[str, int] = field(default_factory=dict)
    #: ``feature_type="auto"``: what the choice measured (amct_bridge.espdl.v3.mixed)
    mixed: Any = None

    @property
    def skipped(self) -> list[Problem]:
        """Refused layers (left out with ``skip_unsupported``)."""
        return [
            Problem(x.name, x.kind, x.reason or "") for x in self.layers if x.status == "refused"
        ]

    @property
    def fused(self) -> dict[str, str]:
        """Fused layer -> the layer whose node computes it."""
        return {x.name: x.into for x in self.layers if x.status == "fused" and x.into}

    @property
    def warnings(self) -> list[str]:
        """Notes on exponents, saturation and host-side steps."""
        return list(self.notes)


def check_layer_bits(
    layer_bits: dict[str, int] | None, layers: list[SourceLayer], fused: dict[str, str]
) -> dict[str, int]:
    """``layer_bits`` checked (known layers, 8 or 16) with fused layers named by their head.

    Example:
        >>> check_layer_bits({"bn": 16}, [SourceLayer("bn", "batch_norm")], {"bn": "c"})
        {'c': 16}
        >>> check_layer_bits({"c9": 16}, [], {})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: layer_bits names 'c9', which is no layer of the model...
    """
    names = {x.name for x in layers}
    widths: dict[str, int] = {}
    for name, value in (layer_bits or {}).items():
        if name not in names:
            close = difflib.get_close_matches(str(name), sorted(names), n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ExportError(f"layer_bits names {name!r}, which is no layer of the model{hint}")
        bits = FEATURE_TYPES.get(value, value) if isinstance(value, str) else value
        if bits not in (8, 16):
            raise ExportError(f"layer_bits[{name!r}] = {value!r}: expected 8 or 16")
        head = fused.get(name, name)
        if widths.get(head, bits) != bits:
            raise ExportError(f"layer_bits: {name!r} and the layers fused with it differ")
        widths[head] = int(bits)
    return widths


def _check_links(layers: list[SourceLayer]) -> None:
    index: dict[str, int] = {}
    for i, layer in enumerate(layers):
        if layer.name in index:
            raise ExportError(f"layer {layer.describe()}: the name {layer.name!r} is used twice")
        index[layer.name] = i
    for i, layer in enumerate(layers):
        late = [x for x in layer.inputs if index.get(x, -1) >= i]
        if late:
            raise ExportError(
                f"layer {layer.describe()} reads {late[0]!r}, which does not come before it: "
                "SourceLayers must be in topological order"
            )


def _sole_consumer(layer: SourceLayer, consumers: dict) -> SourceLayer | None:
    users = consumers.get(layer.name, [])
    if len(users) == 1 and users[0].inputs == [layer.name] and not layer.attrs.get("model_output"):
        return users[0]
    return None


def _plan(layers: list[SourceLayer], skip_fusion) -> tuple[dict[str, Chain], dict[str, str]]:
    """Chains by head name, and fused layer -> head (v3 fuses BN and ReLU only)."""
    consumers = consumers_map(layers)
    by_name = {x.name: x for x in layers}
    chains: dict[str, Chain] = {}
    fused: dict[str, str] = {}
    for head in layers:
        if not chain_head(head):
            continue
        chain = Chain(head, members=[head.name])
        src = by_name.get(head.inputs[0]) if len(head.inputs) == 1 else None
        valid = str(head.attrs.get("padding", "valid")).lower() == "valid"
        if (
            head.op in WEIGHT_OPS
            and head.op != "dense"
            and valid
            and not head.attrs.get("pads")
            and src is not None
            and src.kind in ZERO_PADDING_KINDS
            and src.op == "runtime"
            and len(src.inputs) == 1
            and _sole_consumer(src, consumers) is head
        ):
            chain.pad, chain.pads = src, zero_padding(src)
            fused[src.name] = head.name
        elif head.attrs.get("pads") is not None:
            chain.pads = [int(p) for p in head.attrs["pads"]]
        own = head.attrs.get("activation")
        if own is None:
            nxt = _sole_consumer(head, consumers)
            if nxt is not None and nxt.op == "batch_norm" and not skip_fusion(head.name):
                chain.bn = nxt
                chain.members.append(nxt.name)
                nxt = _sole_consumer(nxt, consumers)
            if nxt is not None and nxt.op == "relu":
                chain.act_layer, chain.activation = nxt, "Relu"
                chain.members.append(nxt.name)
        elif own == "relu":
            chain.activation = "Relu"
        for member in chain.members[1:]:
            fused[member] = head.name
        chains[head.name] = chain
    return chains, fused


def _sidecar_strangers(layers: list[SourceLayer], stats: CalibrationStats) -> list[str]:
    """A note when sidecar entries name no layer (a sidecar of another model gives its ranges
    to nobody; the layers fall back to bounds)."""
    names = {x.name for x in layers} | {x.name.split("@")[0] for x in layers}
    strangers = [
        key
        for key, entry in stats.layers.items()
        if key not in names and key.split("/")[0] not in names
        and "BatchNorm" not in (entry.kind or "")  # a BN folded away by strip_qat
    ]  # fmt: skip
    if not strangers:
        return []
    more = f" and {len(strangers) - 5} more" if len(strangers) > 5 else ""
    listing = ", ".join(repr(k) for k in strangers[:5])
    return [
        f"sidecar entries name no layer of this model: {listing}{more}; their ranges are not "
        "used (is the sidecar of another model?)"
    ]


def _emit(em: Emitter, layer: SourceLayer) -> None:
    """Lower one layer through the registry (fused members and refused inputs first)."""
    if layer.name in em.fused:
        head = em.fused[layer.name]
        em.done(layer, "fused", into=head)
        if em.chains[head].pad is layer and layer.inputs[0] in em.tensor_of:
            em.tensor_of[layer.name] = em.tensor_of[layer.inputs[0]]  # pads of the conv
        return
    bits = em.width(layer)
    if layer.op == "input":
        em.use(bits)
        lower_input(em, layer, [])
        return
    missing = [x for x in layer.inputs if x not in em.tensor_of]
    if missing:
        why = em.report.get(missing[0])
        if why is not None and why.reason and not why.reason.startswith("reads "):
            detail = f" (refused: {why.reason})"
        else:
            detail = " (refused)"
        em.refuse(layer, f"reads {missing[0]!r}, which is not exported{detail}")
        return
    entry = lowering_for(layer)
    if entry is None:
        em.refuse(layer, no_lowering(layer))
        return
    ins = [em.tensor_of[x] for x in layer.inputs]
    if bits is None:  # a reshape, pass-through or host step: its input's width
        bits = em.bits_of(ins[0]) if ins else em.default_bits
    em.use(bits)
    start = len(em.nodes)
    ins = [em.convert(x) for x in ins]  # another width: a RequantizeLinear (its nodes)
    entry.lower(em, layer, ins)
    done = em.report.get(layer.name)
    if done is not None and done.status == "exported":
        done.nodes = [n.name for n in em.nodes[start:]]


def _test_values(
    model: EspdlModel,
    em: Emitter,
    test_input: np.ndarray | None,
    seed: int,
) -> None:
    """Fill ``test_inputs`` / ``test_outputs``: the first sample of ``test_input`` (or a seeded
    input inside the calibrated range), quantized, and what our simulator computes for it."""
    rng = np.random.default_rng(seed)
    ints = {}
    for info in model.inputs:
        shape = [int(s) for s in info.shape]
        if test_input is not None:
            sample = np.asarray(test_input, np.float64)
            if sample.size != int(np.prod(shape)):
                sample = sample[:1]
            if sample.size != int(np.prod(shape)):
                raise ExportError(
                    f"test input of shape {np.shape(test_input)} does not fit the model input "
                    f"{info.name!r} of shape {shape[1:]} (one sample, batch first)"
                )
            sample = sample.reshape(shape)
            bad = int(np.size(sample) - np.isfinite(sample).sum())
            if bad:  # numpy would cast NaN to 0 with a RuntimeWarning: a test of nothing
                raise ExportError(
                    f"test input: {bad} of {sample.size} values of the sample for "
                    f"{info.name!r} are NaN or infinite; the test input must be finite"
                )
        else:
            lo, hi = em.range_of(info.name)
            sample = rng.uniform(lo, hi, size=shape)
        ints[info.name] = em.quantize(sample, info.exponent, _DTYPES[info.elem_type])
    result = simulate_espdl(model, ints, em.target)
    model.test_inputs = [Tensor(n, v, [em.exps[n]]) for n, v in ints.items()]
    outs = []
    for info in model.outputs:
        value = result.outputs[info.name]
        outs.append(Tensor(info.name, np.ascontiguousarray(value), list(info.exponents)))
    model.test_outputs = outs
    em.notes += result.notes


def export_layers_v3(
    layers: list[SourceLayer],
    out: str | os.PathLike | None,
    *,
    record: Record | None = None,
    stats: CalibrationStats | None = None,
    target: str = "esp32s3",
    feature_type: str = "s8",
    test_input: np.ndarray | None = None,
    seed: int = 0,
    skip_unsupported: bool = False,
    overwrite: bool = False,
    tuning: Tuning | None = None,
    layer_bits: dict[str, int] | None = None,
) -> V3ExportResult:
    """Export ``layers`` (execution order) as an ESP-DL v3 model; write it to ``out`` (a
    ``.espdl`` path; None: compute only).

    Args:
        layers: the model as SourceLayers (from an adapter).
        out: the file to write (atomically); must not exist unless ``overwrite``.
        record: AMCT record (skip_fusion, scale_d fallback for exponents; keys checked).
        stats: calibration sidecar (ranges per layer).
        target: ``esp32s3``, ``esp32p4`` or ``c`` (rounding, filter layout, bias width).
        feature_type: ``s8`` or ``s16``.
        test_input: float input whose first sample becomes the embedded test input (the
            chip's input: after any host-side Rescaling); default a seeded input inside the
            calibrated input range.
        seed: seed of the default test input.
        skip_unsupported: leave refused layers out (listed) instead of failing.
        overwrite: replace an existing ``out``.
        tuning: exponents, per-channel filters and bias corrections searched on calibration
            data (:func:`amct_bridge.espdl.v3.search.search_tuning_v3`) that replace the
            range rule's where they say; None: the range rule.
        layer_bits: mixed precision: layer name -> 8 or 16 for the layers that run at
            another width than ``feature_type`` (a conv chain by its head; a fused BN/ReLU
            names its head's). Each node runs at one width: a ``RequantizeLinear`` converts a
            tensor where its reader's width differs (int8 -> int16 exact, int16 -> int8 at its
            range); reshapes, pass-throughs and host steps keep their input's width, the model
            input takes its first reader's (docs/espdl-v3.md, "Mixed precision").

    Example:
        >>> export_layers_v3([], None, target="esp32")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: target 'esp32': expected one of esp32s3, esp32p4, c ...
    """
    bits = check_options_v3(target, feature_type)
    if out is not None:
        check_output_path(out)
    if out is not None and Path(out).exists() and not overwrite:
        raise ExportError(f"{out} already exists: pass overwrite=True (--overwrite) to replace it")
    _check_links(layers)
    check_record_keys(record, layers)
    check_sidecar_model(stats, layers)  # a sidecar of another model, by layer name
    if not any(x.op == "input" for x in layers):
        raise ExportError("the model has no input layer")

    keys = {x.name: x.attrs.get("record_key", x.name) for x in layers}  # a shared layer's call

    def skip_fusion(name: str) -> bool:
        factors = record.layers.get(keys.get(name, name)) if record else None
        return bool(factors and factors.skip_fusion)

    chains, fused = _plan(layers, skip_fusion)
    widths = check_layer_bits(layer_bits, layers, fused)
    em = Emitter(layers, record, stats, bits, target, chains, fused, widths)
    if tuning is not None:
        em.tune(tuning)
        em.notes += tuning.notes
    if stats is not None:
        em.notes += sidecar_of_another_record(record, stats)
        em.notes += _sidecar_strangers(layers, stats)
    for layer in layers:
        _emit(em, layer)
    # a fused member whose head was refused is refused too
    for name, head in fused.items():
        if em.report.get(head) is not None and em.report[head].status == "refused":
            layer = em.by_name[name]
            em.refuse(layer, f"fused into {head!r}, which is refused")
    missing = [x.name for x in layers if x.name not in em.report]
    if missing:  # a bug guard: every layer must be exported, fused, passed, hosted or refused
        raise ExportError(f"layers neither exported, fused, skipped nor refused: {missing}")
    report = [em.report[x.name] for x in layers]
    refused = [x for x in report if x.status == "refused"]
    if refused and not skip_unsupported:
        roots = [x for x in refused if not x.reason.startswith(("reads ", "fused into "))]
        listing = "\n".join(f"  layer {x.name!r} ({x.kind}): {x.reason}" for x in roots)
        rest = [x.name for x in refused if x not in roots]
        if rest:
            more = f" and {len(rest) - 5} more" if len(rest) > 5 else ""
            listing += (
                f"\n  and {len(rest)} layer(s) that read or fuse into them: "
                f"{', '.join(repr(n) for n in rest[:5])}{more}"
            )
        raise ExportError(
            f"ESP-DL v3 export cannot take these layers (skip_unsupported leaves them out):\n"
            f"{listing}"
        )
    outputs = []
    for layer in layers:
        if layer.attrs.get("model_output"):
            tensor = em.tensor_of.get(layer.name)
            if tensor is None:
                em.notes.append(f"model output {layer.name!r} is not exported (refused)")
            elif tensor not in outputs:
                outputs.append(tensor)
    if not outputs:
        raise ExportError("no model output is exported (every output layer is refused)")
    model = EspdlModel(
        em.nodes,
        em.inits,
        inputs=[em.infos[n] for n in em.inputs],
        outputs=[em.infos[n] for n in outputs],
        value_info=list(em.infos.values()),
        metadata={"target": target},
        ir_version=8,
        graph_name="main_graph",
        producer_name="amct_bridge",
        source=str(out) if out is not None else "<export>",
    )
    _test_values(model, em, test_input, seed)
    result = V3ExportResult(
        Path(out) if out is not None else None,
        target,
        feature_type,
        model,
        report,
        em.sources,
        em.notes,
        dict(em.tensor_of),
        {k: v for k, v in widths.items() if v != bits},
    )
    if out is not None:
        write_espdl(model, out)
    return result
