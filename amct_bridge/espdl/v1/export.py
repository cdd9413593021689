"""Export record + weights as ESP-DL v1 convert.py input: config.json + coefficient .npy files.

One config.json entry per exported chain (conv/depthwise/dense + folded BN + fused activation,
see :mod:`amct_bridge.espdl.plan`), in execution order, named by a unique C identifier. Next to
them: ``names.json`` (C identifier -> model layer name) and ``export.json`` (fused layers,
exponents and where each came from, skipped layers, the convert.py command line). Every entry
is run through :func:`amct_bridge.espdl.v1.preview.preview_layer` before anything is written, so
an entry convert.py would reject never reaches the disk.

Example:
    >>> import numpy as np, tempfile, pathlib
    >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
    >>> layers = [SourceLayer("in", "input"),
    ...           SourceLayer("fc", "dense", ["in"], "Dense",
    ...                       {"kernel": np.full((4, 2), 0.5, np.float32)})]
    >>> stats = CalibrationStats(layers={"fc": LayerStats("Dense", TensorRange(0, 1),
    ...                                                   TensorRange(-2, 2))})
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "espdl"
    >>> res = export_layers(layers, out, stats=stats)
    >>> sorted(res.config["fc"].items())  # doctest: +NORMALIZE_WHITESPACE
    [('feature_type', 's8'), ('filter_exponent', -7), ('input_exponent', -6),
     ('operation', 'fully_connected'), ('output_exponent', -5)]
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.checks import (
    check_record_keys,
    check_sidecar_keys,
    check_sidecar_model,
    passthrough,
    record_coverage,
    sidecar_of_another_record,
    unaccounted,
)
from amct_bridge.espdl.consistency import check_scale_w
from amct_bridge.espdl.exponent_groups import shared_exponent_groups
from amct_bridge.espdl.exponent_search import Tuning
from amct_bridge.espdl.exponents import ExponentFinder
from amct_bridge.espdl.naming import c_identifiers
from amct_bridge.espdl.plan import Chain, plan_chains
from amct_bridge.espdl.refusals import refusal_message
from amct_bridge.espdl.source import OPS, WEIGHT_OPS, SourceLayer
from amct_bridge.espdl.v1 import spec
from amct_bridge.espdl.v1.border import border_warnings
from amct_bridge.espdl.v1.checks import saturation_warnings, unresolved_concats
from amct_bridge.espdl.v1.chip_graph import chip_graph
from amct_bridge.espdl.v1.coefficients import Coefficients, chain_coefficients
from amct_bridge.espdl.v1.cpp import constructor
from amct_bridge.espdl.v1.cpp_app import cpp_outputs
from amct_bridge.espdl.v1.head import host_heads, logit_bound
from amct_bridge.espdl.v1.height1 import lift_1d
from amct_bridge.espdl.v1.preview import preview_layer
from amct_bridge.espdl.v1.result import ExportedLayer, ExportResult
from amct_bridge.espdl.v1.runtime import runtime_class, runtime_layers
from amct_bridge.espdl.writer import npy_bytes, write_directory
from amct_bridge.quant.espdl import auto_exponent, range_to_exponent
from amct_bridge.records.calibration import CalibrationStats
from amct_bridge.records.model import Record

GRANULARITIES = ("per-tensor", "per-channel")
REPORT_FORMAT = "amct_bridge.espdl_export/1"


def _check_links(layers: list[SourceLayer]) -> None:
    """Layers link by name, in topological order: a repeated name or an input naming the layer
    itself or a later one is a cycle, which the exponent search would follow forever (found by
    the fuzzer: a runtime layer named like the input it reads)."""
    index: dict[str, int] = {}
    for i, layer in enumerate(layers):
        if layer.name in index:
            raise ExportError(
                f"layer {layer.describe()}: the name {layer.name!r} is used twice (layers "
                f"{index[layer.name]} and {i}); SourceLayer names must be unique"
            )
        index[layer.name] = i
    for i, layer in enumerate(layers):
        late = [x for x in layer.inputs if index.get(x, -1) >= i]
        if late:
            raise ExportError(
                f"layer {layer.describe()} reads {late[0]!r}, which does not come before it: "
                "SourceLayers must be in topological order (a cycle?)"
            )


def _sidecar_strangers(layers: list[SourceLayer], stats: CalibrationStats) -> list[str]:
    """A note when sidecar entries name no layer: a sidecar of another model gives its ranges
    to nobody, and the layers it should have covered fall back to bounds (silent before)."""
    # a call site (``relu@1``) has its own entry or shares its layer's (``relu``)
    names = {x.name for x in layers} | {x.name.split("@")[0] for x in layers}
    strangers = [
        key
        for key, entry in stats.layers.items()
        if key not in names
        and key.split("/")[0] not in names
        # a BN folded away (strip_qat): the conv's own entry holds the BN's output range
        and "BatchNorm" not in (entry.kind or "")
    ]
    if not strangers:
        return []
    hints = []
    for key in strangers[:5]:
        close = difflib.get_close_matches(key, sorted(names), n=1)
        hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    more = f" and {len(strangers) - 5} more" if len(strangers) > 5 else ""
    return [
        f"sidecar entries name no layer of this model: {', '.join(hints)}{more}; their ranges "
        "are not used (is the sidecar of another model?)"
    ]


def check_options(feature_type: str, granularity: str, target: str) -> None:
    """Refuse option combinations ESP-DL v1 cannot run.

    Example:
        >>> check_options("s16", "per-channel", "esp32")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: s16 per-channel is not supported by the ESP-DL v1 ...
    """
    if feature_type not in spec.FEATURE_BITS:
        raise ExportError(f"feature_type {feature_type!r}: expected one of s8, s16")
    if granularity not in GRANULARITIES:
        raise ExportError(f"granularity {granularity!r}: expected per-tensor or per-channel")
    if target not in spec.TARGETS:
        raise ExportError(f"target {target!r}: expected one of {', '.join(spec.TARGETS)}")
    if feature_type == "s16" and granularity == "per-channel":
        raise ExportError(
            "s16 per-channel is not supported by the ESP-DL v1 runtime (per-channel quantization "
            "is int8 only): use --feature-type s8 or --granularity per-tensor"
        )


def _entry(
    chain: Chain, coef: Coefficients, feature_type: str, per_channel: bool, exps: dict
) -> dict:
    entry: dict = {"operation": WEIGHT_OPS[chain.head.op], "feature_type": feature_type}
    if coef.bias is not None:
        entry["bias"] = "True"  # the tool tests truthiness; omitted entirely when there is none
    if not per_channel:
        entry["filter_exponent"] = exps["filter"]
    if exps.get("input") is not None:
        entry["input_exponent"] = exps["input"]
    entry["output_exponent"] = exps["output"]
    if chain.activation is not None:
        entry["activation"] = {"type": chain.activation}
    return entry


def _output_exponents(
    layers: list[SourceLayer], chains: list[Chain], finder: ExponentFinder
) -> tuple[dict[str, tuple], dict[str, list[str]], list[str]]:
    """Pass 1: every chain's output exponent, raised to a shared one where branches meet."""
    found: dict[str, tuple] = {}
    warnings: dict[str, list[str]] = {}
    for chain in chains:
        finder.warnings.clear()
        searched = (chain.last, "output") in finder.overrides  # the logits' too (search.py)
        if chain.head.attrs.get("host_activation") and not searched:
            # the sidecar has the probabilities' range
            found[chain.last] = _logit_exponent(chain, finder)
        else:
            found[chain.last] = finder.output_exponent(chain)
        warnings[chain.last] = list(finder.warnings)
    groups, loose = shared_exponent_groups(layers, chains)
    for group in groups:
        top = max(found[end][0] for end in group)
        for end in group:
            exp, src, rng = found[end]
            if exp != top:
                others = ", ".join(repr(e) for e in group if e != end)
                found[end] = (top, f"{src}, raised from {exp} to match {others}", rng)
            finder.chain_outputs[end] = top
    return found, warnings, loose


def _logit_exponent(chain: Chain, finder: ExponentFinder) -> tuple:
    """Output exponent of a head whose softmax/sigmoid is left to the host: its calibrated
    output range is after that function, so the logits' range measured by the calibration
    (the sidecar's ``preactivation``; QAT's: its EMA) gives it; a sidecar without one (written
    before 2026-12): a bound of the logits from the input range, with a warning."""
    head = chain.head
    func = head.attrs["host_activation"]
    measured = finder.range_exponent(head.name, "preactivation")
    if measured is not None and measured[2] is not None:
        finder.chain_outputs[chain.last] = measured[0]
        return measured[0], f"sidecar logit range of {head.name!r} (before its {func})", measured[2]
    found = finder.range_exponent(head.name, "input") or finder.record_exponent(head.name)
    if found is None or found[2] is None:
        feeding = finder.input_exponent(chain)
        if feeding is None:
            raise ExportError(
                f"layer {head.name!r}: cannot choose output_exponent for its logits (its "
                f"{head.attrs['host_activation']} is left to the host): no input range in the "
                "calibration sidecar, no scale_d in the record, no exported layer before it"
            )
        top = float(2 ** (finder.bits - 1) - 1) * 2.0 ** feeding[0]
        found = (feeding[0], feeding[1], (-top, top))
    rng = logit_bound(head, found[2])
    exp = range_to_exponent(rng[0], rng[1], finder.bits)
    finder.chain_outputs[chain.last] = exp
    finder.warnings.append(
        f"layer {head.name!r}: exported without its {func} (left to the host); its calibrated "
        f"output range is the {func}'s and the sidecar has no measured logit range "
        f"(preactivation), so output_exponent {exp} bounds the logits from the input range "
        f"[{found[2][0]:.4g}, {found[2][1]:.4g}] and the weights (coarser than a calibrated "
        "range: calibrate again for a measured one)"
    )
    return exp, f"bound of the logits from the {found[1]} through the weights", rng


def _export_chain(
    chain: Chain,
    c_name: str,
    finder: ExponentFinder,
    out_found: tuple,
    warnings: list[str],
    options: tuple[str, bool, str],
    offset: np.ndarray | None = None,
) -> ExportedLayer:
    feature_type, per_channel, target = options
    coef = chain_coefficients(chain)
    if offset is not None:  # a searched bias correction (exponent_search.bias_offsets)
        base = np.zeros(len(offset)) if coef.bias is None else coef.bias.astype(np.float64)
        coef.bias = (base + offset).astype(np.float32)
    axis = spec.OPERATIONS[WEIGHT_OPS[chain.head.op]].channel_axis
    record = finder.record
    factors = record.layers.get(chain.head.name) if record else None
    warning = check_scale_w(chain.head.name, factors, coef.filter, axis)
    out_exp, out_src, out_range = out_found
    found_in = finder.input_exponent(chain)
    if found_in is None and per_channel and coef.bias is not None:
        raise ExportError(
            f"layer {chain.head.name!r}: per-channel bias needs input_exponent, but neither the "
            "calibration sidecar (input range) nor the record (scale_d/offset_d) gives one"
        )
    arrays = {f"{c_name}_filter": coef.filter}
    if coef.bias is not None:
        arrays[f"{c_name}_bias"] = coef.bias
    if coef.alpha is not None:
        arrays[f"{c_name}_activation"] = coef.alpha
    bits = spec.FEATURE_BITS[feature_type]
    searched_filter = finder.overrides.get((chain.head.name, "filter"))
    exps = {
        "filter": auto_exponent(coef.filter, bits, name=f"{chain.head.name} filter")
        if searched_filter is None or per_channel  # per-channel: convert.py's own exponents
        else int(searched_filter),
        "input": None if found_in is None else found_in[0],
        "output": out_exp,
    }
    entry = _entry(chain, coef, feature_type, per_channel, exps)
    preview = preview_layer(c_name, entry, arrays, target=target, per_channel=per_channel)
    warnings = warnings + saturation_warnings(chain.head.name, preview)
    sources = {"output_exponent": out_src}
    if found_in is not None:
        sources["input_exponent"] = found_in[1]
    if searched_filter is not None and not per_channel:
        sources["filter_exponent"] = "searched on the calibration data"
    if offset is not None:
        sources["bias"] = (
            "corrected by the chip's mean error on the calibration data (largest change "
            f"{float(np.max(np.abs(offset))):.3g})"
        )
    attrs = chain.head.attrs
    if chain.pads is not None:  # a folded ZeroPadding2D: explicit pads
        attrs = {**attrs, "padding": "not_set", "pads": chain.pads}
    return ExportedLayer(
        c_name,
        chain.head.name,
        entry["operation"],
        chain.fused,
        entry,
        coef,
        preview,
        sources,
        out_range,
        ([warning] if warning else []) + warnings,
        constructor(c_name, entry["operation"], entry, feature_type, per_channel, attrs),
        chain.pads,
    )


def export_layers(
    layers: list[SourceLayer],
    out_dir: str | os.PathLike | None,
    *,
    record: Record | None = None,
    stats: CalibrationStats | None = None,
    feature_type: str = "s8",
    granularity: str = "per-tensor",
    target: str = "esp32",
    skip_unsupported: bool = False,
    overwrite: bool = False,
    cpp: str | None = None,
    tuning: Tuning | None = None,
) -> ExportResult:
    """Export framework-free ``layers`` (execution order) to ``out_dir`` (None = dry run).

    Args:
        layers: the model as :class:`SourceLayer` list (from an adapter).
        out_dir: directory to create; must not exist or be empty unless ``overwrite``.
        record: AMCT record (skip_fusion, scale_d/offset_d fallback for exponents).
        stats: calibration sidecar (input/output ranges per layer).
        feature_type: "s8" or "s16".
        granularity: "per-tensor" or "per-channel" (convert.py ``-q 0`` / ``-q 1``).
        target: chip, used for the preview layout and the convert.py command in export.json.
        skip_unsupported: leave refused layers out (listed in export.json) instead of failing.
        overwrite: replace an existing non-empty ``out_dir``.
        cpp: also write convert.py's ``<cpp>.cpp``/``.hpp``, the model class and an
            ``app_main.cpp`` (:func:`amct_bridge.espdl.v1.cpp_app.cpp_outputs`).
        tuning: searched exponents and bias corrections that replace the range rule's
            (:func:`amct_bridge.espdl.v1.search.search_tuning`); None: the range rule.

    Example:
        >>> lstm = SourceLayer("x", "unsupported", kind="LSTM", attrs={"reason": "RNN"})
        >>> export_layers([lstm], None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: ESP-DL v1 cannot take these layers:
          layer 'x' (LSTM): RNN
        to export the rest, pass --skip-unsupported (Python: skip_unsupported=True): ...
    """
    check_options(feature_type, granularity, target)
    odd = [x for x in layers if x.op not in OPS]  # else only the bug guard below names them
    if odd:
        raise ExportError(
            f"layer {odd[0].describe()}: op {odd[0].op!r} is not a SourceLayer op "
            f"(expected one of {', '.join(OPS)}; adapters map other layers to 'unsupported')"
        )
    layers = lift_1d(layers)  # 1-D tensors at height 1 (a Reshape after a (W, C) input)
    _check_links(layers)
    check_record_keys(record, layers)
    check_sidecar_keys(stats, layers)
    check_sidecar_model(stats, layers)  # a sidecar of another model, by layer name
    every_layer = layers
    layers, host = host_heads(layers)  # a final softmax / sigmoid: left to the host

    def skip_fusion(name: str) -> bool:
        factors = record.layers.get(name) if record else None
        return bool(factors and factors.skip_fusion)

    chains, problems = plan_chains(layers, skip_fusion)
    if problems and not skip_unsupported:
        raise ExportError(refusal_message(problems))
    if not chains:
        raise ExportError("nothing to export: the model has no Conv2D / DepthwiseConv2D / Dense")
    fused = {name for c in chains for name in c.fused}
    extra = [x.name for x in layers if runtime_class(x) and x.name not in fused]
    names = c_identifiers([c.head.name for c in chains] + extra)  # chains keep their names
    bits = spec.FEATURE_BITS[feature_type]
    finder = ExponentFinder(
        layers, record, stats, bits=bits, overrides=tuning.exponents if tuning else None
    )
    options = (feature_type, granularity == "per-channel", target)
    outs, warnings, loose = _output_exponents(layers, chains, finder)
    # after the chains' outputs and before their inputs: a conv after an Add reads its exponent
    runtime, raised = runtime_layers(layers, finder, names, feature_type, fused)
    for end, (exp, cat) in raised.items():
        old, src, rng = outs[end]
        outs[end] = (exp, f"{src}, raised from {old} to {exp} to match the inputs of {cat!r}", rng)
    loose = unresolved_concats(loose, runtime)
    offsets = tuning.bias_offsets if tuning else {}
    exported = [
        _export_chain(
            c,
            names[c.head.name],
            finder,
            outs[c.last],
            warnings[c.last],
            options,
            offsets.get(c.head.name),
        )
        for c in chains
    ]
    result = ExportResult(
        Path(out_dir) if out_dir is not None else None,
        feature_type,
        granularity,
        target,
        exported,
        problems,
        loose,
        runtime,
        passthrough=passthrough(layers),
        inputs=[x.name for x in layers if x.op == "input"],
        host=host,
    )
    if tuning is not None:
        result.notes += tuning.notes
    result.notes += sidecar_of_another_record(record, stats)
    result.notes += record_coverage([c.head.name for c in chains], record, stats)
    if stats is not None:
        result.notes += _sidecar_strangers(every_layer, stats)
    missing = unaccounted(layers, _report(result))
    if missing:  # a bug guard: the rules above must place every layer somewhere
        raise ExportError(f"layers neither exported, fused, skipped nor refused: {missing}")
    try:
        result.graph = chip_graph(layers, result)
    except ExportError as err:  # the export stays usable; the simulator says why it cannot run
        result.graph_error = str(err)
    result.notes += border_warnings(result)  # same-padded average pools: measured at the border
    extra: dict[str, bytes] = {}
    if cpp is not None:
        extra, notes = cpp_outputs(result, cpp)
        result.notes += notes
    if out_dir is not None:
        write_directory(out_dir, {**_files(result), **extra}, overwrite=overwrite)
    return result


def _json(doc: object) -> bytes:
    return (json.dumps(doc, indent=4) + "\n").encode()


def _report(result: ExportResult) -> dict:
    q = 1 if result.granularity == "per-channel" else 0
    return {
        "format": REPORT_FORMAT,
        "feature_type": result.feature_type,
        "granularity": result.granularity,
        "target": result.target,
        "convert_command": (
            f"python convert.py -t {result.target} -i <this directory> -n <NAME> -o <OUT> -q {q}"
        ),
        "layers": [
            {
                "name": layer.name,
                "source": layer.source,
                "fused": layer.fused,
                "operation": layer.operation,
                "output_exponent": layer.entry["output_exponent"],
                "input_exponent": layer.entry.get("input_exponent"),
                "exponent_sources": layer.sources,
                "cpp": layer.cpp,
                **({"pads": layer.pads} if layer.pads is not None else {}),
            }
            for layer in result.layers
        ],
        "runtime_layers": [item.to_json() for item in result.runtime],
        "passthrough": result.passthrough,
        "inputs": result.inputs,
        "host": [item.to_json() for item in result.host],
        "skipped": [{"layer": p.layer, "kind": p.kind, "reason": p.reason} for p in result.skipped],
        "warnings": result.warnings,
        "graph": result.graph,
        **({"graph_error": result.graph_error} if result.graph is None else {}),
    }


def _files(result: ExportResult) -> dict[str, bytes]:
    files = {
        "config.json": _json(result.config),
        "names.json": _json(result.names),
        "export.json": _json(_report(result)),
    }
    for layer in result.layers:
        coef = layer.coefficients
        files[f"{layer.name}_filter.npy"] = npy_bytes(coef.filter)
        if coef.bias is not None:
            files[f"{layer.name}_bias.npy"] = npy_bytes(coef.bias)
        if coef.alpha is not None:
            files[f"{layer.name}_activation.npy"] = npy_bytes(coef.alpha)
    return files
