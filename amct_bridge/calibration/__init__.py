"""Framework-free calibration core shared by the Keras and MindSpore adapters.

Following NNCF's split between ``common/`` and its backends, everything that does not need the
framework lives here; an adapter (``amct_bridge.keras``, ``amct_bridge.mindspore``) only
translates framework objects into these types and framework statistics into :class:`Row` s. The
core never imports an adapter (tests/test_architecture.py checks it).

=============================================  ================================================
module                                         what
=============================================  ================================================
:mod:`amct_bridge.calibration.layers`          :class:`QuantPart`, :class:`LayerDesc`,
                                               :class:`ModelDesc` (what an adapter hands over)
:mod:`amct_bridge.calibration.plan`            :func:`make_plan`, :class:`Target`, :class:`Plan`,
                                               :func:`batchnorm_chains` (Conv/Dense + BN rule),
                                               skip_layers "did you mean", observer sharing
:mod:`amct_bridge.calibration.protocol`        :class:`Point`, :class:`Row`, the
                                               :class:`Instrumentation` and
                                               :class:`WeightSource` protocols,
                                               :class:`PartWeights`, :class:`BatchNormParams`
:mod:`amct_bridge.calibration.session`         :class:`CalibrationSession`: points, observers,
                                               drains on a worker thread, grids, NaN/Inf, batches
:mod:`amct_bridge.calibration.records`         record + sidecar building, flavor, atomic writes
:mod:`amct_bridge.calibration.weights`         BN folding, ARQ scale_w, DMQ, shift_bit on numpy
:mod:`amct_bridge.calibration.merge`           data-parallel runs: observers merged across
                                               ranks from one ``gather`` collective, ok/error
                                               agreement, rank-count check
=============================================  ================================================

The adapter contract
--------------------
1. **Describe the model** as a :class:`ModelDesc`:

   * ``layers``: every leaf layer / cell by *key* (the framework's own name: Keras layer names,
     ``"outer/inner"`` for nested models; MindSpore ``cells_and_names()`` names such as
     ``"layer1.0.conv1"``), in the framework's layer order, each a :class:`LayerDesc` with its
     ``kind`` (registry name; a subclass gets its base's), its quantized ``parts``
     (:class:`QuantPart`: record-key suffix, op type, has weights, per-channel scale_w allowed,
     BN-foldable), the role flags ``activation`` (sidecar ranges only) and ``runtime``
     (coefficient-free op whose output range runtimes need: Add, concat, pools), the
     framework's short ``name`` (messages), ``params`` (``channel_axis``: -1 channels-last,
     1 NCHW; BatchNorm ``on_channels``) and the framework object as opaque ``handle``;
   * ``graph``: the graph IR (:mod:`amct_bridge.graph.ir`; node ``layer`` = LayerDesc key,
     node ``kind`` = the framework's class name, ``params["activation"]`` a fused activation)
     or None (then: no BN folding, one call per layer, layer order = execution order);
   * ``operations``: raw ops in the graph that are not layers (``x + y``), by node ``layer``;
   * ``foldable_kinds`` / ``batch_norm_kinds``: graph node kinds for the chain rule (a
     foldable layer without fused activation whose only reader is a BN on its channel axis;
     neither shared nor a model output); ``quantizable_kinds`` for messages.

2. **Give the numbers** through a :class:`WeightSource`:

   * ``part_weights(layer_desc, part) -> PartWeights(kernel, layout, bias)``: float32 numpy in
     the framework's own layout, *named per layer* from :data:`amct_bridge.quant.layouts.LAYOUTS`
     (Keras: Conv2D ``"HWIO"``, DepthwiseConv2D ``"HWCM"``, Conv2DTranspose ``"HWOI"``, Dense
     ``"IO"``; MindSpore: Conv2d ``"OIHW"``, depthwise ``(C*m, 1, kH, kW)`` also ``"OIHW"``
     (output channels on axis 0), Dense ``(out, in)`` ``"OI"``, Conv2dTranspose ``(in, out,
     kH, kW)`` ``"IOHW"``). ``bias`` None when the part has none;
   * ``batch_norm(bn_desc) -> BatchNormParams(gamma, beta, mean, var, eps)`` (gamma/beta None
     when unused; MindSpore: ``eps`` is the cell's ``eps``, moving stats ``moving_mean`` /
     ``moving_variance``).

   The core folds, runs ARQ per output channel of that layout (per tensor where the part or
   the layout says so), DMQ on its input axis and shift_bit; nothing is transposed.

3. **Gather statistics** with an object implementing :class:`Instrumentation`, created per pass
   by the session hook ``_instrument(mode, points)`` for the given :class:`Point` list (index
   ``i`` of the list is ``Row.point == i``). Exactly this surface (Keras'
   ``amct_bridge.keras.instrument.Instrumentation`` is the reference implementation):

   * ``install()`` / ``remove()``: start observing / leave nothing behind (idempotent remove;
     the model's outputs, parameters and saved state unchanged);
   * ``drain() -> list[Row]``: every summary since the last drain. ``Row.point`` (int index),
     ``Row.step`` (0, 1, 2... per point and replica: a point with ``calls == 2`` yields two
     per batch, the core divides by ``calls``), ``Row.stats`` a
     :class:`~amct_bridge.quant.stats.BatchStats` (numpy reference:
     :func:`~amct_bridge.quant.stats.batch_stats`; count, min, max; ``hist`` = this batch's
     own histogram over its own ``[min, max]`` with ``Point.bins`` bins, or None when the batch
     was binned onto the point's grid or the point has ``bins == 0``; ``channel_absmax``),
     ``Row.channel_range`` ``[2, C]`` per-channel min/max when ``Point.channel_axis`` is set
     (DMQ), else None; also ``Row.replica``;
   * ``set_grid(i, lo, hi)`` / ``grid(i)``: from now on histogram batches of point ``i`` lying
     inside ``[lo, hi]`` are binned onto that grid and *accumulated* (not returned by drain);
     ``grid`` is None until set;
   * ``take_histograms(indices) -> [(i, lo, hi, counts)]``: the accumulated grid counts
     (int64 numpy, ``bins`` long) since the last take, then zeroed; empty entries left out;
   * ``due() -> [i]``: points whose accumulators must be taken before the next drain
     (overflow); ``[]`` if the accumulator cannot overflow;
   * ``set_limit(steps | None)``: batches after ``steps`` must not be binned onto a grid
     (they still come back from drain, with their own ``hist``; the core drops them);
   * ``read_every`` (int property): batch ends between drains so that no buffer overflows;
   * ``python_calls`` (int attribute): how often adapter Python ran while tracing (tests).

   A simple implementation may never bin onto a grid: return every batch's own ``hist`` from
   ``drain``, ``[]`` from ``take_histograms`` / ``due``, and just remember ``set_grid``.

4. **Drive the passes**: subclass :class:`CalibrationSession`, implement ``describe``,
   ``weight_source``, ``_instrument`` and, if the compiled step must be re-made to pick the
   instrumentation up, ``_activate(mode)`` / ``_deactivate(mode)``; then from the framework's
   callbacks call ``new_run()``, ``start_pass(mode)``, ``batch_begin/batch_end(mode, batch)``,
   ``stop_pass(mode)``, ``stop_all()`` on errors, and at the end
   ``settle_for_write(require_batches=True)`` + :func:`build_record` /
   :func:`finish_record` (flavor, e.g. "mindspore") / :func:`write_outputs`.

Example (a toy adapter: numpy "layers", statistics computed on the host):
    >>> import numpy as np, os, tempfile
    >>> from amct_bridge.config import LayerQuantConfig, QuantConfig
    >>> from amct_bridge.quant.stats import batch_stats
    >>> fc = LayerDesc("fc", "Dense", (QuantPart("", "MatMul", True, False, True),),
    ...                handle=np.float32([[1.0, -2.0], [0.5, 4.0]]))  # (out, in) = "OI"
    >>> class Weights:
    ...     def part_weights(self, layer, part):
    ...         return PartWeights(layer.handle, "OI", None)
    ...     def batch_norm(self, bn): raise AssertionError("no BN here")
    >>> class Inst:  # the protocol, host-side: every batch with its own histogram
    ...     python_calls, read_every = 0, 1
    ...     def __init__(self, points):
    ...         self.points, self.rows, self.grids, self.steps = points, [], {}, [0] * len(points)
    ...     def install(self): pass
    ...     def remove(self): pass
    ...     def feed(self, x):  # what a framework would do in-graph for every point
    ...         for i, p in enumerate(self.points):
    ...             t = x if p.role == "input" else x @ fc.handle.T
    ...             self.rows.append(Row(i, 0, self.steps[i], batch_stats(t, p.bins)))
    ...             self.steps[i] += 1  # per point, since install (not per drain)
    ...     def drain(self): rows, self.rows = self.rows, []; return rows
    ...     def due(self): return []
    ...     def take_histograms(self, indices): return []
    ...     def set_grid(self, i, lo, hi): self.grids[i] = (lo, hi)
    ...     def grid(self, i): return self.grids.get(i)
    ...     def set_limit(self, steps): pass
    >>> class ToySession(CalibrationSession):
    ...     def describe(self): return ModelDesc("toy", {"fc": fc})
    ...     def weight_source(self): return Weights()
    ...     def _instrument(self, mode, points):
    ...         self.inst = Inst(points); return self.inst
    >>> cfg = QuantConfig(common=LayerQuantConfig(algorithm="minmax", options={}))
    >>> s = ToySession(cfg, batch_num=2, model_name="toy")
    >>> s.new_run(); s.start_pass("eval")
    >>> for batch in range(2):
    ...     s.inst.feed(np.float32([[0.0, 1.0], [2.0, -1.0]]) * (batch + 1))
    ...     s.batch_begin("eval", batch); s.batch_end("eval", batch)
    >>> s.active, s.batches, s.settle_for_write(require_batches=True)
    (False, 2, True)
    >>> record, stats, folds = build_record(s)
    >>> record, text = finish_record(record, "inner")
    >>> record.layers["fc"].scale_w, stats.layers["fc"].input.max
    ([0.031496062874794006], 4.0)
"""

from amct_bridge.calibration.layers import LayerDesc, ModelDesc, QuantPart
from amct_bridge.calibration.plan import Plan, Target, batchnorm_chains, make_plan
from amct_bridge.calibration.protocol import (
    BatchNormParams,
    Instrumentation,
    PartWeights,
    Point,
    Row,
    WeightSource,
)
from amct_bridge.calibration.records import (
    Built,
    FoldedPart,
    build_record,
    finish_record,
    write_outputs,
)
from amct_bridge.calibration.session import CalibrationSession, Observed

__all__ = [
    "BatchNormParams",
    "Built",
    "CalibrationSession",
    "FoldedPart",
    "Instrumentation",
    "LayerDesc",
    "ModelDesc",
    "Observed",
    "PartWeights",
    "Plan",
    "Point",
    "QuantPart",
    "Row",
    "Target",
    "WeightSource",
    "batchnorm_chains",
    "build_record",
    "finish_record",
    "make_plan",
    "write_outputs",
]
