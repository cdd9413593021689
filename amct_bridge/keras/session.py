"""One calibration session of ``QuantCalibration``: the Keras half of the core session.

:class:`~amct_bridge.calibration.session.CalibrationSession` owns the points, observers, batch
counting and the write step. This subclass says how Keras does its part: the model described
for the core (:func:`amct_bridge.keras.plan.describe_model`), weights
(:class:`~amct_bridge.keras.weights.KerasWeights`), an :class:`~amct_bridge.keras.instrument.
Instrumentation` per pass with the step function re-traced so it runs inside the compiled
graph (and the user's step function put back when the pass ends; the instrumented one is kept
on the model for the next run with the same plan, those of the last :data:`KEEP_PLANS` plans,
see ``keep_step``), and the Keras-only outputs (TF op keys, frozen graph) of
:mod:`amct_bridge.keras.record_builder`.

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

import operator
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from amct_bridge.calibration.layers import ModelDesc
from amct_bridge.calibration.plan import Target
from amct_bridge.calibration.protocol import Point
from amct_bridge.calibration.session import CalibrationSession, Observed
from amct_bridge.config import QuantConfig
from amct_bridge.keras.instrument import Instrumentation
from amct_bridge.keras.plan import describe_model, refuse_qat_model
from amct_bridge.keras.record_builder import build_outputs, write_outputs
from amct_bridge.keras.weights import KerasWeights
from amct_bridge.records.codec import from_proto, to_proto

__all__ = ["KEEP_PLANS", "Observed", "Session"]

#: Host reads happen at most every this many batch ends (fewer transfers, same data)...
_READ_EVERY = 16
#: ...as long as the ring buffers of all histograms stay below this many bytes.
_HIST_BUDGET = 32 * 2**20
_NOT_SAVED = object()  # no step function saved yet (None is a valid saved one)


#: Observed steps kept per model (calibrate()) or per model and mode (the callback): those of
#: the last plans run, the least recently used dropped first. Someone comparing algorithms
#: goes back and forth between a few plans (minmax, ifmr, hfmg, minmax...): with one kept step,
#: every change traced the step again. Each kept step holds its buffers (see keep_step).
KEEP_PLANS = 4


@dataclass
class _Kept:
    """An observed step kept for the next run on the same model and plan: its key, buffers
    and function (calibrate()'s own traced step, or the callback's Keras step function)."""

    key: tuple
    inst: Instrumentation
    fn: object = None


class _KeptPlans:
    """Kept steps of one model (and mode), least recently used first, at most ``limit``.

    ``same`` compares two keys. A run takes its step out (:meth:`take`) and puts it back when
    it ends (:meth:`put`): as the most recent one, in place of any other of the same key.

    Example:
        >>> plans = _KeptPlans(limit=2)
        >>> for key in ("minmax", "ifmr", "hfmg"):
        ...     plans.put(_Kept(key, None))
        >>> [kept.key for kept in plans], plans.take("minmax")
        (['ifmr', 'hfmg'], None)
        >>> plans.put(plans.take("ifmr")); [kept.key for kept in plans]
        ['hfmg', 'ifmr']
    """

    def __init__(self, limit: int = KEEP_PLANS, same: Callable = operator.eq) -> None:
        self.limit = limit
        self.same = same
        self._items: list[_Kept] = []

    def take(self, key: tuple) -> _Kept | None:
        """The kept step of ``key``, taken out (None when none is kept)."""
        for i, kept in enumerate(self._items):
            if self.same(kept.key, key):
                return self._items.pop(i)
        return None

    def put(self, kept: _Kept) -> None:
        """Keep ``kept`` as the most recently used; drop the least recent beyond ``limit``."""
        self._items = [k for k in self._items if not self.same(k.key, kept.key)]
        self._items.append(kept)
        del self._items[: max(0, len(self._items) - self.limit)]

    def drop_where(self, stale: Callable[[tuple], bool]) -> None:
        """Drop the kept steps whose key is ``stale`` (one that no run can ask for again)."""
        self._items = [k for k in self._items if not stale(k.key)]

    @property
    def latest(self) -> _Kept | None:
        """The most recently used kept step."""
        return self._items[-1] if self._items else None

    def __iter__(self) -> Iterator[_Kept]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)


#: The callback's observed steps (Keras' own step functions re-made with the instrumentation
#: in): kept on the model itself, in this untracked attribute, per mode. Keras' step
#: functions close over the model, so a weakly keyed table would keep it alive; on the model
#: the function, its buffers and the model form a cycle the garbage collector takes.
_KEPT_ATTR = "_amct_bridge_kept_steps"


class _KeptSteps(dict):
    """mode -> _KeptPlans, on the model (see _KEPT_ATTR): not copied, pickled or saved with
    it."""

    def __deepcopy__(self, memo):
        return _KeptSteps()

    def __reduce__(self):
        return (_KeptSteps, ())


#: calibrate() on arrays traces its own observed step (direct_step). Like Keras' predict
#: function it is kept for the next calibrate() of the same model object with the same observed
#: tensors (tracing and instantiating it is most of a short calibration's cost): those of the
#: last KEEP_PLANS plans per model (a _KeptPlans), weakly keyed, holding neither the model nor a
#: closure over it, so they go with the model.
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_KEPT_LOCK = threading.Lock()  # a run takes its entry out, so two threads never share one
_TRACE_LOCK = threading.Lock()  # wrappers of two traces on the same layers would nest


class _TracedOnce(Instrumentation):
    """calibrate()'s instrumentation: the layers are wrapped only while its step is traced
    (:meth:`trace`), under one lock, so calls of the traced step on other threads, or another
    model's trace, never meet a wrapper."""

    def install(self) -> None:
        """Nothing: see :meth:`trace`."""

    def remove(self) -> None:
        """Nothing: see :meth:`trace`."""

    def trace(self, spec):
        """The observed step of the model on batches of ``spec`` (see :func:`direct_step`)."""
        with _TRACE_LOCK:
            super().install()
            try:
                return direct_step(self.model, self, spec)
            finally:
                super().remove()


class Session(CalibrationSession):
    """Statistics of one calibration session of a Keras model (see the module docstring)."""

    def __init__(
        self,
        model,
        config: QuantConfig,
        batch_num: int | None,
        direct_spec=None,
        keep_step: bool = True,
    ) -> None:
        super().__init__(config, batch_num, model_name=model.name)
        self.model = model
        # calibrate() on arrays: no Keras step function, the session traces its own (see
        # direct_step); ``direct_spec`` is the TensorSpec of its batches; ``keep_step``: keep
        # the observed step for the next run on this model (_KEPT, or the model's _KEPT_ATTR)
        self.direct_spec = direct_spec
        self.keep_step = keep_step
        self.step_function = None
        self._saved_fn = _NOT_SAVED
        self._weights = KerasWeights()
        self._kept: _Kept | None = None  # calibrate()'s observed step of this run
        self.written = None  # the last record written, as its file holds it (see write)

    # ---- the core's hooks ---------------------------------------------------------------------

    def describe(self) -> ModelDesc:
        """The model as the core sees it (it is built by the time a run starts)."""
        refuse_qat_model(self.model)
        return describe_model(self.model)

    def weight_source(self) -> KerasWeights:
        """Kernels in Keras layout, BN parameters."""
        return self._weights

    def inner_of(self, target: Target):
        """SeparableConv2D: its depthwise output feeds the pointwise op."""
        return _depthwise_output

    def _instrument(self, mode: str, points: list[Point]) -> Instrumentation:
        spe = int(getattr(self.model, "steps_per_execution", 1) or 1)
        per_read = sum(4 * p.bins * max(1, p.calls) * spe for p in points)
        every = max(1, min(_READ_EVERY, _HIST_BUDGET // max(1, per_read)))
        # XLA has no histogram op: a histogram pass's step runs without it (the user's
        # compiled step comes back when the pass ends); an XLA step cannot run our native ops
        jit = bool(getattr(self.model, "jit_compile", False))
        hist = any(p.bins for p in points)
        if self.direct_spec is not None:
            return self._direct_instrumentation(points, every)
        native = hist or not jit
        key = _step_key(self.model, mode, points, every, native)
        table = self._kept_steps(create=False)
        if not self.keep_step:
            table.pop(mode, None)  # keep_step=False drops the mode's kept steps
        plans = table.get(mode)
        kept = None
        if plans is not None:
            # a compile() makes a new config object: steps of an earlier one never match again
            config = key[-1][1]
            plans.drop_where(lambda old: old[-1][1] is not config)
            kept = plans.take(key)
        if kept is not None:
            kept.inst.reset()
        else:
            inst = Instrumentation(
                self.model, points, every, steps=(f"{mode}_step",), native=native
            )
            kept = _Kept(key, inst)
        self._kept = kept
        return kept.inst

    def _kept_steps(self, create: bool) -> _KeptSteps:
        """The model's kept step functions (an empty, unattached table if none and not
        ``create``)."""
        table = vars(self.model).get(_KEPT_ATTR)
        if table is None:
            table = _KeptSteps()
            if create:
                # object.__setattr__: no Keras tracking, nothing saved with the model
                object.__setattr__(self.model, _KEPT_ATTR, table)
        return table

    def _activate(self, mode: str) -> None:
        """Re-trace the ``mode`` step function so the instrumentation runs in its graph."""
        if self.direct_spec is not None:
            kept = self._kept
            if kept.fn is None:
                kept.fn = self._inst.trace(self.direct_spec)
            self.step_function = kept.fn
            return
        self._saved_fn = getattr(self.model, f"{mode}_function")
        kept = self._kept
        if kept.fn is not None:  # the step function of an earlier run: no new trace
            setattr(self.model, f"{mode}_function", kept.fn)
            return
        jit_setting = getattr(self.model, "jit_compile", False)
        jit, hist = bool(jit_setting), any(p.bins for p in self.points)
        if jit and hist:
            self.model.jit_compile = False
        try:
            getattr(self.model, f"make_{mode}_function")(force=True)
        finally:
            if jit and hist:
                self.model.jit_compile = jit_setting
        kept.fn = getattr(self.model, f"{mode}_function")

    def _direct_instrumentation(self, points: list[Point], every: int) -> Instrumentation:
        """The buffers of the step kept for this model and plan, else new ones."""
        key = _plan_key(points, self.direct_spec, every)
        with _KEPT_LOCK:
            if not self.keep_step:
                _KEPT.pop(self.model, None)  # keep_step=False drops the model's kept steps
            plans = _KEPT.get(self.model)
            kept = plans.take(key) if plans is not None else None
        if kept is not None:
            kept.inst.reset()
            kept.inst.model = self.model
        else:
            kept = _Kept(key, _TracedOnce(self.model, points, every, steps=(), native=True))
        self._kept = kept
        return kept.inst

    def _deactivate(self, mode: str) -> None:
        """Put the user's step function back (None too: Keras then makes a fresh one); keep
        the observed step for the next run of its plan (the most recent of KEEP_PLANS)."""
        self.step_function = None
        kept, self._kept = self._kept, None
        if kept is not None and kept.fn is not None and self.keep_step:
            if self.direct_spec is not None:
                kept.inst.model = None  # the entry must not keep the model alive
                with _KEPT_LOCK:
                    plans = _KEPT.get(self.model)
                    if plans is None:
                        plans = _KEPT[self.model] = _KeptPlans()
                    plans.put(kept)
            else:
                table = self._kept_steps(create=True)
                table.setdefault(mode, _KeptPlans(same=_same_key)).put(kept)
        if self._saved_fn is not _NOT_SAVED:
            setattr(self.model, f"{mode}_function", self._saved_fn)
        self._saved_fn = _NOT_SAVED

    # ---- output -------------------------------------------------------------------------------

    def write(self, outputs: dict, require_batches: bool = False) -> None:
        """Build record + sidecar (+ frozen graph) from what was seen, then write them all."""
        if not self.settle_for_write(require_batches):
            return
        built = build_outputs(self, **outputs)
        write_outputs(built, **outputs)
        # what load() of the file gives (proto floats are float32), without parsing the text
        # again: calibrate() returned that read-back, ~0.1 s for MobileNetV2's 300 kB record
        flavor = built.record.flavor
        # source: the file, so the export / report find its sidecar from the Record too
        path = str(outputs["record_path"])
        self.written = from_proto(to_proto(built.record, flavor), flavor, source=path)


def direct_step(model, inst: Instrumentation, spec):
    """An observed forward pass of ``model`` on batches of ``spec``: a concrete function.

    Lighter to trace than Keras' predict step (no data adapter, no distribution wrappers,
    no outputs handed back) and called on the batches directly. The model is called as
    ``predict_step`` calls it, so every observed tensor is the one ``predict`` computes.

    Example:
        >>> # Session(model, config, None, direct_spec=tf.TensorSpec([None, 8])) runs it
    """
    import tensorflow as tf

    kwargs = {"training": False} if getattr(model, "_call_has_training_arg", True) else {}
    ref = weakref.ref(model)  # the kept function must not keep the model alive

    def forward(x):
        ref()(x, **kwargs)

    fn = tf.function(inst.wrap_step(forward), input_signature=[spec], autograph=False)
    return fn.get_concrete_function()


def _plan_key(points: list[Point], spec, every: int) -> tuple:
    """What the traced observed step depends on besides the model: its tensors and batches."""
    observed = tuple(
        (p.key, p.role, id(p.layer), p.bins, p.channel_axis, p.channels, p.calls, p.inner)
        for p in points
    )
    return observed, tuple(spec.shape.as_list()), spec.dtype.name, every


def _step_key(model, mode: str, points: list[Point], every: int, native: bool) -> tuple:
    """What a Keras step function re-made with the instrumentation depends on: the mode and
    observed tensors, the reads, and the model's settings that ``make_<mode>_function`` reads
    (a compile() makes a new config object; a strategy scope another strategy). The last
    item holds objects, compared by identity (see _same_key)."""
    observed = tuple(
        (p.key, p.role, id(p.layer), p.bins, p.channel_axis, p.channels, p.calls, p.inner)
        for p in points
    )
    settings = (
        int(getattr(model, "steps_per_execution", 1) or 1),
        bool(getattr(model, "jit_compile", False)),
        bool(getattr(model, "run_eagerly", False)),
    )
    same = (model.distribute_strategy, getattr(model, "_compile_config", None))
    return mode, observed, every, native, settings, same


def _same_key(a: tuple, b: tuple) -> bool:
    """Equal keys of :func:`_step_key`: the objects of the last item the same ones."""
    return a[:-1] == b[:-1] and all(x is y for x, y in zip(a[-1], b[-1], strict=True))


def _depthwise_output(layer, x):
    """SeparableConv2D's inner tensor: the depthwise convolution of its input (TF's own op).

    SeparableConv1D: Keras' own 1-D depthwise conv (TF's op on the input and kernel expanded to
    height 1, with Keras' channels-first handling), which is what the layer computes inside.
    """
    import tensorflow as tf

    if getattr(layer, "rank", 2) == 1:
        import keras

        return keras.ops.depthwise_conv(
            x,
            tf.cast(layer.depthwise_kernel, x.dtype),
            strides=layer.strides,
            padding=layer.padding,
            dilation_rate=layer.dilation_rate,
            data_format=layer.data_format,
        )
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
