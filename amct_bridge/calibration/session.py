"""The calibration session core: points, observers, passes, batch counting, the write step.

A session lives from the start of a run to its end (or across runs when an adapter keeps it).
:meth:`CalibrationSession.new_run` plans the model (:mod:`amct_bridge.calibration.plan`) on first
use and creates one :class:`Observed` point per observed tensor, shared between targets that
read the same tensor with the same settings. Each *pass* installs the adapter's
:class:`~amct_bridge.calibration.protocol.Instrumentation`, drains its rows
(:class:`~amct_bridge.quant.stats.BatchStats`) into the observers on one worker thread while the
model keeps running, moves histogram grids to the union of the ranges seen, and stops after
``batch_num`` batches. NaN/Inf in a batch stops the run with the layer and batch in the message.
:meth:`CalibrationSession.write` builds record + sidecar (:mod:`amct_bridge.calibration.records`)
and writes them only when every piece was built.

An adapter subclasses :class:`CalibrationSession` and implements four hooks: ``describe``
(the :class:`~amct_bridge.calibration.layers.ModelDesc`), ``weight_source``, ``_instrument``
(a not yet installed Instrumentation for a pass) and, when its step must be re-made to pick the
instrumentation up, ``_activate`` / ``_deactivate``; ``_first_read`` checks, before the first read
of a pass, what only the run can tell (MindSpore: each cell's calls per step against the graph).

Example:
    >>> from amct_bridge.config import QuantConfig
    >>> from amct_bridge.calibration.layers import LayerDesc, ModelDesc, QuantPart
    >>> class Tiny(CalibrationSession):
    ...     def describe(self):
    ...         fc = LayerDesc("fc", "Dense", (QuantPart("", "MatMul", False, False, True),))
    ...         return ModelDesc("tiny", {"fc": fc})
    >>> s = Tiny(QuantConfig(), batch_num=None, model_name="tiny"); s.new_run()
    >>> [(o.point.key, o.point.role) for o in s.observed]
    [('fc', 'input'), ('fc', 'output')]
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from amct_bridge.calibration.layers import ModelDesc, QuantPart
from amct_bridge.calibration.plan import Plan, Target, make_plan, observer_settings
from amct_bridge.calibration.protocol import Instrumentation, Point, Row, WeightSource
from amct_bridge.calibration.weights import input_channels
from amct_bridge.config import LayerQuantConfig, QuantConfig
from amct_bridge.errors import CalibrationError
from amct_bridge.quant.factors import bits_of
from amct_bridge.quant.observers import make_observer

#: Settings of tensors only the sidecar reports (see CalibrationSession._settings_for).
SIDECAR_ONLY = LayerQuantConfig(algorithm="minmax", options={})


@dataclass
class Observed:
    """One observed tensor: its point, observer and (DMQ) running per-channel min and max."""

    point: Point
    observer: Any
    channel_range: np.ndarray | None = None  # [2, C]
    settings: tuple = ()  # (algorithm, options, act_type): points are shared only if equal
    folded_bn: str | None = None  # output of a layer whose BN is folded: that BN's name
    #: a layer called at several sites per step: [min, max] seen at each site (the k-th
    #: summary of a step is site k), for the sidecar's per-site entries (``relu@1``)
    sites: list[list[float]] | None = None

    def note_site(self, step: int, lo: float, hi: float) -> None:
        """Widen the range of the site that summary ``step`` of this point came from."""
        if self.sites is None:
            return
        site = self.sites[step % len(self.sites)]
        site[0], site[1] = min(site[0], lo), max(site[1], hi)


class CalibrationSession:
    """Statistics of one calibration session (see the module docstring).

    Args:
        config: the resolved quantization settings.
        batch_num: stop after this many batches (None: every batch).
        model_name: for messages.
    """

    def __init__(self, config: QuantConfig, batch_num: int | None, model_name: str = "") -> None:
        self.config = config
        self.batch_num = batch_num
        self.model_name = model_name
        self.plan: Plan | None = None
        self.observed: list[Observed] = []
        self.tensors: dict[tuple[str, str], int] = {}
        self.batches = 0
        self.python_calls = 0  # adapter code run in Python while tracing, for tests
        self._inst: Instrumentation | None = None
        self._mode: str | None = None
        self._pass_base = 0
        self._pass_batches = 0  # upper bound from batch hooks (decides when to stop)
        self._pass_seen = 0  # exact, from the rows read back
        self._begin = 0
        self._ends = 0
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list = []
        self._spans: dict[int, tuple[float, float]] = {}  # point -> union of batch ranges
        self._gridded: set[int] = set()  # points with a grid in this pass's instrumentation
        self._first = False

    # ---- adapter hooks ------------------------------------------------------------------------

    def describe(self) -> ModelDesc:
        """The model as layer descriptors + graph IR (called once, on the first run)."""
        raise NotImplementedError

    def weight_source(self) -> WeightSource:
        """Reads kernels, biases and BatchNorm parameters in a stated layout."""
        raise NotImplementedError

    def inner_of(self, target: Target) -> Any:
        """Adapter data for the point of an inner tensor (``Point.inner``); default None."""
        return None

    def _instrument(self, mode: str, points: list[Point]) -> Instrumentation:
        """A new, not yet installed Instrumentation observing ``points`` in pass ``mode``."""
        raise NotImplementedError

    def _activate(self, mode: str) -> None:
        """After install: make the framework run the instrumented step (Keras: re-trace)."""

    def _deactivate(self, mode: str) -> None:
        """After remove: put back what ``_activate`` changed."""

    def _first_read(self, steps: int) -> None:
        """Before the first read of a pass, after ``steps`` (>= 1) batch ends: check what only
        the run can tell (MindSpore: calls per step against the graph's sites); default none."""

    # ---- set-up -------------------------------------------------------------------------------

    def new_run(self) -> None:
        """Start a run: plan the model on first use."""
        if self.plan is None:
            self.plan = make_plan(self.describe(), self.config)
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
            layer_parts = first.desc.parts if first.desc is not None else ()
            self._add(first, "input", layer_parts[0] if layer_parts else None, by_tensor)
            if len(layer_parts) > 1:  # the first part's output feeds the second part
                self._add(last, "inner", layer_parts[-1], by_tensor, self.inner_of(last))
            self._add(last, "output", None, by_tensor)
            if last.preactivation is not None:  # before a fused softmax / sigmoid...: logits
                self._add(last, "preactivation", None, by_tensor)

    def _settings_for(self, target: Target, role: str) -> LayerQuantConfig:
        """The layer's own settings where a record entry reads the tensor, else min/max.

        A tensor that no quantized layer reads (a conv output before its ReLU, a model output)
        only feeds the sidecar, so it gets min/max (raw extremes) instead of a histogram and a
        clip search: the record is the same, the calibration cheaper. Its producer uses the
        reader's settings so both share one observed point.
        """
        if target.quantized and role in ("input", "inner"):
            return target.config
        tid = target.tensors[0] if role == "input" else target.tensors[1]
        reader = self._readers.get(tid) if tid is not None else None
        return reader if reader is not None else SIDECAR_ONLY

    def _in_channels(self, target: Target, part: QuantPart) -> int:
        weights = self.weight_source().part_weights(target.desc, part)
        return input_channels(weights.kernel, weights.layout)

    def _add(self, target: Target, role: str, part, by_tensor: dict, inner=None) -> None:
        """Add the point of one tensor, or reuse the point already observing the same tensor."""
        cfg = self._settings_for(target, role)
        dmq = cfg.migration_strength is not None and part is not None and part.has_weights
        tid = {"input": target.tensors[0], "output": target.tensors[1]}.get(role)
        shared = by_tensor.get(tid) if tid is not None else None
        if shared is not None and self.observed[shared].settings == observer_settings(cfg):
            point = self.observed[shared].point
            if dmq and point.channel_axis is None:  # the consumer needs channel ranges too
                point.channel_axis = target.desc.channel_axis
                point.channels = self._in_channels(target, part)
            self.tensors[(target.layer_key, role)] = shared
            return
        observer = make_observer(
            cfg.algorithm,
            num_bits=bits_of(cfg.act_type),
            activation_offset=self.config.activation_offset,
            name=f"layer {target.layer_key!r} {role}",
            **cfg.options,
        )
        # a folded BN's output is the target's output: observe it there
        layer = target.output_layer if role == "output" else target.layer
        point = Point(
            key=target.layer_key,
            role=role,
            layer=layer,
            bins=int(observer.bins),
            channel_axis=target.desc.channel_axis if dmq else None,
            channels=self._in_channels(target, part) if dmq else 0,
            calls=target.calls,
            inner=inner,
        )
        self.tensors[(target.layer_key, role)] = len(self.observed)
        if tid is not None:
            by_tensor[tid] = len(self.observed)
        folded = target.bn_desc.name if role == "output" and target.bn_desc is not None else None
        sites = [[math.inf, -math.inf] for _ in range(target.calls)] if target.calls > 1 else None
        self.observed.append(
            Observed(
                point, observer, settings=observer_settings(cfg), folded_bn=folded, sites=sites
            )
        )

    # ---- passes -------------------------------------------------------------------------------

    @property
    def points(self) -> list[Point]:
        """Every observed point, in index order (what Row.point indexes)."""
        return [o.point for o in self.observed]

    def start_pass(self, mode: str) -> None:
        """Install the instrumentation for pass ``mode`` (no-op when active or done)."""
        if self._inst is not None or self._done():
            return
        points = self.points
        self._inst = self._instrument(mode, points)
        if self.batch_num is not None:
            self._inst.set_limit(self.batch_num - self.batches)
        self._gridded = set()
        self._set_grids(  # earlier passes' ranges (accumulate)
            [
                (index, *float32_outward(lo, hi))
                for index, (lo, hi) in self._spans.items()
                if points[index].bins and lo < hi
            ]
        )
        self._inst.install()
        self._mode, self._pass_base = mode, self.batches
        self._pass_batches = self._pass_seen = self._ends = 0
        self._first = True  # no read yet in this pass (see _first_read)
        self._activate(mode)

    def batch_begin(self, mode: str, batch: int) -> None:
        """Note the first step of this execution (one execution may run several steps)."""
        self._begin = batch

    def batch_end(self, mode: str, batch: int) -> None:
        """Count the steps just run; read summaries when buffers may fill or batch_num is hit."""
        if self._inst is None or mode != self._mode:
            return
        self._pass_batches += max(1, batch - self._begin + 1)
        self._ends += 1
        done = self.batch_num is not None and self._pass_base + self._pass_batches >= self.batch_num
        # the first read comes early: it gives the histogram points their grids; a non-finite
        # batch is read at once (instrumentations that can tell cheaply: non_finite()), so the
        # error names it and the run stops there, not at the next read or the end of the run
        non_finite = getattr(self._inst, "non_finite", None)
        bad = non_finite is not None and non_finite()
        if done or bad or self._ends == 1 or self._ends % self._inst.read_every == 0:
            self._drain()
        if done:
            self.stop_pass(mode)

    def stop_pass(self, mode: str) -> None:
        """Read what is left, remove the instrumentation, wait for the observers."""
        if self._inst is None or mode != self._mode:
            return
        try:
            self._drain(final=True)
        finally:
            self.stop_all()
        self._settle()

    def stop_all(self) -> None:
        """Remove the instrumentation and undo ``_activate`` (idempotent; used on errors)."""
        if self._inst is None:
            return
        self._inst.remove()
        self.python_calls += self._inst.python_calls
        self._deactivate(self._mode)
        self._inst = None
        self.batches = self._pass_base + self._pass_seen
        if self.batch_num is not None:
            self.batches = min(self.batches, self.batch_num)

    @property
    def active(self) -> bool:
        """True while a pass is instrumented."""
        return self._inst is not None

    def _done(self) -> bool:
        return self.batch_num is not None and self.batches >= self.batch_num

    def _drain(self, final: bool = False) -> None:
        """Read the summaries, check them, and hand them to the observer thread.

        Histogram points: rows binned on their own range (no grid yet, or outside it) move
        the point's grid to the union of all ranges seen (with headroom on a side that grew);
        the counts accumulated on the old grid are taken first. ``final``: take every
        accumulator (end of pass, or a record written mid-pass).
        """
        if self._first and self._pass_batches:
            self._first = False
            self._first_read(self._pass_batches)
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
                continue  # steps run past batch_num in one execution
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
            obs.note_site(row.step, stats.min, stats.max)
            updates.append((obs, stats, row.channel_range))
        self._move_grids(own, rows)
        if updates or grids:
            # observers run on one worker thread, in order, while the next steps execute
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="amct_bridge_observers")
            # done futures are dropped (one per read: a long fit would pile them up until the
            # pass ends); a failed one stays for _settle to re-raise
            self._futures = [f for f in self._futures if not f.done() or f.exception()]
            self._futures.append(self._pool.submit(_apply, updates, grids))

    def _move_grids(self, own: set[int], rows: list[Row]) -> None:
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
        grids = []
        for index in sorted(own):
            lo, hi = self._spans[index]
            if not lo < hi:
                continue  # constant so far: keep histogramming each batch on its own
            had_grid = index in self._gridded  # as the instrumentation's grid(index) says
            below, above = grown.get(index, (False, False))
            pad = (hi - lo) / 8 if had_grid else 0.0  # a range that grew may grow again
            grids.append((index, *float32_outward(lo - pad * below, hi + pad * above)))
        self._set_grids(grids)

    def _set_grids(self, grids: list[tuple[int, float, float]]) -> None:
        """Set grids ``(point, lo, hi)``, at once where the instrumentation can (``set_grids``:
        one write for dozens of tensors), and note which points have one."""
        many = getattr(self._inst, "set_grids", None)
        if many is not None and grids:
            many(grids)
        else:
            for index, lo, hi in grids:
                self._inst.set_grid(index, lo, hi)
        self._gridded.update(index for index, _, _ in grids)

    def _settle(self) -> None:
        """Wait for pending observer updates; re-raise their errors."""
        futures, self._futures = self._futures, []
        for future in futures:
            future.result()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # ---- output -------------------------------------------------------------------------------

    def settle_for_write(self, require_batches: bool = False) -> bool:
        """Read what a running pass holds and wait for the observers; False when there is
        nothing to write (no batch seen), CalibrationError instead with ``require_batches``.
        """
        if self._inst is not None:  # mid-pass (e.g. every epoch): read what the graph holds
            self._drain(final=True)
            self.batches = self._pass_base + self._pass_seen
        self._settle()
        if self.batches == 0:
            if require_batches:
                raise CalibrationError(
                    f"no calibration batch was seen for model {self.model_name!r}; "
                    "no record written (empty dataset or steps=0?)"
                )
            return False
        return True


def _apply(updates: list, grids: list) -> None:
    for obs, lo, hi, counts in grids:
        obs.observer.add_histogram(lo, hi, counts)
    for obs, stats, channel_range in updates:
        later = bool(obs.point.bins) and stats.hist is None
        obs.observer.update_stats(stats, hist_later=later)
        if channel_range is not None:
            obs.channel_range = _merge_ranges(obs.channel_range, channel_range)


def float32_outward(lo: float, hi: float) -> tuple[float, float]:
    """``[lo, hi]`` widened to float32 ends (in-graph grids are float32).

    Example:
        >>> lo, hi = float32_outward(0.1, 0.2)
        >>> lo <= 0.1 < 0.2 <= hi, np.float32(lo) == lo
        (True, True)
    """
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
