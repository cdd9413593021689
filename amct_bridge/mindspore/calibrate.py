"""``calibrate(net, data, record_path)``: post-training calibration of a MindSpore network in one
call, for scripts without ``mindspore.train.Model``.

It drives :class:`~amct_bridge.mindspore.callback.QuantCalibration` through the same events
``Model.eval`` fires (``on_eval_begin``, ``on_eval_step_begin`` / ``end`` per batch,
``on_eval_end``) while it calls ``net(batch)`` itself, in inference mode (``set_train(False)``,
restored afterwards), in whatever mode the context is (GRAPH_MODE or PyNative).

Example:
    >>> import os, tempfile, numpy as np
    >>> from mindspore import nn
    >>> net = nn.SequentialCell([nn.Dense(8, 4), nn.ReLU(), nn.Dense(4, 2)])
    >>> path = os.path.join(tempfile.mkdtemp(), "record.txt")
    >>> rec = calibrate(net, np.random.rand(64, 8).astype("float32"), path, algorithm="minmax")
    >>> sorted(rec.layers), rec.flavor
    (['0', '2'], 'mindspore')
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn
from mindspore.train import RunContext

from amct_bridge.errors import CalibrationError
from amct_bridge.mindspore.callback import QuantCalibration
from amct_bridge.mindspore.session import net_inputs
from amct_bridge.records import Record

__all__ = ["calibrate"]


def calibrate(
    net: nn.Cell,
    data: Any,
    record_path: str | os.PathLike,
    *,
    batch_size: int = 32,
    **options: Any,
) -> Record:
    """Run ``net`` on ``data`` with a :class:`QuantCalibration` and return the record written.

    Args:
        net: the network (``nn.Cell``), weights loaded.
        data: a numpy array or ``mindspore.Tensor`` (batched along axis 0 by ``batch_size``),
            a tuple / list of them (one per network input, or inputs then labels: the network
            takes as many leading ones as its ``construct`` has parameters), or a
            ``mindspore.dataset`` (already batched; same rule for its columns). float64 data
            is cast to float32.
        record_path: the AMCT record to write (sidecar ``<record_path>.calib.json`` too).
        batch_size: samples per batch for array data (ignored for a dataset).
        **options: :class:`QuantCalibration` options (``algorithm``, ``batch_num``,
            ``config``, ``flavor``, ``skip_layers``...); only the batches up to ``batch_num``
            are run.

    Returns:
        The record as written (what ``load(record_path)`` gives, built without re-reading it).

    Raises:
        CalibrationError: bad options, no batch, NaN/Inf (naming cell and batch), unknown
            ``skip_layers`` names, nothing to quantize; no record is written then.

    Example:
        >>> # see the module docstring
    """
    if not isinstance(net, nn.Cell):
        raise CalibrationError(f"calibrate(): net must be a mindspore.nn.Cell, got {type(net)}")
    if int(batch_size) < 1:
        raise CalibrationError(f"calibrate(): batch_size must be >= 1, got {batch_size}")
    callback = QuantCalibration(record_path, **options)
    args: dict[str, Any] = {"network": net, "eval_network": net, "cur_step_num": 0, "mode": "eval"}
    context = RunContext(args)
    training = net.training
    net.set_train(False)
    try:
        callback.on_eval_begin(context)
        for element in _batches(data, int(batch_size)):
            if callback.done:
                break  # batch_num reached: the rest would run without probes
            args["cur_step_num"] += 1
            args["eval_dataset_element"] = element
            callback.on_eval_step_begin(context)
            inputs = net_inputs(net, element)
            net(*inputs) if isinstance(inputs, list) else net(inputs)
            callback.on_eval_step_end(context)
        callback.on_eval_end(context)
    finally:
        callback.restore()
        net.set_train(training)
    return callback.written


def _batches(data: Any, batch_size: int) -> Iterator[tuple[Tensor, ...]]:
    """Batches as tuples of float32-or-original Tensors (one per column / array)."""
    if hasattr(data, "create_tuple_iterator"):  # a mindspore.dataset
        for row in data.create_tuple_iterator(num_epochs=1):
            yield tuple(_as_tensor(c) for c in row)
        return
    arrays = list(data) if isinstance(data, (tuple, list)) else [data]
    arrays = [a.asnumpy() if isinstance(a, Tensor) else np.asarray(a) for a in arrays]
    counts = {len(a) if a.ndim else None for a in arrays}
    if len(counts) != 1 or None in counts:
        shapes = ", ".join(str(a.shape) for a in arrays)
        raise CalibrationError(
            f"calibrate(): the arrays need one row per sample on axis 0, got shapes {shapes}"
        )
    total = counts.pop()
    for start in range(0, total, batch_size):
        yield tuple(_as_tensor(a[start : start + batch_size]) for a in arrays)


def _as_tensor(value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value.astype(ms.float32) if value.dtype == ms.float64 else value
    array = np.asarray(value)
    if array.dtype == np.float64:
        array = array.astype(np.float32)  # MindSpore keeps float64; the weights are float32
    return Tensor(array)


class _CallableModule(types.ModuleType):
    """Importing this submodule binds ``amct_bridge.mindspore.calibrate`` (the package's lazy
    name for the function) to the module: calling the module calls :func:`calibrate`, so both
    import orders give a working ``amct_bridge.mindspore.calibrate(net, data, path)``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Record:
        return calibrate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
