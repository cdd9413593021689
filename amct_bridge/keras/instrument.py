"""In-graph activation statistics: wrap layer calls, summarise tensors, leave no trace.

While a calibration run is active, every target layer gets an instance attribute ``call`` that
runs the layer's own ``call`` and then, for each observed tensor (the layer's input, output, or an
inner tensor such as SeparableConv2D's depthwise output), writes a small per-batch summary into
``tf.Variable`` buffers: ``[min, max, element count]``, an optional ``bins``-bin histogram over
[min, max] (``tf.histogram_fixed_width`` semantics, see ``amct_bridge.quant.stats.BatchStats``)
and optional per-channel min and max (DMQ). The model's step function is re-traced so the
summaries are computed inside the compiled graph; only these summaries ever reach the host.

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
            for point in self.points:
                slots = max(1, point.calls) * spe * max(1, steps_per_read)
                self._vars.append(self._make_vars(point, slots))
        # ON_READ (distributed) variables have no scatter ops: those get whole-buffer assigns
        self._scatter = not any(
            isinstance(v, tf.distribute.DistributedValues) for d in self._vars for v in d.values()
        )
        self._last: dict[tuple[int, int], int] = {}
        self._installed: list[object] = []
        self.python_calls = 0
        self._fetch = None

    # ---- graph side -------------------------------------------------------------------------

    def _make_vars(self, point: Point, slots: int) -> dict[str, tf.Variable]:
        def var(shape, dtype, name):
            return tf.Variable(
                tf.zeros(shape, dtype),
                trainable=False,
                name=f"amct_bridge_{name}",
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )

        out = {
            "count": var([1], tf.int64, "count"),
            "mm": var([slots, 3], tf.float64, "minmax"),
        }
        if point.bins:
            out["hist"] = var([slots, point.bins], tf.int32, "hist")
        if point.channel_axis is not None:
            out["chan"] = var([slots, 2, point.channels], tf.float32, "channel_range")
        return out

    def _summarise(self, index: int, x: tf.Tensor) -> None:
        """Write the summary of ``x`` into point ``index``'s next ring slot (in-graph).

        Few ops on purpose: every op costs trace time once and executor time every step.
        """
        point, v = self.points[index], self._vars[index]
        x = tf.cast(x, tf.float32)
        lo, hi = tf.reduce_min(x), tf.reduce_max(x)
        size = tf.cast(tf.size(x, out_type=tf.int64), tf.float64)
        slots = v["mm"].shape[0]
        # count has shape [1]: the slot is already the index vector a scatter wants
        slot = tf.math.floormod(v["count"].assign_add(_ONE) - 1, slots)
        self._put(v["mm"], slot, tf.stack([tf.cast(lo, tf.float64), tf.cast(hi, tf.float64), size]))
        if point.bins:
            # equal min/max: every value into bin 0 (the BatchStats contract)
            top = tf.where(hi > lo, hi, lo + 1.0)
            hist = tf.histogram_fixed_width(x, tf.stack([lo, top]), point.bins, dtype=tf.int32)
            self._put(v["hist"], slot, hist)
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

        def call(*args, **kwargs):
            outputs = original(*args, **kwargs)
            x = args[0] if args else kwargs.get("inputs")
            if not _should_record(x):
                return outputs
            self.python_calls += 1  # once per trace, not per batch, when the step is compiled
            for index in indices:
                role = self.points[index].role
                if role == "input":
                    self._summarise(index, _first(x))
                elif role == "output":
                    self._summarise(index, _first(outputs))
                else:
                    self._summarise(index, self.points[index].inner(layer, _first(x)))
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
        while self._installed:
            layer = self._installed.pop()
            if "call" in vars(layer):
                object.__delattr__(layer, "call")

    # ---- host side --------------------------------------------------------------------------

    def _components(self) -> list[list[tf.Variable]]:
        """Per point, per replica: the local variables, flattened [count, mm, hist?, chan?]."""
        out = []
        for v in self._vars:
            per_var = [
                list(self.strategy.experimental_local_results(v[k])) for k in _ORDER if k in v
            ]
            out.append(per_var)
        return out

    def drain(self) -> list[Row]:
        """Read every summary written since the last drain (one host transfer for all points)."""
        comps = self._components()
        flat = [c for per_var in comps for replicas in per_var for c in replicas]
        if self._fetch is None:
            # one graph call reads every buffer (one transfer off an accelerator); autograph
            # off: converting this lambda cost more than many later reads
            self._fetch = tf.function(lambda: [c.read_value() for c in flat], autograph=False)
        values = [t.numpy() for t in self._fetch()]
        rows: list[Row] = []
        pos = 0
        for index, per_var in enumerate(comps):
            names = [k for k in _ORDER if k in self._vars[index]]
            n_rep = len(per_var[0])
            arrays = {}
            for name in names:
                arrays[name] = values[pos : pos + n_rep]
                pos += n_rep
            for rep in range(n_rep):
                rows.extend(self._rows_of(index, rep, {k: a[rep] for k, a in arrays.items()}))
        return rows

    def _rows_of(self, index: int, replica: int, arr: dict[str, np.ndarray]) -> list[Row]:
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
        for step in range(last, count):
            slot = step % slots
            lo, hi, size = arr["mm"][slot]
            stats = BatchStats(
                count=int(size),
                min=float(lo),
                max=float(hi),
                # int32 view of the buffer row: the observers convert it once, copying here
                # per row cost more main-thread time than the step it overlaps
                hist=arr["hist"][slot] if "hist" in arr else None,
                channel_absmax=np.abs(chan[slot]).max(axis=0) if chan is not None else None,
            )
            rows.append(Row(index, replica, step, stats, chan[slot] if chan is not None else None))
        return rows


_ORDER = ("count", "mm", "hist", "chan")
_ONE = np.ones(1, np.int64)


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
