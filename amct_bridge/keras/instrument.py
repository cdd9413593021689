"""In-graph activation statistics: wrap layer calls, summarise tensors, leave no trace.

While a calibration pass is active, the target layers get an instance attribute ``call`` that
runs the layer's own ``call`` and then summarises each observed tensor (the layer's input,
output, an inner tensor such as SeparableConv2D's depthwise output, or its output before a
fused activation, which an instance ``activation`` attribute hands over): ``[min, max, element
count]``, optional per-channel min and max (DMQ) and, for histogram algorithms, ``bins`` counts
(``tf.histogram_fixed_width`` semantics, see ``amct_bridge.quant.stats.BatchStats``; with
histograms, one native op of :mod:`amct_bridge.keras.native` computes all of it where that op
could be built, stock TF ops otherwise, with the same results). The
model's step method (``train_step`` / ``test_step`` / ``predict_step``) is wrapped too: the
summaries of one step are collected while it is traced and written to ``tf.Variable`` buffers
in one go when the step returns (a few ops per step instead of a dozen per tensor: every op
costs trace time once and executor time every step). The step function is re-traced, so all of
this runs inside the compiled graph; only the summaries ever reach the host. Layers run outside
a wrapped step (another pass's step, an eager call in a callback) are not observed.

The buffers these writes fill, and the host reads of the core's
:class:`~amct_bridge.calibration.protocol.Instrumentation` protocol, are in
:mod:`amct_bridge.keras.instrument_buffers` (ring layout, histogram grids, replicas).

:meth:`Instrumentation.remove` deletes the instance attributes again, so the class methods are
back and nothing of ours stays in the model (no tracked variables, no config change).

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="fc")])
    >>> inst = Instrumentation(m, [Point("fc", "input", m.get_layer("fc"))])
    >>> inst.install(); m.make_predict_function(force=True)
    >>> _ = m.predict(np.ones((3, 4), "float32"), verbose=0); rows = inst.drain()
    >>> inst.remove(); rows[0].stats.min, rows[0].stats.max, "call" in vars(m.get_layer("fc"))
    (1.0, 1.0, False)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from amct_bridge.calibration.protocol import Point, Row
from amct_bridge.keras import native
from amct_bridge.keras.instrument_buffers import _NO_GRID, RingBuffers, _Group
from amct_bridge.keras.layers import clamp_bounds

__all__ = ["STEP_METHODS", "Instrumentation", "Point", "Row"]

#: An inner tensor of a layer: computed from (layer, layer input) inside the wrapped call.
InnerFn = Callable[[object, tf.Tensor], tf.Tensor]

#: The step methods a calibration pass can wrap (one per Keras step function).
STEP_METHODS = ("train_step", "test_step", "predict_step")


@dataclass
class _Entry:
    """One column's summary in the step being traced."""

    lo: tf.Tensor
    hi: tf.Tensor
    size: tf.Tensor
    inside: tf.Tensor | None = None
    hist: tf.Tensor | None = None
    chan: tf.Tensor | None = None


class _Frame:
    """What one step (of one replica) summarised so far, in the graph being traced."""

    def __init__(self, graph, step, parent: _Frame | None = None) -> None:
        self.graph = graph
        self.step = step  # this step's number (the batch_num gate), None without histograms
        self.parent = parent  # the step's frame, for a frame inside a control-flow branch
        self.writes = 0  # ring rows this step writes (traced: counts both branches of a cond)
        self.entries: dict[int, _Entry] = {}
        self.grids: dict[int, tuple[list, list, list]] = {}  # bins -> rows, lows, highs
        self.minmax: dict[int, tuple] = {}  # id(tensor) -> (tensor, min, max)
        self._consts: dict[tuple, tf.Tensor] = {}

    def const(self, value, dtype=tf.float32) -> tf.Tensor:
        """One Const op per value and step, not one per use (each op costs trace time)."""
        key = (repr(value), dtype)
        if key not in self._consts:
            self._consts[key] = tf.constant(value, dtype)
        return self._consts[key]


class Instrumentation(RingBuffers):
    """Installs in-graph statistics on a model's layers and reads them back.

    Args:
        model: the Keras model (its ``distribute_strategy`` decides where buffers live).
        points: the tensors to observe.
        steps_per_read: batch ends between two host reads (buffers hold that many steps).
        steps: the model's step methods whose runs are observed (default: all three).
        native: use the native ops of :mod:`amct_bridge.keras.native` where they could be
            built (not in a step XLA compiles: it cannot compile them).

    Example:
        >>> # see the module docstring
    """

    def __init__(
        self,
        model,
        points: list[Point],
        steps_per_read: int = 1,
        steps: tuple[str, ...] = STEP_METHODS,
        native: bool = True,
    ) -> None:
        super().__init__(model, points, steps_per_read)
        self.model = model
        self.native = native
        self.steps = tuple(steps)
        self._local = threading.local()  # per replica thread: the frames of running steps
        self._installed: list[tuple[object, str, object]] = []
        self.python_calls = 0
        self.derived = 0

    def reset(self) -> None:
        """Buffers as new and the trace counters at 0, for a traced step run again."""
        super().reset()
        self.python_calls = self.derived = 0

    # ---- graph side -------------------------------------------------------------------------

    def _frames(self) -> list[_Frame]:
        if not hasattr(self._local, "frames"):
            self._local.frames = []
        return self._local.frames

    def wrap_step(self, step_fn) -> Callable:
        """``step_fn`` made an observed step: the layers it runs are summarised and the
        summaries written to the buffers when it returns (trace it in a ``tf.function``).

        Example:
            >>> # Session's direct path: tf.function(inst.wrap_step(forward), autograph=False)
        """

        @tf.autograph.experimental.do_not_convert
        def step(*args, **kwargs):
            if tf.distribute.get_replica_context() is None:
                return step_fn(*args, **kwargs)
            number = self._steps.assign_add(1) if self._steps is not None else None
            frame = _Frame(_graph(), number)
            frames = self._frames()
            frames.append(frame)
            try:
                outputs = step_fn(*args, **kwargs)
            finally:
                frames.pop()
            self._flush(frame)
            # more than one write per step: the host reads more often (see read_every)
            self.writes_per_step = max(self.writes_per_step, frame.writes)
            return outputs

        return step

    def _wrap(self, layer, indices: list[int]) -> Callable:
        original = layer.call  # the bound class method (instance attribute not set yet)

        # Our code has no tensor-dependent Python control flow: autograph converting it would
        # only slow every trace down. The layer's own call is left to autograph as before.
        @tf.autograph.experimental.do_not_convert
        def observe(args, kwargs, outputs):
            frames = self._frames()
            x = args[0] if args else kwargs.get("inputs")
            if not frames or not _should_record(x):
                return  # outside an observed step, or a symbolic call
            self.python_calls += 1  # once per trace, not per batch, when the step is compiled
            frame, graph = frames[-1], _graph()
            solo = graph is not frame.graph  # in a control-flow branch: write it there
            if solo:
                frame = _Frame(graph, frame.step, parent=frame)
            for index in indices:
                role = self.points[index].role
                if role == "input":
                    self._summarise(frame, index, _first(x))
                elif role == "output":
                    clamp = _clamp_of(self.points[index].layer) is not None
                    self._summarise(frame, index, _first(outputs), _first(x) if clamp else None)
                elif role == "preactivation":  # what the layer's activation was called on
                    pre = self._captured().pop(id(layer), None)
                    if pre is not None:
                        self._summarise(frame, index, pre)
                else:
                    self._summarise(frame, index, self.points[index].inner(layer, _first(x)))
            if solo:
                self._flush(frame)

        def call(*args, **kwargs):
            outputs = original(*args, **kwargs)
            observe(args, kwargs, outputs)
            return outputs

        return call

    def _captured(self) -> dict[int, tf.Tensor]:
        """id(layer) -> the tensor its activation was last called on (this thread's traces)."""
        if not hasattr(self._local, "preactivation"):
            self._local.preactivation = {}
        return self._local.preactivation

    def _capture(self, layer) -> Callable:
        """``layer.activation`` that also keeps its argument for the layer's wrapped call
        (Keras' Dense and convolutions end in ``self.activation(outputs)``): the output before
        the activation at no extra op, not a second matmul / convolution."""
        activation = layer.activation

        def capture(x, *args, **kwargs):
            if self._frames():  # inside an observed step: the wrapped call reads it next
                self._captured()[id(layer)] = x
            return activation(x, *args, **kwargs)

        return capture

    def _summarise(self, frame: _Frame, index: int, x: tf.Tensor, source=None) -> None:
        """Add the summary of ``x`` to ``frame`` (written when the step ends).

        ``source``: the layer input when ``x`` is the output of a clamp (ReLU, ReLU6); if that
        input was summarised in this step, ``x``'s min and max are derived from its (exact:
        the clamp is monotone) instead of reduced again.
        """
        point = self.points[index]
        free = [c for c in self._cols[index] if c not in frame.entries]
        if not free:  # called more often than planned: write this step's summaries now
            self._flush(frame)
            free = self._cols[index]
        col = free[0]
        raw = x
        x = tf.cast(x, tf.float32)
        fused = None
        if point.bins:
            rows, lows, highs = self._grid(frame, point.bins)
            at = self._groups[point.bins].pos(col)
            # one native op for min, max, count and histogram where it could be built
            fused = native.summary(x, rows[at], point.bins) if self.native else None
        seen = frame.minmax.get(id(source)) if source is not None else None
        size = None
        if fused is not None:
            lo, hi, size, inside, hist = fused
        elif seen is not None and seen[0] is source:
            low, high = _clamp_of(point.layer)
            lo, hi = _clamp(frame, seen[1], low, high), _clamp(frame, seen[2], low, high)
            self.derived += 1  # per trace, for tests
        elif self.native and (one_pass := native.min_max(x)) is not None:
            lo, hi, size = one_pass
        else:
            rank = x.shape.rank  # one shared axes constant (None: unknown rank, let TF build it)
            axes = frame.const(list(range(rank)), tf.int32) if rank is not None else None
            lo, hi = tf.reduce_min(x, axes), tf.reduce_max(x, axes)
        # the tensor itself is kept so a reused id() can never match another tensor
        frame.minmax[id(raw)] = (raw, lo, hi)
        entry = _Entry(lo, hi, size if size is not None else tf.size(x, out_type=tf.int64))
        if fused is not None:
            entry.inside, entry.hist = inside, hist
        elif point.bins:
            # The same as the native op with stock TF ops. Inside the host-set grid (and
            # within batch_num): bin onto the grid. Otherwise (first batches, a range that
            # grew): the batch's own histogram over [min, max] (equal min/max: every value
            # into bin 0, the BatchStats contract), which also goes to the ring. Both are
            # added to the accumulator when the step ends (no mask, no tf.cond); the host
            # subtracts the own ones again.
            entry.inside = tf.logical_and(lo >= lows[at], hi <= highs[at])
            # NaN or Inf (min/max NaN or infinite, then hi - lo < inf fails): histogram
            # nothing over [0, 1] instead; histogram_fixed_width raises on NaN and bins an
            # infinite range wrongly, and the host names the layer and batch anyway
            ok = hi - lo < frame.const(np.inf)
            # a constant tensor: [lo, lo + 1], or [lo, next float] where lo + 1 == lo
            # (|lo| >= 2^24): an empty range would divide by a zero bin width
            up = lo + frame.const(1.0)
            up = tf.where(up > lo, up, tf.math.nextafter(lo, frame.const(np.inf)))
            own = tf.stack([lo, tf.where(hi > lo, hi, up)])
            own = tf.where(ok, own, frame.const([0.0, 1.0]))
            n = tf.where(ok, entry.size, frame.const(0, tf.int64))
            values = tf.reshape(x, frame.const([-1], tf.int32))
            values = tf.slice(
                values, frame.const([0], tf.int64), tf.reshape(n, frame.const([1], tf.int32))
            )
            entry.hist = tf.histogram_fixed_width(
                values,
                tf.where(entry.inside, rows[at], own),
                frame.const(point.bins, tf.int32),
                dtype=tf.int32,
            )
        if point.channel_axis is not None:
            axes = [a for a in range(x.shape.rank) if a != point.channel_axis % x.shape.rank]
            entry.chan = tf.stack([tf.reduce_min(x, axis=axes), tf.reduce_max(x, axis=axes)])
        frame.entries[col] = entry

    def _grid(self, frame: _Frame, bins: int) -> tuple[list, list, list]:
        """Each column's grid ``[lo, hi]`` row, low and high end, read once per step; past
        ``batch_num`` no grid (no batch is inside)."""
        if bins not in frame.grids:
            grid = self._groups[bins].vars["grid"].read_value()
            within = frame.step <= self._limit.read_value()
            grid = tf.where(within, grid, frame.const(_NO_GRID))
            lows, highs = tf.unstack(grid, axis=1)
            frame.grids[bins] = (tf.unstack(grid), tf.unstack(lows), tf.unstack(highs))
        return frame.grids[bins]

    def _flush(self, frame: _Frame) -> None:
        """Write the frame's summaries into the next ring row (a few ops per buffer)."""
        entries, frame.entries = frame.entries, {}
        if not entries:
            return
        (frame.parent or frame).writes += 1
        cols = sorted(entries)
        es = [entries[c] for c in cols]
        written = self._count.assign_add(1)
        slot = tf.math.floormod(written - 1, self.slots)
        # marker 1 (written), 2 where the histogram is the batch's own (in the ring)
        marker = np.ones(len(cols), np.float64)
        binned = [i for i, e in enumerate(es) if e.inside is not None]
        if binned:
            own = tf.cast(tf.logical_not(tf.stack([es[i].inside for i in binned])), tf.float64)
            marker = marker + tf.scatter_nd(np.array(binned)[:, None], own, [len(cols)])
        row = tf.stack(
            [
                tf.cast(tf.stack([e.lo for e in es]), tf.float64),
                tf.cast(tf.stack([e.hi for e in es]), tf.float64),
                tf.cast(tf.stack([e.size for e in es]), tf.float64),
                marker,
            ],
            axis=1,
        )
        if len(cols) < len(self._col_point):
            row = tf.scatter_nd(np.array(cols)[:, None], row, [len(self._col_point), 4])
        at = tf.reshape(slot, [1, 1])
        self._put(self._mm, at, tf.expand_dims(row, 0))
        for group in self._groups.values():
            present = [(group.pos(c), entries[c]) for c in cols if c in group]
            if present:
                self._flush_group(frame, group, present, slot)
        for col in cols:
            if col in self._chan:
                self._put(self._chan[col], at, tf.expand_dims(entries[col].chan, 0))

    def _flush_group(self, frame: _Frame, group: _Group, present: list, slot) -> None:
        """Every histogram into the accumulator; the batches' own ones also into the ring
        (binned ones into its never-read scratch row: no tf.cond, see _make_vars)."""
        pos = np.array([p for p, _ in present], np.int64)
        inside = tf.stack([e.inside for _, e in present])
        scratch = frame.const(self.slots, tf.int64)
        index = tf.stack([tf.where(inside, scratch, slot), pos], 1)
        hist, acc = group.vars["hist"], group.vars["acc"]
        if self._scatter:
            # one small scatter per column: no stacked copy of all histograms
            shape = frame.const([1, group.bins], tf.int32)
            for (p, entry), at in zip(present, tf.split(index, len(present)), strict=True):
                row = tf.reshape(entry.hist, shape)
                tf.raw_ops.ResourceScatterNdUpdate(ref=hist.handle, indices=at, updates=row)
                at_acc = frame.const([[p]], tf.int64)
                tf.raw_ops.ResourceScatterNdAdd(ref=acc.handle, indices=at_acc, updates=row)
            return
        hists = tf.stack([e.hist for _, e in present])
        hist.assign(tf.tensor_scatter_nd_update(hist.read_value(), index, hists))
        acc.assign(tf.tensor_scatter_nd_add(acc.read_value(), pos[:, None], hists))

    def _put(self, var: tf.Variable, index, rows: tf.Tensor) -> None:
        """``var[index] = rows`` in-graph, ``index`` an ``[n, k]`` matrix of leading indices
        (a one-row buffer gets a plain assign)."""
        if var.shape[0] == 1:
            var.assign(rows)
        elif self._scatter:
            tf.raw_ops.ResourceScatterNdUpdate(ref=var.handle, indices=index, updates=rows)
        else:
            var.assign(tf.tensor_scatter_nd_update(var.read_value(), index, rows))

    def due(self) -> list[int]:
        """Points whose accumulator must be taken before the next read: a bin could
        otherwise pass int32 (every count since the last take in one bin, plus a full
        ring of batches twice the largest seen)."""
        out = set()
        for (_, col), added in self._added.items():
            if added + 2 * self.slots * self._largest.get(col, 0) >= _ACC_LIMIT:
                out.add(self._col_point[col])
        return sorted(out)

    def install(self) -> None:
        """Wrap the target layers' ``call`` and the model's step methods (instance
        attributes; the classes are untouched). Re-make the step function afterwards."""
        if self.native:
            native.load()  # build or load the native ops now, not in the middle of a trace
        by_layer: dict[int, list[int]] = {}
        layers: dict[int, object] = {}
        for i, point in enumerate(self.points):
            by_layer.setdefault(id(point.layer), []).append(i)
            layers[id(point.layer)] = point.layer
        for lid, indices in by_layer.items():
            self._set(layers[lid], "call", self._wrap(layers[lid], indices))
            pre = any(self.points[i].role == "preactivation" for i in indices)
            if pre and callable(getattr(layers[lid], "activation", None)):
                self._set(layers[lid], "activation", self._capture(layers[lid]))
        for name in self.steps:
            self._set(self.model, name, self.wrap_step(getattr(self.model, name)))

    def _set(self, obj, name: str, value) -> None:
        self._installed.append((obj, name, vars(obj).get(name, _MISSING)))
        # object.__setattr__: bypass Keras attribute tracking, nothing gets tracked/saved
        object.__setattr__(obj, name, value)

    def remove(self) -> None:
        """Restore every wrapped layer and step method (idempotent)."""
        while self._installed:
            obj, name, before = self._installed.pop()
            if before is _MISSING:
                if name in vars(obj):
                    object.__delattr__(obj, name)
            else:
                object.__setattr__(obj, name, before)


_MISSING = object()
_ACC_LIMIT = 2**31 - 1  # int32 histogram accumulator (see Instrumentation.due)


def _graph():
    """The graph ops are being added to (a FuncGraph while tracing; eager: the global one)."""
    return tf.compat.v1.get_default_graph()


def _clamp(frame: _Frame, t: tf.Tensor, low: float, high: float) -> tf.Tensor:
    """``min(max(t, low), high)`` with no op for an infinite bound."""
    t = tf.maximum(t, frame.const(low)) if np.isfinite(low) else t
    return tf.minimum(t, frame.const(high)) if np.isfinite(high) else t


def _clamp_of(layer) -> tuple[float, float] | None:
    return clamp_bounds(layer) if layer is not None else None


def _first(x):
    """The first tensor of a (possibly nested) layer input/output."""
    while isinstance(x, (list, tuple)):
        x = x[0]
    if isinstance(x, dict):
        return _first(next(iter(x.values())))
    return x


def _should_record(x) -> bool:
    """Record only real tensors in a replica context (skip symbolic / cross-replica traces)."""
    x = _first(x)
    if not isinstance(x, (tf.Tensor, tf.Variable)) and not hasattr(x, "numpy"):
        return False
    return tf.distribute.get_replica_context() is not None
