"""Searched power-of-two exponents and bias corrections: the framework- and format-free part.

The range rule (:mod:`amct_bridge.espdl.exponents`) takes the smallest exponent whose symmetric
range covers the calibrated range. That never saturates, but it is not the exponent that gives
the chip's smallest error: the runtime floors at every requantization (a bias of -1/2 LSB per
layer that the next layers sum up), a smaller exponent halves the step at the price of clipping
a few outliers, and a coarse output step rounds small biases to 0. Where the runtime lets us
choose (output exponents of convs, dense layers, Add2D and pools; per-tensor filter exponents;
the model input's exponent), a format's search (ESP-DL v1:
:func:`amct_bridge.espdl.v1.search.search_tuning`) runs its bit-exact chip simulator on the
calibration data and keeps the exponents with the smallest chip output error. This module holds
what does not depend on a format (docs/espdl-export.md, "How exponents are chosen"):

- :func:`relative_error`: the error measure, ``Σ(ref − got)² / Σref²`` (SNR = −10·log10 of it);
- :func:`coordinate_search`: integer coordinate descent over the exponents, starting from the
  range rule and keeping a change only when it lowers the error (the result is never worse
  than the start on the data it was scored on);
- :func:`bias_offsets`: per-channel mean error of a layer's chip output, the bias correction
  that cancels it (where the activation is linear);
- :class:`Tuning`: what the search chose, as the exporter takes it.

Example:
    >>> score = lambda v: (v["a"] + 2) ** 2 + (v["b"] - 1) ** 2  # best at a = -2, b = 1
    >>> best, err, _ = coordinate_search({"a": 0, "b": 0}, score)
    >>> best, err
    ({'a': -2, 'b': 1}, 0)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np

#: Exponent steps a search tries on each side of the range rule's exponent.
SEARCH_SPAN = 3
#: How an export chooses its exponents: the range rule, or searched on calibration data.
EXPONENT_RULES = ("max", "search")


@dataclass
class CalibrationData:
    """What an adapter hands over for a search: inputs as the chip takes them and the float
    model's outputs on them.

    ``x``: float inputs, NHWC (the chip's layout); ``floats``: the float outputs (NHWC) by
    framework layer name, or a function of the names wanted giving them (as
    :func:`amct_bridge.espdl.evaluation.evaluate_export` takes them); ``output``: the
    framework layer of the model's first output (None: the chip's first output); ``given``:
    how many samples the user gave (the adapters pass ``x`` already cut to
    :func:`~amct_bridge.espdl.v1.search.search_samples`), said in the search's note.

    Example:
        >>> CalibrationData(np.zeros((2, 4)), {"fc": np.zeros((2, 3))}, "fc").output
        'fc'
    """

    x: np.ndarray
    floats: dict[str, np.ndarray] | Callable[[list[str]], dict[str, np.ndarray]]
    output: str | None = None
    given: int | None = None


@dataclass
class Tuning:
    """Exponents and bias corrections that replace the range rule's choice in an export.

    ``exponents`` maps ``(layer, side)`` to an exponent: side ``"output"`` / ``"input"`` as
    the calibration sidecar's ranges of that layer (what :class:`ExponentFinder` looks up),
    ``"filter"`` for a conv/dense's per-tensor filter exponent. ``bias_offsets`` maps a
    conv/dense (the chain's first layer) to a float vector added to its bias (BN folded) before
    the export quantizes it. ``notes`` say what the search found (export.json's warnings).

    Example:
        >>> Tuning({("conv1", "output"): -4}).exponents[("conv1", "output")]
        -4
    """

    exponents: dict[tuple[str, str], int] = field(default_factory=dict)
    bias_offsets: dict[str, np.ndarray] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def relative_error(ref: np.ndarray, got: np.ndarray) -> float:
    """``Σ(ref − got)² / Σref²`` in float64 (0 when equal; inf for a zero ``ref`` with error).

    Example:
        >>> relative_error(np.array([1.0, -1.0]), np.array([1.1, -1.0]))  # 0.01 / 2
        0.005000000000000009
    """
    ref64 = np.asarray(ref, np.float64)
    noise = float(np.sum((ref64 - np.asarray(got, np.float64)) ** 2))
    signal = float(np.sum(ref64**2))
    if noise == 0.0:
        return 0.0
    return noise / signal if signal > 0 else float("inf")


def coordinate_search(
    start: dict[Hashable, int],
    score: Callable[[dict[Hashable, int]], float],
    *,
    span: int = SEARCH_SPAN,
    passes: int = 2,
) -> tuple[dict[Hashable, int], float, int]:
    """Integer coordinate descent: each variable in turn moves by ±1 while the score drops.

    Starts at ``start`` (the range rule), walks each variable (in the given order: execution
    order, so that later layers adapt to earlier choices) one step at a time in the direction
    that lowers ``score``, at most ``span`` steps from its start, and keeps a move only when
    the score is strictly lower; ``passes`` rounds over all variables (stops early when a round
    changes nothing). A candidate the format refuses scores ``inf``. Returns (best values, best
    score, number of scored candidates); the best score is never above ``score(start)``.

    Example:
        >>> coordinate_search({"e": -5}, lambda v: abs(v["e"] + 7), span=1)
        ({'e': -6}, 1, 3)
    """
    best = dict(start)
    best_score = score(best)
    evaluations = 1
    for _ in range(passes):
        changed = False
        for key in start:
            for step in (-1, 1):
                moved = False
                while abs(best[key] + step - start[key]) <= span:
                    trial = {**best, key: best[key] + step}
                    trial_score = score(trial)
                    evaluations += 1
                    if not trial_score < best_score:
                        break
                    best, best_score, moved, changed = trial, trial_score, True, True
                if moved:
                    break  # improved going this way: the other way was worse to begin with
        if not changed:
            break
    return best, best_score, evaluations


def bias_offsets(
    ref: np.ndarray, got: np.ndarray, *, linear_above: float | None = None
) -> np.ndarray:
    """Per-channel (last axis) mean of ``ref − got``: what to add to the bias to cancel it.

    A fused ReLU / LeakyReLU bends the output at 0, so a bias only shifts the positive side
    (a ReLU's zeros stay 0): ``linear_above=0.0`` averages only where the float output is
    positive; None averages everywhere (no activation). Channels with no such value get 0.

    Example:
        >>> ref = np.array([[1.0, 0.0], [3.0, 0.5]]); got = np.array([[0.5, 0.0], [2.5, 0.0]])
        >>> bias_offsets(ref, got).tolist(), bias_offsets(ref, got, linear_above=0.0).tolist()
        ([0.5, 0.25], [0.5, 0.5])
    """
    ref64 = np.asarray(ref, np.float64)
    channels = ref64.shape[-1]
    ref2 = ref64.reshape(-1, channels)
    diff = ref2 - np.asarray(got, np.float64).reshape(-1, channels)
    if linear_above is None:
        return diff.mean(axis=0) if len(diff) else np.zeros(channels)
    mask = ref2 > linear_above
    count = mask.sum(axis=0)
    total = np.where(mask, diff, 0.0).sum(axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), 0.0)


def channel_errors(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Per-channel (last axis) sum of squared errors.

    Example:
        >>> channel_errors(np.array([[1.0, 2.0]]), np.array([[0.0, 2.5]])).tolist()
        [1.0, 0.25]
    """
    ref64 = np.asarray(ref, np.float64)
    diff = ref64 - np.asarray(got, np.float64).reshape(ref64.shape)
    return (diff**2).reshape(-1, ref64.shape[-1]).sum(axis=0)
