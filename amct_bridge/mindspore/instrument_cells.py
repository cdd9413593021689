"""The cells :mod:`amct_bridge.mindspore.instrument` puts into a network: :class:`Probe` (in
place of an observed cell) holding one :class:`Summary` per observed tensor, and the swap itself
(:func:`places`, :func:`put`).

Everything here runs as graph ops on Parameters (see the instrument module for the design):
no Python side effect in a ``construct``, so GRAPH_MODE compiles it into the network's graph.

Example:
    >>> from mindspore import nn
    >>> net = nn.SequentialCell([nn.ReLU()])
    >>> [(type(p).__name__, n) for p, n in places(net)[id(net[0])]]
    [('SequentialCell', '0')]
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from amct_bridge.calibration.protocol import Point

NO_LIMIT = 2**31 - 1  # int32 call counter: no limit
NO_GRID = np.array([np.inf, -np.inf], np.float32)  # a grid no batch is inside


def _param(value: np.ndarray, name: str) -> Parameter:
    return Parameter(Tensor(value), name=name, requires_grad=False)


#: Ring row columns: min, max, a NaN flag (the sum of x: NaN iff an element is NaN, barring
#: infinities of both signs, which min/max show), element count, marker (1: written, no own
#: histogram; 2: the row's histogram is the batch's own).
ROW = 5


class Summary:
    """The buffers of one observed tensor (one point); the :class:`Probe` that observes it owns
    them (a plain object, not a Cell: a sub-cell per tensor doubled the graph's compile time).

    Args:
        prefix: unique Parameter name prefix.
        point: the observed point (``bins``, ``channel_axis``, ``channels`` are used; a float
            ``inner`` is a scale: the cell sees the observed tensor times it, e.g. the output
            of a functional ``q @ kᵀ`` that reaches the Softmax cell as ``(q @ kᵀ) * 0.35``,
            so the summary is of the seen tensor divided by it).
        slots: ring rows.

    Example:
        >>> s = Summary("doc.0", Point("fc", "input", None, bins=4), 2)
        >>> s.mm.shape, s.hist.shape, s.acc.shape
        ((2, 5), (2, 4), (4,))
    """

    def __init__(self, prefix: str, point: Point, slots: int) -> None:
        self.slots = int(slots)
        self.bins = int(point.bins)
        self.channel_axis = point.channel_axis
        inner = point.inner
        self.scale = float(inner) if isinstance(inner, int | float) and inner != 1 else None
        self.mm = _param(np.zeros((slots, ROW), np.float64), f"{prefix}.minmax")
        self.hist = self.acc = self.grid = self.chan = None
        if self.bins:
            self.hist = _param(np.zeros((slots, self.bins), np.int32), f"{prefix}.hist")
            self.acc = _param(np.zeros(self.bins, np.int32), f"{prefix}.hist_acc")
            self.grid = _param(NO_GRID.copy(), f"{prefix}.grid")
        if self.channel_axis is not None:
            chans = (slots, 2, int(point.channels))
            self.chan = _param(np.zeros(chans, np.float32), f"{prefix}.channels")

    def parameters(self) -> list[Parameter]:
        """The buffers, in the order of :meth:`spec`'s indices."""
        return [p for p in (self.mm, self.hist, self.acc, self.grid, self.chan) if p is not None]

    def spec(self, first: int) -> tuple:
        """Static description for :func:`_summarise`: the buffers' indices in the probe's
        ParameterTuple (-1: absent), starting at ``first``, then bins, channel axis and scale
        (None: none)."""
        index, out = first, []
        for p in (self.mm, self.hist, self.acc, self.grid, self.chan):
            out.append(index if p is not None else -1)
            index += p is not None
        axis = -1 if self.channel_axis is None else int(self.channel_axis)
        return (*out, self.bins, axis, self.scale)


def _summarise(x, slot, within, bufs, spec):
    """Summarise ``x`` into ring row ``slot`` (shape (1,)) of the buffers ``spec`` names in
    ``bufs``; ``within``: the call is within the limit and may bin onto the grid. Returns the
    health flag (0, or NaN when ``x`` holds a NaN or an infinity, or its sum overflows: then
    the host reads the rows, which tell)."""
    mm, hist_ring, acc, grid_i, chan_i, bins, axis, scale = spec
    if x.dtype != ms.float32:
        x = ops.cast(x, ms.float32)
    x = ops.stop_gradient(x)
    if scale is not None:  # the tensor before a multiplication by a constant (Summary)
        x = x / scale
    # reduce the flat view over its one axis: on CPU, ReduceMin/Max/Sum over all axes of an
    # N-d tensor took ~10x as long as over axis 0 of the same data flattened (benchmark
    # ResNet: most of the calibrated eval step's extra time); the values are the same
    flat = ops.reshape(x, (-1,))
    lo = ops.reduce_min(flat, 0)
    hi = ops.reduce_max(flat, 0)
    # CPU ReduceMin/ReduceMax skip a NaN unless it is the first element: the sum is NaN when
    # an element is NaN (an infinity shows in min/max; an overflow gives +-inf, not NaN), one
    # pass fewer than the sum of x * 0; the host tests isnan (Instrumentation._rows_of)
    total = ops.reduce_sum(flat, 0)
    n = 1
    for d in x.shape:  # static: no Size op
        n *= d
    if bins:
        grid = bufs[grid_i]
        inside = ops.logical_and(ops.logical_and(lo >= grid[0], hi <= grid[1]), within)
        lo64, hi64 = ops.cast(lo, ms.float64), ops.cast(hi, ms.float64)
        top = ops.select(hi > lo, hi64, lo64 + 1.0)  # constant batch: all in bin 0
        start = ops.select(inside, ops.cast(grid[0], ms.float64), lo64)
        end = ops.select(inside, ops.cast(grid[1], ms.float64), top)
        pos = (ops.cast(flat, ms.float64) - start) / ((end - start) / bins)
        # pos >= 0, so the cast truncates like floor; NaN/Inf batches bin garbage into
        # valid bins (the clamp), the host stops on their min/max anyway
        index = ops.clamp(ops.cast(pos, ms.int32), 0, bins - 1)
        hist = ops.unsorted_segment_sum(ops.ones_like(index), index, bins)
        ops.assign_add(bufs[acc], hist * ops.cast(inside, ms.int32))
        ops.scatter_update(bufs[hist_ring], slot, ops.reshape(hist, (1, bins)))
        tail = ops.stack([ops.scalar_to_tensor(n, ms.float64), 2.0 - ops.cast(inside, ms.float64)])
    else:
        tail = Tensor((n, 1.0), ms.float64)
    row = ops.concat((ops.cast(ops.stack([lo, hi, total]), ms.float64), tail))
    ops.scatter_update(bufs[mm], slot, ops.reshape(row, (1, 5)))
    if axis >= 0:
        per = ops.swapaxes(x, 0, axis)
        per = ops.reshape(per, (per.shape[0], -1))
        chan = ops.stack([ops.reduce_min(per, 1), ops.reduce_max(per, 1)])
        ops.scatter_update(bufs[chan_i], slot, ops.expand_dims(chan, 0))
    return total * 0.0  # 0, or NaN for a NaN / an infinity / an overflowing sum


def _unregistered(cell: nn.Cell, name: str, value) -> None:
    """``cell.name = value`` for a Parameter or ParameterTuple, kept out of ``cell._params``."""
    object.__setattr__(cell, name, value)


class Probe(nn.Cell):
    """The wrapper put in place of an observed cell: summaries around the cell's own call.

    All summaries' buffers are one ParameterTuple of the probe and the summaries run inline
    (:func:`_summarise`), so the graph gains no sub-cell per observed tensor.
    ``getattr`` falls through to the wrapped cell, so ``self.conv.weight`` in a parent's
    ``construct`` still works while the probe is installed.

    Example:
        >>> p = Probe(nn.ReLU(), [], [], "doc", slots=1, calls=1)
        >>> type(p.cell).__name__, int(p.count.asnumpy())
        ('ReLU', 0)
    """

    def __init__(
        self,
        cell,
        inputs: list[Summary],
        outputs: list[Summary],
        prefix: str,
        slots: int,
        calls,
        health: Parameter | None = None,
    ) -> None:
        super().__init__(auto_prefix=False)
        self.insert_child_to_cell("cell", cell)  # setattr would rename the cell's parameters
        params: list[Parameter] = []
        specs: list[tuple] = []
        for summary in (*inputs, *outputs):
            specs.append(summary.spec(len(params)))
            params.extend(summary.parameters())
        self.in_specs = tuple(specs[: len(inputs)])
        self.out_specs = tuple(specs[len(inputs) :])
        self.has_inputs, self.has_outputs = bool(inputs), bool(outputs)
        self.has_grid = any(s.bins for s in (*inputs, *outputs))
        self.slots, self.calls = int(slots), int(calls)
        self.one = Tensor(1, ms.int32)
        self.last = 0  # host side: counter at the last drain
        # The statistics are attributes, not registered Parameters: both modes read and assign
        # them all the same, but parameters_and_names(), and so save_checkpoint and a
        # ModelCheckpoint during a calibrated epoch, never sees them.
        _unregistered(self, "bufs", ParameterTuple(params))
        _unregistered(self, "count", _param(np.zeros((), np.int32), f"{prefix}.count"))
        _unregistered(self, "limit", _param(np.full((), NO_LIMIT, np.int32), f"{prefix}.limit"))
        # one float32 shared by every probe of a network: the sum of the NaN flags, so the host
        # learns of a non-finite batch from one read per step instead of one per probe
        if health is None:
            health = _param(np.zeros((), np.float32), f"{prefix}.health")
        _unregistered(self, "health", health)

    def construct(self, *inputs):
        """Summarise the input(s), run the cell, summarise its output, count the call."""
        n = self.count + 0  # this call's number, read before the increment below
        slot = ops.reshape(ops.floor_mod(n, self.slots), (1,))
        within = n < self.limit if self.has_grid else n
        if self.has_inputs:
            for spec in self.in_specs:
                flag = _summarise(inputs[0], slot, within, self.bufs, spec)
                ops.assign_add(self.health, flag)
        out = self.cell(*inputs)
        if self.has_outputs:
            first = out[0] if isinstance(out, tuple) else out
            for spec in self.out_specs:
                flag = _summarise(first, slot, within, self.bufs, spec)
                ops.assign_add(self.health, flag)
        ops.assign_add(self.count, self.one)
        return out

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            cells = self.__dict__.get("_cells")
            if not cells or cells.get("cell") is None:
                raise
            return getattr(cells["cell"], name)


def places(net) -> dict[int, list[tuple[object, str]]]:
    """id(cell) -> every (parent, child name) holding it, over the whole cell tree.

    Example:
        >>> from mindspore import nn
        >>> relu = nn.ReLU()
        >>> [n for _, n in places(nn.SequentialCell([relu, nn.Dense(2, 2), relu]))[id(relu)]]
        ['0', '2']
    """
    out: dict[int, list[tuple[object, str]]] = {}
    seen: set[int] = set()
    stack = [net]
    while stack:
        parent = stack.pop()
        if id(parent) in seen:
            continue
        seen.add(id(parent))
        for name, child in parent._cells.items():
            if child is not None:
                out.setdefault(id(child), []).append((parent, name))
                stack.append(child)
    return out


def put(parent, name: str, cell) -> None:
    """``parent.name = cell`` without renaming parameters; SequentialCell runs its cell_list.

    Example:
        >>> from mindspore import nn
        >>> seq = nn.SequentialCell([nn.ReLU()]); put(seq, "0", nn.ReLU6())
        >>> type(seq.cell_list[0]).__name__
        'ReLU6'
    """
    parent.insert_child_to_cell(name, cell)
    if isinstance(parent, nn.SequentialCell):
        parent.cell_list = list(parent._cells.values())
