"""One calibration session of a MindSpore network: the MindSpore half of the core session.

:class:`~amct_bridge.calibration.session.CalibrationSession` owns the points, observers, batch
counting and the record. This subclass says how MindSpore does its part:

* **describe**: every leaf cell of ``cells_and_names()`` (:func:`amct_bridge.mindspore.cells.
  leaf_cells`) as a layer descriptor keyed by its name (``layer1.0.conv1``), plus the graph IR
  from a MindIR export (:func:`amct_bridge.mindspore.graph.extract_graph`) for the Conv/Dense +
  BatchNorm2d rule, calls per step (a ReLU used twice) and the functional ``x + y`` /
  ``ops.concat`` ops. The export needs an input: ``sample_input`` (the callback takes the first
  batch). A functional op gets a sidecar entry only when both its first input and its output
  are the input or output of a cell called once per step (the probes wrap cells; a functional
  op has none), e.g. not ``relu(x + y)`` when that ReLU cell is also called elsewhere.
* **weights**: :class:`~amct_bridge.mindspore.weights.MindSporeWeights` (OIHW, Dense (out, in),
  Conv2dTranspose (in, out, kH, kW), BatchNorm2d ``eps`` and moving statistics).
* **statistics**: an :class:`~amct_bridge.mindspore.instrument.Instrumentation` per pass
  (wrapper cells updating Parameters, in the graph in both modes; the output of an
  ``nn.Dense(activation=...)`` before that activation is the input of its activation cell,
  probed there); the network and every
  compiled top-level cell given (``Model``'s eval / train networks) compile anew while the
  probes are in and get their graphs from before back on removal, so no stale graph runs on
  with or without probes.
* **write**: the core's record (flavor "mindspore" by default, or "inner") and sidecar, both
  written atomically only after everything was built.

Grouped convolutions (``1 < group < in_channels``) are not quantized (AMCT has no such op):
the session logs a warning naming them.

Example:
    >>> import numpy as np
    >>> from mindspore import nn
    >>> from amct_bridge.config import QuantConfig
    >>> net = nn.SequentialCell([nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()])
    >>> s = Session(net, QuantConfig(), batch_num=None, sample_input=(1, 3, 8, 8)); s.new_run()
    >>> [(t.key, t.kind, t.bn_key) for t in s.plan.targets]
    [('0', 'Conv2D', '1'), ('2', 'ReLU', None)]
"""

from __future__ import annotations

import copy
import inspect
import logging
import os
import weakref
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from mindspore import nn

from amct_bridge.calibration.layers import LayerDesc, ModelDesc
from amct_bridge.calibration.merge import agree, merge_observed
from amct_bridge.calibration.protocol import Point
from amct_bridge.calibration.records import Built, build_record, finish_record, write_outputs
from amct_bridge.calibration.session import CalibrationSession
from amct_bridge.config import QuantConfig
from amct_bridge.errors import CalibrationError, GraphError
from amct_bridge.graph.ir import Graph
from amct_bridge.mindspore.cells import (
    BATCH_NORM_KINDS,
    FOLDABLE_KINDS,
    QUANTIZABLE_KINDS,
    RUNTIME,
    leaf_cells,
    structure_key,
)
from amct_bridge.mindspore.cells import describe as describe_cell
from amct_bridge.mindspore.instrument import Instrumentation
from amct_bridge.mindspore.weights import MindSporeWeights
from amct_bridge.records import Record
from amct_bridge.records.codec import from_proto, to_proto

__all__ = ["FLAVORS", "Session", "input_count", "net_inputs"]

log = logging.getLogger(__name__)

#: Record flavors a MindSpore calibration writes ("inner" carries DMQ and prune records).
FLAVORS = ("mindspore", "inner")
#: network -> (structure and input key, graph IR of its MindIR export)
_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: Host reads happen at most every this many batch ends (fewer transfers, same data)...
_READ_EVERY = 16
#: ...as long as the ring buffers of all histograms stay below this many bytes.
_HIST_BUDGET = 32 * 2**20
_GROUPED = ("GroupedConv2D", "GroupedConv2DTranspose")


class Session(CalibrationSession):
    """Statistics of one calibration session of a MindSpore network (see the module docstring).

    Args:
        net: the network (``nn.Cell``) whose leaf cells are calibrated.
        config: the resolved :class:`~amct_bridge.config.QuantConfig`.
        batch_num: batches to gather (None: every batch of the run).
        sample_input: one input for the MindIR export (shape, array, Tensor, or a list for
            several inputs); set it before the first :meth:`new_run`.
        compiled: other compiled top-level cells that run the network (``Model``'s networks);
            more with :meth:`forget_graphs`.
        group: the data-parallel ranks (:func:`amct_bridge.mindspore.distributed.current`):
            :meth:`write` merges every rank's statistics first, rank 0 writes, every rank
            returns the same record.

    Example:
        >>> # see the module docstring
    """

    def __init__(
        self,
        net,
        config: QuantConfig,
        batch_num: int | None,
        *,
        sample_input: Any = None,
        compiled: Iterable = (),
        group=None,
    ) -> None:
        super().__init__(config, batch_num, model_name=type(net).__name__)
        self.net = net
        self.group = group
        self.sample_input = sample_input
        self.compiled: list = []
        self._weights = MindSporeWeights()
        # op point -> (cell, role, scale: the cell sees the op's tensor times it, None: 1)
        self._homes: dict[tuple[str, str], tuple[Any, str, float | None]] = {}
        self.written: Record | None = None  # the last record written (see write)
        self.forget_graphs(*compiled)

    # ---- the core's hooks ---------------------------------------------------------------------

    def describe(self) -> ModelDesc:
        """Leaf cells by ``cells_and_names()`` name + the graph IR of a MindIR export."""
        name = type(self.net).__name__
        layers = {key: describe_cell(key, cell) for key, cell in leaf_cells(self.net).items()}
        if not layers and describe_cell("", self.net).quantizable:
            raise CalibrationError(
                f"network {name!r} is itself a single {name} cell: its own input cannot be "
                f"observed from inside; wrap it, e.g. nn.SequentialCell([net])"
            )
        grouped = [k for k, d in layers.items() if d.kind in _GROUPED]
        if grouped:
            log.warning(
                "network %r: grouped convolution(s) %s (1 < group < in_channels) are not "
                "quantized (AMCT has no such op); they stay float",
                name,
                ", ".join(map(repr, grouped)),
            )
        graph = self._graph(name)
        return ModelDesc(
            name,
            layers,
            graph,
            self._operations(graph, layers),
            foldable_kinds=FOLDABLE_KINDS,
            batch_norm_kinds=BATCH_NORM_KINDS,
            quantizable_kinds=QUANTIZABLE_KINDS,
        )

    def weight_source(self) -> MindSporeWeights:
        """Kernels in MindSpore layout, BatchNorm2d parameters."""
        return self._weights

    def _instrument(self, mode: str, points: list[Point]) -> Instrumentation:
        per_read = sum(4 * p.bins * max(1, p.calls) for p in points)
        every = max(1, min(_READ_EVERY, _HIST_BUDGET // max(1, per_read)))
        # points of functional ops are observed on the cell touching the same tensor
        cells = [self._on_cell(p) for p in points]
        return Instrumentation(self.net, cells, every, compiled=self.compiled)

    def _first_read(self, steps: int) -> None:
        """Each probed cell must have run its graph's calls per step: the k-th row of a step is
        site k only then. MindSpore's compiler merges identical calls (CSE): in
        ``fc(x) + fc(fc(x))`` the MindIR export computes ``fc(x)`` once (2 sites), while the
        probes (side effects) make all 3 calls run: the rows cannot be told apart by site."""
        points = self.points
        for indices, made in self._inst.calls_made():
            planned = max(max(1, points[i].calls) for i in indices)
            if made == 0 or made == planned * steps:
                continue  # a cell the run does not reach has no rows to misplace
            point = points[indices[0]]
            key = point.key
            sites = ", ".join(repr(key if k == 0 else f"{key}@{k}") for k in range(planned))
            raise CalibrationError(
                f"layer {key!r} (cell {type(point.layer).__name__}): the graph of the MindIR "
                f"export has {planned} call site(s) per step ({sites}), but the instrumented run "
                f"called it {made} time(s) in {steps} step(s) ({made / steps:g} per step); the "
                "statistics cannot be given to its sites, no record written. MindSpore's compiler "
                "merges identical calls in the export (e.g. fc(x) written twice is computed "
                "once), the probes make every call run. Compute the repeated call once and reuse "
                "its result (y = self.fc(x)), or give each call its own cell."
            )

    # ---- MindSpore specifics ------------------------------------------------------------------

    def forget_graphs(self, *cells) -> None:
        """Top-level cells that compile anew while the probes are in (and now, if
        a pass is running), e.g. ``Model._eval_network``.

        Example:
            >>> # session.forget_graphs(run_context.original_args().get("train_network"))
        """
        for cell in cells:
            if isinstance(cell, nn.Cell) and all(cell is not c for c in self.compiled):
                self.compiled.append(cell)
                if self._inst is not None:
                    self._inst.forget_graphs(cell)

    def _graph(self, name: str) -> Graph:
        if self.sample_input is None:
            raise CalibrationError(
                f"network {name!r}: calibration reads the graph from a MindIR export, which "
                "needs an input: give sample_input (a shape such as (1, 3, 32, 32) or an array)"
            )
        from amct_bridge.mindspore.graph import extract_graph  # MindIR parsing: only here
        from amct_bridge.mindspore.mindir import to_tensors

        try:
            tensors = to_tensors(self.sample_input)
            key = (structure_key(self.net), tuple((t.shape, str(t.dtype)) for t in tensors))
            cached = _GRAPHS.get(self.net)
            if cached is None or cached[0] != key:
                # the export compiles the network's graph; the next calibration of the same
                # cell tree at the same input shapes (repeated calibrate()) reads the same graph
                cached = key, extract_graph(self.net, tensors)
                _GRAPHS[self.net] = cached
            return copy.deepcopy(cached[1])
        except GraphError as err:
            raise CalibrationError(
                f"network {name!r}: cannot read its graph (needed for BatchNorm folding and "
                f"calls per step): {err}"
            ) from None

    def _operations(self, graph: Graph, layers: dict[str, LayerDesc]) -> dict[str, LayerDesc]:
        """Functional Add / concat ops whose input and output a single-call cell observes."""
        single = {n.layer: n for n in graph if n.is_layer and n.layer in layers and not n.shared}

        def home(tid: str) -> tuple[Any, str, float | None] | None:
            producer = graph.producer_of(tid)
            if producer is not None and producer.layer in single and producer.outputs[0] == tid:
                return layers[producer.layer].handle, "output", None
            for reader in graph.consumers_of(tid):
                if reader.layer in single and reader.inputs == [tid]:
                    return layers[reader.layer].handle, "input", None
            return _through_scalar(graph, tid, home)

        ops: dict[str, LayerDesc] = {}
        for node in graph:
            if node.is_layer or node.kind not in RUNTIME or not node.inputs:
                continue
            where = {"input": home(node.inputs[0]), "output": home(node.outputs[0])}
            if None in where.values():
                log.info("functional op %r: no cell sees its tensors; no sidecar range", node.name)
                continue
            for role, found in where.items():
                self._homes[(node.layer, role)] = found
            ops[node.layer] = LayerDesc(node.layer, node.kind, runtime=True, params={})
        return ops

    def _on_cell(self, point: Point) -> Point:
        if point.role == "preactivation":  # nn.Dense(activation=...): its activation cell's input
            return replace(point, layer=point.layer.activation, role="input")
        if isinstance(point.layer, nn.Cell):
            return point
        cell, role, scale = self._homes[(point.key, point.role)]
        # scale: the cell sees the op's output times it; the probe divides it back out
        return replace(point, layer=cell, role=role, inner=scale)

    # ---- output -------------------------------------------------------------------------------

    def write(
        self,
        record_path: str | os.PathLike,
        flavor: str = "mindspore",
        require_batches=False,
        stop: str | None = None,
    ) -> Record | None:
        """Build record + sidecar from what was seen, then write both (atomically each).

        ``stop``: end the pass of that mode first (in a data-parallel run inside the step every
        rank agrees on, so a rank failing there fails every rank instead of leaving them
        waiting). With a :attr:`group`, the ranks' statistics are merged first
        (:func:`amct_bridge.calibration.merge.merge_observed`); every rank builds the same
        record, only rank 0 writes the files.

        Returns the record as its file holds it (None when nothing was seen and
        ``require_batches`` is False).
        """
        if self.group is not None:
            return self._write_merged(record_path, flavor, require_batches, stop)
        if stop is not None:
            self.stop_pass(stop)
        if not self.settle_for_write(require_batches):
            return None
        record, stats, _ = build_record(self)
        record, text = finish_record(record, flavor)
        write_outputs(Built(record, text, stats), record_path)
        return self._written(record, flavor, record_path)

    def _written(self, record: Record, flavor: str, record_path) -> Record:
        # what load() of the file gives (proto floats are float32), without parsing it again
        # source: the file, so the export / report find its sidecar from the Record too
        self.written = from_proto(to_proto(record, flavor), flavor, source=str(record_path))
        return self.written

    def _write_merged(self, record_path, flavor: str, require_batches, stop) -> Record | None:
        group = self.group
        error = None
        try:
            if stop is not None:
                self.stop_pass(stop)
            self.settle_for_write(False)
        except Exception as err:  # every rank learns of it below, then raises
            error = err
        layout = ";".join(
            f"{o.point.key}/{o.point.role}/{o.point.bins}/{o.point.channels}/"
            f"{len(o.sites or ())}/{o.observer.algorithm}"
            for o in self.observed
        )
        agree(group.gather, error, "the calibration merge", layout=layout)
        observed, batches = merge_observed(self.observed, self.batches, group.gather)
        if batches == 0:
            if require_batches:
                raise CalibrationError(
                    f"no calibration batch was seen for model {self.model_name!r} on any of the "
                    f"{group.world} ranks; no record written (empty dataset or steps=0?)"
                )
            return None
        mine = self.observed, self.batches
        self.observed, self.batches = observed, batches
        built = None
        try:
            record, stats, _ = build_record(self)
            record, text = finish_record(record, flavor)
            built = Built(record, text, stats)
            if group.rank == 0:
                write_outputs(built, record_path)
        except Exception as err:
            error = err
        finally:  # the session goes on with its own statistics (save_every_epoch, accumulate)
            self.observed, self.batches = mine
        agree(group.gather, error, "writing the record (rank 0)")
        return self._written(built.record, flavor, record_path)


def _through_scalar(graph: Graph, tid: str, home) -> tuple[Any, str, float | None] | None:
    """Where a tensor no cell touches is seen when it reaches a cell through a multiplication
    or division by a nonzero constant (attention's ``q @ kᵀ * 0.35`` before its nn.Softmax):
    ``home`` of the product, with ``scale`` the factor the cell sees the tensor times (the
    probe divides it back out: min and max of ``y / c`` are those of ``x`` for ``y = x * c``).
    None when no such reader exists."""
    for reader in graph.consumers_of(tid):
        scalars = reader.params.get("scalar_operands") or []
        if reader.is_layer or reader.inputs != [tid] or len(scalars) != 1:
            continue
        (position, value), kind = scalars[0], reader.kind
        if value == 0.0 or reader.params.get("const_operands") or kind not in _SCALING:
            continue
        if kind == "Divide" and position != 1:
            continue  # c / x is no scaling
        found = home(reader.outputs[0])
        if found is None:
            continue
        cell, role, inner = found
        factor = value if kind == "Multiply" else 1.0 / value
        return cell, role, factor * (1.0 if inner is None else inner)
    return None


#: Functional kinds that scale a tensor by a constant operand (see _through_scalar).
_SCALING = ("Multiply", "Divide")


def input_count(net, columns: int) -> int:
    """How many of ``columns`` leading values ``net.construct`` takes positionally (all of them
    with ``*args``; 1 if its signature cannot be read).

    Example:
        >>> from mindspore import nn
        >>> input_count(nn.Dense(2, 2), 2)
        1
    """
    try:
        params = inspect.signature(net.construct).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = [p.kind for p in params]
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return columns
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return max(1, sum(1 for k in kinds if k in positional))


def net_inputs(net, element: tuple | list) -> Any:
    """The part of a dataset element (a batch's columns) that ``net`` takes: as many leading
    columns as its ``construct`` has positional parameters (all with ``*args``).

    ``Model`` with a ``loss_fn`` hands ``(data, label)`` to ``WithLossCell`` / ``WithEvalCell``,
    whose network takes ``data`` only; a network with its own loss takes every column.

    Example:
        >>> from mindspore import nn
        >>> net_inputs(nn.Dense(2, 2), ("x", "label"))
        'x'
    """
    element = list(element)
    count = input_count(net, len(element))
    taken = element[:count]
    return taken[0] if len(taken) == 1 else taken
