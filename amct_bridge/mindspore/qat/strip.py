"""QAT network -> plain network: the QAT cells unwrapped, the trained (folded) weights kept.

:func:`strip_qat` returns a copy of the QAT network in which every
:class:`~amct_bridge.mindspore.qat.cells.QATQuant` / ``QATObserve`` is replaced by the cell it
wraps. The classes are the network's own, the parameter names its own: the copy's checkpoint
loads into a freshly built float network of the same class (``load_param_into_net``), and
``export_espdl`` / ``simulate`` take it with the QAT record. A BatchNorm2d folded by
``quantize_aware`` stays where it was as an exact identity plus bias (gamma 1, mean 0, variance
``1 - eps``, beta = the folded bias), so the weight is the deployed one and the exporter folds
the BN trivially; its ``use_batch_statistics`` is restored.

Example:
    >>> import numpy as np
    >>> from mindspore import nn
    >>> from amct_bridge.mindspore.qat import quantize_aware
    >>> plain = strip_qat(quantize_aware(nn.SequentialCell([nn.Dense(4, 3)])))
    >>> type(plain[0]).__name__, sorted(p.name for p in plain.get_parameters())
    ('Dense', ['0.bias', '0.weight'])
"""

from __future__ import annotations

import copy

from mindspore import nn

from amct_bridge.mindspore.instrument_cells import places, put
from amct_bridge.mindspore.qat.cells import QATObserve, QATQuant
from amct_bridge.mindspore.qat.model import _info, check_folded

__all__ = ["strip_qat"]


def strip_qat(qat_net: nn.Cell) -> nn.Cell:
    """A plain copy of a QAT network with its trained weights (module docstring).

    The QAT network is not modified. ``simulate(strip_qat(qat), qat_record(qat), x)`` computes
    what the QAT network computes in inference.

    Raises:
        QuantError: ``qat_net`` was not made by ``quantize_aware``, or a folded BatchNorm2d is
            no longer the identity (a float checkpoint loaded into it afterwards).

    Example:
        >>> # ms.save_checkpoint(strip_qat(qat), "deploy.ckpt")
    """
    info = _info(qat_net)
    check_folded(qat_net, info)
    out = copy.deepcopy(qat_net)
    holders = places(out)
    wrappers = {}
    for _, cell in out.cells_and_names():
        if isinstance(cell, (QATQuant, QATObserve)):
            wrappers[id(cell)] = cell
    for cell in wrappers.values():
        for parent, child in holders.get(id(cell), []):
            put(parent, child, cell.cell)
    cells = dict(out.cells_and_names())
    for bn_key, mode in info.bn_modes.items():
        bn = cells[bn_key]
        bn.use_batch_statistics = mode
        bn.gamma.requires_grad = True
    for key in info.folded:
        cell = cells[key]
        if getattr(cell, "has_bias", False):
            cell.bias.requires_grad = True
    del out.amct_qat
    return out
