"""QAT record + sidecar from trained ranges, written as one set (framework-free; docs/qat.md).

Both adapters' ``save_qat_record`` collect, per quantized part, its input clip range and kernel
(record entries via :func:`layer_factors`, from the numpy math of :mod:`amct_bridge.quant.qat`
and :mod:`amct_bridge.quant.arq`) and, per observed cell, an output range; this module turns
them into the record and the calibration sidecar (``<record>.calib.json``) the ESP-DL exporter
reads, validates both in memory and writes them together (temp files, then renamed), so a
failure leaves the previous files.

Sidecar rules (the calibration callback's format, ``algorithm: "qat-ema"`` / ``"qat-learned"``):

* a quantized part: ``input`` = its clip range (what scale_d / offset_d encode), ``output`` =
  the EMA of its output;
* a tensor a quantized layer reads gets that reader's clip range as ``min`` / ``max`` and keeps
  the EMA as ``observed_min`` / ``observed_max`` (:func:`clipped`): the network was trained to
  see it clipped there;
* a layer called at several sites per step (one ReLU cell used four times) keeps a range per
  site (:func:`call_sites` names them as the graph does: ``relu``, ``relu@1``...), and each
  site gets its own entry, as in the calibration sidecar. A quantized layer called at several
  sites clips every site's input at one range, the :func:`union_range` of its sites' ranges:
  the record holds one ``scale_d`` / ``offset_d`` per layer, applied at every site.

Example:
    >>> clipped(TensorRange(-1.0, 9.0), TensorRange(0.0, 6.0)).to_dict()
    {'min': 0.0, 'max': 6.0, 'observed_min': -1.0, 'observed_max': 9.0}
    >>> tensor_range(0.0, 1.0, seen=0) is None
    True
    >>> union_range([(-1.0, 2.0, 3), (0.0, 5.0, 3), (-9.0, 9.0, 0)])
    (-1.0, 5.0, 3.0)
    >>> import numpy as np
    >>> f = layer_factors("fc", -1.0, 1.0, 3, 4, np.float32([[1.0, -0.5]]), "OI")
    >>> f.dst_type, f.offset_d, f.scale_w
    ('INT4', -1, [0.1428571492433548])
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from numpy.typing import ArrayLike

from amct_bridge.calibration.records import Built, _warn_collapsed, write_outputs
from amct_bridge.errors import QuantError, ValidationError
from amct_bridge.graph.ir import Graph
from amct_bridge.quant.arq import arq_scales
from amct_bridge.quant.factors import FLT_EPSILON, activation_factors, raw_activation_scale
from amct_bridge.quant.qat import DST_TYPES
from amct_bridge.records import dumps, validate
from amct_bridge.records.calibration import CalibrationStats, TensorRange
from amct_bridge.records.model import LayerFactors, Record

__all__ = [
    "algorithm_name",
    "call_sites",
    "clipped",
    "layer_factors",
    "shared_layers",
    "site_names",
    "tensor_range",
    "union_range",
    "write_qat_outputs",
]


def site_names(key: str, n: int) -> list[str]:
    """The names of a layer's ``n`` call sites, as the graph IR names its nodes: the first site
    is the layer's own key, the k-th ``"<key>@k"``.

    Example:
        >>> site_names("relu", 3)
        ['relu', 'relu@1', 'relu@2']
    """
    return [key] + [f"{key}@{k}" for k in range(1, int(n))]


def call_sites(graph: Graph | None) -> dict[str, list[str]]:
    """Layer key -> its node names in execution (topological) order, for every layer the graph
    calls more than once. The k-th call of a step is site k: QAT cells count their calls and
    keep the state of site ``calls mod n``, as the calibration probes number their rows.

    Example:
        >>> from amct_bridge.graph.ir import Graph, Node
        >>> g = Graph()
        >>> for name in ("relu", "fc", "relu@1"):
        ...     g.add_node(Node(name, name.split("@")[0], "ReLU", "Relu", [], [], {}))
        >>> call_sites(g)
        {'relu': ['relu', 'relu@1']}
    """
    if graph is None:
        return {}
    found: dict[str, list[str]] = {}
    for node in graph.nodes:
        found.setdefault(node.layer, []).append(node.name)
    return {layer: names for layer, names in found.items() if len(names) > 1}


def shared_layers(sites: dict[str, list[str]], keys: Iterable[str]) -> list[str]:
    """The ``keys`` called at several sites, named with their sites (for messages).

    Example:
        >>> shared_layers({"fc": ["fc", "fc@1"]}, ["fc", "out"])
        ["'fc' (sites fc, fc@1)"]
    """
    return [f"{k!r} (sites {', '.join(sites[k])})" for k in keys if k in sites]


def union_range(rows: Iterable[tuple[float, float, float]]) -> tuple[float, float, float]:
    """One ``(min, max, seen)`` covering every site's ``(min, max, seen)`` that saw a batch: the
    clip range of a quantized layer called at several sites (``seen``: the most any site saw).
    None seen: ``(0.0, 0.0, 0.0)``.

    Example:
        >>> union_range([(0.0, 1.0, 0)])
        (0.0, 0.0, 0.0)
    """
    seen = [(float(lo), float(hi), float(n)) for lo, hi, n in rows if n > 0]
    if not seen:
        return 0.0, 0.0, 0.0
    return min(r[0] for r in seen), max(r[1] for r in seen), max(r[2] for r in seen)


def tensor_range(lo: float, hi: float, seen: float) -> TensorRange | None:
    """The tracked range, or None when no training batch reached it.

    Example:
        >>> tensor_range(-1.0, 2.0, 5)
        TensorRange(min=-1.0, max=2.0, observed_min=None, observed_max=None)
    """
    return TensorRange(float(lo), float(hi)) if seen > 0 else None


def clipped(observed: TensorRange | None, clip: TensorRange | None) -> TensorRange | None:
    """The range of a tensor a quantized reader clips at ``clip`` (the EMA as observed).

    Example:
        >>> clipped(None, TensorRange(0.0, 1.0)).max
        1.0
    """
    if clip is None:
        return observed
    if observed is None:
        return clip
    return TensorRange(clip.min, clip.max, observed.min, observed.max)


def layer_factors(
    key: str,
    lo: float,
    hi: float,
    seen: float,
    bits: int,
    kernel: ArrayLike | None = None,
    layout: str | None = None,
    *,
    channel_wise: bool = True,
    symmetric: bool = False,
    skip_fusion: bool | None = None,
    part: str = "input",
) -> LayerFactors:
    """The QAT record entry of one quantized part (AMCT's inner flavor with ``dst_type``).

    Args:
        key: record key (for messages).
        lo, hi: the part's trained input clip range; ``seen``: training batches it saw.
        bits: 8 or 4 (``dst_type`` INT8 / INT4).
        kernel, layout: the (trained, BN-folded) kernel and its layout; None for pooling.
        channel_wise: per-output-channel scale_w (ignored for Dense / MatMul layouts).
        symmetric: ``activation_offset = false``.
        skip_fusion: written as is (True when a BatchNorm follows that was not folded).
        part: name of the tracked tensor (messages).

    Raises:
        QuantError: the range was never observed (``seen <= 0``) or is not finite.

    Example:
        >>> layer_factors("pool", 0.0, 2.0, 1, 8).offset_d
        -128
    """
    if seen <= 0:
        raise QuantError(
            f"layer {key!r}: its {part} range was never observed; train at least one step first"
        )
    dst = next(name for name, b in DST_TYPES.items() if b == bits)
    scale_d, offset_d = activation_factors(lo, hi, bits, symmetric, name=f"{key} {part}")
    f = LayerFactors(scale_d=scale_d, offset_d=offset_d, dst_type=dst)
    if kernel is not None:
        scale = arq_scales(kernel, layout, channel_wise, num_bits=bits, name=key)
        f.scale_w = [float(s) for s in scale]
        f.offset_w = [0] * len(f.scale_w)
        if skip_fusion:
            f.skip_fusion = True
    return f


def algorithm_name(modes: set[str] | list[str]) -> str:
    """The sidecar's ``algorithm`` for the activation range modes used.

    Example:
        >>> algorithm_name({"ema"})
        'qat-ema'
    """
    return "qat-" + ",".join(sorted(set(modes)))


def write_qat_outputs(
    record: Record, stats: CalibrationStats, path: str | os.PathLike, *, what: str = "model"
) -> Record:
    """Validate ``record`` and write it with its sidecar ``stats`` atomically; return it.

    Raises:
        QuantError: the record is empty (no quantized part); nothing is written.
        ValidationError: the record breaks AMCT's rules; nothing is written.

    Example:
        >>> # save_qat_record(qat, "qat.txt") of either adapter ends here
    """
    if not record.layers:
        raise QuantError(f"{what}: no quantized layer to write; nothing written")
    problems = validate(record)
    if problems:
        raise ValidationError(problems)
    collapsed = _collapsed(record, stats)
    if collapsed:  # as the calibration warns: QAT's forward pass quantized them to one level
        stats.warnings = list(stats.warnings or []) + _warn_collapsed(collapsed)
    write_outputs(Built(record, dumps(record, record.flavor), stats), path)
    return record


def _collapsed(record: Record, stats: CalibrationStats) -> list[tuple[str, tuple, float]]:
    """Layers whose QAT input range gives a scale below FLT_EPSILON, written as 1.0 (AMCT's
    rule): every input value quantizes to one level, in training and on the device."""
    found = []
    for key, factors in record.layers.items():
        entry = stats.layers.get(key)
        rng = entry.input if entry is not None else None
        if rng is None or factors.scale_d != 1.0:
            continue
        bits = factors.dst_type or "INT8"
        raw = raw_activation_scale(rng.min, rng.max, bits, factors.offset_d == 0, name=key)
        if 0.0 < raw < FLT_EPSILON:
            found.append((key, (rng.min, rng.max), raw))
    return found
