"""In-graph activation statistics for MindSpore: wrapper cells updating Parameters.

:class:`Instrumentation` implements the core's instrumentation protocol
(:class:`amct_bridge.calibration.protocol.Instrumentation`) for MindSpore cells. For every
observed cell, :meth:`~Instrumentation.install` puts a wrapper cell (:class:`Probe`) in its
place with ``parent.insert_child_to_cell(name, probe)`` (``setattr`` would rename the cell's
parameters) at every place the cell is a child of, refreshes ``SequentialCell.cell_list`` and
makes the network and every other compiled top-level cell it was given (``Model``'s eval /
train networks) compile anew: a compiled graph never notices a swapped child, it would run on
without statistics (or keep collecting after :meth:`~Instrumentation.remove`).
:meth:`~Instrumentation.remove` puts the cells back; the wrappers and their Parameters are gone,
so outputs, parameter names and checkpoints are as before.

The graphs compiled before the install are kept, not cleared: MindSpore names a compiled graph
by phase, creation time and id of the top-level cell (``graph.api._real_phase``), so while the
probes are in, each compiled cell gets another creation time (its instrumented graph compiles
under another name), and :meth:`~Instrumentation.remove` puts back the creation time: the next
run without probes reuses its graph instead of compiling it again (benchmark ResNet: the
recompile after a calibrated epoch). The probes are kept per network (``_KEPT``) with the
creation time each compiled cell's instrumented graph got (``_PROBED``): a later
Instrumentation of the same points on the same cell tree
(:func:`~amct_bridge.mindspore.cells.structure_key`; repeated ``calibrate()`` / callback
runs) takes them over, reset, and its install gives the cells that creation time again, so
the instrumented graph runs again without a compile. Another probe set's install frees the
old instrumented graph (freeing it renumbers MindSpore's arguments key of the cell: then every
graph of the cell is freed, and the one without probes compiles again after that pass);
otherwise it is freed with the cell.

A probe runs only graph ops on ``ops.stop_gradient`` of the observed tensor, so the same code
runs in GRAPH_MODE (compiled into the network's graph, also under ``Model.train``) and in
PYNATIVE_MODE; gradients and trainable parameters are untouched (the statistics Parameters have
``requires_grad=False`` and are not in the optimizer's list). No Python side effect: an
attribute write in a GRAPH_MODE ``construct`` runs as a Python fallback every call (measured:
10x slower).

Per call of the cell, each observed tensor (cell input and/or output, :class:`Summary`) writes
one row ``[min, max, NaN flag, element count, marker]`` (float64) into a ring of ``slots`` rows,
optionally its per-channel min and max (DMQ; channel axis 1, NCHW) and its histogram. A probe's
call counter (int32 Parameter) picks the row and numbers the rows. The host reads the rings
every ``read_every`` batch ends (:meth:`~Instrumentation.drain`), so each batch keeps its own
row (``ema`` updates per batch, the core counts batches and names the batch with NaN/Inf)
while the host reads a few small Parameters per point only every 16 steps. Measured on the
benchmark's ResNet (27 points): one read costs ~1 ms (~35 us per point, histogram rings only
read when a row holds its own histogram), i.e. ~1 ms per step when reading every step, ~0.1 ms
per step when reading every 16; the ring costs one ``scatter_update`` per point and call.

Histograms follow the grid protocol of the Keras adapter, with the same results: the host sets a
grid ``[lo, hi]`` per point (:meth:`~Instrumentation.set_grid`, a float32 Parameter); a batch
inside the grid (and within :meth:`~Instrumentation.set_limit`) is binned onto it and summed
into an int32 accumulator Parameter, taken by :meth:`~Instrumentation.take_histograms`; any
other batch is binned over its own ``[min, max]`` (equal: all in bin 0) into its ring row only
(marker 2), and the host hands it over with the row, then moves the grid. Binning is
``min(floor((x - lo) / ((hi - lo) / bins)), bins - 1)`` in float64, the formula of
:func:`amct_bridge.quant.stats.batch_stats`; counts by ``unsorted_segment_sum`` (``ops.histc``
bakes its range into the graph, ``HistogramFixedWidth`` has no CPU kernel). Exact: min, max,
counts, per-channel ranges and every bin equal the numpy reference on the same float32 tensor.

A cell called at several sites per step (one ``nn.ReLU`` used twice, or back to back as in
``fc(fc(x))``) gets one probe: its rows merge all sites, one row per call, so ``Point.calls``
must give the calls per step (the graph's nodes of the cell; the core numbers batches as
``row.step // calls`` and the k-th row of a step is site k; too small a value fills the ring
early and :meth:`~Instrumentation.drain` says so). Not seen: functional ops in ``construct``
(``x + y``, ``ops.concat``), cells referenced only outside the cell tree (plain lists, dicts), and
``@ms.jit`` functions compiled by the user (only top-level cells given compile anew). A
checkpoint saved *during* a pass (``ModelCheckpoint``) contains the statistics Parameters.

Example:
    >>> import numpy as np, mindspore as ms
    >>> from mindspore import nn
    >>> from amct_bridge.calibration.protocol import Point
    >>> net = nn.SequentialCell([nn.Dense(3, 2), nn.ReLU()])
    >>> inst = Instrumentation(net, [Point("0", "input", net[0])])
    >>> inst.install(); _ = net(ms.Tensor(np.float32([[1, -2, 3]]))); rows = inst.drain()
    >>> inst.remove(); (rows[0].stats.min, rows[0].stats.max, rows[0].stats.count), type(net[0])
    ((-2.0, 3.0, 3), <class 'mindspore.nn.layer.basic.Dense'>)
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Iterable

import numpy as np
from mindspore import Parameter, Tensor, nn
from mindspore.graph.api import _cell_graph_executor

from amct_bridge.calibration.protocol import Point, Row
from amct_bridge.errors import CalibrationError
from amct_bridge.mindspore.cells import structure_key
from amct_bridge.mindspore.instrument_cells import (
    NO_GRID,
    NO_LIMIT,
    Probe,
    Summary,
    places,
    put,
)
from amct_bridge.quant.stats import BatchStats

__all__ = ["Instrumentation", "Probe", "Summary"]

_ACC_LIMIT = 2**31 - 1  # int32 accumulator
_OWN_HIST = 2.0  # ring marker: the row's histogram is the batch's own
_uids = itertools.count()
#: compiled top-level cell -> phases of its instrumented graphs of the last pass (freed at the
#: next install, or with the cell)
_DEAD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: network -> the probes of its last instrumentation, for the next one of the same points on
#: the same cell tree (repeated calibrate() / callback runs): their graph is not compiled again
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: compiled top-level cell -> (kept probes, creation time their instrumented graph compiled
#: under): a later install of the same probes gives the cell that time again
_PROBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Kept:
    """Probes and buffers of one instrumentation layout of one network (see ``_KEPT``)."""

    def __init__(self, key: tuple, probes, probe_index, summary, health) -> None:
        self.key, self.probes, self.probe_index = key, probes, probe_index
        self.summary, self.health = summary, health
        self.installed = False
        self.owner: weakref.ref | None = None  # the Instrumentation using them


class Instrumentation:
    """Installs probes on a network's cells and reads their statistics back.

    Args:
        net: the network (top-level cell) whose cell tree holds the observed cells.
        points: the tensors to observe; ``layer`` is the cell, ``role`` "input" or "output"
            (a float ``inner``: the cell sees the tensor times it, :class:`Summary`).
        steps_per_read: batch ends between two reads (each probe's ring holds
            ``steps_per_read * calls`` rows).
        compiled: other top-level cells whose compiled graphs must be rebuilt on install and
            remove (``model._eval_network``, ``model._train_network``, a callback's
            ``run_context.original_args()["eval_network"]``); more via :meth:`forget_graphs`.

    Example:
        >>> # see the module docstring
    """

    def __init__(
        self, net, points: list[Point], steps_per_read: int = 16, compiled: Iterable = ()
    ) -> None:
        self.net = net
        self.points = list(points)
        self.steps_per_read = max(1, int(steps_per_read))
        self.python_calls = 0  # nothing of ours runs in Python per step (see module docstring)
        self._compiled: list = [net]
        self._installed: list[tuple[object, str, object]] = []  # (parent, name, original)
        # compiled top-level cells while installed: (cell, creation time, compile cache)
        self._shelf: list[tuple[nn.Cell, int, frozenset]] = []
        self.forget_graphs(*compiled)
        uid = next(_uids)
        by_cell: dict[int, list[int]] = {}
        for index, point in enumerate(self.points):
            if point.role not in ("input", "output"):
                raise CalibrationError(
                    f"layer {point.key!r}: MindSpore observes cell inputs and outputs, "
                    f"not {point.role!r} tensors"
                )
            if not isinstance(point.layer, nn.Cell):
                raise CalibrationError(f"layer {point.key!r}: {point.layer!r} is not a Cell")
            by_cell.setdefault(id(point.layer), []).append(index)
        key = (
            structure_key(net),
            tuple(
                (id(p.layer), p.role, p.bins, p.channel_axis, p.channels, max(1, p.calls))
                + (p.inner if isinstance(p.inner, int | float) else None,)  # a Summary's scale
                for p in self.points
            ),
            self.steps_per_read,
        )
        kept = _KEPT.get(net)
        if kept is not None and kept.key == key and not kept.installed:
            self._adopt(kept)
        else:
            self._build(uid, by_cell)
            _KEPT[net] = self._kept = _Kept(
                key, self._probes, self._probe_index, self._summary, self._health
            )
        self._kept.owner = weakref.ref(self)
        self._by_probe = [
            [i for i, k2 in self._probe_index.items() if k2 == k] for k in range(len(self._probes))
        ]
        self._grids: dict[int, tuple[float, float]] = {}
        self._added: dict[int, int] = {}  # point -> elements since its last take
        self._largest: dict[int, int] = {}

    def _build(self, uid: int, by_cell: dict[int, list[int]]) -> None:
        """New probes and buffers for the points (grouped by cell in ``by_cell``)."""
        self._probes: list[Probe] = []
        self._probe_index: dict[int, int] = {}  # point -> its probe
        self._summary: dict[int, Summary] = {}
        self._health = Parameter(
            Tensor(np.zeros((), np.float32)), name=f"amct_bridge.{uid}.health", requires_grad=False
        )
        for k, indices in enumerate(by_cell.values()):
            calls = max(max(1, self.points[i].calls) for i in indices)
            slots = self.steps_per_read * calls
            for i in indices:
                self._summary[i] = Summary(f"amct_bridge.{uid}.{i}", self.points[i], slots)
                self._probe_index[i] = k
            ins = [self._summary[i] for i in indices if self.points[i].role == "input"]
            outs = [self._summary[i] for i in indices if self.points[i].role == "output"]
            cell = self.points[indices[0]].layer
            self._probes.append(
                Probe(cell, ins, outs, f"amct_bridge.{uid}.c{k}", slots, calls, self._health)
            )

    def _adopt(self, kept: _Kept) -> None:
        """Take over the probes of an earlier instrumentation of the same points on the same
        cell tree, reset to their initial state (the rings are read only where written)."""
        old = kept.owner() if kept.owner is not None else None
        if old is not None:
            old._kept = None  # its probes are ours now: it cannot install them again
        self._kept = kept
        self._probes, self._probe_index = kept.probes, kept.probe_index
        self._summary, self._health = kept.summary, kept.health
        for probe in self._probes:  # a Tensor each: set_data may share its storage
            probe.last = 0
            probe.count.set_data(Tensor(np.zeros((), np.int32)))
            probe.limit.set_data(Tensor(np.full((), NO_LIMIT, np.int32)))
        for summary in self._summary.values():
            if summary.bins:
                summary.acc.set_data(Tensor(np.zeros(summary.bins, np.int32)))
                summary.grid.set_data(Tensor(NO_GRID.copy()))
        self._health.set_data(Tensor(np.zeros((), np.float32)))

    # ---- swapping -----------------------------------------------------------------------------

    def forget_graphs(self, *cells) -> None:
        """Add top-level cells that must compile anew while the probes are in (and at once if
        installed: a graph compiled before must not run on unobserved); their graphs without
        probes come back on remove.

        Example:
            >>> # inst.forget_graphs(run_context.original_args().get("eval_network"))
        """
        for cell in cells:
            if cell is not None and all(cell is not c for c in self._compiled):
                self._compiled.append(cell)
                if self._installed:
                    self._shelve(cell)

    def install(self) -> None:
        """Put every probe in place of its cell (all places it is a child of), then make the
        compiled cells compile anew (their graphs are kept for :meth:`remove`). Idempotent."""
        if self._installed:
            return
        if self._kept is None:
            raise CalibrationError(
                "this Instrumentation's probes were taken over by a newer Instrumentation of "
                "the same network and points: install that one"
            )
        holders = places(self.net)
        for k, probe in enumerate(self._probes):
            cell = probe.cell
            found = holders.get(id(cell), [])
            if not found:
                key = self.points[self._by_probe[k][0]].key
                self.remove()
                raise CalibrationError(
                    f"layer {key!r}: cell {type(cell).__name__} is not a child of any cell of "
                    "the network (the top-level cell itself cannot be observed)"
                )
            for parent, name in found:
                self._installed.append((parent, name, cell))
                put(parent, name, probe)
        self._kept.installed = True
        for cell in self._compiled:
            self._shelve(cell)

    def remove(self) -> None:
        """Put the original cells back and the graphs compiled before :meth:`install`; free the
        instrumented graphs (idempotent)."""
        if not self._installed:
            return
        while self._installed:
            parent, name, cell = self._installed.pop()
            put(parent, name, cell)
        while self._shelf:
            self._unshelve(*self._shelf.pop())
        if self._kept is not None:
            self._kept.installed = False

    def _shelve(self, cell) -> None:
        """Keep ``cell``'s compiled graphs aside: another creation time makes it compile anew."""
        if not isinstance(cell, nn.Cell) or any(cell is c for c, _, _ in self._shelf):
            return
        cache = cell.compile_cache
        probed = _PROBED.get(cell)
        if probed is not None and probed[0] is self._kept:
            created = probed[1]  # these probes' graph, still compiled: it runs again
        else:
            if _DEAD.pop(cell, None):
                # another probe set's graph: freeing it renumbers the cell's graphs
                # (MindSpore's arguments key), so free them all; the plain one compiles again
                _cell_graph_executor.del_net_res(cell, set(cache))
                cache.clear()
            created = max(time.time_ns(), cell.create_time + 1)
            _PROBED[cell] = (self._kept, created)
        self._shelf.append((cell, cell.create_time, frozenset(cache)))
        object.__setattr__(cell, "_create_time", created)

    @staticmethod
    def _unshelve(cell, created: int, phases: frozenset) -> None:
        # the instrumented graphs stay in the compile cache, so the cell frees them when it
        # goes (Cell.__del__), or the next install does (freeing one now would renumber the
        # graph without probes, which then compiles again)
        probed = set(cell.compile_cache) - phases
        if probed:
            _DEAD[cell] = probed
        object.__setattr__(cell, "_create_time", created)

    # ---- host side ----------------------------------------------------------------------------

    @property
    def read_every(self) -> int:
        """Batch ends between two :meth:`drain` calls (rings hold that many steps)."""
        return self.steps_per_read

    def set_limit(self, steps: int | None) -> None:
        """Steps after which no batch bins onto a grid any more (None: never)."""
        for probe in self._probes:
            limit = NO_LIMIT if steps is None else min(NO_LIMIT, max(0, steps) * probe.calls)
            probe.limit.set_data(Tensor(np.array(limit, np.int32)))

    def set_grid(self, index: int, lo: float, hi: float) -> None:
        """Bin point ``index``'s batches inside ``[lo, hi]`` onto that grid from now on (take
        the histograms first: the accumulated counts belong to the old grid)."""
        grid = np.array([lo, hi], np.float32)
        self._summary[index].grid.set_data(Tensor(grid))
        self._grids[index] = (float(grid[0]), float(grid[1]))

    def grid(self, index: int) -> tuple[float, float] | None:
        """Point ``index``'s grid, None before the first :meth:`set_grid`."""
        return self._grids.get(index)

    def take_histograms(self, indices) -> list[tuple[int, float, float, np.ndarray]]:
        """``(point, lo, hi, counts)`` accumulated on each point's grid since the last take
        (only batches binned onto the grid); zeroes the accumulators."""
        out = []
        for index in indices:
            summary = self._summary[index]
            if not summary.bins:
                continue
            self._added.pop(index, None)
            counts = summary.acc.asnumpy().astype(np.int64)
            if counts.any():
                summary.acc.set_data(Tensor(np.zeros(summary.bins, np.int32)))
                lo, hi = self._grids[index]
                out.append((index, lo, hi, counts))
        return out

    def due(self) -> list[int]:
        """Points whose accumulator must be taken before the next read: a bin could pass int32
        otherwise (everything since the last take in one bin, plus two full rings of the
        largest batch)."""
        out = []
        for index, added in self._added.items():
            slots = self._probes[self._probe_index[index]].slots
            if added + 2 * slots * self._largest.get(index, 0) >= _ACC_LIMIT:
                out.append(index)
        return sorted(out)

    def non_finite(self) -> bool:
        """True once any observed tensor held a NaN or an infinity (one read of one scalar: the
        session asks after every step, so a bad batch stops the run where it happened)."""
        return not np.isfinite(float(self._health.asnumpy()))

    def calls_made(self) -> list[tuple[list[int], int]]:
        """Per probe: the points it observes and the calls of its cell since :meth:`install`."""
        return [(self._by_probe[k], int(p.count.asnumpy())) for k, p in enumerate(self._probes)]

    def drain(self) -> list[Row]:
        """Every summary written since the last drain, in write order per point."""
        rows: list[Row] = []
        for k, probe in enumerate(self._probes):
            count = int(probe.count.asnumpy())
            last = probe.last
            if count - last > probe.slots:
                raise CalibrationError(
                    f"cell {type(probe.cell).__name__} ran {count - last} times since the last "
                    f"read, but its ring holds {probe.slots} ({probe.calls} call(s) per step "
                    "planned): is it called more often per step than the graph shows?"
                )
            probe.last = count
            if count == last:
                continue
            for index in self._by_probe[k]:
                rows.extend(self._rows_of(index, probe, range(last, count)))
        return rows

    def _rows_of(self, index: int, probe: Probe, calls: range) -> list[Row]:
        summary = self._summary[index]
        mm = summary.mm.asnumpy()
        slots = [n % probe.slots for n in calls]
        hist = None
        if summary.bins and (mm[slots, 4] == _OWN_HIST).any():
            hist = summary.hist.asnumpy()
        chan = summary.chan.asnumpy() if summary.channel_axis is not None else None
        rows = []
        for n, slot in zip(calls, slots, strict=True):
            lo, hi, flag, size, marker = mm[slot]
            if np.isnan(flag) and np.isfinite(lo) and np.isfinite(hi):
                lo = hi = np.nan  # a NaN the CPU reductions skipped (see instrument_cells.ROW)
            own = None
            if summary.bins:
                self._added[index] = self._added.get(index, 0) + int(size)
                self._largest[index] = max(self._largest.get(index, 0), int(size))
                if marker == _OWN_HIST:
                    own = hist[slot].astype(np.int64)
            ranges = chan[slot] if chan is not None else None
            stats = BatchStats(
                count=int(size),
                min=float(lo),
                max=float(hi),
                hist=own,
                channel_absmax=np.abs(ranges).max(axis=0) if ranges is not None else None,
            )
            rows.append(Row(index, 0, n, stats, ranges))
        return rows
