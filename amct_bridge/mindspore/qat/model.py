"""Quantization-aware training for MindSpore ``Model.train``, writing AMCT's QAT record
(docs/qat.md, docs/mindspore.md "Quantization-aware training").

Workflow (AMCT's create_quant_retrain_model / save_quant_retrain_model in MindSpore terms)::

    qat = quantize_aware(net, "INT4", sample_input=(1, 1, 8, 8))  # a copy; `net` unchanged
    model = Model(qat, loss, nn.Momentum(qat.trainable_params(), 0.01, 0.9))
    model.train(3, dataset)                     # fake-quantized forward, STE backward
    save_qat_record(qat, "qat.txt")             # record + qat.txt.calib.json
    plain = strip_qat(qat)                      # the net's own classes, trained folded weights
    export_espdl(plain, "qat.txt", "out", sample_input=(1, 1, 8, 8))

Quantized cells (``nn.Conv2d`` group 1 and depthwise, ``nn.Dense``, ``nn.Conv2dTranspose``,
``nn.AvgPool2d``) become :class:`~amct_bridge.mindspore.qat.cells.QATQuant`; activations,
pools and unfolded BatchNorm2d become :class:`~amct_bridge.mindspore.qat.cells.QATObserve`.
With ``fold_batchnorm`` a BatchNorm2d that follows a quantized cell (the core's rule,
:func:`amct_bridge.calibration.plan.batchnorm_chains`, on the graph of ``sample_input``) is
folded into its weight before training and becomes an exact identity plus bias (gamma 1, mean
0, variance ``1 - eps``, ``beta`` = the folded bias, moving statistics frozen): the cell
classes and parameter names stay the network's, and the trained weight is the deployed one.

A cell called at several sites per step (the tutorial LeNet5 calls one ``self.relu`` four
times) keeps a range per call site, named as the graph names its nodes (``relu``, ``relu@1``...):
the sidecar gets an entry per site, as the calibration sidecar does, and the export takes each
site's range (:mod:`amct_bridge.mindspore.qat.cells`). The call sites come from the graph of
``sample_input``, so a network with a ``construct`` of its own needs it.
MindSpore's compiler merges identical calls in that graph (``fc(x) + fc(x) + fc(relu(x))``:
2 sites, 3 calls in training): one counting forward of ``sample_input`` refuses such a network
(docs/mindspore.md, "Identical calls the compiler merges").

``power_of_two=True`` trains with ESP-DL's power-of-two format (docs/qat.md, "Power-of-two
QAT"): one symmetric int8 quantizer per tensor the chip holds, placed along the graph by
:func:`amct_bridge.calibration.qat.pow2_plan` (a functional op's output at the cell that reads
it), thresholds learned (TQT) or from the EMA, weights per tensor at the export's exponent.

Example:
    >>> import numpy as np
    >>> from mindspore import Tensor, nn
    >>> net = nn.SequentialCell([nn.Dense(4, 3)])
    >>> qat = quantize_aware(net, "INT4")
    >>> _ = qat.set_train(True)
    >>> _ = qat(Tensor(np.ones((2, 4), np.float32)))
    >>> qat_record(qat).layers["0"].dst_type
    'INT4'
"""

from __future__ import annotations

import copy
import logging
import os
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mindspore import Tensor, nn

from amct_bridge.calibration.layers import ModelDesc
from amct_bridge.calibration.merge import agree, differing, merge_tracked
from amct_bridge.calibration.plan import batchnorm_chains, unquantized_layers, warn_unquantized
from amct_bridge.calibration.qat import (
    algorithm_name,
    call_sites,
    clipped,
    layer_factors,
    pow2_factors,
    pow2_plan,
    pow2_tensor_range,
    refuse_shared_sites,
    shared_layers,
    tensor_range,
    union_range,
    write_qat_outputs,
)
from amct_bridge.errors import CalibrationError, QuantError, RecordError
from amct_bridge.mindspore.cells import (
    BATCH_NORM_KINDS,
    FOLDABLE_KINDS,
    OBSERVED_FLOAT,
    QUANTIZABLE_KINDS,
    RUNTIME,
    describe,
    leaf_cells,
)
from amct_bridge.mindspore.instrument_cells import places, put
from amct_bridge.mindspore.qat.cells import (
    QATObserve,
    QATObserveInput,
    QATQuant,
    output_padding,
)
from amct_bridge.mindspore.weights import batch_norm_params, bias_of, kernel_of
from amct_bridge.quant.factors import bits_of
from amct_bridge.quant.fold import fold_batchnorm
from amct_bridge.quant.qat import (
    THRESHOLD_WARMUP,
    check_options,
    record_range,
    threshold_exponent,
)
from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
from amct_bridge.records.model import Record

log = logging.getLogger(__name__)

__all__ = [
    "QATInfo",
    "pow2_quantizers",
    "qat_record",
    "qat_stats",
    "quantize_aware",
    "save_qat_record",
]


@dataclass
class QATInfo:
    """What :func:`quantize_aware` decided, kept on the QAT cell as ``amct_qat``.

    Attributes:
        options: the options given (dst_type, activation_range, ...).
        quantized: record key -> layout of the weight (None: pooling), in network order.
        folded: quantized key -> key of the BatchNorm2d folded into it.
        unfolded: quantized key -> key of the BatchNorm2d that follows it, not folded
            (``skip_fusion``).
        observed: key -> kind of each QATObserve cell.
        readers: call site (graph node name: ``relu``, ``relu@1``) whose output a quantized
            cell reads -> that reader's call site.
        functional: functional op (``x + y``, ``ops.concat``: graph node name) -> (its kind,
            the call site of the cell that reads its output alone and so observes its range).
        bn_modes: folded BN key -> its ``use_batch_statistics`` before (strip_qat restores it).
        sites: key of a cell called at several sites per step -> its call sites, in
            execution order (``["relu", "relu@1", ...]``).
        order: key (cell or functional op) -> position of its first call in the graph (the
            sidecar lists entries in execution order, a cell's sites after its first one).
        sources: power_of_two: call site -> the node whose quantizer holds its output
            (:class:`~amct_bridge.calibration.qat.Pow2Plan` ``source``), for every node.
        input_sources: power_of_two: call site -> the node whose quantizer holds its input.
    """

    options: dict
    quantized: dict[str, str | None] = field(default_factory=dict)
    folded: dict[str, str] = field(default_factory=dict)
    unfolded: dict[str, str] = field(default_factory=dict)
    observed: dict[str, str] = field(default_factory=dict)
    readers: dict[str, str] = field(default_factory=dict)
    functional: dict[str, tuple[str, str]] = field(default_factory=dict)
    bn_modes: dict[str, Any] = field(default_factory=dict)
    sites: dict[str, list[str]] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)
    sources: dict[str, str | None] = field(default_factory=dict)
    input_sources: dict[str, str | None] = field(default_factory=dict)


def quantize_aware(
    net: nn.Cell,
    dst_type: str = "INT8",
    *,
    activation_range: str | None = None,
    ema_decay: float = 0.99,
    activation_offset: bool = True,
    channel_wise: bool = True,
    skip_layers: tuple[str, ...] | list[str] = (),
    fold_batchnorm: bool = True,
    init_record: Record | str | os.PathLike | None = None,
    sample_input: Any = None,
    power_of_two: bool = False,
) -> nn.Cell:
    """A trainable copy of ``net`` with fake-quantized inputs and weights (module docstring).

    Args:
        net: the float network (NCHW). Not modified.
        dst_type: "INT8" (default) or "INT4": bits of activations and weights.
        activation_range: "ema" (moving average of each batch's min/max) or "learned";
            default "ema", "learned" with ``power_of_two``.
        ema_decay: EMA momentum (default 0.99).
        activation_offset: asymmetric activations (AMCT default True).
        channel_wise: per-output-channel weight scales for convolutions (Dense: one).
        skip_layers: cell names to keep float.
        fold_batchnorm: fold a BatchNorm2d following a quantized cell into it (default).
        init_record: a PTQ record (path or Record): its scale_d / offset_d set the starting
            input ranges, so the first training step quantizes with calibrated ranges (AMCT's
            ``UlqInitializer(record)``).
        sample_input: an input shape, array or Tensor: the graph tells which BatchNorm2d
            follows which cell, which cell's output each quantized cell reads (sidecar), and
            which cells are called at several sites (each site keeps its own ranges). Needed
            when the network has BatchNorm2d cells or a ``construct`` of its own (anything but
            nested ``nn.SequentialCell`` s), or holds one cell at several places, and always
            with ``power_of_two``.
        power_of_two: train with ESP-DL's power-of-two format (docs/qat.md): symmetric int8,
            scale ``2^e``, ``e = ceil(log2 t - log2 127)`` of a threshold ``t`` per tensor
            (learned, TQT; or from the EMA with ``activation_range="ema"``) at every tensor the
            chip holds, weights per tensor at the export's automatic exponent, rounding half
            up (esp32s3, C kernels); ``activation_offset`` / ``channel_wise`` do not apply.
            Not under ``msrun`` (data-parallel) yet.

    Returns:
        A new ``nn.Cell`` (the same classes, ``amct_qat`` holding a :class:`QATInfo`): train it
        with ``Model.train``, then :func:`save_qat_record` and :func:`strip_qat`.

    Raises:
        QuantError: a bad option, a ``skip_layers`` name that is no quantizable cell, no
            quantizable cell at all, no ``sample_input`` for a network that needs it, or a
            cell called more times per step than the graph has sites for it (identical calls
            the compiler merged in the export).
        RecordError: ``init_record`` names a cell that is not quantized here.

    Example:
        >>> # qat = quantize_aware(net, "INT4", sample_input=(1, 3, 32, 32))
    """
    if activation_range is None:
        activation_range = "learned" if power_of_two else "ema"
    bits = check_options(dst_type, activation_range, ema_decay, power_of_two=power_of_two)
    if power_of_two:
        activation_offset, channel_wise = False, False  # ESP-DL: symmetric, per tensor
    if not isinstance(net, nn.Cell):
        raise QuantError(f"quantize_aware: expected a mindspore.nn.Cell, got {type(net).__name__}")
    name = type(net).__name__
    qat = copy.deepcopy(net)
    leaves = {k: describe(k, c) for k, c in leaf_cells(qat).items()}
    quantizable = {k: d for k, d in leaves.items() if d.quantizable}
    unknown = sorted(set(skip_layers) - set(quantizable))
    if unknown:
        raise QuantError(
            f"skip_layers names no quantizable cell of {name!r}: {unknown}; quantizable cells: "
            f"{list(quantizable) or 'none'}"
        )
    chosen = {k: d for k, d in quantizable.items() if k not in set(skip_layers)}
    if not chosen:
        kinds = sorted({d.kind for d in leaves.values()})
        raise QuantError(
            f"network {name!r} has no quantizable cell to train (nn.Conv2d / nn.Conv1d with "
            f"group 1 or depthwise, nn.Dense, nn.Conv2dTranspose, nn.AvgPool2d"
            f"{'' if not skip_layers else ', not in skip_layers'}); its cells are: "
            f"{', '.join(kinds) or 'none'}"
        )
    for key, d in chosen.items():  # refuse a bad output_padding before anything is changed
        if d.kind == "Conv2DTranspose":
            output_padding(d.handle, key)
    has_bn = any(d.kind in BATCH_NORM_KINDS for d in leaves.values())
    if has_bn and sample_input is None:
        raise QuantError(
            f"network {name!r} has BatchNorm2d cells: give sample_input (an input shape or array) "
            "so the graph tells which BatchNorm2d follows which quantized cell"
        )
    holders = places(qat)
    if power_of_two and sample_input is None:
        raise QuantError(
            f"network {name!r}: power_of_two places one quantizer per tensor along the graph: "
            "give sample_input (an input shape or array)"
        )
    if sample_input is None:
        why = _may_share(qat, leaves, holders)
        if why:
            raise QuantError(
                f"network {name!r}: give sample_input (an input shape or array): {why}, so a "
                "cell may be called at several sites, and only the graph tells; each site then "
                "keeps its own ranges (one range for all would merge them)"
            )
    graph = None
    if sample_input is not None:
        from amct_bridge.mindspore.graph import extract_graph

        graph = extract_graph(qat, sample_input)
    sites = {k: v for k, v in call_sites(graph).items() if k in leaves}
    desc = ModelDesc(
        name,
        leaves,
        graph,
        foldable_kinds=FOLDABLE_KINDS,
        batch_norm_kinds=BATCH_NORM_KINDS,
        quantizable_kinds=QUANTIZABLE_KINDS,
    )
    chains = {k: bn_key for k, (bn_key, _) in batchnorm_chains(desc).items() if k in chosen}
    # as calibration: a cell with weights that trains float must be named (issue 33)
    warn_unquantized(unquantized_layers(desc, set(quantizable)), QUANTIZABLE_KINDS)
    info = QATInfo(
        options=dict(
            dst_type=dst_type,
            activation_range=activation_range,
            ema_decay=float(ema_decay),
            activation_offset=bool(activation_offset),
            channel_wise=bool(channel_wise),
            fold_batchnorm=bool(fold_batchnorm),
            power_of_two=bool(power_of_two),
        )
    )
    from amct_bridge.mindspore import distributed

    group = distributed.current() if activation_range == "learned" else None
    if power_of_two and distributed.current() is not None:
        raise QuantError(
            f"network {name!r}: power_of_two is not supported in a data-parallel run (msrun) "
            "yet: train it in one process"
        )
    info.sites = sites
    shared_quantized = shared_layers(sites, chosen)
    roles: dict[str, dict] = {}
    if power_of_two:
        roles = _pow2_roles(info, graph, leaves, quantizable, chosen, chains, fold_batchnorm)
    for key, d in chosen.items():
        if fold_batchnorm and key in chains:
            _fold(d.handle, leaves[chains[key]].handle, key, chains[key], d.parts[0].layout)
            info.folded[key] = chains[key]
            info.bn_modes[chains[key]] = leaves[chains[key]].handle.use_batch_statistics
        elif key in chains:
            info.unfolded[key] = chains[key]
        wrapper = QATQuant(
            d.handle,
            key,
            d.kind,
            bits,
            activation_range,
            ema_decay,
            symmetric=not activation_offset,
            channel_wise=channel_wise and d.parts[0].channel_wise,
            sites=sites.get(key),
            preactivation=_fused(d.handle),
            **roles.get(key, {}),
        )
        wrapper.track_output = key not in info.folded  # the folded BN's observer has it
        if group is not None:
            wrapper.set_ranks(group.rank, group.world)
        _swap(holders, d.handle, wrapper, key)
        info.quantized[key] = d.parts[0].layout
    info.functional = _functional_homes(graph, leaves)
    layer_of = {n.name: n.layer for n in graph.nodes} if graph is not None else {}
    watch_input = {layer_of[reader] for _, reader in info.functional.values()}
    for key, d in leaves.items():
        # a skip_layers cell stays float but is observed: the export needs its output range
        skipped = key in quantizable and key not in chosen
        if key in chosen or not (
            d.activation or d.runtime or d.kind in BATCH_NORM_KINDS or skipped
        ):
            continue
        # a float cell the v3 export computes from integers (nn.LayerNorm) needs its input's
        # exponent too, as the calibration sidecar has it: a Transformer's first LayerNorm
        # reads the model input, which no other cell observes
        watched = key in watch_input or d.kind in OBSERVED_FLOAT
        kind = QATObserveInput if watched else QATObserve
        extra = roles.get(key, {})
        if kind is QATObserve:
            extra.pop("quantize_input", None)
        wrapper = kind(d.handle, key, ema_decay, sites.get(key), **extra)
        _swap(holders, d.handle, wrapper, key)
        info.observed[key] = d.kind
    for op, (_, reader) in list(info.functional.items()):
        if layer_of[reader] not in chosen and layer_of[reader] not in info.observed:
            del info.functional[op]  # read by a cell that is neither quantized nor observed
    if graph is not None:
        for index, node in enumerate(graph.nodes):
            info.order.setdefault(node.layer, index)
            if node.layer in chosen and node.inputs:
                producer = graph.producer_of(node.inputs[0])
                if producer is not None:
                    info.readers.setdefault(producer.name, node.name)
    _check_calls(qat, graph, sample_input, name)
    if shared_quantized:
        log.warning(
            "quantize_aware(%s): quantized cell(s) %s called at several sites: every site's "
            "input is fake-quantized with one range (an AMCT record holds one scale_d / "
            "offset_d per cell, which simulate applies at every site; %s), each site's output "
            "range is kept apart in the sidecar; the ESP-DL exporters refuse a cell called "
            "more than once: give each site a cell of its own to deploy it",
            name,
            ", ".join(shared_quantized),
            "the union of the sites' own EMAs"
            if activation_range == "ema"
            else "one learned range, started at the union of the first step's sites",
        )
    qat.amct_qat = info
    if power_of_two:
        _link(info, _wrappers(qat), leaves)
    if init_record is not None:
        (_init_pow2 if power_of_two else _init_ranges)(qat, init_record)
    return qat


def _fused(cell: nn.Cell) -> bool:
    """An ``nn.Dense`` whose activation cell hides its input's range (softmax, sigmoid...,
    not ReLU / ReLU6): QAT tracks that input, the sidecar's ``preactivation``, as the
    calibration observes it (:func:`amct_bridge.calibration.plan.fused_activations`)."""
    from amct_bridge.calibration.plan import EXACT_ACTIVATIONS
    from amct_bridge.mindspore.graph_cells import dense_activation

    return dense_activation(cell) not in EXACT_ACTIVATIONS


def _preactivation(ranges: dict, site: str) -> TensorRange | None:
    """The EMA of a quantized cell's output before its activation cell, None when not
    tracked."""
    row = ranges.get((site, "preactivation"))
    return None if row is None else tensor_range(*row)


def _link(info: QATInfo, wrappers: dict[str, nn.Cell], leaves: dict) -> None:
    """Power-of-two: each quantized cell whose input its producer quantizes gets that
    quantizer's threshold, and a cell with a folded BN adds the BN's beta itself (the BN's
    wrapper passes its input on), so their biases are rounded to the chip's grid."""
    quantizers = _quantizers(info, wrappers)
    for key in info.quantized:
        cell = wrappers[key]
        if not cell.quantize_input:
            cell.link_source(quantizers[info.input_sources[key]][0])
        if key in info.folded and cell.has_weight:
            bn_key = info.folded[key]
            cell.link_folded_bias(leaves[bn_key].handle.beta)
            wrappers[bn_key].passthrough = True


def _observed_keys(leaves: dict, quantizable: dict, chosen: dict) -> set[str]:
    """The cells quantize_aware wraps in a QATObserve (the loop in quantize_aware)."""
    return {
        key
        for key, d in leaves.items()
        if key not in chosen
        and (d.activation or d.runtime or d.kind in BATCH_NORM_KINDS or key in quantizable)
    }


def _pow2_roles(info, graph, leaves, quantizable, chosen, chains, fold) -> dict[str, dict]:
    """Per cell key, its wrapper's power-of-two options (:func:`pow2_plan`), the plan's
    sources kept in ``info``; refuses what one exponent per cell cannot train."""
    observed = _observed_keys(leaves, quantizable, chosen)
    homes = {
        op: reader
        for op, (_, reader) in _functional_homes(graph, leaves).items()
        if reader in chosen or reader in observed  # an unshared cell: its key is the site
    }
    bias_after = {key: chains[key] for key in chosen if fold and key in chains}
    plan = pow2_plan(graph, chosen, observed | set(homes), bias_after=bias_after)
    info.sources = dict(plan.source)
    for node in graph.nodes:  # the quantizer of what each node reads
        producer = graph.producer_of(node.inputs[0]) if node.inputs else None
        info.input_sources[node.name] = plan.source.get(producer.name) if producer else None
    note = plan.preactivation_note("activation cell")
    if note:
        log.warning("quantize_aware(power_of_two=True): %s", note)
    home_of = {reader: op for op, reader in homes.items()}
    learned = info.options["activation_range"] == "learned"
    roles: dict[str, dict] = {}
    for key in sorted(set(chosen) | observed):
        nodes = info.sites.get(key, [key])
        own = [n for n in nodes if plan.source.get(n) == n] + [
            home_of[k] for k in nodes if k in home_of
        ]
        if len(nodes) > 1 and (key in chosen or own):
            refuse_shared_sites(key, nodes, "cell")
        if key in chosen:
            fed = plan.input_source.get(key)
            roles[key] = dict(
                power_of_two=True,
                quantize_input=fed is None or home_of.get(key) == fed,
                quantize_output=plan.source.get(key) == key,
            )
        else:
            roles[key] = dict(
                quantize_output=plan.source.get(key) == key,
                learned=learned,
                quantize_input=key in home_of,
            )
    return roles


class _CountCalls(nn.Cell):
    """A throw-away top-level cell for the counting forward: its compiled graph is its own, so
    the QAT network compiles afresh (counting off) when it is trained or run."""

    def __init__(self, net: nn.Cell) -> None:
        super().__init__(auto_prefix=False)  # the network's parameter names stay as they are
        self.net = net

    def construct(self, *inputs):
        return self.net(*inputs)


def _check_calls(qat: nn.Cell, graph, sample_input: Any, name: str) -> None:
    """Every cell called at several sites runs its graph's call sites once per forward.

    A site's ranges are ``calls mod n_sites``, so the training calls per step must be the
    graph's sites. MindSpore's compiler merges identical calls (CSE) in the MindIR export
    (``fc(x) + fc(x) + fc(relu(x))``: 2 sites), while the wrappers' state updates (side
    effects) make all 3 calls run in training. One forward of ``sample_input`` in eval mode,
    in the current mode, counts the calls without moving any range (eval mode: the wrappers
    and BatchNorm update nothing; the counters are reset after).

    Raises:
        QuantError: a cell's calls per forward differ from its graph's call sites.
    """
    shared = {}
    for _, cell in qat.cells_and_names():
        if isinstance(cell, (QATQuant, QATObserve)) and cell.shared:
            shared.setdefault(cell.key, cell)
    if not shared or graph is None:
        return
    from amct_bridge.mindspore.mindir import to_tensors

    # parents first (cells_and_names' order): set_train of each restores its own flag
    flags = [(c, c.training, c.phase) for _, c in qat.cells_and_names()]
    counter = _CountCalls(qat)
    try:
        for cell in shared.values():
            cell.counting = True
        counter.set_train(False)
        counter(*to_tensors(sample_input))
        counted = {key: int(cell.calls.asnumpy()) for key, cell in shared.items()}
    finally:
        for cell in shared.values():
            cell.counting = False
            cell.calls.set_data(Tensor(np.int32(0)))
        for cell, training, phase in flags:
            cell.set_train(training)
            cell.phase = phase
    for key, cell in shared.items():
        made = counted[key]
        if made == cell.n_sites:
            continue
        sites = ", ".join(repr(s) for s in cell.site_names)
        raise QuantError(
            f"quantize_aware({name}): cell {key!r} ({type(cell.cell).__name__}): the graph of "
            f"the MindIR export has {cell.n_sites} call site(s) per step ({sites}), but the QAT "
            f"network calls it {made} time(s) per step; its sites' ranges would be mixed up "
            "(the k-th call of a step keeps site k's). MindSpore's compiler merges identical "
            "calls in the export (e.g. fc(x) written twice is computed once), the QAT cells "
            "make every call run. Compute the repeated call once and reuse its result "
            "(y = self.fc(x)), or give each call its own cell."
        )


def _functional_homes(graph, leaves: dict) -> dict[str, tuple[str, str]]:
    """Functional Add / concat ops whose output a cell reads alone: that cell's input at that
    call site is the op's output (as the calibration session observes them; a cell called at
    several sites observes its input per site, so any site can be the home)."""
    if graph is None:
        return {}
    found = {}
    for node in graph.nodes:
        if node.is_layer or node.kind not in RUNTIME or not node.outputs:
            continue
        for reader in graph.consumers_of(node.outputs[0]):
            if reader.is_layer and reader.layer in leaves and reader.inputs == [node.outputs[0]]:
                found[node.layer] = (node.kind, reader.name)
                break
        else:
            log.info(
                "functional op %r: no cell reads its output alone; no sidecar range", node.name
            )
    return found


def _may_share(net: nn.Cell, leaves: dict, holders: dict) -> str:
    """Why, without a graph, a cell of ``net`` may be called at several sites per step ("": it
    cannot: nested ``nn.SequentialCell`` s call each child once, in order)."""
    for key, d in leaves.items():
        cell = d.handle
        if len(holders.get(id(cell), ())) > 1:
            where = ", ".join(repr(n) for _, n in holders[id(cell)])
            return f"cell {key!r} ({type(cell).__name__}) is held at several places ({where})"
    for key, cell in net.cells_and_names():
        if key in leaves or any(key.startswith(f"{k}.") for k in leaves):
            continue
        if type(cell).construct is not nn.SequentialCell.construct:
            where = f"cell {key!r}" if key else "it"
            return f"{where} ({type(cell).__name__}) has a construct of its own"
    return ""


def _swap(holders: dict, cell: nn.Cell, wrapper: nn.Cell, key: str) -> None:
    found = holders.get(id(cell), [])
    if not found:
        raise QuantError(
            f"cell {key!r} ({type(cell).__name__}) is not a child of any cell (the top-level "
            "cell itself cannot be wrapped: put it in an nn.SequentialCell)"
        )
    for parent, child in found:
        put(parent, child, wrapper)


def _identity_variance(eps: float) -> np.float32:
    """The float32 variance ``v`` with ``v + eps == 1`` exactly (so ``rsqrt`` gives 1)."""
    e = np.float32(eps)
    v = np.float32(1.0) - e
    for _ in range(8):
        total = np.float32(v + e)
        if total == np.float32(1.0):
            return v
        v = np.nextafter(v, np.float32(2.0) if total < 1 else np.float32(0.0), dtype=np.float32)
    raise QuantError(f"no float32 variance makes a BatchNorm with eps {eps} an identity")


def _fold(cell: nn.Cell, bn: nn.Cell, key: str, bn_key: str, layout: str) -> None:
    """Fold ``bn`` (inference statistics) into ``cell``; ``bn`` becomes identity + bias."""
    p = batch_norm_params(bn, bn_key)
    kernel, bias = fold_batchnorm(
        kernel_of(cell, key), bias_of(cell), p.gamma, p.beta, p.mean, p.var, p.eps, layout, name=key
    )
    cell.weight.set_data(Tensor(kernel.astype(np.float32)))
    if bias_of(cell) is not None:  # the folded bias lives in the BN's beta
        cell.bias.set_data(Tensor(np.zeros_like(bias, np.float32)))
        cell.bias.requires_grad = False
    n = len(bias)
    bn.gamma.set_data(Tensor(np.ones(n, np.float32)))
    bn.gamma.requires_grad = False
    bn.beta.set_data(Tensor(bias.astype(np.float32)))
    bn.beta.requires_grad = True
    bn.moving_mean.set_data(Tensor(np.zeros(n, np.float32)))
    bn.moving_variance.set_data(Tensor(np.full(n, _identity_variance(bn.eps), np.float32)))
    bn.use_batch_statistics = False  # frozen: inference statistics in training too


def _info(qat_net: nn.Cell) -> QATInfo:
    info = getattr(qat_net, "amct_qat", None)
    if not isinstance(info, QATInfo):
        raise QuantError(
            f"network {type(qat_net).__name__!r} is not a QAT network: use quantize_aware(net)"
        )
    return info


def check_folded(qat_net: nn.Cell, info: QATInfo) -> None:
    """Every folded BatchNorm2d is still the identity ``quantize_aware`` made of it.

    A float checkpoint loaded into the QAT network afterwards (its names are the network's)
    puts the BN statistics back beside already folded weights: the network then computes
    neither the float nor the QAT function, so this is an error, not a record.
    """
    cells = dict(qat_net.cells_and_names())
    for key, bn_key in info.folded.items():
        bn = cells.get(bn_key)
        bn = getattr(bn, "cell", bn)
        gamma, mean = bn.gamma.asnumpy(), bn.moving_mean.asnumpy()
        var = bn.moving_variance.asnumpy()
        if not (np.all(gamma == 1) and np.all(mean == 0) and np.all(var == var.flat[0])):
            raise QuantError(
                f"BatchNorm2d {bn_key!r} was folded into {key!r} by quantize_aware, but its "
                "gamma / moving statistics changed since (a float checkpoint loaded into the QAT "
                "network?): load float weights into the network before quantize_aware(net)"
            )


def _wrappers(qat_net: nn.Cell) -> dict[str, nn.Cell]:
    """Record key -> QATQuant / QATObserve cell of the QAT network."""
    out = {}
    for _, cell in qat_net.cells_and_names():
        if isinstance(cell, (QATQuant, QATObserve)):
            out.setdefault(cell.key, cell)
    return out


def _init_record(qat: nn.Cell, init_record: Record | str | os.PathLike):
    """``(record, info, wrappers)`` of an ``init_record``, refused when a key names no
    quantized cell."""
    from amct_bridge.records import load

    record = init_record if isinstance(init_record, Record) else load(init_record)
    info = _info(qat)
    unknown = [k for k in record.layers if k not in info.quantized]
    if unknown:
        raise RecordError(
            f"init_record: keys name no quantized cell of this QAT network: {unknown}; quantized "
            f"cells: {list(info.quantized)}"
        )
    return record, info, _wrappers(qat)


def _init_ranges(qat: nn.Cell, init_record: Record | str | os.PathLike) -> None:
    """Each quantized cell's input range from the record's scale_d / offset_d."""
    record, info, wrappers = _init_record(qat, init_record)
    for key, f in record.layers.items():
        if f.scale_d is None or f.offset_d is None:
            continue
        lo, hi = record_range(f.scale_d, f.offset_d, bits_of(f.dst_type or f.act_type or "INT8"))
        wrappers[key].set_input_range(lo, hi)


def _init_pow2(qat: nn.Cell, init_record: Record | str | os.PathLike) -> None:
    """Power-of-two thresholds from a PTQ record (each quantized cell's input: the range its
    scale_d / offset_d encode) and its sidecar when there is one (every quantized output), as
    TQT starts from a calibration."""
    from amct_bridge.quant.qat import log2_threshold
    from amct_bridge.records.calibration import load_stats, sidecar_path

    record, info, wrappers = _init_record(qat, init_record)
    quantizers = _quantizers(info, wrappers)

    def start(quantizer, lo: float, hi: float) -> None:
        log2t, (lo_p, hi_p, seen_p) = quantizer
        log2t.set_data(Tensor(np.float32(log2_threshold(lo, hi))))
        # the calibration is the threshold's start: its warm-up is over
        for param, value in ((lo_p, lo), (hi_p, hi), (seen_p, float(THRESHOLD_WARMUP))):
            param.set_data(Tensor(np.full(param.shape, value, np.float32)))

    if not isinstance(init_record, Record) and os.path.exists(sidecar_path(init_record)):
        for node, entry in load_stats(sidecar_path(init_record)).layers.items():
            if node in quantizers and entry.output is not None:
                start(quantizers[node], entry.output.min, entry.output.max)
    for key, f in record.layers.items():
        if f.scale_d is not None and f.offset_d is not None:
            bits = bits_of(f.dst_type or f.act_type or "INT8")
            quantizer = _input_quantizer(info, key, wrappers[key], quantizers)
            start(quantizer, *record_range(f.scale_d, f.offset_d, bits))


def qat_record(qat_net: nn.Cell) -> Record:
    """The AMCT QAT record (inner flavor, ``dst_type``) of a trained QAT network.

    Keys are cell names; per quantized cell scale_d / offset_d from its input range, scale_w /
    offset_w by ARQ of its current (folded) weight, ``skip_fusion`` where a BatchNorm2d was
    not folded. In a data-parallel run this is this rank's own ranges: :func:`save_qat_record`
    merges the ranks'.

    Raises:
        QuantError: not a QAT network, a cell never saw a training step, or a folded
            BatchNorm2d is no longer the identity (a float checkpoint loaded afterwards).

    Example:
        >>> # rec = qat_record(qat)
    """
    info = _info(qat_net)
    check_folded(qat_net, info)
    wrappers = _wrappers(qat_net)
    return _record(info, wrappers, _ranges(wrappers))


def _ranges(wrappers: dict[str, nn.Cell]) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(call site or key, "input" / "output") -> ``(min, max, seen)`` of every tracked tensor
    (a cell called once: its key; per-site state: each site's name, the first being the key)."""
    out = {}
    for cell in wrappers.values():
        out.update(cell.tracked())
    return out


def _input_clip(cell: QATQuant, ranges: dict) -> tuple[float, float, float]:
    """A quantized cell's input clip range: its own, or the union of its sites' EMAs."""
    if cell.site_input:
        return union_range(ranges[(site, "input")] for site in cell.site_names)
    return ranges[(cell.key, "input")]


def _record(info: QATInfo, wrappers: dict[str, nn.Cell], ranges: dict) -> Record:
    if info.options.get("power_of_two"):
        return _pow2_record(info, wrappers)
    bits = bits_of(info.options["dst_type"])
    record = Record(flavor="inner")
    for key, layout in info.quantized.items():
        cell = wrappers[key]
        lo, hi, seen = _input_clip(cell, ranges)
        kernel = kernel_of(cell.cell, key) if layout is not None else None
        record.layers[key] = layer_factors(
            key,
            lo,
            hi,
            seen,
            bits,
            kernel,
            layout,
            channel_wise=cell.out_axis is not None,
            symmetric=not info.options["activation_offset"],
            skip_fusion=key in info.unfolded,
        )
    return record


def qat_stats(qat_net: nn.Cell) -> CalibrationStats:
    """The calibration sidecar of a trained QAT network (docs/qat.md "Sidecar").

    Quantized cells: input = clip range, output = EMA of the output (of the folded BN's
    output when a BN was folded into it: the bias lives there); folded BN: that range;
    activations, pools, unfolded BNs: EMA of the output. A tensor a quantized cell reads gets
    that cell's clip range (the EMA as observed).

    Example:
        >>> # stats = qat_stats(qat); stats.layers["relu"].output.max
    """
    info = _info(qat_net)
    wrappers = _wrappers(qat_net)
    return _stats(info, wrappers, _ranges(wrappers))


def _in_order(stats: CalibrationStats, order: dict[str, int]) -> CalibrationStats:
    """``stats`` with its layers in execution order, as the calibration sidecar has them (a
    site ``name@k`` after the first; a key ``order`` lacks last)."""
    if order:
        end = len(order)
        rank = {k: order.get(k.split("@")[0], end) for k in stats.layers}
        stats.layers = dict(sorted(stats.layers.items(), key=lambda kv: rank[kv[0]]))
    return stats


def _stats(info: QATInfo, wrappers: dict[str, nn.Cell], ranges: dict) -> CalibrationStats:
    if info.options.get("power_of_two"):
        return _pow2_stats(info, wrappers, ranges)
    clip_at = {}  # call site of a quantized cell -> its input clip range
    for cell in wrappers.values():
        if isinstance(cell, QATQuant):
            clip = tensor_range(*_input_clip(cell, ranges))
            clip_at.update(dict.fromkeys(cell.site_names, clip))
    clip_of = {p: clip_at[r] for p, r in info.readers.items() if r in clip_at}
    stats = CalibrationStats(algorithm=algorithm_name({info.options["activation_range"]}))
    ops_before: dict[str, list[tuple[str, str]]] = {}
    for op, (kind, reader) in info.functional.items():
        ops_before.setdefault(reader, []).append((op, kind))
    batches = 0
    for key, cell in wrappers.items():
        for site in cell.site_names:  # a cell called once: its key alone
            _site_stats(info, cell, key, site, ranges, clip_at, clip_of, ops_before, stats)
        if isinstance(cell, QATQuant):
            batches = max(batches, int(_input_clip(cell, ranges)[2]))
    stats.batches = batches
    return _in_order(stats, info.order)


def _site_stats(info, cell, key, site, ranges, clip_at, clip_of, ops_before, stats) -> None:
    """The sidecar entries of one call site of a wrapped cell (and of the functional ops whose
    output it reads there)."""
    quantized = isinstance(cell, QATQuant)
    own_input = ranges.get((site, "input")) if not quantized or cell.site_input else None
    for op, kind in ops_before.get(site, []):  # the op's output is this site's input
        if quantized and own_input is not None:
            output = clipped(tensor_range(*own_input), clip_at[site])
        elif quantized:
            output = clip_at[site]
        elif own_input is not None:  # QATObserveInput
            output = tensor_range(*own_input)
        else:
            continue
        stats.layers[op] = LayerStats(kind, output=output)
    if quantized:
        clip = clip_at[site]
        site_input = clip if own_input is None else clipped(tensor_range(*own_input), clip)
        bn = info.folded.get(key)  # a cell called at several sites is never folded
        out_key = bn if bn is not None else site
        output = clipped(tensor_range(*ranges[(out_key, "output")]), clip_of.get(out_key))
        kind = describe(key, cell.cell).kind
        pre = _preactivation(ranges, site)
        stats.layers[site] = LayerStats(kind, input=site_input, output=output, preactivation=pre)
        if bn is not None:
            stats.layers[bn] = LayerStats("BatchNormalization", output=output)
    elif key not in info.folded.values():
        output = clipped(tensor_range(*ranges[(site, "output")]), clip_of.get(site))
        kind = info.observed.get(key, "Activation")
        # nn.LayerNorm: its input range too (the model input's exponent when it reads it)
        seen = tensor_range(*own_input) if own_input is not None else None
        site_input = seen if kind in OBSERVED_FLOAT else None
        stats.layers[site] = LayerStats(kind, input=site_input, output=output)


def pow2_quantizers(qat_net: nn.Cell) -> dict[str, tuple]:
    """Node -> ``(log2t Parameter, (min, max, seen) EMA Parameters)`` of every power-of-two
    quantizer of a QAT network, by the node whose output it quantizes (a cell's own input
    quantizer under ``"<key>:input"``; a functional op's, at the cell reading it, under the
    op's name).

    Example:
        >>> # pow2_quantizers(qat)["bn1"]: the quantizer of conv1 + its folded BN's output
    """
    info = _info(qat_net)
    return _quantizers(info, _wrappers(qat_net))


def _quantizers(info: QATInfo, wrappers: dict[str, nn.Cell]) -> dict[str, tuple]:
    found = {}
    for key, cell in wrappers.items():
        inputs = (cell.in_min, cell.in_max, cell.in_seen) if hasattr(cell, "in_min") else None
        if cell.quantize_output and hasattr(cell, "out_log2t"):
            found[key] = (cell.out_log2t, (cell.out_min, cell.out_max, cell.out_seen))
        if getattr(cell, "quantize_input", False) and hasattr(cell, "in_log2t"):
            found[f"{key}:input"] = (cell.in_log2t, inputs)
    for op, (_, reader) in info.functional.items():  # quantized at the cell reading it
        if f"{reader}:input" in found:
            found[op] = found[f"{reader}:input"]
    return found


def _input_quantizer(info: QATInfo, key: str, cell: QATQuant, quantizers: dict) -> tuple:
    """A power-of-two cell's input quantizer: its own, or its producer's."""
    name = f"{key}:input" if cell.quantize_input else info.input_sources.get(key)
    if name not in quantizers:
        raise QuantError(f"cell {key!r}: no power-of-two quantizer holds its input ({name!r})")
    return quantizers[name]


def _exponent(log2t) -> int:
    return threshold_exponent(float(log2t.asnumpy()))


def _pow2_record(info: QATInfo, wrappers: dict[str, nn.Cell]) -> Record:
    """The record of a power-of-two QAT network: ``scale_d = 2^e_in``, ``scale_w = [2^e_w]``."""
    quantizers = _quantizers(info, wrappers)
    record = Record(flavor="inner")
    for key, layout in info.quantized.items():
        cell = wrappers[key]
        log2t, (_, _, seen) = _input_quantizer(info, key, cell, quantizers)
        kernel = kernel_of(cell.cell, key) if layout is not None else None
        record.layers[key] = pow2_factors(
            key,
            _exponent(log2t),
            float(seen.asnumpy()),
            kernel,
            skip_fusion=key in info.unfolded,
        )
    return record


def _pow2_stats(info: QATInfo, wrappers: dict[str, nn.Cell], ranges: dict) -> CalibrationStats:
    """The sidecar of a power-of-two QAT network: each tensor's range is its quantizer's
    (:func:`pow2_tensor_range`), the tensor's own EMA the observed range."""
    quantizers = _quantizers(info, wrappers)

    def held(name, ema):
        """The range of a tensor whose values quantizer ``name`` holds (None: float)."""
        if ema is None:
            return None
        if name in quantizers:
            log2t, params = quantizers[name]
            seen = min(float(params[2].asnumpy()), ema[2])
            return pow2_tensor_range(_exponent(log2t), ema[0], ema[1], seen)
        return tensor_range(*ema)

    stats = CalibrationStats(
        algorithm=algorithm_name({info.options["activation_range"]}, power_of_two=True)
    )
    batches = 0
    homes = {reader: (op, kind) for op, (kind, reader) in info.functional.items()}
    for key, cell in wrappers.items():
        for site in cell.site_names:
            own_in = ranges.get((site, "input"))
            if site in homes:  # the functional op whose output this site reads
                op, kind = homes[site]
                stats.layers[op] = LayerStats(kind, output=held(op, own_in))
            if isinstance(cell, QATQuant):
                log2t, _ = _input_quantizer(info, key, cell, quantizers)
                name = f"{key}:input" if cell.quantize_input else info.input_sources.get(key)
                bn = info.folded.get(key)
                out_key = bn if bn is not None else key
                output = held(
                    out_key if out_key in quantizers else None, ranges[(out_key, "output")]
                )
                kind = describe(key, cell.cell).kind
                stats.layers[site] = LayerStats(
                    kind,
                    input=held(name, own_in),
                    output=output,
                    preactivation=_preactivation(ranges, site),
                )
                if bn is not None:
                    stats.layers[bn] = LayerStats("BatchNormalization", output=output)
                batches = max(batches, int(own_in[2]))
            elif key not in info.folded.values():
                kind = info.observed.get(key, "Activation")
                output = held(info.sources.get(site), ranges[(site, "output")])
                site_input = None
                if kind in OBSERVED_FLOAT:  # nn.LayerNorm: its input's range too
                    site_input = held(info.input_sources.get(site), own_in)
                stats.layers[site] = LayerStats(kind, input=site_input, output=output)
    stats.batches = batches
    return _in_order(stats, info.order)


def save_qat_record(qat_net: nn.Cell, path: str | os.PathLike) -> Record:
    """Write :func:`qat_record` to ``path`` and :func:`qat_stats` next to it
    (``<path>.calib.json``), as one set (temp files, then renamed); return the record.

    In a data-parallel run (:func:`amct_bridge.mindspore.distributed.current`; every rank must
    call it) the ranks' EMA ranges are averaged weighted by their steps, learned ranges checked
    equal, weights checked identical (a checksum per quantized cell); rank 0 alone writes and
    every rank returns the same record. A failure on any rank raises on every rank
    (docs/mindspore.md, "Data-parallel runs").

    Raises:
        QuantError: not a QAT network, or saved before any training step (nothing written).
        ValidationError: the record breaks AMCT's rules (nothing written).
        CalibrationError: data-parallel: a rank failed (named), or the ranks' weights differ.

    Example:
        >>> # save_qat_record(qat, "qat.txt"); export_espdl(strip_qat(qat), "qat.txt", "out", ...)
    """
    from amct_bridge.mindspore import distributed

    group = distributed.current()
    if group is not None:
        return _save_merged(qat_net, path, group)
    record = qat_record(qat_net)
    stats = qat_stats(qat_net)
    return write_qat_outputs(record, stats, path, what=f"network {type(qat_net).__name__!r}")


def _save_merged(qat_net: nn.Cell, path: str | os.PathLike, group) -> Record:
    """save_qat_record across the ranks of ``group``: agree, merge, check, rank 0 writes."""
    what = f"network {type(qat_net).__name__!r}"
    error, layout = None, ""
    try:
        info = _info(qat_net)
        check_folded(qat_net, info)
        wrappers = _wrappers(qat_net)
        ranges = _ranges(wrappers)
        names = list(ranges)
        layout = ";".join(f"{k}/{t}" for k, t in names) + repr(sorted(info.options.items()))
        for key in info.quantized:  # this rank's own steps: a rank that saw none is wrong
            layer_factors(key, *_input_clip(wrappers[key], ranges), 8)
    except Exception as err:  # every rank learns of it below, then raises
        error = err
    agree(group.gather, error, "saving the QAT record", layout=layout)

    learned = info.options["activation_range"] == "learned"
    owner = {site: cell for cell in wrappers.values() for site in cell.site_names}
    is_learned = [learned and t == "input" and isinstance(owner[k], QATQuant) for k, t in names]
    merged, differ = merge_tracked(np.array([ranges[n] for n in names]), is_learned, group.gather)
    if differ:
        log.warning(
            "data-parallel QAT: the learned input ranges of %s differ between the %d ranks "
            "(each rank starts them at its own first batch's min/max, and the all-reduced "
            "gradients move them alike): the record takes their mean, weighted by steps; give "
            "quantize_aware(init_record=...) to start every rank from the same ranges",
            ", ".join(repr(names[i][0]) for i in differ),
            group.world,
        )
    elif learned:
        log.info("data-parallel QAT: the learned ranges are equal on every rank")
    sums = [_checksum(kernel_of(wrappers[k].cell, k)) for k, lay in info.quantized.items() if lay]
    keys = [k for k, lay in info.quantized.items() if lay]
    bad = differing(np.array(sums, np.float64), group.gather)
    if bad:
        raise CalibrationError(
            f"{what}: the weights of {', '.join(repr(keys[i]) for i in bad)} differ between the "
            f"{group.world} ranks (checksums): the ranks did not train the same network (start "
            "every rank from the same weights, ParallelMode.DATA_PARALLEL); no record written"
        )
    ranges = {n: tuple(float(v) for v in row) for n, row in zip(names, merged, strict=True)}
    record = None
    try:
        record = _record(info, wrappers, ranges)
        stats = _stats(info, wrappers, ranges)
        if group.rank == 0:
            write_qat_outputs(record, stats, path, what=what)
    except Exception as err:
        error = err
    agree(group.gather, error, "writing the QAT record (rank 0)")
    return record


def _checksum(kernel: np.ndarray) -> float:
    """CRC-32 of the kernel's bytes (exact in float64)."""
    return float(zlib.crc32(np.ascontiguousarray(kernel).tobytes()))
