"""In-graph activation statistics: wrap layer calls, summarise tensors, leave no trace.

While a calibration run is active, every target layer gets an instance attribute ``call`` that
runs the layer's own ``call`` and then, for each observed tensor (the layer's input, output, or an
inner tensor such as SeparableConv2D's depthwise output), writes a small per-batch summary into
``tf.Variable`` buffers: ``[min, max, element count, own-histogram flag]``, optional per-channel
min and max (DMQ) and, for histogram algorithms, ``bins`` counts (``tf.histogram_fixed_width``
semantics, see ``amct_bridge.quant.stats.BatchStats``). The model's step function is re-traced so
the summaries are computed inside the compiled graph; only these summaries ever reach the host.

Histograms are binned onto a per-point *grid* ``[lo, hi]`` that the host sets (the union of the
ranges seen so far) and summed in-graph, so the host merges one accumulated histogram now and
then instead of one per batch. A batch that is not inside the grid (no grid yet, a range that
grew, past ``batch_num``) gets its own histogram over its ``[min, max]`` in a ring row instead;
the host then moves the grid (``Session``).

Each tensor ("point") owns a ring of ``slots`` rows and a write counter, so several steps per
execution (``steps_per_execution``), shared layers called several times and host reads every few
batches all work: the host reads counter and rows, and turns every row written since its last read
into one ``BatchStats``. Under ``tf.distribute`` strategies the buffers are ``ON_READ`` variables:
each replica writes its own copy and the host reads every replica's rows.

:meth:`Instrumentation.remove` deletes the instance attributes again, so the layers' class
``call`` is back and nothing of ours stays in the model (no tracked variables, no config change).

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="fc")])
    >>> inst = Instrumentation(m, [Point("fc", "input", m.get_layer("fc"))])
    >>> inst.install(); _ = m.predict(np.ones((3, 4), "float32"), verbose=0); rows = inst.drain()
    >>> inst.remove(); rows[0].stats.min, rows[0].stats.max, "call" in vars(m.get_layer("fc"))
    (1.0, 1.0, False)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from amct_bridge.errors import CalibrationError
from amct_bridge.keras.layers import clamp_bounds
from amct_bridge.quant.stats import BatchStats

#: An inner tensor of a layer: computed from (layer, layer input) inside the wrapped call.
InnerFn = Callable[[object, tf.Tensor], tf.Tensor]


@dataclass
class Point:
    """One observed tensor of one layer.

    Args:
        key: sidecar / record key it belongs to ("conv1", "sep/pointwise").
        role: "input", "output" or "inner" (then ``inner`` computes it from the layer input).
        layer: the Keras layer whose call is wrapped.
        bins: histogram bins per batch (0 = min/max only).
        channel_axis: axis for per-channel min/max (None = not gathered).
        channels: size of that axis (static; sizes the buffer).
        calls: how many times the layer runs per step (shared layers, nested model reuse).
        inner: for role "inner": ``fn(layer, layer_input) -> tensor``.

    Example:
        >>> Point("fc", "input", layer=None).bins
        0
    """

    key: str
    role: str
    layer: object
    bins: int = 0
    channel_axis: int | None = None
    channels: int = 0
    calls: int = 1
    inner: InnerFn | None = None


@dataclass
class Row:
    """One batch summary read back from the graph: which point, which replica, which batch."""

    point: int
    replica: int
    step: int
    stats: BatchStats
    channel_range: np.ndarray | None = None  # [2, C]: per-channel min and max (DMQ)


class Instrumentation:
    """Installs in-graph statistics on a model's layers and reads them back.

    Args:
        model: the Keras model (its ``distribute_strategy`` decides where buffers live).
        points: the tensors to observe.
        steps_per_read: batch ends between two host reads (buffers hold that many steps).

    Example:
        >>> # see the module docstring
    """

    def __init__(self, model, points: list[Point], steps_per_read: int = 1) -> None:
        self.model = model
        self.points = list(points)
        spe = int(getattr(model, "steps_per_execution", 1) or 1)
        self.strategy = model.distribute_strategy
        self.steps_per_read = max(1, int(steps_per_read))
        self._vars: list[dict[str, tf.Variable]] = []
        with self.strategy.scope():
            # calls per point past which histograms stop accumulating (batch_num)
            self._limit = _local_var([], tf.int64, "limit")
            self.set_limit(None)
            for point in self.points:
                slots = max(1, point.calls) * spe * max(1, steps_per_read)
                self._vars.append(self._make_vars(point, slots))
        # ON_READ (distributed) variables have no scatter ops: those get whole-buffer assigns
        self._scatter = not any(
            isinstance(v, tf.distribute.DistributedValues) for d in self._vars for v in d.values()
        )
        self._last: dict[tuple[int, int], int] = {}
        self._minmax: dict[int, tuple] = {}  # id(tensor) -> (tensor, min, max) while tracing
        self._installed: list[object] = []
        self.python_calls = 0
        self.derived = 0

    # ---- graph side -------------------------------------------------------------------------

    def _make_vars(self, point: Point, slots: int) -> dict[str, tf.Variable]:
        var = _local_var
        out = {
            "count": var([1], tf.int64, "count"),
            # per call: [min, max, element count, 1 if its histogram is in the "hist" ring]
            "mm": var([slots, 4], tf.float64, "minmax"),
        }
        if point.bins:
            # one extra row: where a batch binned on the grid writes (never read), so the
            # step needs no tf.cond (two traced branches per point cost more trace time than
            # this row copy costs per step)
            out["hist"] = var([slots + 1, point.bins], tf.int32, "hist")
            out["acc"] = var([point.bins], tf.int64, "hist_acc")
            grid = var([2], tf.float32, "grid")
            for local in self.strategy.experimental_local_results(grid):
                local.assign(_NO_GRID)  # empty until the host sets one
            out["grid"] = grid
        if point.channel_axis is not None:
            out["chan"] = var([slots, 2, point.channels], tf.float32, "channel_range")
        return out

    def _summarise(self, index: int, x: tf.Tensor, source=None) -> None:
        """Write the summary of ``x`` into point ``index``'s next ring slot (in-graph).

        ``source``: the layer input when ``x`` is the output of a clamp (ReLU, ReLU6); if that
        input was summarised in this trace, ``x``'s min and max are derived from its (exact:
        the clamp is monotone) instead of reduced again.

        Few ops on purpose: every op costs trace time once and executor time every step.
        """
        point, v = self.points[index], self._vars[index]
        seen = self._minmax.get(id(source)) if source is not None else None
        raw = x
        x = tf.cast(x, tf.float32)
        if seen is not None and seen[0] is source:
            low, high = _clamp_of(point.layer)
            lo = tf.clip_by_value(seen[1], low, high)
            hi = tf.clip_by_value(seen[2], low, high)
            self.derived += 1  # per trace, for tests
        else:
            lo, hi = tf.reduce_min(x), tf.reduce_max(x)
        # the tensor itself is kept so a reused id() can never match another tensor
        self._minmax[id(raw)] = (raw, lo, hi)
        size = tf.cast(tf.size(x, out_type=tf.int64), tf.float64)
        slots = v["mm"].shape[0]
        # count has shape [1]: the slot is already the index vector a scatter wants
        written = v["count"].assign_add(_ONE)
        slot = tf.math.floormod(written - 1, slots)
        own = tf.zeros([], tf.float64)
        if point.bins:
            # Inside the host-set grid (and within batch_num): bin onto the grid and add to
            # the accumulator, nothing per batch for the host to merge. Otherwise (first
            # batches, a range that grew): the batch's own histogram over [min, max] goes to
            # the ring (equal min/max: every value into bin 0, the BatchStats contract).
            # the grid is stored as [lo, -hi] (empty: [inf, inf]): one comparison tests both
            # ends; with the batch_num gate that is one reduce_all (few ops: see above)
            bounds = v["grid"].read_value()
            within = written <= self._limit.read_value() * max(1, point.calls)
            inside = tf.reduce_all(
                tf.concat([tf.stack([lo, -hi]) >= bounds, within], 0), keepdims=False
            )
            own_range = tf.stack([lo, tf.where(hi > lo, hi, lo + 1.0)])
            value_range = tf.where(inside, bounds * _FLIP, own_range)
            hist = tf.histogram_fixed_width(x, value_range, point.bins, dtype=tf.int32)
            v["acc"].assign_add(tf.cast(hist, tf.int64) * tf.cast(inside, tf.int64))
            self._put(v["hist"], tf.where(inside, _SCRATCH * slots, slot), hist)
            own = 1.0 - tf.cast(inside, tf.float64)
        self._put(
            v["mm"], slot, tf.stack([tf.cast(lo, tf.float64), tf.cast(hi, tf.float64), size, own])
        )
        if point.channel_axis is not None:
            axes = [a for a in range(x.shape.rank) if a != point.channel_axis % x.shape.rank]
            chan = tf.stack([tf.reduce_min(x, axis=axes), tf.reduce_max(x, axis=axes)])
            self._put(v["chan"], slot, chan)

    def _put(self, var: tf.Variable, slot: tf.Tensor, row: tf.Tensor) -> None:
        """``var[slot] = row`` in-graph (a plain assign when the ring has one slot)."""
        row = tf.expand_dims(row, 0)
        if var.shape[0] == 1:
            var.assign(row)
        elif self._scatter:
            tf.raw_ops.ResourceScatterUpdate(resource=var.handle, indices=slot, updates=row)
        else:
            var.assign(tf.tensor_scatter_nd_update(var.read_value(), slot[:, None], row))

    def _wrap(self, layer, indices: list[int]) -> Callable:
        original = layer.call  # the bound class method (instance attribute not set yet)

        # Our code has no tensor-dependent Python control flow: autograph converting it would
        # only slow every trace down. The layer's own call is left to autograph as before.
        @tf.autograph.experimental.do_not_convert
        def observe(args, kwargs, outputs):
            x = args[0] if args else kwargs.get("inputs")
            if not _should_record(x):
                return
            self.python_calls += 1  # once per trace, not per batch, when the step is compiled
            for index in indices:
                role = self.points[index].role
                if role == "input":
                    self._summarise(index, _first(x))
                elif role == "output":
                    clamp = _clamp_of(self.points[index].layer) is not None
                    self._summarise(index, _first(outputs), _first(x) if clamp else None)
                else:
                    self._summarise(index, self.points[index].inner(layer, _first(x)))

        def call(*args, **kwargs):
            outputs = original(*args, **kwargs)
            observe(args, kwargs, outputs)
            return outputs

        return call

    def install(self) -> None:
        """Wrap the target layers' ``call`` (instance attributes; the class is untouched)."""
        by_layer: dict[int, list[int]] = {}
        layers: dict[int, object] = {}
        for i, point in enumerate(self.points):
            by_layer.setdefault(id(point.layer), []).append(i)
            layers[id(point.layer)] = point.layer
        for lid, indices in by_layer.items():
            layer = layers[lid]
            # object.__setattr__: bypass Keras attribute tracking, nothing gets tracked/saved
            object.__setattr__(layer, "call", self._wrap(layer, indices))
            self._installed.append(layer)

    def remove(self) -> None:
        """Restore every wrapped layer (idempotent)."""
        self._minmax.clear()
        while self._installed:
            layer = self._installed.pop()
            if "call" in vars(layer):
                object.__delattr__(layer, "call")

    # ---- host side --------------------------------------------------------------------------

    def _locals(self, index: int, name: str) -> list[tf.Variable]:
        """Point ``index``'s variable ``name``, one component per replica."""
        return list(self.strategy.experimental_local_results(self._vars[index][name]))

    def set_limit(self, steps: int | None) -> None:
        """Steps after which histograms stop accumulating in-graph (None: never).

        Rows past the limit still reach the host, which drops them (steps_per_execution can
        run past ``batch_num``); the accumulator cannot be split afterwards, hence the gate.
        """
        value = np.int64(2**40 if steps is None else max(0, int(steps)))  # x calls: no overflow
        for local in self.strategy.experimental_local_results(self._limit):
            local.assign(value)

    def set_grid(self, index: int, lo: float, hi: float) -> None:
        """Bin point ``index``'s batches inside ``[lo, hi]`` onto that grid from now on.

        Call :meth:`take_histograms` first: the accumulated counts belong to the old grid.
        """
        for local in self._locals(index, "grid"):
            local.assign(np.array([lo, -hi], np.float32))

    def grid(self, index: int) -> tuple[float, float] | None:
        """The grid point ``index`` bins onto, or None when it has none yet."""
        lo, hi = _grid_range(self._locals(index, "grid")[0])
        return (lo, hi) if lo < hi else None

    def take_histograms(self, indices) -> list[tuple[int, float, float, np.ndarray]]:
        """``(point, lo, hi, counts)`` accumulated on each replica's grid; zeroes them."""
        out = []
        for index in indices:
            if "acc" not in self._vars[index]:
                continue
            grids = self._locals(index, "grid")
            for acc, grid in zip(self._locals(index, "acc"), grids, strict=True):
                counts = acc.numpy()
                if counts.any():
                    acc.assign(np.zeros_like(counts))
                    out.append((index, *_grid_range(grid), counts))
        return out

    def drain(self) -> list[Row]:
        """Read every summary written since the last drain (every replica's rows; the
        histogram ring only of points that have rows binned on their own range).

        Eager reads, a few microseconds each: a tf.function reading them all in one call cost
        ~0.15 s to trace, more than a short run's reads altogether.
        """
        rows: list[Row] = []
        for index, v in enumerate(self._vars):
            parts = {
                name: self._locals(index, name)
                for name in ("count", "mm", "chan", "hist")
                if name in v
            }
            for rep, (count, mm) in enumerate(zip(parts["count"], parts["mm"], strict=True)):
                arr = {"count": count.numpy(), "mm": mm.numpy()}
                if "chan" in parts:
                    arr["chan"] = parts["chan"][rep].numpy()
                hist_var = parts["hist"][rep] if "hist" in parts else None
                rows.extend(self._rows_of(index, rep, arr, hist_var))
        return rows

    def _rows_of(self, index: int, replica: int, arr: dict, hist_var) -> list[Row]:
        count = int(arr["count"][0])
        last = self._last.get((index, replica), 0)
        slots = arr["mm"].shape[0]
        if count - last > slots:
            raise CalibrationError(
                f"layer {self.points[index].key!r}: {count - last} batch summaries of its "
                f"{self.points[index].role} since the last read, but only {slots} fit: was the "
                "model called outside fit/evaluate/predict while calibrating?"
            )
        self._last[(index, replica)] = count
        rows = []
        chan = arr.get("chan")
        steps = range(last, count)
        # read the ring only if some row's histogram is there (rare once a grid is set)
        own = hist_var is not None and any(arr["mm"][s % slots][3] for s in steps)
        hist = hist_var.numpy() if own else None
        for step in steps:
            slot = step % slots
            lo, hi, size, has_hist = arr["mm"][slot]
            stats = BatchStats(
                count=int(size),
                min=float(lo),
                max=float(hi),
                hist=hist[slot] if has_hist else None,
                channel_absmax=np.abs(chan[slot]).max(axis=0) if chan is not None else None,
            )
            rows.append(Row(index, replica, step, stats, chan[slot] if chan is not None else None))
        return rows


_ONE = np.ones(1, np.int64)
_SCRATCH = np.ones(1, np.int64)  # times the ring size: the hist ring's scratch row
_FLIP = np.array([1.0, -1.0], np.float32)  # [lo, -hi] <-> [lo, hi]
_NO_GRID = np.array([np.inf, np.inf], np.float32)  # [lo, -hi] no batch is inside


def _local_var(shape, dtype, name: str) -> tf.Variable:
    """A buffer each replica writes on its own (ON_READ); plain variable without a strategy."""
    return tf.Variable(
        tf.zeros(shape, dtype),
        trainable=False,
        name=f"amct_bridge_{name}",
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )


def _grid_range(grid: tf.Variable) -> tuple[float, float]:
    """``(lo, hi)`` of a grid variable (stored as ``[lo, -hi]``)."""
    lo, neg_hi = grid.numpy()
    return float(lo), -float(neg_hi)


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
