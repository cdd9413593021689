"""Observers + weights -> AMCT record and calibration sidecar, written atomically.

Everything is built in memory first and written only when all pieces exist, so a failure (bad
factors, a key that cannot be resolved...) never leaves a partial record.

Per quantized part: ``scale_d``/``offset_d`` from its input observer (act_type bits,
activation_offset), ``scale_w``/``offset_w`` by ARQ on the (BN-folded unless skip_fusion) kernel,
``tensor_balance_factor`` with DMQ, ``shift_bit`` with joint_quant, ``skip_fusion: true`` for
layers the user excluded from fusion, ``act_type`` only when it is not the default INT8.
The record is built in the "inner" flavor and converted to the requested one at the end
(:func:`finish_record`).

Example:
    >>> import numpy as np
    >>> from amct_bridge.quant.observers import make_observer
    >>> obs = make_observer("minmax")
    >>> obs.update(np.array([-1.0, 2.0], np.float32))
    >>> search_clip_ranges([obs])
    [(-1.0, 2.0)]
"""

from __future__ import annotations

import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amct_bridge.calibration import weights as cw
from amct_bridge.calibration.plan import Plan, Target
from amct_bridge.calibration.protocol import PartWeights
from amct_bridge.errors import CalibrationError
from amct_bridge.quant.factors import (
    FLT_EPSILON,
    activation_factors,
    bits_of,
    raw_activation_scale,
)
from amct_bridge.records import LayerFactors, Record, convert, dumps
from amct_bridge.records.atomic import atomic_write_files
from amct_bridge.records.calibration import (
    CalibrationStats,
    LayerShape,
    LayerStats,
    TensorRange,
    sidecar_path,
)

log = logging.getLogger(__name__)


@dataclass
class FoldedPart:
    """A part whose BatchNorm was folded: the folded weights the record describes, and the
    part's own weights (an adapter baking the fold into a graph needs both)."""

    target: Target
    folded: PartWeights
    original: PartWeights


@dataclass
class Built:
    """What one write produces: record text, sidecar, and extra files (path -> bytes)."""

    record: Record
    record_text: str
    stats: CalibrationStats
    extra: dict[Path, bytes] = field(default_factory=dict)


def build_record(session) -> tuple[Record, CalibrationStats, list[FoldedPart]]:
    """The "inner" record, the sidecar and the BN folds from a session's observers.

    Example:
        >>> # used by the adapters' write step; see tests/calibration/test_keras_pins.py
    """
    ranges = _clip_ranges(session)
    record = Record(flavor="inner")
    folds = []
    source = (
        session.weight_source() if any(t.part.has_weights for t in session.plan.quantized) else None
    )
    collapsed: list[tuple[str, tuple[float, float], float]] = []
    for target in session.plan.quantized:
        factors, fold = _layer_factors(session, source, target, ranges, collapsed)
        record.layers[target.key] = factors
        if fold is not None:
            folds.append(fold)
    stats = _sidecar(session, ranges)
    # the full lists stay in the sidecar: layers left float, then collapsed scales
    stats.warnings = list(session.plan.warnings) + _warn_collapsed(collapsed)
    stats.model = model_shapes(session, source)
    return record, stats, folds


def model_shapes(session: Any, source: Any = None) -> dict[str, LayerShape]:
    """The sidecar's ``model``: every layer the calibration planned (quantized, skipped,
    activations, runtime layers, folded BatchNorms, layers with weights left float) by key with
    its kind, and every part with weights (quantized or skipped) by record key with its
    kernel's shape and layout, as the calibration read them. The ESP-DL export compares them
    with the model it exports (:func:`amct_bridge.espdl.checks.check_sidecar_model`).

    Args:
        session: a :class:`~amct_bridge.calibration.session.CalibrationSession` with its plan.
        source: its ``weight_source()`` (read from the session when None and needed).

    Example:
        >>> # see tests/calibration/test_core.py::test_the_sidecar_describes_the_model
    """
    plan = session.plan
    shapes: dict[str, LayerShape] = {}
    for target in plan.targets:
        kind = target.desc.kind if target.desc is not None else target.kind
        shapes.setdefault(target.layer_key, LayerShape(kind))
        if target.bn_key is not None:
            bn = target.bn_desc.kind if target.bn_desc is not None else "BatchNormalization"
            shapes.setdefault(target.bn_key, LayerShape(bn))
    for layer in getattr(plan, "unquantized", ()):  # weights, no record entry
        shapes.setdefault(layer.key, LayerShape(layer.kind))
    weighted = [t for t in plan.targets if t.part is not None and t.part.has_weights]
    if weighted and source is None:
        source = session.weight_source()
    for target in weighted:
        own = source.part_weights(target.desc, target.part)
        kernel = tuple(int(d) for d in own.kernel.shape)
        shapes[target.key] = LayerShape(target.kind, kernel, str(own.layout))
    return shapes


def finish_record(record: Record, flavor: str) -> tuple[Record, str]:
    """Convert an "inner" record to ``flavor`` (dropped fields are logged) and dump it.

    Example:
        >>> rec, text = finish_record(Record({"fc": LayerFactors(scale_d=0.5, offset_d=0)}),
        ...                           "inner")
        >>> 'key: "fc"' in text
        True
    """
    if flavor != "inner":
        record, dropped = convert(record, flavor)
        _warn_dropped(flavor, dropped)
    record.flavor = flavor
    text = dumps(record, flavor)
    if not record.layers:
        raise CalibrationError("no record entry was produced; nothing written")
    return record, text


def _warn_dropped(flavor: str, dropped: list[str]) -> None:
    """One warning per field the flavor cannot hold, naming its first layers (one line per
    layer before: shift_bit of every layer, say); each layer's line at DEBUG (-v)."""
    by_field: dict[str, list[str]] = {}
    for line in dropped:
        found = re.match(r"layer '(.*)': (\w+) \(", line)
        if found is None:  # prune records: one line already
            log.warning("record flavor %r cannot hold %s: dropped", flavor, line)
            continue
        by_field.setdefault(found.group(2), []).append(found.group(1))
    for name, layers in by_field.items():
        shown = ", ".join(map(repr, layers[:FIRST_FEW]))
        more = (
            f" and {len(layers) - FIRST_FEW} more (-v lists them)"
            if len(layers) > FIRST_FEW
            else ""
        )
        count = f"{len(layers)} layer{'s' if len(layers) != 1 else ''}"
        log.warning(
            "record flavor %r cannot hold %s: dropped for %s: %s%s",
            flavor,
            name,
            count,
            shown,
            more,
        )
    for line in dropped:
        log.debug("record flavor %r cannot hold %s: dropped", flavor, line)


def write_outputs(built: Built, record_path: str | os.PathLike) -> None:
    """Write the record, its sidecar and any extra files, as one set: an interruption leaves
    all of them as they were (never a new record beside another run's sidecar). The sidecar
    lists the keys of the record written with it (``record_keys``): a record cut short or
    edited later is told from one whose layers the calibration skipped.

    Example:
        >>> # see build_record
    """
    built.stats.record_keys = list(built.record.layers)
    built.stats.flavor = built.record.flavor  # inspect / validate lead with it
    atomic_write_files(
        {
            Path(record_path): built.record_text.encode(),
            sidecar_path(record_path): built.stats.to_json().encode(),
            **{Path(path): data for path, data in built.extra.items()},
        }
    )


def _clip_ranges(session) -> dict[int, tuple[float, float]]:
    """Each observed tensor's clip range, searched once (HFMG/IFMR searches are not cheap)."""
    seen = [(i, obs.observer) for i, obs in enumerate(session.observed) if obs.observer.batches]
    ranges = search_clip_ranges([observer for _, observer in seen])
    return {i: found for (i, _), found in zip(seen, ranges, strict=True)}


def search_clip_ranges(observers: list) -> list[tuple[float, float]]:
    """``clip_range()`` of each observer, the histogram searches spread over all cores.

    HFMG/IFMR searches (tens of ms per tensor; numpy releases the GIL) dominate the end of a
    calibration run, so they run in a thread pool; the observers are only read.

    Example:
        >>> # see the module docstring
    """
    workers = min(sum(1 for obs in observers if obs.bins), os.cpu_count() or 1)
    if workers <= 1:
        return [obs.clip_range() for obs in observers]
    with ThreadPoolExecutor(workers, thread_name_prefix="amct_bridge_search") as pool:
        return list(pool.map(lambda obs: obs.clip_range(), observers))


def _part_index(target: Target) -> int:
    parts = target.desc.parts if target.desc is not None else ()
    return parts.index(target.part) if target.part in parts else 0


def _input_index(session, target: Target) -> int:
    role = "inner" if _part_index(target) > 0 else "input"
    return session.tensors[(target.layer_key, role)]


def _layer_factors(session, source, target: Target, ranges, collapsed: list):
    cfg, config = target.config, session.config
    index = _input_index(session, target)
    observed = session.observed[index]
    bits, symmetric = bits_of(cfg.act_type), not config.activation_offset
    if index not in ranges:
        raise CalibrationError(f"layer {target.key!r}: its input was never observed")
    clip = ranges[index]
    scale_d, offset_d = activation_factors(*clip, bits, symmetric=symmetric)
    factors = LayerFactors(act_type=cfg.act_type if cfg.act_type != "INT8" else None)
    fold = None
    if target.part.has_weights:
        own = source.part_weights(target.desc, target.part)
        weights = own
        if target.bn_desc is not None:
            bn = source.batch_norm(target.bn_desc)
            weights = cw.fold(own, bn, target.key)
            fold = FoldedPart(target, weights, own)
        kernel, layout = weights.kernel, weights.layout
        if cfg.migration_strength is not None:
            balance, kernel, (lo, hi) = cw.balance(
                observed.channel_range, kernel, layout, cfg.migration_strength, target.key
            )
            factors.tensor_balance_factor = balance
            clip = (lo, hi)
            scale_d, offset_d = activation_factors(lo, hi, bits, symmetric=symmetric)
        factors.scale_w, factors.offset_w = cw.weight_factors(
            kernel,
            layout,
            part_channel_wise=target.part.channel_wise,
            channel_wise=cfg.channel_wise,
            name=target.key,
        )
        if target.skip_fusion:
            factors.skip_fusion = True
        if config.joint_quant:
            factors.shift_bit = cw.shift_bits(kernel, layout, factors.scale_w, bits, symmetric)
    raw = raw_activation_scale(*clip, bits, symmetric, name=target.key)
    if 0.0 < raw < FLT_EPSILON:
        collapsed.append((target.key, clip, raw))
    factors.scale_d, factors.offset_d = float(scale_d), int(offset_d)
    return factors, fold


#: A warning about many layers names this many of them; -v (DEBUG) and the sidecar: all.
FIRST_FEW = 5


def _warn_collapsed(collapsed: list[tuple[str, tuple[float, float], float]]) -> list[str]:
    """AMCT turns a scale below FLT_EPSILON into 1.0 (valid, silent): say so for a range that is
    not all zero, since every value of it then quantizes to one level. One warning for all
    such layers (40 lines on an untrained MobileNetV3Small before); returns every layer's
    message (logged at DEBUG, kept in the sidecar's ``warnings``)."""
    messages = [
        f"layer {key!r}: its input range [{lo:.3g}, {hi:.3g}] gives scale_d {raw:.3g}, below "
        "FLT_EPSILON, which AMCT replaces by 1.0: every input value quantizes to one level "
        "(the activations vanish before this layer: untrained or badly scaled weights?)"
        for key, (lo, hi), raw in collapsed
    ]
    if len(messages) == 1:
        log.warning("%s", messages[0])
    elif messages:
        shown = ", ".join(
            f"{key!r} ([{lo:.3g}, {hi:.3g}], scale_d {raw:.3g})"
            for key, (lo, hi), raw in collapsed[:FIRST_FEW]
        )
        more = f" and {len(messages) - FIRST_FEW} more" if len(messages) > FIRST_FEW else ""
        log.warning(
            "%d layers: their input ranges give scale_d below FLT_EPSILON, which AMCT replaces "
            "by 1.0: every input value of these layers quantizes to one level (the activations "
            "vanish before them: untrained or badly scaled weights?): %s%s (every layer: -v, "
            "or the sidecar's warnings)",
            len(messages),
            shown,
            more,
        )
        for message in messages:
            log.debug("%s", message)
    return messages


def _range(observed, clip: tuple[float, float]) -> TensorRange:
    obs = observed.observer
    return TensorRange(float(clip[0]), float(clip[1]), float(obs.min), float(obs.max))


def _observed_tensors(session) -> dict[str, int]:
    """Graph tensor id -> index of an observed point holding its range."""
    result: dict[str, int] = {}
    for target in session.plan.targets:
        for tid, role in zip(target.tensors, ("input", "output"), strict=True):
            index = session.tensors.get((target.layer_key, role))
            if tid is not None and index is not None:
                result.setdefault(tid, index)
    return result


def _union(ranges: list[TensorRange | None]) -> TensorRange | None:
    """One range covering all of ``ranges`` (None if any is unknown)."""
    if not ranges or any(r is None for r in ranges):
        return None
    raw = [r for r in ranges if r.observed_min is not None and r.observed_max is not None]
    return TensorRange(
        min(r.min for r in ranges),
        max(r.max for r in ranges),
        min(r.observed_min for r in raw) if len(raw) == len(ranges) else None,
        max(r.observed_max for r in raw) if len(raw) == len(ranges) else None,
    )


def _runtime_stats(session, target: Target, clip: dict, by_tensor: dict[str, int]) -> LayerStats:
    """Sidecar entry of a runtime layer: input = union over ALL its inputs (Add, concat)
    when each is observed somewhere; output = its own observed output."""

    def of(index):
        seen = index is not None and index in clip
        return _range(session.observed[index], clip[index]) if seen else None

    inputs = [of(by_tensor.get(tid)) if tid is not None else None for tid in target.inputs]
    if len(target.inputs) <= 1:
        inputs = [of(session.tensors.get((target.layer_key, "input")))]
    output = of(session.tensors.get((target.layer_key, "output")))
    return LayerStats(target.kind, input=_union(inputs), output=output)


def _site_entries(session, target: Target, entry: LayerStats) -> dict[str, LayerStats]:
    """A layer called at several sites per step: the first site's ranges under its own key
    (the graph calls it ``relu``), the others as ``relu@1``, ``relu@2``, as the graph and the
    exports name the sites. Each is the raw extremes of its site (a clip search runs on the
    merged tensor only); without sites, ``{key: entry}``."""
    points = {
        role: session.observed[session.tensors[(target.layer_key, role)]]
        for role in ("input", "output")
        if (target.layer_key, role) in session.tensors
    }
    counts = {len(o.sites) for o in points.values() if o.sites is not None}
    if len(counts) != 1 or any(o.sites is None for o in points.values()):
        return {target.key: entry}
    out = {}
    for k in range(counts.pop()):
        ranges = {}
        for role, obs in points.items():
            lo, hi = obs.sites[k]
            ranges[role] = TensorRange(lo, hi, lo, hi) if lo <= hi else None
        site = LayerStats(entry.kind, input=ranges.get("input"), output=ranges.get("output"))
        out[target.key if k == 0 else f"{target.key}@{k}"] = site
    return out


def _sidecar(session, clip: dict) -> CalibrationStats:
    # runtime layers get minmax points of their own: not an algorithm the user chose
    algorithms = sorted({t.config.algorithm for t in session.plan.targets if not t.runtime})
    stats = CalibrationStats(algorithm=",".join(algorithms), batches=session.batches)
    by_tensor = _observed_tensors(session)
    for target in session.plan.targets:
        get = session.tensors.get
        if target.runtime:
            entry = _runtime_stats(session, target, clip, by_tensor)
            stats.layers.update(_site_entries(session, target, entry))
            continue
        if target.desc is not None and len(target.desc.parts) > 1:
            roles = ("input", "inner") if _part_index(target) == 0 else ("inner", "output")
        else:
            roles = ("input", "output")
        ranges = []
        for role in roles:
            index = get((target.layer_key, role))
            seen = index is not None and index in clip
            ranges.append(_range(session.observed[index], clip[index]) if seen else None)
        entry = LayerStats(target.kind, input=ranges[0], output=ranges[1])
        pre = get((target.layer_key, "preactivation")) if target.preactivation else None
        if pre is not None and pre in clip:  # the output before its fused activation
            entry.preactivation = _range(session.observed[pre], clip[pre])
        if len(roles) == 2 and roles[0] == "input" and roles[1] == "output":
            stats.layers.update(_site_entries(session, target, entry))
        else:
            stats.layers[target.key] = entry
        if target.bn_key is not None:  # the folded BN's output is the same tensor
            kind = target.bn_desc.kind if target.bn_desc is not None else "BatchNormalization"
            stats.layers[target.bn_key] = LayerStats(kind, output=ranges[1])
    return _in_execution_order(stats, session.plan)


def _in_execution_order(stats: CalibrationStats, plan: Plan) -> CalibrationStats:
    """Runtime targets come last in the plan; the sidecar lists layers in execution order."""
    layer_of = {t.key: t.layer_key for t in plan.targets}
    end = len(plan.rank)

    def rank(key: str) -> int:
        base = key.split("@")[0]  # a call site after its layer's first one (stable sort)
        return plan.rank.get(layer_of.get(key, layer_of.get(base, base)), end)

    stats.layers = dict(sorted(stats.layers.items(), key=lambda kv: rank(kv[0])))  # stable
    return stats
