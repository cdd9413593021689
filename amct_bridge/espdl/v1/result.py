"""What an ESP-DL v1 export produced: :class:`ExportedLayer` entries and the :class:`ExportResult`.

Only data, no behaviour beyond reading it back: the export (:mod:`amct_bridge.espdl.v1.export`)
fills it; the chip graph (:mod:`~amct_bridge.espdl.v1.chip_graph`), the network loader
(:mod:`~amct_bridge.espdl.v1.network`), the simulator, the C++ writers and the report read it.
This module imports none of them, so they can all import it (no import circle through the
export).

Example:
    >>> res = ExportResult(None, "s8", "per-tensor", "esp32", [], [], notes=["a note"])
    >>> res.config, res.names, res.warnings
    ({}, {}, ['a note'])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from amct_bridge.espdl.plan import Problem
from amct_bridge.espdl.v1.coefficients import Coefficients
from amct_bridge.espdl.v1.preview import LayerPreview
from amct_bridge.espdl.v1.runtime import RuntimeLayer


@dataclass
class ExportedLayer:
    """One config.json entry and how it was made.

    Example:
        >>> import numpy as np
        >>> from amct_bridge.espdl.v1.preview import preview_layer
        >>> entry = {"operation": "fully_connected", "feature_type": "s8", "output_exponent": -5}
        >>> f = np.full((1, 1, 2, 1), 0.5, np.float32)
        >>> layer = ExportedLayer("fc", "dense", "fully_connected", ["dense"], entry,
        ...                       Coefficients(f), preview_layer("fc", entry, {"fc_filter": f}))
        >>> layer.preview.filter.exponent, layer.warnings
        (-7, [])
    """

    name: str
    source: str
    operation: str
    fused: list[str]
    entry: dict
    coefficients: Coefficients
    preview: LayerPreview
    sources: dict[str, str] = field(default_factory=dict)
    output_range: tuple[float, float] | None = None
    warnings: list[str] = field(default_factory=list)
    cpp: str | None = None
    pads: list[int] | None = None  # a folded ZeroPadding2D: PADDING_NOT_SET {t, b, l, r}


@dataclass
class ExportResult:
    """Everything :func:`~amct_bridge.espdl.v1.export.export_layers` produced (``out_dir`` is
    None for a dry run).

    Example:
        >>> from amct_bridge.espdl.plan import Problem
        >>> res = ExportResult(None, "s16", "per-tensor", "esp32s3", [],
        ...                    [Problem("lstm", "LSTM", "RNN")])
        >>> str(res.skipped[0]), res.graph
        ("layer 'lstm' (LSTM): RNN", None)
    """

    out_dir: Path | None
    feature_type: str
    granularity: str
    target: str
    layers: list[ExportedLayer]
    skipped: list[Problem]
    notes: list[str] = field(default_factory=list)
    runtime: list[RuntimeLayer] = field(default_factory=list)
    graph: dict | None = None  # the chip graph (amct_bridge.espdl.v1.network), None if unavailable
    graph_error: str | None = None
    passthrough: list[dict] = field(default_factory=list)  # Dropout & co.: compute nothing
    inputs: list[str] = field(default_factory=list)  # the model's input layers
    #: a final softmax / sigmoid the chip leaves to the host (amct_bridge.espdl.v1.head.HostOp)
    host: list = field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        """Model-wide notes, then every layer's warnings (e.g. scale_w not matching)."""
        per_layer = [w for layer in [*self.layers, *self.runtime] for w in layer.warnings]
        return self.notes + per_layer

    @property
    def config(self) -> dict:
        """The config.json content."""
        return {layer.name: layer.entry for layer in self.layers}

    @property
    def names(self) -> dict[str, str]:
        """C identifier -> model layer name."""
        return {layer.name: layer.source for layer in self.layers}
