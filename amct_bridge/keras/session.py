"""One calibration session of ``QuantCalibration``: passes, observers, output.

A session lives from the start of a run (fit / evaluate / predict) to its end (or across runs with
``accumulate=True``). Inside it, each *pass* instruments one step function (train / test /
predict), re-traces it, feeds the per-batch summaries read back from the graph to one observer per
observed tensor, and puts the original step function back when the pass ends or ``batch_num``
batches were seen. :meth:`Session.write` turns observers + weights into the record, sidecar and
(optionally) frozen graph, and writes them only when every piece was built.

Example:
    >>> import keras, numpy as np
    >>> from amct_bridge.config import QuantConfig
    >>> x = keras.Input((4,))
    >>> m = keras.Model(x, keras.layers.Dense(2, name="fc")(x))
    >>> s = Session(m, QuantConfig(), batch_num=None); s.new_run()
    >>> [(t.key, t.kind) for t in s.plan.targets], [o.point.role for o in s.observed]
    ([('fc', 'Dense')], ['input', 'output'])
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from amct_bridge.config import LayerQuantConfig, QuantConfig
from amct_bridge.errors import CalibrationError
from amct_bridge.keras import layers as registry
from amct_bridge.keras.instrument import Instrumentation, Point
from amct_bridge.keras.plan import Plan, Target, make_plan, observer_settings
from amct_bridge.keras.record_builder import build_outputs, write_outputs
from amct_bridge.keras.weights import input_channels
from amct_bridge.quant.factors import bits_of
from amct_bridge.quant.observers import make_observer

#: Settings of tensors only the sidecar reports (see Session._settings_for).
_SIDECAR_ONLY = LayerQuantConfig(algorithm="minmax", options={})
#: Host reads happen at most every this many batch ends (fewer transfers, same data)...
_READ_EVERY = 16
#: ...as long as the ring buffers of all histograms stay below this many bytes.
_HIST_BUDGET = 32 * 2**20


@dataclass
class Observed:
    """One observed tensor: its point, observer and (DMQ) running per-channel min and max."""

    point: Point
    observer: object
    channel_range: np.ndarray | None = None  # [2, C]
    settings: tuple = ()  # (algorithm, options, act_type): points are shared only if equal
    folded_bn: str | None = None  # output of a layer whose BN is folded: that BN's name


class Session:
    """Statistics of one calibration session (see the module docstring)."""

    def __init__(self, model, config: QuantConfig, batch_num: int | None) -> None:
        self.model = model
        self.config = config
        self.batch_num = batch_num
        self.plan: Plan | None = None
        self.observed: list[Observed] = []
        self.tensors: dict[tuple[str, str], int] = {}
        self.batches = 0
        self._inst: Instrumentation | None = None
        self._mode: str | None = None
        self._saved_fn = None
        self._pass_base = 0
        self._pass_batches = 0  # upper bound from batch hooks (decides when to stop)
        self._pass_seen = 0  # exact, from the rows read back
        self._begin = 0
        self._ends = 0
        self.python_calls = 0  # wrapper bodies run in Python (traces), for tests
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list = []
        self._spans: dict[int, tuple[float, float]] = {}  # point -> union of batch ranges

    # ---- set-up -------------------------------------------------------------------------------

    def new_run(self) -> None:
        """Start a run: plan the model on first use (it is built by now)."""
        if self.plan is None:
            self.plan = make_plan(self.model, self.config)
            self._make_points()
        self._pass_base = self.batches

    def _make_points(self) -> None:
        by_tensor: dict[str, int] = {}
        by_layer: dict[str, list[Target]] = {}
        # tensor id -> settings of the first record entry that reads it: only there does the
        # algorithm's clip range matter (it becomes scale_d)
        self._readers: dict[str, LayerQuantConfig] = {}
        for target in self.plan.targets:
            by_layer.setdefault(target.layer_key, []).append(target)
            if target.quantized and target.tensors[0] is not None:
                self._readers.setdefault(target.tensors[0], target.config)
        for parts in by_layer.values():
            first, last = parts[0], parts[-1]
            layer_parts = registry.quant_parts(first.layer)
            self._add(first, "input", layer_parts[0] if layer_parts else None, by_tensor)
            if first.kind == "SeparableConv2D":  # the depthwise output feeds the pointwise op
                self._add(last, "inner", layer_parts[-1], by_tensor, _depthwise_output)
            self._add(last, "output", None, by_tensor)

    def _settings_for(self, target: Target, role: str) -> LayerQuantConfig:
        """The layer's own settings where a record entry reads the tensor, else min/max.

        A tensor that no quantized layer reads (a conv output before its ReLU, a model output)
        only feeds the sidecar, so it gets min/max (raw extremes) instead of a histogram and a
        clip search: the record is the same, the callback cheaper. Its producer uses the
        reader's settings so both share one observed point.
        """
        if target.quantized and role in ("input", "inner"):
            return target.config
        tid = target.tensors[0] if role == "input" else target.tensors[1]
        reader = self._readers.get(tid) if tid is not None else None
        return reader if reader is not None else _SIDECAR_ONLY

    def _add(self, target: Target, role: str, part, by_tensor: dict, inner=None) -> None:
        """Add the point of one tensor, or reuse the point already observing the same tensor."""
        cfg = self._settings_for(target, role)
        dmq = cfg.migration_strength is not None and part is not None and part.has_weights
        tid = {"input": target.tensors[0], "output": target.tensors[1]}.get(role)
        shared = by_tensor.get(tid) if tid is not None else None
        if shared is not None and self._same_settings(shared, cfg):
            point = self.observed[shared].point
            if dmq and point.channel_axis is None:  # the consumer needs channel ranges too
                point.channel_axis = _channel_axis(target.layer)
                point.channels = input_channels(target.layer, part)
            self.tensors[(target.layer_key, role)] = shared
            return
        observer = make_observer(
            cfg.algorithm,
            num_bits=bits_of(cfg.act_type),
            activation_offset=self.config.activation_offset,
            name=f"layer {target.layer_key!r} {role}",
            **cfg.options,
        )
        axis = _channel_axis(target.layer) if dmq else None
        # a folded BN's output is the target's output: observe it there (wrap the BN layer)
        layer = target.output_layer if role == "output" else target.layer
        point = Point(
            key=target.layer_key,
            role=role,
            layer=layer,
            bins=int(observer.bins),
            channel_axis=axis,
            channels=input_channels(target.layer, part) if dmq else 0,
            calls=target.calls,
            inner=inner,
        )
        self.tensors[(target.layer_key, role)] = len(self.observed)
        if tid is not None:
            by_tensor[tid] = len(self.observed)
        folded = target.bn.name if role == "output" and target.bn is not None else None
        self.observed.append(
            Observed(point, observer, settings=observer_settings(cfg), folded_bn=folded)
        )

    def _same_settings(self, index: int, cfg) -> bool:
        return self.observed[index].settings == observer_settings(cfg)

    # ---- passes -------------------------------------------------------------------------------

    def start_pass(self, mode: str) -> None:
        """Instrument the ``mode`` step function (train / test / predict) and re-trace it."""
        if self._inst is not None or self._done():
            return
        points = [o.point for o in self.observed]
        spe = int(getattr(self.model, "steps_per_execution", 1) or 1)
        per_read = sum(4 * p.bins * max(1, p.calls) * spe for p in points)
        every = max(1, min(_READ_EVERY, _HIST_BUDGET // max(1, per_read)))
        # XLA has no histogram op: a histogram pass's step runs without it (the user's
        # compiled step comes back when the pass ends); an XLA step cannot run our native ops
        jit_setting = getattr(self.model, "jit_compile", False)
        jit = bool(jit_setting)
        hist = any(p.bins for p in points)
        self._inst = Instrumentation(
            self.model, points, every, steps=(f"{mode}_step",), native=hist or not jit
        )
        if self.batch_num is not None:
            self._inst.set_limit(self.batch_num - self.batches)
        for index, (lo, hi) in self._spans.items():  # accumulate=True: earlier passes' ranges
            if points[index].bins and lo < hi:
                self._inst.set_grid(index, *_float32_outward(lo, hi))
        self._inst.install()
        self._mode, self._pass_base = mode, self.batches
        self._pass_batches = self._pass_seen = self._ends = 0
        self._saved_fn = getattr(self.model, f"{mode}_function")
        if jit and hist:
            self.model.jit_compile = False
        try:
            getattr(self.model, f"make_{mode}_function")(force=True)
        finally:
            if jit and hist:
                self.model.jit_compile = jit_setting

    def batch_begin(self, mode: str, batch: int) -> None:
        """Note the first step of this execution (steps_per_execution may cover several)."""
        self._begin = batch

    def batch_end(self, mode: str, batch: int) -> None:
        """Count the steps just run; read summaries when buffers may fill or batch_num is hit."""
        if self._inst is None or mode != self._mode:
            return
        self._pass_batches += max(1, batch - self._begin + 1)
        self._ends += 1
        done = self.batch_num is not None and self._pass_base + self._pass_batches >= self.batch_num
        # the first read comes early: it gives the histogram points their grids
        if done or self._ends == 1 or self._ends % self._inst.read_every == 0:
            self._drain()
        if done:
            self.stop_pass(mode)

    def stop_pass(self, mode: str) -> None:
        """Read what is left, remove the instrumentation and put the original step function back."""
        if self._inst is None or mode != self._mode:
            return
        try:
            self._drain(final=True)
        finally:
            self.stop_all()
        self._settle()

    def stop_all(self) -> None:
        """Remove instrumentation and restore the step function (idempotent; used on errors)."""
        if self._inst is None:
            return
        self._inst.remove()
        self.python_calls += self._inst.python_calls
        setattr(self.model, f"{self._mode}_function", self._saved_fn)
        self._inst, self._saved_fn = None, None
        self.batches = self._pass_base + self._pass_seen
        if self.batch_num is not None:
            self.batches = min(self.batches, self.batch_num)

    def _done(self) -> bool:
        return self.batch_num is not None and self.batches >= self.batch_num

    def _drain(self, final: bool = False) -> None:
        """Read the graph's summaries, check them, and hand them to the observer thread.

        Histogram points: rows binned on their own range (no grid yet, or outside it) move
        the point's grid to the union of all ranges seen (with headroom on a side that grew);
        the counts accumulated on the old grid are taken first. ``final``: take every
        accumulator (end of pass, or a record written mid-pass).
        """
        rows = self._inst.drain()
        own = {row.point for row in rows if row.stats.hist is not None}
        # also the accumulators that could overflow before the next read
        take = sorted(own.union(self._inst.due()))
        if final:
            take = [i for i, o in enumerate(self.observed) if o.point.bins]
        grids = [
            (self.observed[i], lo, hi, counts)
            for i, lo, hi, counts in self._inst.take_histograms(take)
        ]
        updates = []
        for row in rows:
            obs = self.observed[row.point]
            batch = self._pass_base + row.step // max(1, obs.point.calls)
            if self.batch_num is not None and batch >= self.batch_num:
                continue  # steps_per_execution overshoot past batch_num
            self._pass_seen = max(self._pass_seen, batch - self._pass_base + 1)
            stats = row.stats
            if not (math.isfinite(stats.min) and math.isfinite(stats.max)):
                where = f"layer {obs.point.key!r}: {obs.point.role}"
                if obs.folded_bn is not None:
                    where += f" (after its folded {obs.folded_bn!r})"
                raise CalibrationError(
                    f"{where} of batch {batch} contains NaN or Inf "
                    f"(min {stats.min}, max {stats.max}); no record written"
                )
            updates.append((obs, stats, row.channel_range))
        self._move_grids(own, rows)
        if updates or grids:
            # observers run on one worker thread, in order, while the next steps execute
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="amct_bridge_observers")
            self._futures.append(self._pool.submit(_apply, updates, grids))

    def _move_grids(self, own: set[int], rows) -> None:
        """Widen the spans with this read's rows; re-grid the points that overflowed."""
        grown: dict[int, tuple[bool, bool]] = {}
        for row in rows:
            lo, hi = row.stats.min, row.stats.max
            old = self._spans.get(row.point)
            if old is None:
                self._spans[row.point] = (lo, hi)
                continue
            below, above = grown.get(row.point, (False, False))
            grown[row.point] = (below or lo < old[0], above or hi > old[1])
            self._spans[row.point] = (min(lo, old[0]), max(hi, old[1]))
        for index in own:
            lo, hi = self._spans[index]
            if not lo < hi:
                continue  # constant so far: keep histogramming each batch on its own
            had_grid = self._inst.grid(index) is not None
            below, above = grown.get(index, (False, False))
            pad = (hi - lo) / 8 if had_grid else 0.0  # a range that grew may grow again
            self._inst.set_grid(index, *_float32_outward(lo - pad * below, hi + pad * above))

    def _settle(self) -> None:
        """Wait for pending observer updates; re-raise their errors."""
        futures, self._futures = self._futures, []
        for future in futures:
            future.result()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # ---- output -------------------------------------------------------------------------------

    def write(self, outputs: dict, require_batches: bool = False) -> None:
        """Build record + sidecar (+ frozen graph) from what was seen, then write them all."""
        if self._inst is not None:  # mid-pass (save_every_epoch): read what the graph holds
            self._drain(final=True)
            self.batches = self._pass_base + self._pass_seen
        self._settle()
        if self.batches == 0:
            if require_batches:
                raise CalibrationError(
                    f"no calibration batch was seen for model {self.model.name!r}; "
                    "no record written (empty dataset or steps=0?)"
                )
            return
        built = build_outputs(self, **outputs)
        write_outputs(built, **outputs)


def _apply(updates: list, grids: list) -> None:
    for obs, lo, hi, counts in grids:
        obs.observer.add_histogram(lo, hi, counts)
    for obs, stats, channel_range in updates:
        later = bool(obs.point.bins) and stats.hist is None
        obs.observer.update_stats(stats, hist_later=later)
        if channel_range is not None:
            obs.channel_range = _merge_ranges(obs.channel_range, channel_range)


def _float32_outward(lo: float, hi: float) -> tuple[float, float]:
    """``[lo, hi]`` widened to float32 ends (the in-graph grid is float32)."""
    lo32, hi32 = np.float32(lo), np.float32(hi)
    if lo32 > lo:
        lo32 = np.nextafter(lo32, np.float32(-np.inf))
    if hi32 < hi:
        hi32 = np.nextafter(hi32, np.float32(np.inf))
    return float(lo32), float(hi32)


def _merge_ranges(prev: np.ndarray | None, new: np.ndarray) -> np.ndarray:
    if prev is None:
        return new.copy()
    return np.stack([np.minimum(prev[0], new[0]), np.maximum(prev[1], new[1])])


def _channel_axis(layer) -> int:
    return 1 if getattr(layer, "data_format", "channels_last") == "channels_first" else -1


def _depthwise_output(layer, x):
    """SeparableConv2D's inner tensor: the depthwise convolution of its input (TF's own op)."""
    import tensorflow as tf

    fmt = "NCHW" if layer.data_format == "channels_first" else "NHWC"
    strides = (1, 1, *layer.strides) if fmt == "NCHW" else (1, *layer.strides, 1)
    return tf.nn.depthwise_conv2d(
        x,
        tf.cast(layer.depthwise_kernel, x.dtype),  # mixed precision: compute like the layer
        strides=strides,
        padding=layer.padding.upper(),
        dilations=layer.dilation_rate,
        data_format=fmt,
    )
