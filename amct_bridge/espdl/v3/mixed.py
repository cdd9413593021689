"""ESP-DL v3 mixed precision: the fewest int16 layers that keep the simulated chip within a
stated drop on the calibration data (``feature_type="auto"``; docs/espdl-v3.md, "Mixed
precision").

The v3 runtime runs int8 and int16 nodes in one file: each node's inputs and output have one
width, and a ``RequantizeLinear`` node converts a tensor where its reader runs at the other
width (:meth:`~amct_bridge.espdl.v3.lowering.Emitter.convert`). esp-ppq needs a hand-written
``dispatching_table`` for that; here :func:`choose_layer_bits` picks the widths:

- the choices: each layer with weights (a conv / dense chain with its fused BN and ReLU, a
  LayerNormalization, PReLU, RNN, attention...) and each layer with several inputs (Add,
  Concat, Mul...). A single-input layer without weights (pools, activations, softmax) runs at
  its input's width; reshapes, pass-throughs and host steps keep their input's tensor; the model
  input takes its first reader's width;
- the judge: the range-rule export at those widths, run by the bit-exact simulator on the
  calibration inputs (the exponent search's judge), against the float model. The **drop** is,
  for a classifier (an output of shape ``(N, C)``, ``C > 1``), the share of calibration samples
  whose arg-max differs from the float model's (an upper bound of the accuracy lost against
  float on those samples: a sample can change its correctness only when its class changes);
  for any other output, the RMS error relative to the float output's range,
  ``sqrt(mean((chip - float)²)) / (max(float) - min(float))``. A softmax / sigmoid head is
  judged by its logits (as the search does);
- the order: all-int8 first, each choice ranked by the SNR it loses in the all-int8 chip (the
  per-layer SNR of the evaluation report, :func:`~amct_bridge.espdl.evaluation.snr_db`: its
  inputs' SNR minus its output's); the worst is switched to int16 first, one by one, until
  the drop is at most ``max_drop``; then each int16 layer whose return to int8 keeps the drop
  within ``max_drop`` returns (latest first, until none can): no single chosen layer can go
  back to int8 without exceeding ``max_drop`` (a minimal set, not necessarily the smallest of
  all sets: finding that needs every subset).

When even all-int16 exceeds ``max_drop`` every choice is int16 and a note says so.

Example:
    >>> output_drop(np.float32([[1, 0], [0, 1]]), np.float32([[1, 0], [1, 0]]))
    (0.5, 'argmax')
    >>> output_drop(np.float32([0.0, 1.0]), np.float32([0.0, 0.9]))[1]
    'error'
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.evaluation import snr_db
from amct_bridge.espdl.exponent_search import CalibrationData, Tuning
from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v3.evaluation import quantize_input
from amct_bridge.espdl.v3.export import AUTO_NEEDS_DATA, V3ExportResult, export_layers_v3
from amct_bridge.espdl.v3.lowering.emitter import same_values
from amct_bridge.espdl.v3.simulate import simulate_espdl

__all__ = [
    "DEFAULT_MAX_DROP",
    "MixedChoice",
    "check_max_drop",
    "choose_layer_bits",
    "export_auto",
    "output_drop",
]

#: ``max_drop`` when not given: 1 % of the calibration samples change class (classifiers).
DEFAULT_MAX_DROP = 0.01
_HOST_KINDS = ("Rescaling", "Normalization")
_log = logging.getLogger(__name__)
_BATCH = 128


@dataclass
class MixedChoice:
    """What ``feature_type="auto"`` chose and measured (drops on the calibration inputs).

    ``s16``: the chosen int16 layers, in the order chosen; ``layer_bits``: every layer the
    export runs at 16 bits (the chosen ones and the pools / activations that follow them);
    ``drop`` / ``all_s8`` / ``all_s16``: the drop of the chosen widths, of all-int8 and of
    all-int16; ``metric``: ``"argmax"`` or ``"error"`` (the module docstring).

    Example:
        >>> c = MixedChoice(["c2"], {"c2": 16}, 0.004, 0.01, "argmax", 0.03, 0.002, ["c1", "c2"],
        ...                 512, 5)
        >>> print(c.summary())  # doctest: +NORMALIZE_WHITESPACE
        mixed precision: int16 for c2 (1 of 2 layers); arg-max changed on 0.4% of 512
        calibration samples against float (all-int8 3.0%, all-int16 0.2%; max_drop 1.0%),
        5 exports simulated
    """

    s16: list[str]
    layer_bits: dict[str, int]
    drop: float
    max_drop: float
    metric: str
    all_s8: float
    all_s16: float
    candidates: list[str]
    samples: int
    exports: int
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line: the int16 layers and the drops."""
        chosen = ", ".join(self.s16) if self.s16 else "no layer"
        what = (
            "arg-max changed on {:.1%} of {} calibration samples against float"
            if self.metric == "argmax"
            else "output RMS error {:.2%} of the float range on {} calibration samples"
        ).format(self.drop, self.samples)
        pct = "{:.1%}" if self.metric == "argmax" else "{:.2%}"
        return (
            f"mixed precision: int16 for {chosen} ({len(self.s16)} of "
            f"{len(self.candidates)} layers); {what} (all-int8 {pct.format(self.all_s8)}, "
            f"all-int16 {pct.format(self.all_s16)}; max_drop {pct.format(self.max_drop)}), "
            f"{self.exports} exports simulated"
        )


def output_drop(ref: np.ndarray, got: np.ndarray) -> tuple[float, str]:
    """The drop of ``got`` (chip) against ``ref`` (float), and its kind (module docstring):
    ``(N, C)`` with ``C > 1``: the share of rows whose arg-max differs (``"argmax"``); else the
    RMS error over the range of ``ref`` (``"error"``).

    Example:
        >>> output_drop(np.float32([[0, 2], [3, 1]]), np.float32([[0, 1], [3, 4]]))
        (0.5, 'argmax')
        >>> output_drop(np.float32([0, 2]), np.float32([0, 1]))  # sqrt(0.5) / 2
        (0.3535533905932738, 'error')
    """
    ref = np.asarray(ref, np.float64)
    got = np.asarray(got, np.float64).reshape(ref.shape)
    if ref.ndim == 2 and ref.shape[1] > 1:
        return float(np.mean(ref.argmax(-1) != got.argmax(-1))), "argmax"
    span = float(ref.max() - ref.min()) if ref.size else 0.0
    rms = float(np.sqrt(np.mean((ref - got) ** 2))) if ref.size else 0.0
    if span == 0.0:
        return (0.0 if rms == 0.0 else math.inf), "error"
    return rms / span, "error"


def check_max_drop(feature_type: str | None, max_drop: float | None, calibration: Any) -> float:
    """``max_drop`` checked: with ``feature_type="auto"`` only, in [0, 1), and calibration data
    given; returns it (default :data:`DEFAULT_MAX_DROP`).

    Example:
        >>> check_max_drop("auto", None, None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: feature_type='auto' picks the int16 layers on ...
    """
    if feature_type != "auto":
        raise ExportError(
            f"max_drop goes with feature_type='auto' (the int16 layers it picks), not "
            f"{feature_type!r}"
        )
    if calibration is None:
        raise ExportError(AUTO_NEEDS_DATA)
    value = DEFAULT_MAX_DROP if max_drop is None else max_drop
    if not isinstance(value, int | float) or not 0.0 <= float(value) < 1.0:
        raise ExportError(f"max_drop {max_drop!r}: expected a fraction in [0, 1), e.g. 0.01")
    return float(value)


class _Judge:
    """Exports at given widths (range rule) and runs them on the calibration inputs."""

    def __init__(self, layers: list[SourceLayer], calibration: CalibrationData, options: dict):
        self.layers, self.options = layers, options
        self.target = options.get("target", "esp32s3")
        self.x = np.asarray(calibration.x, np.float32)
        self.linear = frozenset(calibration.linear)
        self.output = calibration.output or next(
            (s.name for s in layers if s.attrs.get("model_output")), layers[-1].name
        )
        self.floats = calibration.floats
        self.refs: dict[str, np.ndarray] = {}
        self.cache: dict[frozenset, tuple[float, str]] = {}
        self.exports = 0

    def ref(self, names: list[str]) -> dict[str, np.ndarray]:
        """Float outputs by layer name (asked once)."""
        wanted = [n for n in names if n not in self.refs]
        if wanted:
            got = self.floats(wanted) if callable(self.floats) else dict(self.floats)
            for name in wanted:
                value = got.get(name)
                self.refs[name] = None if value is None else np.asarray(value)
        return {n: self.refs[n] for n in names if self.refs.get(n) is not None}

    def run(self, layer_bits: dict[str, int]) -> tuple[V3ExportResult, dict[str, np.ndarray]]:
        """The export at ``layer_bits`` and the chip values of its tensors, as reals."""
        result = export_layers_v3(self.layers, None, layer_bits=layer_bits, **self.options)
        self.exports += 1
        return result, self.simulate(result)

    def simulate(self, result: V3ExportResult) -> dict[str, np.ndarray]:
        """The chip values of ``result``'s integer tensors on the calibration inputs, as reals."""
        model = result.model
        infos = {v.name: v for v in (*model.value_info, *model.inputs, *model.outputs)}
        parts: dict[str, list[np.ndarray]] = {}
        # GRU / LSTM run at batch 1 (the runtime's): one sample per run, each sample's values
        # contiguous in the concatenation as with a batch
        step = 1 if any(n.op_type in ("GRU", "LSTM") for n in model.nodes) else _BATCH
        for start in range(0, len(self.x), step):
            ints = quantize_input(model, self.x[start : start + step], self.target)
            values = simulate_espdl(model, ints, self.target).values
            for name, value in values.items():
                if name in infos and infos[name].elem_type in (3, 5):
                    parts.setdefault(name, []).append(value)
        return {
            name: np.ldexp(np.concatenate(v).astype(np.float64), infos[name].exponent)
            for name, v in parts.items()
        }

    def tensor(self, result: V3ExportResult, name: str) -> str | None:
        """The chip tensor compared with layer ``name``'s float output (a head in ``linear``:
        its Conv/Gemm node's logits)."""
        if name in self.linear:
            for node in reversed(result.model.nodes):
                if node.name == name and node.op_type in ("Conv", "Gemm"):
                    return node.outputs[0]
        return result.tensors.get(name)

    def drop(self, result: V3ExportResult, reals: dict[str, np.ndarray]) -> tuple[float, str]:
        """The drop of one export's chip output (module docstring)."""
        ref = self.ref([self.output]).get(self.output)
        tensor = self.tensor(result, self.output)
        if ref is None or tensor not in reals:
            raise ExportError(
                f"feature_type='auto': no float output of {self.output!r} to judge the chip by"
            )
        return output_drop(ref.reshape(len(self.x), -1), reals[tensor].reshape(len(self.x), -1))

    def measure(self, layer_bits: dict[str, int]) -> tuple[float, str]:
        """The drop at ``layer_bits`` (cached)."""
        key = frozenset(layer_bits.items())
        if key not in self.cache:
            result, reals = self.run(layer_bits)
            self.cache[key] = self.drop(result, reals)
        return self.cache[key]


def _choices(layers: list[SourceLayer], result: V3ExportResult) -> tuple[list[str], set[str]]:
    """The layers whose width is chosen and those that follow their input's (module doc)."""
    status = {x.name: x.status for x in result.layers}
    choices, followers = [], set()
    for layer in layers:
        if status.get(layer.name) != "exported" or layer.op == "input":
            continue
        if layer.kind in _HOST_KINDS or same_values(layer):
            continue  # keeps its input's tensor
        if layer.weights or len(set(layer.inputs)) > 1:
            choices.append(layer.name)
        else:
            followers.add(layer.name)
    return choices, followers


def _widths(
    layers: list[SourceLayer], fused: dict[str, str], followers: set[str], s16: set[str]
) -> dict[str, int]:
    """``layer_bits`` of the int16 choices ``s16``: them, and the followers they feed."""
    width: dict[str, int | None] = {}
    out: dict[str, int] = {}
    for layer in layers:
        name = layer.name
        if name in fused and fused[name] in width:
            width[name] = width[fused[name]]
        elif name in s16:
            width[name] = out[name] = 16
        elif name in followers and layer.inputs:
            width[name] = width.get(layer.inputs[0]) or 8
            if width[name] == 16:
                out[name] = 16
        elif layer.op == "input" or not layer.inputs:
            width[name] = None
        elif layer.kind in _HOST_KINDS or same_values(layer):
            width[name] = width.get(layer.inputs[0])
        else:
            width[name] = 8
    return out


def _snr_losses(
    judge: _Judge, layers: list[SourceLayer], result: V3ExportResult, reals: dict, choices
) -> dict[str, float]:
    """Each choice's SNR loss in the all-int8 chip: its inputs' SNR minus its output's (dB;
    a conv chain's output is its last fused member's)."""
    fused, order = result.fused, {x.name: i for i, x in enumerate(layers)}
    last: dict[str, str] = {}
    for member, head in fused.items():
        if order[member] > order[head] and order[member] > order[last.get(head, head)]:
            last[head] = member
    refs = judge.ref([x.name for x in layers if x.op != "input"])
    snr: dict[str, float] = {}

    def before(layer: SourceLayer) -> float:
        return min((snr.get(x, math.inf) for x in layer.inputs), default=math.inf)

    for layer in layers:
        name = layer.name
        if name in fused:  # a member: its head's (a fused pad: its input's)
            head = fused[name]
            snr[name] = snr[head] if head in snr else before(layer)
            continue
        if layer.op == "input":
            tensor, ref = result.tensors.get(name), judge.x
        else:
            compare = name if name in judge.linear else last.get(name, name)
            tensor, ref = judge.tensor(result, compare), refs.get(compare)
        got = reals.get(tensor) if tensor is not None else None
        if ref is not None and got is not None and np.size(ref) == np.size(got):
            ref64 = np.asarray(ref, np.float64)
            snr[name] = snr_db(ref64, got.reshape(ref64.shape))
        else:  # no float counterpart: its input's
            snr[name] = before(layer)
    losses = {}
    for name in choices:
        layer = layers[order[name]]
        if not math.isinf(snr.get(name, math.inf)):
            losses[name] = min(before(layer), 300.0) - snr[name]
    return losses


def choose_layer_bits(
    layers: list[SourceLayer],
    calibration: CalibrationData,
    *,
    max_drop: float = DEFAULT_MAX_DROP,
    **options: Any,
) -> MixedChoice:
    """The fewest int16 layers (greedy, module docstring) whose simulated chip stays within
    ``max_drop`` of the float model on ``calibration``.

    Args:
        layers: the model as :class:`~amct_bridge.espdl.source.SourceLayer` list.
        calibration: the chip's calibration inputs and the float model's outputs on them.
        max_drop: the largest drop allowed (a fraction: 0.01 is 1 % of the samples changing
            class, or an RMS error of 1 % of the output range).
        **options: :func:`~amct_bridge.espdl.v3.export.export_layers_v3`'s record, stats,
            target, skip_unsupported (feature_type is set per layer here).

    Returns:
        the choice, with the drops of all-int8, all-int16 and the chosen widths.

    Example:
        >>> # see tests/espdl_v3/test_v3_mixed_precision.py
    """
    options = {
        k: v
        for k, v in options.items()
        if k not in ("test_input", "seed", "overwrite", "feature_type", "layer_bits", "tuning")
    }
    judge = _Judge(layers, calibration, {**options, "feature_type": "s8"})
    base, reals = judge.run({})
    all_s8, metric = judge.drop(base, reals)
    judge.cache[frozenset()] = (all_s8, metric)
    choices, followers = _choices(layers, base)

    def measure(chosen: list[str]) -> float:
        return judge.measure(_widths(layers, base.fused, followers, set(chosen)))[0]

    all_s16 = measure(choices)
    notes: list[str] = []
    chosen: list[str] = []
    if all_s8 > max_drop:
        losses = _snr_losses(judge, layers, base, reals, choices)
        order = sorted(choices, key=lambda n: -losses.get(n, -math.inf))
        within = False
        for name in order:
            chosen.append(name)
            if measure(chosen) <= max_drop:
                within = True
                break
        if not within:
            notes.append(
                f"feature_type='auto': even all-int16 changes the chip output beyond max_drop "
                f"{max_drop:g} (drop {all_s16:.4g}): every layer is int16"
            )
        else:
            changed = True
            while changed and len(chosen) > 1:  # back to int8 where the drop stays within
                changed = False
                for name in reversed(list(chosen)):
                    trial = [n for n in chosen if n != name]
                    if measure(trial) <= max_drop:
                        chosen, changed = trial, True
    drop = measure(chosen)
    return MixedChoice(
        chosen,
        _widths(layers, base.fused, followers, set(chosen)),
        drop,
        float(max_drop),
        metric,
        all_s8,
        all_s16,
        choices,
        len(judge.x),
        judge.exports,
        notes,
    )


def export_auto(
    layers: list[SourceLayer],
    out: Any,
    *,
    calibration: CalibrationData | None,
    tune: Callable[[dict], Tuning] | None = None,
    max_drop: float | None = None,
    **options: Any,
) -> V3ExportResult:
    """``feature_type="auto"``: :func:`choose_layer_bits`, then the export at those widths
    (with ``tune``, the exponent search given the export's options at those widths:
    :func:`amct_bridge.espdl.v3.search.export_searched` passes it; its choices are kept only
    when the drop stays within ``max_drop``, else the range rule's). The result's ``mixed``
    holds the choice, its notes say it.

    Example:
        >>> export_auto([], None, calibration=None, feature_type="auto")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: feature_type='auto' picks the int16 layers on ...
    """
    max_drop = check_max_drop(options.get("feature_type"), max_drop, calibration)
    if options.get("layer_bits"):
        raise ExportError("feature_type='auto' chooses layer_bits itself: give one or the other")
    choice = choose_layer_bits(layers, calibration, max_drop=max_drop, **options)
    options = {**options, "feature_type": "s8", "layer_bits": choice.layer_bits}
    tuning = None
    if tune is not None:
        tuning = tune(options)
        judge = _Judge(layers, calibration, options)
        trial = export_layers_v3(layers, None, tuning=tuning, **judge.options)
        tuned = judge.drop(trial, judge.simulate(trial))[0]
        if tuned > max_drop >= choice.drop:
            tuning = None
            choice.notes.append(
                f"the exponents searched at these widths change the output beyond max_drop "
                f"(drop {tuned:.4g}): the range rule's are written"
            )
        else:
            choice.drop = tuned
    result = export_layers_v3(layers, out, tuning=tuning, **options)
    result.mixed = choice
    result.notes[:0] = [choice.summary(), *choice.notes]
    _log.info("%s", choice.summary())
    return result
