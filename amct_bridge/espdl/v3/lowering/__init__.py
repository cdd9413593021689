"""Lowerings of source layers to ESP-DL v3 nodes: one function per layer kind, in modules by
family (:mod:`.conv`, :mod:`.activation`, :mod:`.arith`, :mod:`.pool`, :mod:`.shape`,
:mod:`.norm`), and one table, :data:`~.registry.LOWERINGS`, that says which kind becomes which
v3 op(s). :class:`~.emitter.Emitter` holds what an export has written so far.

Example:
    >>> from amct_bridge.espdl.v3.lowering import LOWERINGS
    >>> any("Cropping2D" in x.kinds for x in LOWERINGS)
    True
"""

from amct_bridge.espdl.v3.lowering.emitter import Emitter, V3Layer
from amct_bridge.espdl.v3.lowering.registry import (
    LOWERINGS,
    Lowering,
    chain_head,
    lowering_for,
    no_lowering,
)

__all__ = [
    "Emitter",
    "LOWERINGS",
    "Lowering",
    "V3Layer",
    "chain_head",
    "lowering_for",
    "no_lowering",
]
