"""ESP-DL v1: convert.py input (config.json + coefficient .npy), its exact preview, the C++
files and the bit-exact chip simulator.

Everything here is specific to ESP-DL v1.1.0 (convert.py and the ``dl::layer`` C++ runtime);
what the formats share (source layers, the plan of chains, exponents, checks, naming, the
directory writer) lives in :mod:`amct_bridge.espdl`. Modules:

- :mod:`~amct_bridge.espdl.v1.spec`: what convert.py accepts, as tables;
- :mod:`~amct_bridge.espdl.v1.layout`, :mod:`~amct_bridge.espdl.v1.preview`: convert.py's element
  order and integers; :mod:`~amct_bridge.espdl.v1.coefficients`: float coefficients in its layouts;
- :mod:`~amct_bridge.espdl.v1.runtime`: the coefficient-free runtime layers (Add2D, pools...);
- :mod:`~amct_bridge.espdl.v1.checks`: the v1 warnings (saturation, Concat exponents);
  :mod:`~amct_bridge.espdl.v1.border`: a same-padded average pool's border, measured;
- :mod:`~amct_bridge.espdl.v1.head`: a final softmax / sigmoid left to the host;
- :mod:`~amct_bridge.espdl.v1.result`: :class:`ExportResult`, what an export produced (data
  only: the chip graph, C++ writers, simulator and report read it without importing the export);
- :mod:`~amct_bridge.espdl.v1.export`: the export itself (config.json, npy, export.json);
- :mod:`~amct_bridge.espdl.v1.network`, :mod:`~amct_bridge.espdl.v1.chip_graph`: the chip graph;
  :mod:`~amct_bridge.espdl.v1.chip` (+ ``chip_ops``): the simulator;
- ``cpp*``: convert.py's C++ text (``cpp_coefficients``), layer constructors (``cpp``), the model
  class (``cpp_types`` its parts, ``cpp_model`` builds them, ``cpp_render`` writes them) and
  ``app_main.cpp`` (``cpp_app``);
- :mod:`~amct_bridge.espdl.v1.report`: the human-readable preview table.

Example:
    >>> import amct_bridge.espdl as espdl
    >>> from amct_bridge.espdl.v1 import ExportResult, simulate_chip
    >>> ExportResult is espdl.ExportResult, simulate_chip is espdl.simulate_chip  # re-exported
    (True, True)
"""

from __future__ import annotations

from amct_bridge.espdl.v1.chip import ChipResult, ChipTensor, simulate_chip
from amct_bridge.espdl.v1.cpp_coefficients import convert_set
from amct_bridge.espdl.v1.export import export_layers
from amct_bridge.espdl.v1.network import Network, load_network
from amct_bridge.espdl.v1.preview import (
    LayerPreview,
    load_set,
    preview_layer,
    preview_set,
    tool_output,
)
from amct_bridge.espdl.v1.result import ExportedLayer, ExportResult

__all__ = [
    "ChipResult",
    "ChipTensor",
    "ExportResult",
    "ExportedLayer",
    "LayerPreview",
    "Network",
    "convert_set",
    "export_layers",
    "load_network",
    "load_set",
    "preview_layer",
    "preview_set",
    "simulate_chip",
    "tool_output",
]
