"""The simulated chip's accuracy next to float and fake-quant, and each chip layer's error.

Framework-free: the adapters run their float and fake-quantized models and hand over the scores
and the float outputs of the layers the chip layers compute (NHWC, keyed by the framework's own
layer names); :func:`evaluate_export` runs the bit-exact chip simulator over the same inputs and
compares. ``amct-bridge espdl-eval`` prints :func:`format_evaluation` of it.

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl import SourceLayer, export
    >>> from amct_bridge.records import LayerFactors, Record
    >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
    >>> w = np.float32([[1, -1], [1, 1]])
    >>> layers = [SourceLayer("in", "input"),
    ...           SourceLayer("fc", "dense", ["in"], weights={"kernel": w})]
    >>> stats = CalibrationStats(layers={"fc": LayerStats("Dense", output=TensorRange(-2, 2))})
    >>> res = export(Record({"fc": LayerFactors(scale_d=1 / 255, offset_d=-128)}), layers, None,
    ...              stats=stats)
    >>> x = np.float32([[1, 0], [0, 1]]); y = np.array([0, 1])
    >>> ev = evaluate_export(res, x, y, float_scores=x @ w, floats={"fc": x @ w})
    >>> ev.float_acc, ev.chip_acc, ev.layers[0].source
    (0.5, 0.5, 'fc')
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from amct_bridge.errors import ExportError


@dataclass
class LayerError:
    """A chip layer's output against the float model's output of the same layer.

    Example:
        >>> LayerError("c", "conv1", "Conv2D", -5, 30.0, 0.05, 0.0, False).source
        'conv1'
    """

    name: str
    source: str  # the framework's layer (Keras layer, MindSpore cell) that computes it
    kind: str  # the op computing it (ESP-DL v1 class, ESP-DL v3 operator)
    exponent: int | None  # None: a float tensor (ESP-DL v3 float32), which has no exponent
    snr_db: float
    max_abs: float
    saturated: float
    approximate: bool


@dataclass
class Evaluation:
    """Accuracies (None: not computed) and the per-layer errors.

    ``chip_acc`` is None when no chip output computes the model's output (a skipped last
    layer the host cannot run): ``chip_note`` says why. Otherwise ``chip_note`` says what was
    scored when it is not plainly the model's output (the logits of a head whose softmax is
    left to the host, a chip output followed by float layers on the host).

    A model whose output is not a class vector for the labels (an autoencoder scored with 0/1
    anomaly labels) gets no accuracy at all: ``no_accuracy`` says why
    (:func:`amct_bridge.report.metrics.classification_problem`), and the regression figures
    (``*_snr`` in dB and ``*_mse``, the fake-quantized and the chip's model output against the
    float model's) are what :func:`format_evaluation` prints instead. They are computed for
    every model (None where the output is not there or does not fit).

    Example:
        >>> Evaluation(10, 0.9, None, 0.8, "esp32").chip_acc
        0.8
    """

    samples: int
    float_acc: float | None
    fake_quant_acc: float | None
    chip_acc: float | None
    target: str
    layers: list[LayerError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    source_label: str = "keras layer"  # the last column's header: whose names it lists
    #: chip layers without a row, each "name (source): why" (nothing is left out silently)
    not_compared: list[str] = field(default_factory=list)
    chip_note: str = ""
    #: a same-padded AvgPool2D's error split into border and inner positions (the chip divides
    #: by the full window at the border, the framework by the real cells)
    border: list[str] = field(default_factory=list)
    #: why no accuracy is given ("": the output is a class vector for the labels)
    no_accuracy: str = ""
    fake_quant_snr: float | None = None  # dB, model output against the float model's
    fake_quant_mse: float | None = None
    chip_snr: float | None = None
    chip_mse: float | None = None


def score_outputs(
    y: np.ndarray,
    float_scores: np.ndarray,
    fake_quant_scores: np.ndarray | None,
    chip_scores: np.ndarray | None,
    output: str | None = None,
) -> dict[str, Any]:
    """The :class:`Evaluation` fields of the model output: the accuracies when the float
    output is a class vector for ``y`` (class indices or one-hot), else ``no_accuracy`` (why);
    and, always, the regression figures of the fake-quantized and the chip's output against
    the float output (a chip output in NHWC against an NCHW float output is transposed).

    Example:
        >>> ref = np.float32([[0.1, 0.9], [0.8, 0.2]])
        >>> got = score_outputs(np.array([1, 1]), ref, None, ref)
        >>> got["float_acc"], got["chip_acc"], got["chip_snr"], got["no_accuracy"]
        (0.5, 0.5, inf, '')
    """
    from amct_bridge.report.metrics import class_indices, classification_problem, mse

    problem = classification_problem(float_scores, y)
    labels = None if problem else class_indices(y)[0]
    named = f" {output!r}" if output else ""

    def acc(scores: np.ndarray | None) -> float | None:
        return None if scores is None or labels is None else accuracy(scores, labels)

    fields: dict[str, Any] = {
        "float_acc": acc(float_scores),
        "fake_quant_acc": acc(fake_quant_scores),
        "chip_acc": acc(chip_scores),
        "no_accuracy": (
            f"the model output{named} is not a class vector for these labels: {problem}"
            if problem
            else ""
        ),
    }
    ref = np.asarray(float_scores, np.float64)
    for name, got in (("fake_quant", fake_quant_scores), ("chip", chip_scores)):
        fitted = as_reference(ref, got)
        fields[f"{name}_snr"] = None if fitted is None else snr_db(ref, fitted)
        fields[f"{name}_mse"] = None if fitted is None else mse(ref, fitted)
    return fields


def as_reference(ref: np.ndarray, got: np.ndarray | None) -> np.ndarray | None:
    """``got`` in ``ref``'s shape, or None when it does not fit: a map is transposed between
    NHWC (the chip) and NCHW (MindSpore), a vector of values reshaped (``(N, 1, 1, C)``).

    Example:
        >>> as_reference(np.zeros((2, 3, 4, 5)), np.zeros((2, 4, 5, 3))).shape
        (2, 3, 4, 5)
        >>> as_reference(np.zeros((2, 6)), np.zeros((2, 2, 3))) is None
        True
    """
    if got is None:
        return None
    got = np.asarray(got, np.float64)
    if got.shape == ref.shape:
        return got
    if ref.ndim == 4 and got.ndim == 4:  # NHWC against NCHW, or NCHW against NHWC
        for axes in ((0, 3, 1, 2), (0, 2, 3, 1)):
            if got.transpose(axes).shape == ref.shape:
                return got.transpose(axes)

    def vector(a: np.ndarray) -> bool:  # (N, C), (N, 1, 1, C)...: one axis of values
        return sum(d > 1 for d in a.shape[1:]) <= 1

    return got.reshape(ref.shape) if got.size == ref.size and vector(ref) and vector(got) else None


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    """10·log10(Σref² / Σ(ref − got)²); inf when equal.

    Example:
        >>> round(snr_db(np.array([1.0, -1.0]), np.array([1.1, -1.0])), 1)
        23.0
    """
    noise = float(np.sum((ref.astype(np.float64) - got) ** 2))
    signal = float(np.sum(ref.astype(np.float64) ** 2))
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def accuracy(scores: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of ``scores`` (one row per sample) against class indices ``y``; one score
    per sample is a probability: class 1 when > 0.5 (as the report's accuracy).

    Example:
        >>> accuracy(np.array([[0.1, 0.9], [0.8, 0.2]]), np.array([1, 1]))
        0.5
        >>> accuracy(np.array([[0.7], [0.2]]), np.array([1, 1]))
        0.5
    """
    flat = np.asarray(scores).reshape(len(y), -1)
    predicted = (flat[:, 0] > 0.5).astype(np.int64) if flat.shape[1] == 1 else flat.argmax(axis=1)
    return float(np.mean(predicted == y))


def host_function(name: str, logits: np.ndarray) -> np.ndarray:
    """A head function the export left to the host, in float64 over the last axis.

    Example:
        >>> host_function("sigmoid", np.array([[0.0]])).tolist()
        [[0.5]]
    """
    z = np.asarray(logits, np.float64)
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-z))
    shifted = z - z.max(axis=-1, keepdims=True)
    if name == "log_softmax":
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    if name == "softmax":
        e = np.exp(shifted)
        return e / e.sum(axis=-1, keepdims=True)
    raise ExportError(f"export: host function {name!r} is not softmax, log_softmax or sigmoid")


def source_names(net: Any) -> list[str]:
    """The framework layer each chip layer's output equals (its last fused layer, or itself).

    Example:
        >>> source_names(type("N", (), {"layers": []})())
        []
    """
    return [layer.fused[-1] if layer.fused else layer.source for layer in net.layers]


def evaluate_export(
    export: str | Path | Any,
    x: np.ndarray,
    y: np.ndarray,
    *,
    float_scores: np.ndarray,
    fake_quant_scores: np.ndarray | None = None,
    floats: dict[str, np.ndarray] | Callable[[list[str]], dict[str, np.ndarray]] | None = None,
    output: str | None = None,
    target: str | None = None,
    input_exponent: int | None = None,
    batch_size: int = 64,
    source_label: str = "keras layer",
    missing_reasons: dict[str, str] | None = None,
    host_rest: Callable[[str, np.ndarray], np.ndarray | None] | None = None,
) -> Evaluation:
    """Run the chip simulator on ``x`` (NHWC, as the chip takes it) and compare.

    Args:
        export: an export directory, :class:`~amct_bridge.espdl.ExportResult` or network.
        x, y: the inputs (float, NHWC) and the labels: class indices or one-hot rows; labels
            the model output is not a class vector for give no accuracy, the regression
            figures instead (:func:`score_outputs`).
        float_scores, fake_quant_scores: the float and fake-quantized models' first output.
        floats: the float outputs (NHWC) by framework layer name, or a function of the names
            wanted (:func:`source_names`) giving them; a layer without one gets a "not
            compared" line instead of a row, with ``missing_reasons[source]`` if given.
        output: the framework layer of the model's first output (None: unknown; the chip's
            output is scored only when it is the only one and no model output was skipped).
        target, input_exponent: as :func:`~amct_bridge.espdl.simulate_chip`.
        batch_size: samples per chip call.
        source_label: header of the layer-name column.
        host_rest: ``host_rest(layer, values)``: the model's output computed in float from
            framework layer ``layer``'s output ``values`` (the dequantized chip output, NHWC),
            or None when the model cannot be run from there. Used when a model output was
            skipped at export: the chip's part, then the rest on the host, is scored.

    Example:
        >>> # see the module docstring
    """
    from amct_bridge.espdl.v1.chip import simulate_chip

    net = chip_network(export, x)
    chip: dict = {}
    warnings: list[str] = []
    simulated = target or net.target or "esp32"
    parts: dict[str, list[np.ndarray]] = {layer.name: [] for layer in net.layers}
    for start in range(0, len(x), batch_size):
        res = simulate_chip(net, x[start : start + batch_size], target, input_exponent)
        warnings, simulated = res.warnings, res.target
        for name, tensor in res.layers.items():
            parts[name].append(tensor.values)
            chip["exp:" + name] = tensor.exponent
            chip["approx:" + name] = tensor.approximate
    for name, values in parts.items():
        chip[name] = np.concatenate(values) if values else np.zeros(0)
    scores, note = _chip_scores(net, output, chip, host_rest)
    refs = floats(source_names(net)) if callable(floats) else (floats or {})
    not_compared: list[str] = []
    fields = score_outputs(y, float_scores, fake_quant_scores, scores, output)
    ev = Evaluation(
        len(y),
        fields.pop("float_acc"),
        fields.pop("fake_quant_acc"),
        fields.pop("chip_acc"),
        simulated,
        _layer_errors(net, chip, refs, net.bits, not_compared, missing_reasons),
        warnings,
        source_label,
        not_compared,
        note,
        **fields,
    )
    ev.border = _border_errors(net, chip, refs, tuple(x.shape[1:3]))
    return ev


def _border_errors(net: Any, chip: dict, floats: dict, input_hw: tuple) -> list[str]:
    """SNR of a same-padded AvgPool2D at the border positions and inside, on this data."""
    from amct_bridge.espdl.v1.chip import border_ratios

    same = ("SAME_END", "SAME_BEGIN")
    lines = []
    for layer, source in zip(net.layers, source_names(net), strict=True):
        if layer.kind != "AvgPool2D" or layer.attrs.get("padding") not in same:
            continue
        ref = floats.get(source)
        got = np.ldexp(chip[layer.name].astype(np.float64), chip["exp:" + layer.name])
        src = layer.inputs[0]
        hw = input_hw if src not in chip else chip[src].shape[1:3]  # "input": the model's
        if ref is None or ref.size != got.size or got.ndim != 4:
            continue
        ratio = border_ratios(hw, layer.attrs)
        if ratio.shape != got.shape[1:3] or not (ratio < 1).any():
            continue
        edge = np.broadcast_to((ratio < 1)[None, :, :, None], got.shape)
        ref = ref.reshape(got.shape)
        lines.append(
            f"{layer.name} ({source}): SNR {snr_db(ref[edge], got[edge]):.1f} dB at the "
            f"{int((ratio < 1).sum())} border positions, {snr_db(ref[~edge], got[~edge]):.1f} dB "
            "inside (ESP-DL v1 divides by the full window at the border, the model by the real "
            "cells: see docs/espdl-export.md)"
        )
    return lines


def chip_network(export: str | Path | Any, x: np.ndarray) -> Any:
    """The chip graph of ``export`` (directory, ExportResult or network), checked to take
    ``x`` (NHWC): call it before running a model on data that may be another model's.

    Example:
        >>> chip_network("/nonexistent", np.zeros((1, 2)))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: ...
    """
    from amct_bridge.espdl.v1.chip import as_network

    net = as_network(export)  # the simulator's own reading of it
    where = str(export) if isinstance(export, (str, os.PathLike)) else "the export"
    if net.input_shape is not None and tuple(x.shape[1:]) != tuple(net.input_shape):
        raise ExportError(
            f"{where}: the exported network takes inputs of shape {tuple(net.input_shape)} "
            f"(HWC), the data has {tuple(x.shape[1:])}: is it the export of this model?"
        )
    return net


def _chip_scores(
    net: Any, output: str | None, chip: dict, host_rest: Callable | None
) -> tuple[np.ndarray | None, str]:
    """What to score as the chip's prediction of the model's first output, and a note; (None,
    why) when no chip output computes it. The graph lists its outputs in execution order, which
    need not be the model's output order."""
    layers = {x.name: x for x in net.layers}
    heads = {h.get("layer"): h for h in getattr(net, "host", [])}
    skipped = {s.get("layer"): s for s in getattr(net, "skipped_outputs", [])}

    def values(name: str) -> np.ndarray:
        return np.ldexp(chip[name].astype(np.float64), chip["exp:" + name])

    if output is None:  # the model's output is not known: only an unambiguous chip output
        if len(net.outputs) == 1 and not skipped:
            return values(net.outputs[0]), ""
        return None, (
            f"the model's output layer is not known and the chip has outputs "
            f"{', '.join(map(repr, net.outputs))}"
            + (f" and skipped model outputs {', '.join(map(repr, skipped))}" if skipped else "")
        )
    computed = {m.get("layer"): m.get("chip") for m in getattr(net, "model_outputs", [])}
    for name in net.outputs:
        layer = layers[name]
        if output in (layer.source, *layer.fused) or computed.get(output) == name:
            head = heads.get(output)
            if head is None:
                return values(name), ""
            return _on_host(head, values(name)), (
                f"the chip computes the logits of {output!r}, its {head['function']} is "
                f"applied on the host ({head['why']})"
            )
    chip_name = computed.get(output)  # e.g. a final Dropout: its input's chip layer
    if chip_name in layers and output not in heads:
        return values(chip_name), ""
    head = heads.get(output)  # a final Softmax layer left to the host: the chip computes its input
    if head is not None and head.get("chip") in layers:
        return _on_host(head, values(head["chip"])), (
            f"the chip computes {head['chip']!r}, the input of {output!r}, whose "
            f"{head['function']} is applied on the host ({head['why']})"
        )
    if host_rest is not None:
        for name in net.outputs:
            layer = layers[name]
            source = layer.fused[-1] if layer.fused else layer.source
            scores = host_rest(source, values(name))
            if scores is not None:
                return np.asarray(scores), (
                    f"chip output {name!r} ({source}), then the layers after it to the model "
                    f"output {output!r} run in float on the host"
                )
    if output in skipped:
        entry = skipped[output]
        why = (
            f"the model output {output!r} ({entry.get('kind')}) was skipped at export "
            f"({entry.get('reason')}), so the chip's output {entry.get('chip')!r} is its "
            "input, not the model's output"
        )
    else:
        outs = ", ".join(f"{n!r} ({layers[n].source})" for n in net.outputs)
        why = f"no chip output computes the model output {output!r} (the chip's outputs: {outs})"
    rest = "" if host_rest is None else ", and the rest of the model cannot run from it"
    return None, why + rest


def _on_host(head: dict, logits: np.ndarray) -> np.ndarray:
    flat = logits.reshape(len(logits), -1)  # the function's axis: the classes
    return host_function(str(head.get("function")), flat)


def _layer_errors(
    net: Any,
    chip: dict,
    floats: dict,
    bits: int,
    missing: list[str] | None = None,
    reasons: dict[str, str] | None = None,
) -> list[LayerError]:
    """A row per chip layer with a float counterpart; the others go to ``missing`` with why.
    A layer whose softmax / sigmoid the export left to the host is compared with it applied
    (the float layer's output is after it)."""
    top, bottom = 2 ** (bits - 1) - 1, -(2 ** (bits - 1))
    result = []
    missing = [] if missing is None else missing
    fused_heads = {h.get("chip"): h for h in getattr(net, "host", []) if h["layer"] == h["reads"]}
    for layer, source in zip(net.layers, source_names(net), strict=True):
        if source not in floats:
            why = (reasons or {}).get(source, "no float output of it was recorded")
            missing.append(f"{layer.name} ({source}): {why}")
            continue
        ref = floats[source]
        values = chip[layer.name]
        got = np.ldexp(values.astype(np.float64), chip["exp:" + layer.name])
        if got.size != ref.size:
            missing.append(
                f"{layer.name} ({source}): the chip has {got.size} values, the float model "
                f"{ref.size}"
            )
            continue
        got = got.reshape(ref.shape)
        head = fused_heads.get(layer.name)
        if head is not None:
            got = _on_host(head, got).reshape(ref.shape)
        result.append(
            LayerError(
                layer.name,
                source if head is None else f"{source} (its {head['function']} on the host)",
                layer.kind,
                chip["exp:" + layer.name],
                snr_db(ref, got),
                float(np.max(np.abs(ref - got))) if ref.size else 0.0,
                float(np.mean((values == top) | (values == bottom))) if values.size else 0.0,
                chip["approx:" + layer.name],
            )
        )
    return result


def format_evaluation(ev: Evaluation) -> str:
    """The report ``espdl-eval`` prints.

    Example:
        >>> print(format_evaluation(Evaluation(10, 0.9, None, 0.8, "esp32")))
        ... # doctest: +NORMALIZE_WHITESPACE
        samples: 10
        float accuracy:      0.9000
        fake-quant accuracy: n/a (no --record)
        chip accuracy:       0.8000 (esp32, bit-exact simulator)
    """
    scales = "  (AMCT's scales, not the chip's power-of-two exponents: no chip prediction)"
    chip_note = f"; {ev.chip_note}" if ev.chip_note else ""
    if ev.no_accuracy:  # not a classifier for these labels: regression figures instead
        lines = [
            f"samples: {ev.samples}",
            f"accuracy: n/a ({ev.no_accuracy}); the model output's SNR and MSE against the "
            "float model's instead:",
            f"fake-quant output:   {_figures(ev.fake_quant_snr, ev.fake_quant_mse, 'no --record')}"
            + (scales if ev.fake_quant_snr is not None else ""),
            "chip output:         "
            + _figures(ev.chip_snr, ev.chip_mse, ev.chip_note or "no chip output fits it")
            + (
                f" ({ev.target}, bit-exact simulator{chip_note})" if ev.chip_snr is not None else ""
            ),
        ]
    else:
        fq = "n/a (no --record)" if ev.fake_quant_acc is None else f"{ev.fake_quant_acc:.4f}"
        if ev.fake_quant_acc is not None:  # issue 23 §5: it is not a prediction of the chip
            fq += scales
        if ev.chip_acc is None:
            chip = f"n/a ({ev.chip_note})"
        else:
            chip = f"{ev.chip_acc:.4f} ({ev.target}, bit-exact simulator{chip_note})"
        lines = [
            f"samples: {ev.samples}",
            f"float accuracy:      {ev.float_acc:.4f}",
            f"fake-quant accuracy: {fq}",
            f"chip accuracy:       {chip}",
        ]
    if ev.layers:
        width = max(len("layer"), *(len(e.name) for e in ev.layers))
        kinds = max(19, *(len(e.kind) for e in ev.layers))
        lines += ["", "per-layer error of the chip against the float model:"]
        lines.append(
            f"{'layer':<{width}}  {'class':<{kinds}} {'exp':>4} {'SNR dB':>7} {'max abs':>10} "
            f"{'sat %':>6}  {ev.source_label}"
        )
        for e in ev.layers:
            mark = "  (approximate arithmetic)" if e.approximate else ""
            exp = "-" if e.exponent is None else e.exponent  # a float tensor has none
            lines.append(
                f"{e.name:<{width}}  {e.kind:<{kinds}} {exp:>4} {e.snr_db:>7.1f} "
                f"{e.max_abs:>10.4g} {100 * e.saturated:>6.2f}  {e.source}{mark}"
            )
        worst = min(ev.layers, key=lambda e: e.snr_db)
        lines.append(f"lowest SNR: {worst.name} ({worst.snr_db:.1f} dB)")
    lines += [f"not compared: {line}" for line in ev.not_compared]
    lines += [f"border of a same-padded average pool: {line}" for line in ev.border]
    return "\n".join(lines)


def _figures(snr: float | None, error: float | None, missing: str) -> str:
    """``SNR 30.1 dB, MSE 1.2e-04``, or ``n/a (why)``."""
    if snr is None or error is None:
        return f"n/a ({missing})"
    return f"SNR {snr:.1f} dB, MSE {error:.4g}"
