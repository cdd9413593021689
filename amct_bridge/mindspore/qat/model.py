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
    shared_layers,
    tensor_range,
    union_range,
    write_qat_outputs,
)
from amct_bridge.errors import CalibrationError, QuantError, RecordError
from amct_bridge.mindspore.cells import (
    BATCH_NORM_KINDS,
    FOLDABLE_KINDS,
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
from amct_bridge.quant.qat import check_options, record_range
from amct_bridge.records.calibration import CalibrationStats, LayerStats
from amct_bridge.records.model import Record

log = logging.getLogger(__name__)

__all__ = ["QATInfo", "qat_record", "qat_stats", "quantize_aware", "save_qat_record"]


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


def quantize_aware(
    net: nn.Cell,
    dst_type: str = "INT8",
    *,
    activation_range: str = "ema",
    ema_decay: float = 0.99,
    activation_offset: bool = True,
    channel_wise: bool = True,
    skip_layers: tuple[str, ...] | list[str] = (),
    fold_batchnorm: bool = True,
    init_record: Record | str | os.PathLike | None = None,
    sample_input: Any = None,
) -> nn.Cell:
    """A trainable copy of ``net`` with fake-quantized inputs and weights (module docstring).

    Args:
        net: the float network (NCHW). Not modified.
        dst_type: "INT8" (default) or "INT4": bits of activations and weights.
        activation_range: "ema" (moving average of each batch's min/max) or "learned".
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
            nested ``nn.SequentialCell`` s), or holds one cell at several places.

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
    bits = check_options(dst_type, activation_range, ema_decay)
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
        )
    )
    from amct_bridge.mindspore import distributed

    group = distributed.current() if activation_range == "learned" else None
    info.sites = sites
    shared_quantized = shared_layers(sites, chosen)
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
        kind = QATObserveInput if key in watch_input else QATObserve
        _swap(holders, d.handle, kind(d.handle, key, ema_decay, sites.get(key)), key)
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
    if init_record is not None:
        _init_ranges(qat, init_record)
    return qat


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


def _init_ranges(qat: nn.Cell, init_record: Record | str | os.PathLike) -> None:
    """Each quantized cell's input range from the record's scale_d / offset_d."""
    record = init_record
    if not isinstance(record, Record):
        from amct_bridge.records import load

        record = load(init_record)
    info = _info(qat)
    wrappers = _wrappers(qat)
    unknown = [k for k in record.layers if k not in info.quantized]
    if unknown:
        raise RecordError(
            f"init_record: keys name no quantized cell of this QAT network: {unknown}; quantized "
            f"cells: {list(info.quantized)}"
        )
    for key, f in record.layers.items():
        if f.scale_d is None or f.offset_d is None:
            continue
        lo, hi = record_range(f.scale_d, f.offset_d, bits_of(f.dst_type or f.act_type or "INT8"))
        wrappers[key].set_input_range(lo, hi)


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


def _stats(info: QATInfo, wrappers: dict[str, nn.Cell], ranges: dict) -> CalibrationStats:
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
    if info.order:  # execution order, as the calibration sidecar; a site after its first one
        end = len(info.order)
        rank = {k: info.order.get(k.split("@")[0], end) for k in stats.layers}
        stats.layers = dict(sorted(stats.layers.items(), key=lambda kv: rank[kv[0]]))
    return stats


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
        stats.layers[site] = LayerStats(kind, input=site_input, output=output)
        if bn is not None:
            stats.layers[bn] = LayerStats("BatchNormalization", output=output)
    elif key not in info.folded.values():
        output = clipped(tensor_range(*ranges[(site, "output")]), clip_of.get(site))
        stats.layers[site] = LayerStats(info.observed.get(key, "Activation"), output=output)


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
