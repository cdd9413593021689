"""ReLU6 -> ReLU for ESP-DL v1 (which has no clip), the MindSpore counterpart of
:func:`amct_bridge.keras.replace_relu6` (docs/espdl-export.md, "ReLU6 models").

Example:
    >>> from mindspore import nn
    >>> net = nn.SequentialCell([nn.Dense(2, 2, activation="relu6"), nn.ReLU6()])
    >>> [type(c).__name__ for _, c in replace_relu6(net).cells_and_names()][1:]
    ['Dense', 'ReLU', 'ReLU']
"""

from __future__ import annotations

import copy
import logging

from mindspore import nn

from amct_bridge.errors import AmctBridgeError
from amct_bridge.mindspore.instrument_cells import put

log = logging.getLogger(__name__)


def replace_relu6(net: nn.Cell) -> nn.Cell:
    """A copy of ``net`` with every ``nn.ReLU6`` cell replaced by ``nn.ReLU``; same cell and
    parameter names, same (copied) weights; ``net`` itself is left untouched.

    Covers ``nn.ReLU6`` cells and a cell's own ``activation="relu6"`` (``nn.Dense``,
    ``nn.Conv2d``: its ``activation`` child). A functional ``ops.relu6`` in ``construct`` is
    Python code, which no copy changes: the ESP-DL export still refuses it by name. Fine-tune
    the copy briefly (``Model.train`` with :class:`~amct_bridge.mindspore.QuantCalibration`),
    then export it.

    Raises:
        AmctBridgeError: ``net`` is not a Cell.

    Example:
        >>> # relu_net = replace_relu6(net); Model(relu_net, loss, opt).train(1, ds, callbacks=[cb])
    """
    if not isinstance(net, nn.Cell):
        raise AmctBridgeError(f"replace_relu6: expected a mindspore.nn.Cell, got {type(net)}")
    out = copy.deepcopy(net)  # a fresh object: no compiled graph of the ReLU6 version to reuse
    replaced = []
    for name, cell in list(out.cells_and_names()):
        for child, sub in list(cell._cells.items()):
            if isinstance(sub, nn.ReLU6):
                # put() refreshes SequentialCell.cell_list, which its construct runs
                put(cell, child, nn.ReLU())
                replaced.append(f"{name}.{child}" if name else child)
    log.info("replace_relu6: %d ReLU6 cell(s) replaced: %s", len(replaced), ", ".join(replaced))
    return out
