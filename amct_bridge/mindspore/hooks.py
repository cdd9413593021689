"""What forward hooks need, shared by the report and espdl-eval: PyNative inference for a block
(hooks with Python bodies do not run in GRAPH_MODE), the first tensor of a hook's arguments, and
recording cells' outputs (and inputs) call by call.

Example:
    >>> from mindspore import nn
    >>> net = nn.Dense(2, 1)
    >>> with pynative_inference(net):
    ...     net.training
    False
    >>> first_tensor(((1, 2), 3))
    1
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn


@contextlib.contextmanager
def pynative_inference(net: nn.Cell) -> Iterator[None]:
    """PyNative and inference mode for the block (hooks read tensors); both put back.

    Example:
        >>> # see the module docstring
    """
    mode, training = ms.get_context("mode"), net.training
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net.set_train(False)
    try:
        yield
    finally:
        net.set_train(training)
        ms.set_context(mode=mode)


def first_tensor(x: Any) -> Any:
    """The first tensor of a cell's (possibly nested) inputs or outputs.

    Example:
        >>> first_tensor([[7]])
        7
    """
    while isinstance(x, (list, tuple)):
        x = x[0]
    return x


@contextlib.contextmanager
def recorded(
    cells: dict[str, nn.Cell], inputs: bool = False
) -> Iterator[tuple[dict[str, list[np.ndarray]], dict[str, list[np.ndarray]]]]:
    """Inside the block, every call of ``cells[key]`` appends its output (and, with ``inputs``,
    its first input) as numpy to ``outs[key]`` (``ins[key]``); the hooks go on exit.

    Example:
        >>> from mindspore import Tensor
        >>> fc = nn.Dense(2, 1)
        >>> with pynative_inference(fc), recorded({"fc": fc}) as (outs, ins):
        ...     _ = fc(Tensor(np.ones((3, 2), np.float32)))
        >>> outs["fc"][0].shape, ins
        ((3, 1), {'fc': []})
    """
    outs: dict[str, list[np.ndarray]] = {k: [] for k in cells}
    ins: dict[str, list[np.ndarray]] = {k: [] for k in cells}

    def recorder(key: str):
        def hook(cell, args, output):
            outs[key].append(first_tensor(output).asnumpy())
            if inputs:
                ins[key].append(first_tensor(args).asnumpy())

        return hook

    handles = [cell.register_forward_hook(recorder(k)) for k, cell in cells.items()]
    try:
        yield outs, ins
    finally:
        for handle in handles:
            handle.remove()
