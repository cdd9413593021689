"""The cells MindSpore QAT puts into a copy of the network: :class:`QATQuant` (fake-quantizes
a cell's input and weight, recomputes its op) and :class:`QATObserve` (runs a cell unchanged and
tracks its output range for the sidecar).

Both hold their ranges in ``Parameter`` s named ``<cell>.qat.<tensor>_min`` / ``_max`` /
``_seen`` (``seen``: training batches), so they are saved in checkpoints (training resumes) and
never collide with the network's own names; they wrap their cell as child ``cell`` without a
prefix (``insert_child_to_cell``), so the cell's parameters keep their names (``conv1.weight``).
Only graph ops and ``ops.assign`` in ``construct``: GRAPH_MODE compiles them, PyNative runs them.

A cell called at several sites per step (LeNet5's one ``self.relu`` called four times) gets one
wrapper with ``sites`` = its call-site names from the graph (``relu``, ``relu@1``...): its range
Parameters then hold one value per site (shape ``[n]``), an int32 Parameter
``<cell>.qat.calls`` counts the training calls, and the call ``calls mod n`` updates its site's
entry alone (a one-hot select), as the calibration probes number their rows. ``counting`` (set by
``quantize_aware`` for one eval forward) makes a wrapper count its calls and nothing else, to
check the calls per step match the graph's sites. A quantized cell
called at several sites keeps its sites' input EMAs apart too, but clips every site at their
union (the record holds one scale_d / offset_d per cell); a learned range is one pair.

With ``power_of_two`` (docs/qat.md, "Power-of-two QAT") a quantizer is a ``<tensor>_log2t``
Parameter holding ``log2 t`` of a threshold ``t`` (trained, TQT, or set from the EMA), its
exponent ``ceil(log2 t - log2 127)``: :class:`QATQuant` quantizes its input (unless its
producer's quantizer already did: ``quantize_input=False``), its weight (per tensor, the
export's exponent) and its output (unless a folded BN adds its bias after it);
:class:`QATObserve` its output, :class:`QATObserveInput` also its input (a functional op's
output), each when told to.

Example:
    >>> import numpy as np
    >>> from mindspore import Tensor, nn
    >>> q = QATQuant(nn.Dense(2, 1), "fc", "Dense", bits=4)
    >>> sorted(p.name for p in q.get_parameters())[:3]
    ['bias', 'fc.qat.input_max', 'fc.qat.input_min']
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.nn.layer.conv import _deconv_output_length

from amct_bridge.calibration.qat import union_range
from amct_bridge.errors import QuantError
from amct_bridge.mindspore.qat.fake_quant import (
    arq_fake_quant,
    fake_quant_pow2,
    fake_quant_range,
    limits,
    log2_of_absmax,
    round_half_up_ste,
    threshold_exponent,
    weight_exponent,
)
from amct_bridge.quant.qat import THRESHOLD_WARMUP

__all__ = [
    "OUT_AXIS",
    "QATObserve",
    "QATObserveInput",
    "QATQuant",
    "output_padding",
    "range_params",
]

#: kind -> the weight's output-channel axis in MindSpore's layout (None: one scale).
OUT_AXIS: dict[str, int | None] = {
    "Conv2D": 0,
    "DepthwiseConv2D": 0,  # (C*m, 1, kH, kW)
    "Conv1D": 0,  # nn.Conv1d: (out, in, 1, k), a Conv2D of height 1
    "DepthwiseConv1D": 0,
    "Conv2DTranspose": 1,  # (in, out, kH, kW)
    "Dense": None,
    "AveragePooling2D": None,
}


def output_padding(cell: nn.Cell, key: str) -> tuple[int, int]:
    """``(bottom, right)`` zero rows / columns an ``nn.Conv2dTranspose`` appends to its output.

    MindSpore 2.10 applies ``output_padding`` after the transposed convolution and its bias
    as ``ops.Pad`` with zeros (not PyTorch's extra computed rows: the bias is not added there
    either), and only with ``pad_mode='pad'``, each value below ``max(stride, dilation)``. The
    cell checks that when it runs; the QAT cell computes the op itself, so it is checked here.

    Raises:
        QuantError: a value the cell itself would refuse when run.

    Example:
        >>> output_padding(nn.Conv2dTranspose(1, 1, 3, 2, pad_mode="pad", output_padding=1), "up")
        (1, 1)
    """
    pad = getattr(cell, "output_padding", 0)
    pads = (int(pad), int(pad)) if isinstance(pad, int) else tuple(int(p) for p in pad)
    for axis, p in zip(("height", "width"), pads, strict=True):
        i = 0 if axis == "height" else 1
        limit = max(cell.stride[i], cell.dilation[i])
        if not 0 <= p < limit:
            raise QuantError(
                f"cell {key!r}: Conv2dTranspose output_padding {pad}: the {axis} value must be in "
                f"[0, max(stride, dilation)) = [0, {limit}) (the cell itself refuses it when run)"
            )
    if any(pads) and not cell.is_pad:
        raise QuantError(
            f"cell {key!r}: Conv2dTranspose output_padding {pad} needs pad_mode='pad', not "
            f"{cell.pad_mode!r} (the cell itself refuses it when run)"
        )
    return pads


def range_params(
    key: str, tensor: str, *, trainable: bool, sites: int = 1
) -> tuple[Parameter, ...]:
    """``(min, max, seen)`` Parameters of one tracked tensor of cell ``key``: scalars, or one
    value per call site (shape ``[sites]``) for a cell called at several sites.

    Example:
        >>> [p.name for p in range_params("conv1", "input", trainable=False)]
        ['conv1.qat.input_min', 'conv1.qat.input_max', 'conv1.qat.input_seen']
        >>> range_params("relu", "output", trainable=False, sites=4)[0].shape
        (4,)
    """
    zero = np.zeros(() if sites <= 1 else (int(sites),), np.float32)
    lo, hi = (
        Parameter(Tensor(zero), name=f"{key}.qat.{tensor}_{end}", requires_grad=trainable)
        for end in ("min", "max")
    )
    seen = Parameter(Tensor(zero), name=f"{key}.qat.{tensor}_seen", requires_grad=False)
    return lo, hi, seen


def batch_range(x):
    """``(min, max)`` of ``x`` as float32 scalars, constants for the gradient.

    Reduced over a flat view: on CPU, ReduceMin / ReduceMax over all axes of an N-d tensor take
    several times as long as over the one axis of the same data flattened (docs/mindspore.md,
    "Speed").

    Example:
        >>> import numpy as np
        >>> lo, hi = batch_range(Tensor(np.float32([[[-1.0, 2.0]], [[0.5, 3.0]]])))
        >>> float(lo.asnumpy()), float(hi.asnumpy())
        (-1.0, 3.0)
    """
    xs = ops.reshape(ops.stop_gradient(x), (-1,))
    if xs.dtype != ms.float32:
        xs = ops.cast(xs, ms.float32)
    return ops.reduce_min(xs), ops.reduce_max(xs)


def track_ema(x, lo_p, hi_p, seen_p, decay: float, rest: float):
    """Move ``[lo_p, hi_p]`` towards ``x``'s min/max (the first batch sets it); return it.

    ``range <- decay * range + rest * batch`` with ``rest = 1 - decay``
    (:func:`amct_bridge.quant.qat.ema_update`).
    """
    batch_lo, batch_hi = batch_range(x)
    first = seen_p <= 0.0
    lo = ops.select(first, batch_lo, decay * lo_p + rest * batch_lo)
    hi = ops.select(first, batch_hi, decay * hi_p + rest * batch_hi)
    ops.assign(lo_p, lo)
    ops.assign(hi_p, hi)
    ops.assign_add(seen_p, ops.ones_like(seen_p))
    return lo, hi


def threshold_param(key: str, tensor: str, *, trainable: bool) -> Parameter:
    """The ``log2 t`` Parameter of one power-of-two quantizer (``<cell>.qat.<tensor>_log2t``).

    Example:
        >>> threshold_param("conv1", "output", trainable=True).name
        'conv1.qat.output_log2t'
    """
    return Parameter(
        Tensor(np.float32(0.0)), name=f"{key}.qat.{tensor}_log2t", requires_grad=trainable
    )


def track_pow2(x, lo_p, hi_p, seen_p, log2t_p, decay: float, rest: float, learned: bool):
    """One training step of a power-of-two quantizer: the EMA of ``x`` moves (the sidecar's
    observed range); ``log2 t`` is, learned, the mean of the first ``THRESHOLD_WARMUP``
    batches' ``log2 max|x|`` then the trained Parameter (its gradient flows back through the
    returned value), or, ``ema``, ``log2`` of the EMA's ``max(|lo|, |hi|)``. Returns the
    exponent ``ceil(log2 t - log2 127)``."""
    n = seen_p + 0.0  # batches seen before this one (read before the EMA counts this one)
    batch_lo, batch_hi = batch_range(x)
    lo, hi = track_ema(x, lo_p, hi_p, seen_p, decay, rest)
    if learned:
        # the running mean of the first batches' log2 max|x| (THRESHOLD_WARMUP), then trained
        mean = log2t_p + (log2_of_absmax(batch_lo, batch_hi) - log2t_p) / (n + 1.0)
        t = ops.select(n < THRESHOLD_WARMUP, mean, log2t_p)
        # GRAPH_MODE drops the EMA's assigns when nothing uses what it returns
        t = ops.depend(ops.depend(t, lo), hi)
        ops.assign(log2t_p, ops.stop_gradient(t))
        return threshold_exponent(log2t_p + ops.stop_gradient(t - log2t_p))
    t = log2_of_absmax(lo, hi)
    ops.assign(log2t_p, t)
    return threshold_exponent(t)


def quantize_pow2(x, lo_p, hi_p, seen_p, log2t_p, training: bool, decay, rest, learned):
    """``(x fake-quantized by one power-of-two quantizer, its exponent)``; in inference before
    any training step ``x`` passes unchanged."""
    if training:
        e = track_pow2(x, lo_p, hi_p, seen_p, log2t_p, decay, rest, learned)
        return fake_quant_pow2(x, e), ops.stop_gradient(e)
    e = threshold_exponent(log2t_p)
    y = ops.select(ops.broadcast_to(seen_p > 0.0, x.shape), fake_quant_pow2(x, e), x)
    return y, e


def track_ema_site(x, lo_p, hi_p, seen_p, site, hot, decay: float, rest: float):
    """:func:`track_ema` of call site ``site`` (int32 scalar; ``hot``: its one-hot bool mask)
    in per-site Parameters ``[n]``: the same float32 arithmetic on that site's entry, the other
    entries unchanged. Returns the new ``(lo, hi)`` vectors."""
    batch_lo, batch_hi = batch_range(x)
    first = ops.gather(seen_p, site, 0) <= 0.0
    lo = ops.select(first, batch_lo, decay * ops.gather(lo_p, site, 0) + rest * batch_lo)
    hi = ops.select(first, batch_hi, decay * ops.gather(hi_p, site, 0) + rest * batch_hi)
    lo_all = ops.select(hot, ops.broadcast_to(lo, lo_p.shape), lo_p)
    hi_all = ops.select(hot, ops.broadcast_to(hi, hi_p.shape), hi_p)
    ops.assign(lo_p, lo_all)
    ops.assign(hi_p, hi_all)
    ops.assign_add(seen_p, ops.cast(hot, ms.float32))
    return lo_all, hi_all


def _union(lo_p, hi_p, seen_p) -> tuple[float, float, float]:
    """A tracked tensor's ``(min, max, seen)``: its values, or the union of its sites'."""
    lo, hi, seen = (np.atleast_1d(p.asnumpy()).astype(np.float64) for p in (lo_p, hi_p, seen_p))
    rows = zip(lo, hi, seen, strict=True)
    return union_range(rows)


class _Sites:
    """Call-site bookkeeping of a wrapper (mixed into the cells below): ``site_names``, and for
    several sites the call counter Parameter and the site ids."""

    def _init_sites(self, key: str, sites) -> None:
        names = list(sites) if sites else [key]
        self.site_names = names
        self.n_sites = len(names)
        self.shared = self.n_sites > 1
        # quantize_aware's one counting forward (eval mode): calls counted, no state moved
        self.counting = False
        if self.shared:
            self.calls = Parameter(
                Tensor(np.int32(0)), name=f"{key}.qat.calls", requires_grad=False
            )
            self.site_ids = Tensor(np.arange(self.n_sites, dtype=np.int32))
            self.one = Tensor(1, ms.int32)

    def _site(self):
        """This call's site (int32 scalar) and its one-hot mask; counts the call."""
        site = ops.floor_mod(self.calls + 0, self.n_sites)  # read before the increment
        ops.assign_add(self.calls, self.one)
        return site, ops.equal(self.site_ids, site)

    def _count(self):
        """Counts a call and nothing else (``counting``: quantize_aware's check that every call
        site of the graph runs once per step)."""
        ops.assign_add(self.calls, self.one)

    def tracked(self) -> dict[tuple[str, str], tuple[float, float, float]]:
        """``(site or cell name, "input" / "output") -> (min, max, seen)`` of every tracked
        tensor: one row per site where the state is per site, else one under the cell's key."""
        out = {}
        for tensor, params in self._tracked_params():
            values = [p.asnumpy().astype(np.float64) for p in params]
            if values[0].ndim == 0:
                out[(self.key, tensor)] = tuple(float(v) for v in values)
            else:
                for k, name in enumerate(self.site_names):
                    out[(name, tensor)] = tuple(float(v[k]) for v in values)
        return out


class QATObserve(_Sites, nn.Cell):
    """Runs ``cell`` unchanged; while training, an EMA of its output's min/max (per call site
    when ``sites`` names several).

    Example:
        >>> o = QATObserve(nn.ReLU(), "relu")
        >>> [p.name for p in o.get_parameters()][0]
        'relu.qat.output_min'
        >>> QATObserve(nn.ReLU(), "relu", sites=["relu", "relu@1"]).out_max.shape
        (2,)
    """

    def __init__(
        self,
        cell: nn.Cell,
        key: str,
        ema_decay: float = 0.99,
        sites: list[str] | None = None,
        quantize_output: bool = False,
        learned: bool = False,
    ) -> None:
        super().__init__(auto_prefix=False)
        self.insert_child_to_cell("cell", cell)
        self.key = key
        self.decay = float(ema_decay)
        self.rest = float(1.0 - ema_decay)
        self._init_sites(key, sites)
        self.out_min, self.out_max, self.out_seen = range_params(
            key, "output", trainable=False, sites=self.n_sites
        )
        # power-of-two QAT (one call site): the output's quantizer
        self.quantize_output = bool(quantize_output)
        self.learned = bool(learned)
        # a folded BN whose bias the quantized cell before it adds (link_folded_bias)
        self.passthrough = False
        if self.quantize_output:
            if self.shared:
                raise QuantError(f"cell {key!r}: a power-of-two quantizer at several sites")
            self.out_log2t = threshold_param(key, "output", trainable=self.learned)

    def _tracked_params(self):
        return [("output", (self.out_min, self.out_max, self.out_seen))]

    def _out_pow2(self, y):
        yq, _ = quantize_pow2(
            y, self.out_min, self.out_max, self.out_seen, self.out_log2t, self.training,
            self.decay, self.rest, self.learned,
        )  # fmt: skip
        return yq

    def construct(self, *inputs):
        """The cell's output; its range is tracked in training."""
        if self.counting:
            self._count()
        if self.passthrough:
            return self._out_pow2(inputs[0])
        y = self.cell(*inputs)
        if self.quantize_output:
            return self._out_pow2(y)
        if self.training:
            if self.shared:
                site, hot = self._site()
                track_ema_site(
                    y, self.out_min, self.out_max, self.out_seen, site, hot, self.decay, self.rest
                )
            else:
                track_ema(y, self.out_min, self.out_max, self.out_seen, self.decay, self.rest)
        return y

    def output_range(self) -> tuple[float, float, float]:
        """``(min, max, seen)`` of the output, as floats (several sites: their union)."""
        return _union(self.out_min, self.out_max, self.out_seen)


class QATObserveInput(QATObserve):
    """A :class:`QATObserve` that also tracks its input: the input is the output of a
    functional op (``x + y``, ``ops.concat``) that has no cell to observe it.

    Example:
        >>> o = QATObserveInput(nn.ReLU(), "relu")
        >>> sorted(p.name for p in o.get_parameters())[:2]
        ['relu.qat.input_max', 'relu.qat.input_min']
    """

    def __init__(
        self,
        cell: nn.Cell,
        key: str,
        ema_decay: float = 0.99,
        sites: list[str] | None = None,
        quantize_output: bool = False,
        learned: bool = False,
        quantize_input: bool = False,
    ) -> None:
        super().__init__(cell, key, ema_decay, sites, quantize_output, learned)
        self.in_min, self.in_max, self.in_seen = range_params(
            key, "input", trainable=False, sites=self.n_sites
        )
        # power-of-two QAT: the functional op's output (this cell's input) is quantized here
        self.quantize_input = bool(quantize_input)
        if self.quantize_input:
            if self.shared:
                raise QuantError(f"cell {key!r}: a power-of-two quantizer at several sites")
            self.in_log2t = threshold_param(key, "input", trainable=self.learned)

    def _tracked_params(self):
        return [("input", (self.in_min, self.in_max, self.in_seen)), *super()._tracked_params()]

    def construct(self, *inputs):
        """The cell's output; its input and output ranges are tracked in training."""
        if self.counting:
            self._count()
        if self.quantize_input or self.quantize_output:
            return self._construct_pow2(*inputs)
        if not self.training:
            return self.cell(*inputs)
        x = inputs[0]
        if self.shared:
            site, hot = self._site()
            d, r = self.decay, self.rest
            track_ema_site(x, self.in_min, self.in_max, self.in_seen, site, hot, d, r)
            y = self.cell(*inputs)
            track_ema_site(y, self.out_min, self.out_max, self.out_seen, site, hot, d, r)
        else:
            track_ema(x, self.in_min, self.in_max, self.in_seen, self.decay, self.rest)
            y = self.cell(*inputs)
            track_ema(y, self.out_min, self.out_max, self.out_seen, self.decay, self.rest)
        return y

    def _construct_pow2(self, *inputs):
        x = inputs[0]
        if self.quantize_input:
            x, _ = quantize_pow2(
                x, self.in_min, self.in_max, self.in_seen, self.in_log2t, self.training,
                self.decay, self.rest, self.learned,
            )  # fmt: skip
        elif self.training:
            track_ema(x, self.in_min, self.in_max, self.in_seen, self.decay, self.rest)
        y = self.cell(x, *inputs[1:])
        if self.quantize_output:
            return self._out_pow2(y)
        if self.training:
            track_ema(y, self.out_min, self.out_max, self.out_seen, self.decay, self.rest)
        return y

    def input_range(self) -> tuple[float, float, float]:
        """``(min, max, seen)`` of the input, as floats (several sites: their union)."""
        return _union(self.in_min, self.in_max, self.in_seen)


class QATQuant(_Sites, nn.Cell):
    """Fake-quantizes ``cell``'s input (clip range tracked or learned) and weight (ARQ,
    recomputed every step), then computes the cell's op on them (docs/qat.md, MindSpore).

    Args:
        cell: ``nn.Conv2d`` / ``nn.Conv1d`` (group 1 or depthwise), ``nn.Dense``,
            ``nn.Conv2dTranspose`` or ``nn.AvgPool2d`` (input only).
        key: its ``cells_and_names()`` name (record key, parameter names).
        kind: its kind (:func:`amct_bridge.mindspore.cells.kind_of`).
        bits: 8 or 4.
        activation_range: "ema" or "learned".
        ema_decay: EMA momentum.
        symmetric: offset 0 for the input (``activation_offset=False``).
        channel_wise: per-output-channel weight scales (convolutions).
        sites: the cell's call-site names when it is called at several sites per step: each
            keeps its own output EMA and (``ema``) input EMA; every site clips at the union of
            the input EMAs (``learned``: one range, started at the union of the first step's
            sites), as the record holds one scale_d / offset_d per cell.
        power_of_two: ESP-DL's power-of-two format (module docstring); then
            ``quantize_input`` / ``quantize_output`` say which of its tensors it quantizes.
        preactivation: an ``nn.Dense`` called once: also track (EMA) its output before its
            activation cell (``nn.Dense(..., activation="softmax")``: the logits), the
            sidecar's ``preactivation``.

    Example:
        >>> q = QATQuant(nn.Conv2d(1, 2, 3), "conv", "Conv2D", bits=8)
        >>> q.out_axis
        0
    """

    def __init__(
        self,
        cell: nn.Cell,
        key: str,
        kind: str,
        bits: int = 8,
        activation_range: str = "ema",
        ema_decay: float = 0.99,
        symmetric: bool = False,
        channel_wise: bool = True,
        sites: list[str] | None = None,
        power_of_two: bool = False,
        quantize_input: bool = True,
        quantize_output: bool = True,
        preactivation: bool = False,
    ) -> None:
        super().__init__(auto_prefix=False)
        if kind not in OUT_AXIS:
            raise QuantError(f"cell {key!r} ({type(cell).__name__}, {kind}) is not quantizable")
        self.insert_child_to_cell("cell", cell)
        self.key = key
        self.kind = kind
        self.bits = int(bits)
        self.qmin, self.qmax = limits(bits)
        self.learned = activation_range == "learned"
        self.decay = float(ema_decay)
        self.rest = float(1.0 - ema_decay)
        self.symmetric = bool(symmetric)
        self.has_weight = kind != "AveragePooling2D"
        self.out_axis = OUT_AXIS[kind] if channel_wise else None
        self._init_sites(key, sites)
        self.site_input = self.shared and not self.learned  # an input EMA per site
        self.in_min, self.in_max, self.in_seen = range_params(
            key, "input", trainable=self.learned, sites=self.n_sites if self.site_input else 1
        )
        self.out_min, self.out_max, self.out_seen = range_params(
            key, "output", trainable=False, sites=self.n_sites
        )
        # nn.Dense(activation=...) called once: its output before the activation too
        self.track_pre = (
            bool(preactivation)
            and kind == "Dense"
            and not self.shared
            and bool(getattr(cell, "activation_flag", False))
        )
        if self.track_pre:
            self.pre_min, self.pre_max, self.pre_seen = range_params(
                key, "preactivation", trainable=False
            )
        # off where a folded BN follows: its observer sees the same tensor plus the bias
        self.track_output = True
        self.is_transpose = kind == "Conv2DTranspose"
        pads = output_padding(cell, key) if self.is_transpose else (0, 0)
        self.has_output_padding = any(pads)
        # as nn.Conv2dTranspose.construct: zeros after the bias, bottom rows and right columns
        self.pad_output = ops.Pad(((0, 0), (0, 0), (0, pads[0]), (0, pads[1])))
        self.is_dense = kind == "Dense"
        # nn.Conv1d runs its Conv2D primitive on the input expanded to height 1 (its construct)
        self.is_1d = kind in ("Conv1D", "DepthwiseConv1D")
        self.world = 1  # set_ranks(): a data-parallel run starts learned ranges from all ranks
        self.power_of_two = bool(power_of_two)
        self.quantize_input = bool(quantize_input)
        self.quantize_output = bool(quantize_output)
        if self.power_of_two:
            if self.shared:
                raise QuantError(f"cell {key!r}: power_of_two at several call sites")
            # the EMAs above stay (sidecar's observed ranges, batches), not trained
            self.in_min.requires_grad = self.in_max.requires_grad = False
            if self.quantize_input:
                self.in_log2t = threshold_param(key, "input", trainable=self.learned)
            if self.quantize_output:
                self.out_log2t = threshold_param(key, "output", trainable=self.learned)
        # links to other cells' Parameters (plain lists: not this cell's own Parameters, no
        # renaming; GRAPH_MODE reads them as Parameters): the producer's threshold, a folded
        # BN's beta
        object.__setattr__(self, "_source", [])
        object.__setattr__(self, "_folded_bias", [])

    def link_source(self, log2t: Parameter) -> None:
        """Power-of-two, input quantized by its producer: that quantizer's ``log2 t`` (its
        exponent is the bias's grid ``e_in + e_w``, as on the chip).

        Example:
            >>> # quantize_aware(..., power_of_two=True) links every such cell
        """
        self._source[:] = [log2t]

    def link_folded_bias(self, beta: Parameter) -> None:
        """Power-of-two, a BatchNorm2d folded into this cell: this cell adds the BN's ``beta``
        (the folded bias) rounded to ``e_in + e_w`` as the chip stores it; the BN's wrapper
        passes its input on.

        Example:
            >>> # quantize_aware(..., power_of_two=True) links every folded cell
        """
        self._folded_bias[:] = [beta]

    def set_ranks(self, rank: int, world: int) -> None:
        """In a data-parallel run of ``world`` ranks, a learned range starts at the min / max of
        every rank's first batch (one small AllReduce, in the first step only), so every rank
        holds the same range; the gradient all-reduce then moves it alike on every rank
        (``quantize_aware`` calls it under :func:`amct_bridge.mindspore.distributed.current`).

        Example:
            >>> q = QATQuant(nn.Dense(2, 1), "fc", "Dense", activation_range="learned")
            >>> q.set_ranks(0, 1); q.world  # one rank: nothing to exchange
            1
        """
        self.world = int(world)
        if self.world > 1 and self.learned:
            row = np.zeros((self.world, 1), np.float32)
            row[int(rank)] = 1.0
            self.rank_row = Tensor(row)
            self.all_reduce = ops.AllReduce()  # sums: each rank fills its own row

    def construct(self, x):
        """The cell's output on the fake-quantized input and weight."""
        if self.counting:
            self._count()
        if self.power_of_two:
            return self._construct_pow2(x)
        if self.training:
            if self.shared:
                site, hot = self._site()
                lo, hi = self._update_sites(x, site, hot)
                y = self._op(fake_quant_range(x, lo, hi, self.qmin, self.qmax, self.symmetric))
                if self.track_output:
                    d, r = self.decay, self.rest
                    track_ema_site(y, self.out_min, self.out_max, self.out_seen, site, hot, d, r)
                return y
            lo, hi = self._update(x)
            y = self._op(fake_quant_range(x, lo, hi, self.qmin, self.qmax, self.symmetric))
            if self.track_output:
                track_ema(y, self.out_min, self.out_max, self.out_seen, self.decay, self.rest)
            return y
        if self.site_input:  # every site clips at the union of the sites' EMAs
            lo, hi = ops.reduce_min(self.in_min), ops.reduce_max(self.in_max)
            seen = ops.reduce_max(self.in_seen)
        else:
            lo, hi, seen = self.in_min, self.in_max, self.in_seen
        xq = fake_quant_range(x, lo, hi, self.qmin, self.qmax, self.symmetric)
        # before any training batch the range is unknown: the input passes unchanged
        xq = ops.select(ops.broadcast_to(seen > 0.0, x.shape), xq, x)
        return self._op(xq)

    def _construct_pow2(self, x):
        d, r, learned = self.decay, self.rest, self.learned
        if self.quantize_input:
            xq, e_in = quantize_pow2(
                x, self.in_min, self.in_max, self.in_seen, self.in_log2t, self.training, d, r,
                learned,
            )  # fmt: skip
            y = self._op(xq, e_in)
        else:  # already on its producer's grid: only its EMA (the sidecar's observed range)
            if self.training:
                track_ema(x, self.in_min, self.in_max, self.in_seen, d, r)
            if self._source:
                y = self._op(x, ops.stop_gradient(threshold_exponent(self._source[0])))
            else:
                y = self._op(x)
        if self.quantize_output:
            yq, _ = quantize_pow2(
                y, self.out_min, self.out_max, self.out_seen, self.out_log2t, self.training, d,
                r, learned,
            )  # fmt: skip
            return yq
        if self.training and self.track_output:
            track_ema(y, self.out_min, self.out_max, self.out_seen, d, r)
        return y

    def _op(self, xq, e_in=None):
        """The cell's op on the fake-quantized input, with the fake-quantized weight (power of
        two: per tensor at the export's exponent, the bias rounded to ``e_in + e_w`` as the
        chip stores it when the input's exponent ``e_in`` is known here)."""
        if not self.has_weight:
            return self.cell(xq)
        bias = self.cell.bias if self.cell.has_bias else None
        if self._folded_bias:  # the folded BN's beta (its wrapper passes its input on)
            bias = self._folded_bias[0]
        if self.power_of_two:
            e_w = weight_exponent(self.cell.weight)
            w = fake_quant_pow2(self.cell.weight, e_w)
            if bias is not None and e_in is not None:
                step = ops.pow(2.0, e_in + e_w)
                bias = round_half_up_ste(bias / step) * step
        else:
            w = arq_fake_quant(self.cell.weight, self.out_axis, self.qmin, self.qmax)
        if self.is_dense:
            return self._dense(xq, w, bias)
        if self.is_transpose:
            return self._transpose(xq, w, bias)
        if self.is_1d:
            xq = self.cell.expand_dims(xq, 2)
        y = self.cell.conv2d(xq, w)
        if bias is not None:
            y = self.cell.bias_add(y, bias)
        return self.cell.squeeze(y) if self.is_1d else y

    def _batch_range(self, x):
        """``x``'s min / max (over every rank's batch for a learned range of a data-parallel
        run: that range starts there)."""
        batch_lo, batch_hi = batch_range(x)
        if self.world > 1:
            rows = self.all_reduce(self.rank_row * ops.stack([batch_lo, batch_hi]).reshape(1, 2))
            batch_lo, batch_hi = ops.reduce_min(rows[:, 0]), ops.reduce_max(rows[:, 1])
        return batch_lo, batch_hi

    def _update(self, x):
        if not self.learned:
            return track_ema(x, self.in_min, self.in_max, self.in_seen, self.decay, self.rest)
        # learned: the first batch sets the range, then only gradients move it
        first = self.in_seen <= 0.0
        if self.world > 1:
            lo, hi = self._shared_start(x, first)
        else:
            batch_lo, batch_hi = batch_range(x)
            lo = ops.select(first, batch_lo, self.in_min)
            hi = ops.select(first, batch_hi, self.in_max)
        ops.assign(self.in_min, ops.stop_gradient(lo))
        ops.assign(self.in_max, ops.stop_gradient(hi))
        ops.assign_add(self.in_seen, ops.ones_like(self.in_seen))
        return lo, hi

    def _update_sites(self, x, site, hot):
        """The clip range of call site ``site`` of a cell called at several sites."""
        if not self.learned:
            lo_all, hi_all = track_ema_site(
                x, self.in_min, self.in_max, self.in_seen, site, hot, self.decay, self.rest
            )
            # the union of the sites' EMAs (a site not seen yet holds 0, inside the range's
            # widening to 0 anyway): what the record's one scale_d / offset_d encodes
            return ops.reduce_min(lo_all), ops.reduce_max(hi_all)
        # learned: one range for every site; the first step's sites set it (their union),
        # then only gradients move it; ``seen`` counts steps (site 0's calls)
        batch_lo, batch_hi = self._batch_range(x)
        first = self.in_seen <= 0.0
        widen = ops.logical_and(
            ops.logical_and(site > 0, self.calls <= self.n_sites), self.in_seen <= 1.0
        )
        lo = ops.select(first, batch_lo, self.in_min)
        hi = ops.select(first, batch_hi, self.in_max)
        lo = ops.select(widen, ops.minimum(lo, batch_lo), lo)
        hi = ops.select(widen, ops.maximum(hi, batch_hi), hi)
        ops.assign(self.in_min, ops.stop_gradient(lo))
        ops.assign(self.in_max, ops.stop_gradient(hi))
        ops.assign_add(self.in_seen, ops.cast(site == 0, ms.float32))
        return lo, hi

    def _shared_start(self, x, first):
        # The AllReduce only in the first step (a branch: every rank has seen as many steps, so
        # all take the same one): a collective is a sync point of the ranks, costly on CPU, and
        # after the first step its result went unused. The same values as a select between
        # the all-reduced batch range and the Parameters.
        if first:
            batch_lo, batch_hi = batch_range(x)
            rows = self.all_reduce(self.rank_row * ops.stack([batch_lo, batch_hi]).reshape(1, 2))
            lo, hi = ops.reduce_min(rows[:, 0]), ops.reduce_max(rows[:, 1])
        else:
            lo, hi = self.in_min, self.in_max
        return lo, hi

    def _dense(self, x, w, bias):
        cell = self.cell
        shape = x.shape
        if len(shape) != 2:
            x = ops.reshape(x, (-1, shape[-1]))
        y = cell.matmul(x, w)
        if bias is not None:
            y = cell.bias_add(y, bias)
        if cell.activation_flag:
            if self.track_pre and self.training:
                track_ema(y, self.pre_min, self.pre_max, self.pre_seen, self.decay, self.rest)
            y = cell.activation(y)
        if len(shape) != 2:
            y = ops.reshape(y, shape[:-1] + (y.shape[-1],))
        return y

    def _transpose(self, x, w, bias):
        cell = self.cell
        n, _, h, wd = x.shape
        h_out = _deconv_output_length(
            cell.is_valid,
            cell.is_same,
            cell.is_pad,
            h,
            cell.kernel_size[0],
            cell.stride[0],
            cell.dilation[0],
            cell.padding_top + cell.padding_bottom,
        )
        w_out = _deconv_output_length(
            cell.is_valid,
            cell.is_same,
            cell.is_pad,
            wd,
            cell.kernel_size[1],
            cell.stride[1],
            cell.dilation[1],
            cell.padding_left + cell.padding_right,
        )
        y = cell.conv2d_transpose(x, w, (n, cell.out_channels, h_out, w_out))
        if bias is not None:
            y = cell.bias_add(y, bias)
        if self.has_output_padding:
            y = self.pad_output(y)
        return y

    def input_range(self) -> tuple[float, float, float]:
        """``(min, max, seen)`` of the input clip range, as floats (several sites: the union
        of their EMAs, what every site clips at)."""
        return _union(self.in_min, self.in_max, self.in_seen)

    def output_range(self) -> tuple[float, float, float]:
        """``(min, max, seen)`` of the output EMA, as floats (several sites: their union)."""
        return _union(self.out_min, self.out_max, self.out_seen)

    def _tracked_params(self):
        found = [
            ("input", (self.in_min, self.in_max, self.in_seen)),
            ("output", (self.out_min, self.out_max, self.out_seen)),
        ]
        if self.track_pre:
            found.append(("preactivation", (self.pre_min, self.pre_max, self.pre_seen)))
        return found

    def set_input_range(self, lo: float, hi: float) -> None:
        """Start from the range ``[lo, hi]`` (``init_record``): training continues the EMA (or
        the learned range) from it instead of from the first batch (every site's EMA for a
        cell called at several sites)."""
        shape = self.in_min.shape
        self.in_min.set_data(Tensor(np.full(shape, lo, np.float32)))
        self.in_max.set_data(Tensor(np.full(shape, hi, np.float32)))
        self.in_seen.set_data(Tensor(np.full(shape, 1.0, np.float32)))
