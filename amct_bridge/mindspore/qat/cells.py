"""The cells MindSpore QAT puts into a copy of the network: :class:`QATQuant` (fake-quantizes
a cell's input and weight, recomputes its op) and :class:`QATObserve` (runs a cell unchanged and
tracks its output range for the sidecar).

Both hold their ranges in ``Parameter`` s named ``<cell>.qat.<tensor>_min`` / ``_max`` /
``_seen`` (``seen``: training batches), so they are saved in checkpoints (training resumes) and
never collide with the network's own names; they wrap their cell as child ``cell`` without a
prefix (``insert_child_to_cell``), so the cell's parameters keep their names (``conv1.weight``).
Only graph ops and ``ops.assign`` in ``construct``: GRAPH_MODE compiles them, PyNative runs them.

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

from amct_bridge.errors import QuantError
from amct_bridge.mindspore.qat.fake_quant import arq_fake_quant, fake_quant_range, limits

__all__ = ["OUT_AXIS", "QATObserve", "QATObserveInput", "QATQuant", "range_params"]

#: kind -> the weight's output-channel axis in MindSpore's layout (None: one scale).
OUT_AXIS: dict[str, int | None] = {
    "Conv2D": 0,
    "DepthwiseConv2D": 0,  # (C*m, 1, kH, kW)
    "Conv2DTranspose": 1,  # (in, out, kH, kW)
    "Dense": None,
    "AveragePooling2D": None,
}


def range_params(key: str, tensor: str, *, trainable: bool) -> tuple[Parameter, ...]:
    """``(min, max, seen)`` Parameters of one tracked tensor of cell ``key``.

    Example:
        >>> [p.name for p in range_params("conv1", "input", trainable=False)]
        ['conv1.qat.input_min', 'conv1.qat.input_max', 'conv1.qat.input_seen']
    """
    lo, hi = (
        Parameter(
            Tensor(np.float32(0.0)), name=f"{key}.qat.{tensor}_{end}", requires_grad=trainable
        )
        for end in ("min", "max")
    )
    seen = Parameter(Tensor(np.float32(0.0)), name=f"{key}.qat.{tensor}_seen", requires_grad=False)
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


class QATObserve(nn.Cell):
    """Runs ``cell`` unchanged; while training, an EMA of its output's min/max.

    Example:
        >>> o = QATObserve(nn.ReLU(), "relu")
        >>> [p.name for p in o.get_parameters()][0]
        'relu.qat.output_min'
    """

    def __init__(self, cell: nn.Cell, key: str, ema_decay: float = 0.99) -> None:
        super().__init__(auto_prefix=False)
        self.insert_child_to_cell("cell", cell)
        self.key = key
        self.decay = float(ema_decay)
        self.rest = float(1.0 - ema_decay)
        self.out_min, self.out_max, self.out_seen = range_params(key, "output", trainable=False)

    def construct(self, *inputs):
        """The cell's output; its range is tracked in training."""
        y = self.cell(*inputs)
        if self.training:
            track_ema(y, self.out_min, self.out_max, self.out_seen, self.decay, self.rest)
        return y

    def output_range(self) -> tuple[float, float, float]:
        """``(min, max, seen)`` of the output, as floats."""
        return tuple(float(p.asnumpy()) for p in (self.out_min, self.out_max, self.out_seen))


class QATObserveInput(QATObserve):
    """A :class:`QATObserve` that also tracks its input: the input is the output of a
    functional op (``x + y``, ``ops.concat``) that has no cell to observe it.

    Example:
        >>> o = QATObserveInput(nn.ReLU(), "relu")
        >>> sorted(p.name for p in o.get_parameters())[:2]
        ['relu.qat.input_max', 'relu.qat.input_min']
    """

    def __init__(self, cell: nn.Cell, key: str, ema_decay: float = 0.99) -> None:
        super().__init__(cell, key, ema_decay)
        self.in_min, self.in_max, self.in_seen = range_params(key, "input", trainable=False)

    def construct(self, *inputs):
        """The cell's output; its input and output ranges are tracked in training."""
        if self.training:
            track_ema(inputs[0], self.in_min, self.in_max, self.in_seen, self.decay, self.rest)
        y = self.cell(*inputs)
        if self.training:
            track_ema(y, self.out_min, self.out_max, self.out_seen, self.decay, self.rest)
        return y

    def input_range(self) -> tuple[float, float, float]:
        """``(min, max, seen)`` of the input, as floats."""
        return tuple(float(p.asnumpy()) for p in (self.in_min, self.in_max, self.in_seen))


class QATQuant(nn.Cell):
    """Fake-quantizes ``cell``'s input (clip range tracked or learned) and weight (ARQ,
    recomputed every step), then computes the cell's op on them (docs/qat.md, MindSpore).

    Args:
        cell: ``nn.Conv2d`` (group 1 or depthwise), ``nn.Dense``, ``nn.Conv2dTranspose`` or
            ``nn.AvgPool2d`` (input only).
        key: its ``cells_and_names()`` name (record key, parameter names).
        kind: its kind (:func:`amct_bridge.mindspore.cells.kind_of`).
        bits: 8 or 4.
        activation_range: "ema" or "learned".
        ema_decay: EMA momentum.
        symmetric: offset 0 for the input (``activation_offset=False``).
        channel_wise: per-output-channel weight scales (convolutions).

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
        self.in_min, self.in_max, self.in_seen = range_params(key, "input", trainable=self.learned)
        self.out_min, self.out_max, self.out_seen = range_params(key, "output", trainable=False)
        # off where a folded BN follows: its observer sees the same tensor plus the bias
        self.track_output = True
        self.is_transpose = kind == "Conv2DTranspose"
        self.is_dense = kind == "Dense"
        self.world = 1  # set_ranks(): a data-parallel run starts learned ranges from all ranks

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
        if self.training:
            lo, hi = self._update(x)
            xq = fake_quant_range(x, lo, hi, self.qmin, self.qmax, self.symmetric)
        else:
            xq = fake_quant_range(x, self.in_min, self.in_max, self.qmin, self.qmax, self.symmetric)
            # before any training batch the range is unknown: the input passes unchanged
            xq = ops.select(ops.broadcast_to(self.in_seen > 0.0, x.shape), xq, x)
        if self.has_weight:
            w = arq_fake_quant(self.cell.weight, self.out_axis, self.qmin, self.qmax)
            if self.is_dense:
                y = self._dense(xq, w)
            elif self.is_transpose:
                y = self._transpose(xq, w)
            else:
                y = self.cell.conv2d(xq, w)
                if self.cell.has_bias:
                    y = self.cell.bias_add(y, self.cell.bias)
        else:
            y = self.cell(xq)
        if self.training and self.track_output:
            track_ema(y, self.out_min, self.out_max, self.out_seen, self.decay, self.rest)
        return y

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

    def _dense(self, x, w):
        cell = self.cell
        shape = x.shape
        if len(shape) != 2:
            x = ops.reshape(x, (-1, shape[-1]))
        y = cell.matmul(x, w)
        if cell.has_bias:
            y = cell.bias_add(y, cell.bias)
        if cell.activation_flag:
            y = cell.activation(y)
        if len(shape) != 2:
            y = ops.reshape(y, shape[:-1] + (y.shape[-1],))
        return y

    def _transpose(self, x, w):
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
        if cell.has_bias:
            y = cell.bias_add(y, cell.bias)
        return y

    def input_range(self) -> tuple[float, float, float]:
        """``(min, max, seen)`` of the input clip range, as floats."""
        return tuple(float(p.asnumpy()) for p in (self.in_min, self.in_max, self.in_seen))

    def output_range(self) -> tuple[float, float, float]:
        """``(min, max, seen)`` of the output EMA, as floats."""
        return tuple(float(p.asnumpy()) for p in (self.out_min, self.out_max, self.out_seen))

    def set_input_range(self, lo: float, hi: float) -> None:
        """Start from the range ``[lo, hi]`` (``init_record``): training continues the EMA (or
        the learned range) from it instead of from the first batch."""
        self.in_min.set_data(Tensor(np.float32(lo)))
        self.in_max.set_data(Tensor(np.float32(hi)))
        self.in_seen.set_data(Tensor(np.float32(1.0)))
