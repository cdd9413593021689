"""Ring buffers of the Keras instrumentation: layout in ``tf.Variable`` s and host reads.

Buffers are laid out by *column*: one per observed tensor and call (a shared layer called
twice per step has two). Each write fills one row of a ring of ``slots`` rows (one per step,
``steps_per_execution`` x ``steps_per_read`` of them) and bumps a counter; the host reads
counter and rows and turns every column written since its last read into one ``BatchStats``.
A column written twice before its step ends (a layer called more often than the model graph
shows), or a layer run inside a control-flow branch of the step, gets its own write there.

Histograms are binned onto a per-column *grid* ``[lo, hi]`` that the host sets (the union of
the ranges seen so far) and summed in-graph, so the host merges one accumulated histogram now
and then instead of one per batch. A batch not inside the grid (no grid yet, a range that grew,
past ``batch_num``) gets its own histogram over its ``[min, max]``, which goes to a ring row and,
so that the step needs no mask or ``tf.cond``, into the accumulator too: the host subtracts it
again (exact, integer counts) and moves the grid (``Session``). Under ``tf.distribute``
strategies the buffers are ``ON_READ`` variables: each replica writes its own copy and the host
reads every replica's rows.

The graph side (wrapped calls writing these buffers) is :mod:`amct_bridge.keras.instrument`;
this module creates the buffers and implements the host half of the core's
:class:`~amct_bridge.calibration.protocol.Instrumentation` protocol (drain, due,
take_histograms, set_grid, grid, set_limit, read_every; ``due`` is the
instrumentation's own).

Example:
    >>> _Group(8, []).bins
    8
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from amct_bridge.calibration.protocol import Point, Row
from amct_bridge.errors import CalibrationError
from amct_bridge.quant.stats import BatchStats


@dataclass
class _Group:
    """The histogram columns with one bin count, and their buffers."""

    bins: int
    cols: list[int]
    vars: dict = field(default_factory=dict)
    _pos: dict[int, int] = field(default_factory=dict)  # column -> position (filled by add)

    def add(self, cols: list[int]) -> None:
        for col in cols:
            self._pos[col] = len(self.cols)
            self.cols.append(col)

    def pos(self, col: int) -> int:
        """Position of column ``col`` in this group's buffers."""
        return self._pos[col]

    def __contains__(self, col: int) -> bool:
        return col in self._pos


class RingBuffers:
    """Per-column buffers of one pass and their host-side reads (see the module docstring).

    Args:
        model: the Keras model (its ``distribute_strategy`` decides where buffers live, its
            ``steps_per_execution`` how many steps run between two batch ends).
        points: the tensors to observe.
        steps_per_read: batch ends between two host reads (buffers hold that many steps).

    Example:
        >>> # see amct_bridge.keras.instrument
    """

    def __init__(self, model, points: list[Point], steps_per_read: int = 1) -> None:
        self.points = list(points)
        self.strategy = model.distribute_strategy
        self.steps_per_read = max(1, int(steps_per_read))
        spe = int(getattr(model, "steps_per_execution", 1) or 1)
        self.slots = spe * self.steps_per_read
        # columns: one per point and call
        self._col_point: list[int] = []
        self._cols: list[list[int]] = []
        for index, point in enumerate(self.points):
            first = len(self._col_point)
            self._col_point += [index] * max(1, point.calls)
            self._cols.append(list(range(first, len(self._col_point))))
        self._groups: dict[int, _Group] = {}
        for index, point in enumerate(self.points):
            if point.bins:
                group = self._groups.setdefault(point.bins, _Group(point.bins, []))
                group.add(self._cols[index])
        with self.strategy.scope():
            self._make_vars()
        # ON_READ (distributed) variables have no scatter ops: those get whole-buffer assigns
        self._scatter = not isinstance(self._count, tf.distribute.DistributedValues)
        self._last: dict[int, int] = {}  # replica -> counter at its last read
        self._seq: dict[tuple[int, int], int] = {}  # (point, replica) -> summaries read
        # per (replica, column) since its last take: elements added to its accumulator, and
        # the sum of the own histograms added to it; per column: the largest batch
        self._added: dict[tuple[int, int], int] = {}
        self._junk: dict[tuple[int, int], np.ndarray] = {}
        self._largest: dict[int, int] = {}
        self.writes_per_step = 1

    def _make_vars(self) -> None:
        var = _local_var
        n_cols = len(self._col_point)
        self._count = var([], tf.int64, "count")
        # per step and column: [min, max, element count, marker]; marker 0: not written,
        # 1: written, 2: written with its own histogram in the ring
        self._mm = var([self.slots, n_cols, 4], tf.float64, "minmax")
        self._limit = var([], tf.int64, "limit")  # steps past which nothing bins onto the grid
        self._steps = var([], tf.int64, "steps") if self._groups else None
        self.set_limit(None)
        for group in self._groups.values():
            # one extra row: where a batch binned on the grid writes (never read), so the
            # step needs no tf.cond (two traced branches cost more than this row copy)
            group.vars["hist"] = var(
                [self.slots + 1, len(group.cols), group.bins], tf.int32, "hist"
            )
            # int32 like the histograms (half the memory traffic of int64 per step); the
            # host takes the counts long before a bin could overflow (see due)
            group.vars["acc"] = var([len(group.cols), group.bins], tf.int32, "hist_acc")
            grid = var([len(group.cols), 2], tf.float32, "grid")
            for local in self.strategy.experimental_local_results(grid):
                local.assign(np.tile(_NO_GRID, (len(group.cols), 1)))  # none until set
            group.vars["grid"] = grid
        self._chan: dict[int, tf.Variable] = {}
        for index, point in enumerate(self.points):
            if point.channel_axis is not None:
                for col in self._cols[index]:
                    self._chan[col] = var([self.slots, 2, point.channels], tf.float32, "chan")

    def reset(self) -> None:
        """Back to the state of new buffers, for a traced step that runs again (calibrate()'s
        reused step, :mod:`amct_bridge.keras.session`): counters, accumulators, grids and the
        host's bookkeeping. The rings need no zeroing: a row is read only after it was written.
        ``writes_per_step`` stays: it comes from the trace.

        Example:
            >>> # Session reuses an Instrumentation and its traced step: inst.reset()
        """
        locals_ = [*self._locals(self._count)]
        if self._steps is not None:
            locals_ += self._locals(self._steps)
        for local in locals_:
            local.assign(tf.zeros_like(local))
        for group in self._groups.values():
            for local in self._locals(group.vars["acc"]):
                local.assign(tf.zeros_like(local))
            for local in self._locals(group.vars["grid"]):
                local.assign(np.tile(_NO_GRID, (len(group.cols), 1)))
        for book in (self._last, self._seq, self._added, self._junk, self._largest):
            book.clear()

    def _locals(self, var: tf.Variable) -> list[tf.Variable]:
        """``var``'s components, one per replica."""
        return list(self.strategy.experimental_local_results(var))

    def _where(self, index: int) -> tuple[_Group, list[int]]:
        """Point ``index``'s histogram group and its columns' positions in it."""
        group = self._groups[self.points[index].bins]
        return group, [group.pos(c) for c in self._cols[index]]

    @property
    def read_every(self) -> int:
        """Batch ends between host reads so that the ring never overflows (fewer than
        ``steps_per_read`` when a step writes several rows: the model called twice per step)."""
        return max(1, self.steps_per_read // self.writes_per_step)

    def set_limit(self, steps: int | None) -> None:
        """Steps after which batches no longer bin onto the grid (None: never).

        Rows past the limit still reach the host, which drops them (steps_per_execution can
        run past ``batch_num``); their histograms are their own, in the ring, so the host can
        take them out of the accumulator again, which grid-binned counts could not be.
        """
        value = np.int64(2**62 if steps is None else max(0, int(steps)))
        for local in self._locals(self._limit):
            local.assign(value)

    def set_grid(self, index: int, lo: float, hi: float) -> None:
        """Bin point ``index``'s batches inside ``[lo, hi]`` onto that grid from now on.

        Call :meth:`take_histograms` first: the accumulated counts belong to the old grid.
        """
        group, pos = self._where(index)
        rows = np.tile(np.array([lo, hi], np.float32), (len(pos), 1))
        for local in self._locals(group.vars["grid"]):
            local.scatter_nd_update(np.array(pos)[:, None], rows)

    def grid(self, index: int) -> tuple[float, float] | None:
        """The grid point ``index`` bins onto, or None when it has none yet."""
        group, pos = self._where(index)
        lo, hi = self._locals(group.vars["grid"])[0].numpy()[pos[0]].tolist()
        return (lo, hi) if lo < hi else None

    def take_histograms(self, indices) -> list[tuple[int, float, float, np.ndarray]]:
        """``(point, lo, hi, counts)`` accumulated on each replica's grid; zeroes them.

        The accumulator also holds every batch histogram that went to the ring (those were
        binned on their own range); :meth:`drain` kept their sum, subtracted here.
        """
        out = []
        counts: dict[tuple[int, int], np.ndarray] = {}  # (bins, replica) -> accumulator
        changed: set[tuple[int, int]] = set()
        for index in indices:
            if not self.points[index].bins:
                continue
            group, pos = self._where(index)
            for rep, (acc, grid) in enumerate(self._replica_vars(group, "acc", "grid")):
                key = (group.bins, rep)
                if key not in counts:
                    counts[key] = acc.numpy()
                total = counts[key][pos].astype(np.int64).sum(axis=0)
                for col in self._cols[index]:
                    total -= self._junk.pop((rep, col), 0)
                    self._added.pop((rep, col), None)
                if counts[key][pos].any():  # zeroed even if only own histograms were there
                    counts[key][pos] = 0
                    changed.add(key)
                if total.any():
                    lo, hi = grid.numpy()[pos[0]].tolist()
                    out.append((index, lo, hi, total))
        for bins, rep in changed:
            self._locals(self._groups[bins].vars["acc"])[rep].assign(counts[(bins, rep)])
        return out

    def _replica_vars(self, group: _Group, *names: str):
        """Per replica, the group's variables ``names`` (local components)."""
        return zip(*(self._locals(group.vars[name]) for name in names), strict=True)

    def drain(self) -> list[Row]:
        """Read every summary written since the last drain (every replica's rows; the
        histogram ring only when some row has its own histogram there).

        Eager reads, a few microseconds each: a tf.function reading them all in one call cost
        ~0.15 s to trace, more than a short run's reads altogether.
        """
        rows: list[Row] = []
        counts, mms = self._locals(self._count), self._locals(self._mm)
        for rep, (count_var, mm_var) in enumerate(zip(counts, mms, strict=True)):
            count, last = int(count_var.numpy()), self._last.get(rep, 0)
            if count - last > self.slots:
                raise CalibrationError(
                    f"the instrumented layers wrote {count - last} step summaries since the "
                    f"last read, but only {self.slots} fit: was the model called more than once "
                    "per step (or outside fit/evaluate/predict) while calibrating?"
                )
            self._last[rep] = count
            if count > last:
                rows.extend(self._rows_of(rep, range(last, count), mm_var.numpy()))
        return rows

    def _rows_of(self, replica: int, steps: range, mm: np.ndarray) -> list[Row]:
        slots = [step % self.slots for step in steps]
        # of the histogram rings only the rows that hold a batch's own histogram are read
        # (one gather per bin count; rare once grids are set): a whole ring is up to 32 MiB
        hists = self._own_histograms(replica, slots, mm)
        chans = {col: self._locals(var)[replica].numpy() for col, var in self._chan.items()}
        rows = []
        for slot in slots:
            for col in np.flatnonzero(mm[slot, :, 3]):
                lo, hi, size, marker = mm[slot, col]
                index = self._col_point[col]
                point = self.points[index]
                hist = None
                if point.bins:
                    key = (replica, col)
                    self._added[key] = self._added.get(key, 0) + int(size)
                    self._largest[col] = max(self._largest.get(col, 0), int(size))
                    if marker == _OWN_HIST:
                        hist = hists[(slot, col)]
                        self._junk[key] = self._junk.get(key, 0) + hist.astype(np.int64)
                chan = chans[col][slot] if col in chans else None
                stats = BatchStats(
                    count=int(size),
                    min=float(lo),
                    max=float(hi),
                    hist=hist,
                    channel_absmax=np.abs(chan).max(axis=0) if chan is not None else None,
                )
                seq = self._seq.get((index, replica), 0)
                self._seq[(index, replica)] = seq + 1
                rows.append(Row(index, replica, seq, stats, chan))
        return rows

    def _own_histograms(self, replica: int, slots: list[int], mm: np.ndarray) -> dict:
        """``(slot, column) -> counts`` of the rows in ``slots`` whose histogram is their own."""
        out = {}
        for group in self._groups.values():
            marks = mm[slots][:, group.cols, 3] == _OWN_HIST
            if not marks.any():
                continue
            at, pos = np.nonzero(marks)
            pairs = [(slots[a], p) for a, p in zip(at.tolist(), pos.tolist(), strict=True)]
            pairs = sorted(set(pairs))  # a slot can repeat when the ring wrapped
            ring = self._locals(group.vars["hist"])[replica]
            got = ring.gather_nd(np.array(pairs, np.int64)).numpy()
            for (slot, p), counts in zip(pairs, got, strict=True):
                out[(slot, group.cols[p])] = counts
        return out

    def set_grids(self, grids: list[tuple[int, float, float]]) -> None:
        """:meth:`set_grid` for several ``(point, lo, hi)`` at once: one write per bin count
        and replica instead of one per point (a model has dozens of histogram tensors)."""
        by_group: dict[int, tuple[list, list]] = {}
        for index, lo, hi in grids:
            group, pos = self._where(index)
            at, rows = by_group.setdefault(group.bins, ([], []))
            at += pos
            rows += [[lo, hi]] * len(pos)
        for bins, (at, rows) in by_group.items():
            indices, values = np.array(at)[:, None], np.array(rows, np.float32)
            for local in self._locals(self._groups[bins].vars["grid"]):
                local.scatter_nd_update(indices, values)


_OWN_HIST = 2.0  # row marker: its histogram is the batch's own (in the ring), not on the grid
_NO_GRID = np.array([np.inf, -np.inf], np.float32)  # a grid [lo, hi] no batch is inside


def _local_var(shape, dtype, name: str) -> tf.Variable:
    """A buffer each replica writes on its own (ON_READ); plain variable without a strategy."""
    return tf.Variable(
        tf.zeros(shape, dtype),
        trainable=False,
        name=f"amct_bridge_{name}",
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )
