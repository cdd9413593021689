"""Simulated (fake-quantized) inference of a MindSpore network with a record's factors.

``simulate(net, record, data, labels)`` runs ``data`` through ``net`` as the deployed integer
network computes it and returns the outputs (and the accuracy with ``labels``); the
:func:`simulated` context manager does the same for any code run inside it (``Model.eval`` with
your own metrics). Every cell named in the record computes on quantized -> dequantized values,
with the math of the Keras adapter (:mod:`amct_bridge.keras.simulate`) and the shared core
(:mod:`amct_bridge.calibration.simulate`):

* its input: ``scale_d`` / ``offset_d`` with ``dst_type``'s bit width if set, else
  ``act_type``'s (INT8 default, INT16); DMQ records first divide the input per channel (axis 1,
  NCHW) by ``tensor_balance_factor``;
* its weight: ``scale_w`` (one value or one per output channel of MindSpore's layout: Conv2d
  OIHW axis 0, depthwise ``(C*m, 1, kH, kW)`` axis 0, Conv2dTranspose IOHW axis 1, Dense one
  value) applied to the BN-fused, DMQ-balanced weight where calibration folded a BatchNorm2d
  into the cell (same graph rule, ``skip_fusion`` honoured), divided back by the BN factor so
  the BatchNorm2d keeps running as it is. Biases stay float.

How: the weight Parameters temporarily hold the simulated values (``set_data``), and each
quantized cell is replaced (``insert_child_to_cell``, every place it is a child of) by a
wrapper cell whose ``construct`` fake-quantizes the input with graph ops only, so GRAPH_MODE
compiles it and PYNATIVE runs it; the compile caches of the network (and of the ``models`` /
cells given) are cleared on entry and exit. On exit the cells and the exact original weights
are back: same outputs, parameter names and checkpoint. Cells without a record entry stay
float. Record keys are ``cells_and_names()`` names; a key naming no quantizable cell is an error
(:class:`~amct_bridge.errors.RecordError`), as AMCT's "find <layer> failure".

Example:
    >>> import numpy as np, mindspore as ms
    >>> from mindspore import nn
    >>> from amct_bridge.records import LayerFactors, Record
    >>> net = nn.SequentialCell([nn.Dense(2, 1, has_bias=False)])
    >>> _ = net[0].weight.set_data(ms.Tensor(np.float32([[0.5, 0.25]])))
    >>> rec = Record({"0": LayerFactors(scale_d=0.5, offset_d=0, scale_w=[0.25], offset_w=[0])})
    >>> float(simulate(net, rec, np.float32([[1.2, 0.4]])).outputs[0, 0])  # 1*.5 + .5*.25
    0.625
"""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from amct_bridge.calibration.layers import ModelDesc
from amct_bridge.calibration.plan import batchnorm_chains
from amct_bridge.calibration.simulate import (
    balance_of,
    bn_factor,
    check_factors,
    input_quant,
    require_factors,
    simulated_kernel,
)
from amct_bridge.errors import RecordError
from amct_bridge.mindspore.cells import (
    BATCH_NORM_KINDS,
    FOLDABLE_KINDS,
    QUANTIZABLE_KINDS,
    describe,
    leaf_cells,
)
from amct_bridge.mindspore.instrument_cells import places, put
from amct_bridge.mindspore.session import input_count
from amct_bridge.mindspore.weights import batch_norm_params, kernel_of
from amct_bridge.quant.factors import quant_limits
from amct_bridge.records.model import Record

__all__ = ["QuantInput", "Simulation", "simulate", "simulated"]


class QuantInput(nn.Cell):
    """Wraps a cell; fake-quantizes (and DMQ-divides) its first input, then calls it.

    Args:
        cell: the wrapped cell (its weight Parameter already holds the simulated values).
        quant: ``[scale, offset, bits]`` of the input, or None (input stays float).
        balance: DMQ factors per input channel (axis 1), or None.

    ``getattr`` falls through to the wrapped cell (``self.conv.weight`` in a parent's
    ``construct`` still works).

    Example:
        >>> import numpy as np
        >>> q = QuantInput(nn.Identity(), [0.5, 0, 4], None)
        >>> q(Tensor(np.float32([0.26, 0.75, 9.0]))).asnumpy().tolist()  # 0.75/0.5 = 1.5 -> 2
        [0.5, 1.0, 3.5]
    """

    def __init__(self, cell, quant: list | None, balance: list[float] | None) -> None:
        super().__init__(auto_prefix=False)
        self.insert_child_to_cell("cell", cell)  # setattr would rename the cell's parameters
        self.has_quant = quant is not None
        self.has_balance = balance is not None
        scale, offset, bits = quant if quant is not None else (1.0, 0, 8)
        qmin, qmax = quant_limits(bits)
        # Divisions in float64, rounded once to float32: the correctly rounded float32 quotient
        # numpy computes (no reciprocal multiplication, whatever the graph passes do).
        self.scale64 = Tensor(np.float64(np.float32(scale)))
        self.scale32 = Tensor(np.float32(scale))
        self.offset = float(offset)
        self.qmin, self.qmax = float(qmin), float(qmax)
        values = balance if balance is not None else [1.0]
        self.balance = Tensor(np.asarray(values, np.float32).astype(np.float64))

    def construct(self, *inputs):
        """Fake-quantize ``inputs[0]`` (float32 math, back to its dtype), run the cell."""
        x = inputs[0]
        y = ops.cast(x, ms.float32)
        if self.has_balance:
            shape = (1, -1) + (1,) * (len(x.shape) - 2)
            divided = ops.cast(y, ms.float64) / ops.reshape(self.balance, shape)
            y = ops.cast(divided, ms.float32)
        if self.has_quant:
            v = ops.cast(ops.cast(y, ms.float64) / self.scale64, ms.float32)
            r = ops.sign(v) * ops.floor(ops.abs(v) + 0.5)  # C's round, as numpy's reference
            q = ops.clamp(r + self.offset, self.qmin, self.qmax)
            y = (q - self.offset) * self.scale32
        return self.cell(ops.cast(y, x.dtype), *inputs[1:])

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            cells = self.__dict__.get("_cells")
            if not cells or cells.get("cell") is None:
                raise
            return getattr(cells["cell"], name)


@dataclass
class Simulation:
    """What :func:`simulate` returns.

    Attributes:
        outputs: the simulated outputs (numpy, batches concatenated; a tuple of arrays for a
            network with several outputs).
        accuracy: top-1 accuracy of the (first) output against ``labels``, None without labels.
        cells: the cells that were simulated (record keys), in network order.

    Example:
        >>> Simulation(np.zeros((1, 2)), None, ["fc"]).accuracy is None
        True
    """

    outputs: Any
    accuracy: float | None
    cells: list[str]


@contextlib.contextmanager
def simulated(
    net: nn.Cell,
    record: Record | str | os.PathLike,
    sample_input: Any = None,
    models: tuple = (),
) -> Iterator[list[str]]:
    """Inside the ``with``, ``net`` computes with ``record``'s quantization (module docstring).

    Args:
        net: the network (not modified afterwards).
        record: a :class:`~amct_bridge.records.Record` or a record file (MindSpore or inner
            flavor), keyed by ``cells_and_names()`` names.
        sample_input: an input shape, array or Tensor: needed to read the graph (which
            BatchNorm2d calibration folded into which cell) when the network has BatchNorm
            cells and the record weight factors; otherwise unused.
        models: ``mindspore.train.Model`` objects (their eval / train / predict networks) or
            other top-level cells whose compiled graphs must be rebuilt on entry and exit.

    Yields:
        The simulated cells' names.

    Raises:
        RecordError: a key names no quantizable cell, factors do not fit the cell, or the
            record has no factors at all.

    Example:
        >>> # with simulated(net, "record.txt", (1, 3, 32, 32), models=(model,)):
        >>> #     acc = model.eval(ds)["acc"]
    """
    if not isinstance(record, Record):
        from amct_bridge.records import load

        record = load(record)
    require_factors(record)
    cells = quantizable_cells(net)
    _check_keys(net, record, cells)
    for key, f in record.layers.items():
        cell, layout = cells[key]
        where = f"record key {key!r} ({type(cell).__name__})"
        shape = tuple(cell.weight.shape) if layout is not None else None
        check_factors(where, key, f, shape, layout)
    folded = _folded_bns(net, record, cells, sample_input)
    compiled = [net] + _compiled_cells(models)
    weights: list[tuple[Any, np.ndarray]] = []
    swapped: list[tuple[Any, str, Any]] = []
    holders = places(net)
    try:
        for key, f in record.layers.items():
            cell, layout = cells[key]
            if layout is not None and (f.scale_w or f.tensor_balance_factor):
                w = kernel_of(cell, key)
                new = simulated_kernel(w, layout, f, folded.get(key), key)
                weights.append((cell.weight, cell.weight.asnumpy().copy()))
                cell.weight.set_data(Tensor(new.astype(cell.weight.asnumpy().dtype)))
            quant = input_quant(f)
            balance = balance_of(f)
            if quant is None and balance is None:
                continue
            wrapper = QuantInput(cell, quant, balance)
            if not holders.get(id(cell)):
                raise RecordError(
                    f"record key {key!r}: cell {type(cell).__name__} is not a child of any cell "
                    "of the network (the top-level cell itself cannot be wrapped: put it in an "
                    "nn.SequentialCell)"
                )
            for parent, name in holders.get(id(cell), []):
                swapped.append((parent, name, cell))
                put(parent, name, wrapper)
        _clear(compiled)
        yield list(record.layers)
    finally:
        while swapped:
            parent, name, cell = swapped.pop()
            put(parent, name, cell)
        for param, value in weights:
            param.set_data(Tensor(value))
        _clear(compiled)


def simulate(
    net: nn.Cell,
    record: Record | str | os.PathLike,
    data: Any,
    labels: Any = None,
    *,
    batch_size: int = 32,
) -> Simulation:
    """Run ``data`` through ``net`` with ``record``'s quantization; the network is unchanged.

    Args:
        net: the network (NCHW inputs, as it runs).
        record: a Record or record file (see :func:`simulated`).
        data: a numpy array or Tensor of inputs (batched by ``batch_size``); a tuple of
            them, one per network input (then, when ``labels`` is None, the labels); or a
            ``mindspore.dataset`` whose leading columns are the inputs and, when ``labels`` is
            None, whose next column (if any) is the label.
        labels: class indices ``(N,)`` or one-hot ``(N, K)``; gives ``accuracy`` (top-1 of a
            ``(N, classes)`` first output; other outputs are refused with labels).
        batch_size: batch size for arrays.

    Returns:
        A :class:`Simulation` (outputs, accuracy, simulated cell names).

    Example:
        >>> # res = simulate(net, "record.txt", x_val, y_val); print(res.accuracy)
    """
    batches, found = _batches(net, data, batch_size)
    if not batches:
        raise RecordError("simulate(): no data (zero batches)")
    labels = found if labels is None else labels
    training = net.training
    try:
        net.set_train(False)
        sample = list(batches[0]) if len(batches[0]) > 1 else batches[0][0]
        with simulated(net, record, sample_input=sample) as names:
            outs = [net(*(Tensor(a) for a in b)) for b in batches]
    finally:
        net.set_train(training)
    if isinstance(outs[0], (tuple, list)):
        outputs: Any = tuple(
            np.concatenate([o[i].asnumpy() for o in outs]) for i in range(len(outs[0]))
        )
        first = outputs[0]
    else:
        outputs = first = np.concatenate([o.asnumpy() for o in outs])
    return Simulation(outputs, _accuracy(first, labels), names)


# ---- helpers ----------------------------------------------------------------------------------
def quantizable_cells(net: nn.Cell) -> dict[str, tuple[Any, str | None]]:
    """Record key -> (cell, weight layout or None for data-only cells): the cells a record may
    name (simulation and the quant report both check keys against it).

    Example:
        >>> from collections import OrderedDict
        >>> net = nn.SequentialCell(OrderedDict(fc=nn.Dense(2, 1), relu=nn.ReLU(),
        ...                                     pool=nn.AvgPool2d(2)))
        >>> {key: layout for key, (_, layout) in quantizable_cells(net).items()}
        {'fc': 'OI', 'pool': None}
    """
    out = {}
    for key, cell in leaf_cells(net).items():
        desc = describe(key, cell)
        if desc.quantizable:
            out[key] = (cell, desc.parts[0].layout)
    return out


def _check_keys(net: nn.Cell, record: Record, cells: dict) -> None:
    unknown = [k for k in record.layers if k not in cells]
    if not unknown:
        return
    name = type(net).__name__
    lines = [f"record keys name no quantizable cell of network {name!r}:"]
    for key in unknown:
        close = difflib.get_close_matches(key, list(cells), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        lines.append(f"  find {key} failure in model. Please match{hint}")
    lines.append("quantizable cells: " + (", ".join(cells) or "none"))
    raise RecordError("\n".join(lines))


def _folded_bns(net: nn.Cell, record: Record, cells: dict, sample_input: Any) -> dict:
    """Record key -> BN factor of the BatchNorm2d calibration folded into that cell."""
    weighted = [k for k, f in record.layers.items() if cells[k][1] is not None and f.scale_w]
    leaves = {k: describe(k, c) for k, c in leaf_cells(net).items()}
    if not weighted or not any(d.kind in BATCH_NORM_KINDS for d in leaves.values()):
        return {}
    if sample_input is None:
        raise RecordError(
            f"network {type(net).__name__!r} has BatchNorm cells: give sample_input (an input "
            "shape or array) so the graph tells which BatchNorm was folded into which cell"
        )
    from amct_bridge.mindspore.graph import extract_graph

    desc = ModelDesc(
        type(net).__name__,
        leaves,
        extract_graph(net, sample_input),
        foldable_kinds=FOLDABLE_KINDS,
        batch_norm_kinds=BATCH_NORM_KINDS,
        quantizable_kinds=QUANTIZABLE_KINDS,
    )
    out = {}
    for key, (bn_key, bn) in batchnorm_chains(desc).items():
        if key in weighted:
            p = batch_norm_params(bn.handle, bn_key)
            out[key] = bn_factor(p.gamma, p.var, p.eps)
    return out


def _compiled_cells(models) -> list:
    out = []
    for m in models:
        if isinstance(m, nn.Cell):
            out.append(m)
            continue
        for attr in ("_eval_network", "_train_network", "_predict_network", "_network"):
            cell = getattr(m, attr, None)
            if isinstance(cell, nn.Cell):
                out.append(cell)
    return out


def _clear(cells: list) -> None:
    for cell in cells:
        cell.compile_cache.clear()


def _batches(net: nn.Cell, data: Any, batch_size: int) -> tuple[list[tuple], Any]:
    """Batches as tuples of the network's input arrays (float64 as float32), and the labels
    found after the inputs (a dataset's next column, a tuple's next array)."""
    if hasattr(data, "create_tuple_iterator"):
        rows = [
            [_float32(np.asarray(c)) for c in row]
            for row in data.create_tuple_iterator(num_epochs=1, output_numpy=True)
        ]
        count = input_count(net, len(rows[0]) if rows else 1)
        labels = [r[count] for r in rows if len(r) > count]
        return [tuple(r[:count]) for r in rows], (np.concatenate(labels) if labels else None)
    several = isinstance(data, (tuple, list)) and all(
        isinstance(a, (np.ndarray, Tensor)) for a in data
    )  # arrays: one per input (then labels); a plain nested list is one array
    arrays = list(data) if several else [data]
    arrays = [_float32(a.asnumpy() if isinstance(a, Tensor) else np.asarray(a)) for a in arrays]
    count = input_count(net, len(arrays))
    if len(arrays) < count:
        raise RecordError(
            f"simulate(): network {type(net).__name__!r} takes {count} inputs, got "
            f"{len(arrays)} array(s) (give a tuple with one array per input)"
        )
    labels = arrays[count] if len(arrays) > count else None
    step = max(1, int(batch_size))
    inputs = arrays[:count]
    n = len(inputs[0])
    return [tuple(a[i : i + step] for a in inputs) for i in range(0, n, step)], labels


def _float32(x: np.ndarray) -> np.ndarray:
    # MindSpore keeps float64: the network's weights are float32
    return x.astype(np.float32) if x.dtype == np.float64 else x


def _accuracy(outputs: np.ndarray, labels: Any) -> float | None:
    if labels is None:
        return None
    if outputs.ndim != 2:  # top-1 needs (samples, classes)
        raise RecordError(
            f"simulate(): accuracy needs (samples, classes) outputs, the network's first output "
            f"is {outputs.shape}; leave labels out and compare the outputs"
        )
    y = labels.asnumpy() if isinstance(labels, Tensor) else np.asarray(labels)
    if y.ndim == outputs.ndim and y.ndim > 1:
        y = y.argmax(axis=-1)  # one-hot
    y = y.reshape(-1)
    if len(y) != len(outputs):
        raise RecordError(f"simulate(): {len(y)} labels for {len(outputs)} outputs")
    return float(np.mean(outputs.argmax(axis=-1) == y))
