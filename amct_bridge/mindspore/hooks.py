"""What forward hooks need, shared by the report and espdl-eval: PyNative inference for a block
(hooks with Python bodies do not run in GRAPH_MODE) and the first tensor of a hook's arguments.

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
