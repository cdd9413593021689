"""Searched power-of-two exponents and bias corrections: the framework- and format-free part.

The range rule (:mod:`amct_bridge.espdl.exponents`) takes the smallest exponent whose symmetric
range covers the calibrated range. That never saturates, but it is not the exponent that gives
the chip's smallest error: the runtime floors at every requantization (a bias of -1/2 LSB per
layer that the next layers sum up), a smaller exponent halves the step at the price of clipping
a few outliers, and a coarse output step rounds small biases to 0. Where the runtime lets us
choose (output exponents of convs, dense layers, Add2D and pools; per-tensor filter exponents;
the model input's exponent; on esp32p4 per-channel filters), a format's search (ESP-DL v1:
:func:`amct_bridge.espdl.v1.search.search_tuning`; ESP-DL v3:
:func:`amct_bridge.espdl.v3.search.search_tuning_v3`) runs its bit-exact chip simulator on the
calibration data and keeps the exponents with the smallest chip output error. This module holds
what does not depend on a format (docs/espdl-export.md, "How exponents are chosen"):

- :func:`relative_error`: the error measure, ``Σ(ref − got)² / Σref²`` (SNR = −10·log10 of it);
- :func:`coordinate_search`: integer coordinate descent over the exponents, starting from the
  range rule and keeping a change only when it lowers the error (the result is never worse
  than the start on the data it was scored on);
- :func:`bias_offsets` / :func:`kept_offsets`: per-channel mean error of a layer's chip output,
  the bias correction that cancels it (where the activation is linear), kept per channel where
  it lowers that channel's error;
- :func:`search_samples` / :func:`sample_rule`: how many calibration samples a search scores
  on, and the rule in words;
- :func:`search_note`: the export's warning that says what the search did;
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

from amct_bridge.errors import ExportError

#: Exponent steps a search tries on each side of the range rule's exponent.
SEARCH_SPAN = 3
#: How an export chooses its exponents: the range rule, or searched on calibration data.
EXPONENT_RULES = ("max", "search")
#: At most this many calibration samples are simulated per candidate...
MAX_SAMPLES = 512
#: ... and about this many input values in all (ESP-DL v1: a 96x96x3 model gets 75 samples),
#: but never fewer than MIN_SAMPLES: every candidate is a chip run over them.
MAX_INPUT_VALUES = 2**21
MIN_SAMPLES = 32


@dataclass
class CalibrationData:
    """What an adapter hands over for a search: inputs as the chip takes them and the float
    model's outputs on them.

    ``x``: float inputs, NHWC (the chip's layout); ``floats``: the float outputs (NHWC) by
    framework layer name, or a function of the names wanted giving them (as
    :func:`amct_bridge.espdl.evaluation.evaluate_export` takes them); ``output``: the
    framework layer of the model's first output (None: the chip's first output); ``given``:
    how many samples the user gave (the adapters pass ``x`` already cut to
    :func:`search_samples`), said in the search's note; ``linear``: the layers whose float
    output ``floats`` gives before their own activation (a classifier head's logits: the
    search compares logits, :func:`amct_bridge.espdl.v1.head.chip_reference`).

    Example:
        >>> CalibrationData(np.zeros((2, 4)), {"fc": np.zeros((2, 3))}, "fc").output
        'fc'
    """

    x: np.ndarray
    floats: dict[str, np.ndarray] | Callable[[list[str]], dict[str, np.ndarray]]
    output: str | None = None
    given: int | None = None
    linear: frozenset[str] = frozenset()


@dataclass
class Tuning:
    """Exponents and bias corrections that replace the range rule's choice in an export.

    ``exponents`` maps ``(layer, side)`` to an exponent: side ``"output"`` / ``"input"`` as
    the calibration sidecar's ranges of that layer (what :class:`ExponentFinder` looks up),
    ``"filter"`` for a conv/dense's per-tensor filter exponent, ``"preactivation"`` for the
    output of a conv/dense whose activation runs as a node of its own (ESP-DL v3: a classifier's
    logits before its softmax). ``bias_offsets`` maps a conv/dense (the chain's first layer) to
    a float vector added to its bias (BN folded) before the export quantizes it;
    ``per_channel``: the conv/dense layers written with one filter exponent per output channel
    (ESP-DL v3 on esp32p4). ``notes`` say what the search found (export.json's warnings).

    Example:
        >>> Tuning({("conv1", "output"): -4}).exponents[("conv1", "output")]
        -4
    """

    exponents: dict[tuple[str, str], int] = field(default_factory=dict)
    bias_offsets: dict[str, np.ndarray] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    per_channel: frozenset[str] = frozenset()


def check_rule(exponents: str, calibration: object | None) -> None:
    """Refuse an unknown exponent rule, or a search without calibration data (both formats).

    Example:
        >>> check_rule("search", None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        amct_bridge.errors.ExportError: exponents='search' scores candidates on calibration ...
    """
    if exponents not in EXPONENT_RULES:
        raise ExportError(f"exponents {exponents!r}: expected one of {', '.join(EXPONENT_RULES)}")
    if exponents == "search" and calibration is None:
        raise ExportError(
            "exponents='search' scores candidates on calibration data: pass "
            "calibration_data= (adapters' export_espdl) / --data (export-espdl)"
        )


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
    spans: dict[Hashable, tuple[int, int]] | None = None,
    start_score: float | None = None,
) -> tuple[dict[Hashable, int], float, int]:
    """Integer coordinate descent: each variable in turn moves by ±1 while the score drops.

    Starts at ``start`` (the range rule), walks each variable (in the given order: execution
    order, so that later layers adapt to earlier choices) one step at a time in the direction
    that lowers ``score``, at most ``span`` steps from its start (``spans``: a variable's own
    (steps finer, steps coarser) limits instead), and keeps a move only when the score is
    strictly lower; ``passes`` rounds over all variables (stops early when a round changes
    nothing). A candidate the format refuses scores ``inf``. ``start_score``: ``score(start)``
    when the caller knows it (not scored again). Returns (best values, best score, number of
    scored candidates); the best score is never above ``score(start)``.

    Example:
        >>> coordinate_search({"e": -5}, lambda v: abs(v["e"] + 7), span=1)
        ({'e': -6}, 1, 3)
        >>> coordinate_search({"e": -5}, lambda v: abs(v["e"] + 7), spans={"e": (0, 2)})[0]
        {'e': -5}
    """
    best = dict(start)
    best_score = score(best) if start_score is None else start_score
    evaluations = 1 if start_score is None else 0
    limits = spans or {}
    for _ in range(passes):
        changed = False
        for key in start:
            finer, coarser = limits.get(key, (span, span))
            for step in (-1, 1):
                moved = False
                while -finer <= best[key] + step - start[key] <= coarser:
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


def kept_offsets(
    ref: np.ndarray, before: np.ndarray, after: np.ndarray, offset: np.ndarray
) -> np.ndarray | None:
    """``offset`` where it lowers the channel's squared error (``before``: the chip output
    without it, ``after``: with it), 0 elsewhere; None when no channel gains.

    Example:
        >>> ref = np.array([[1.0, 1.0]]); off = np.array([0.5, 0.5])
        >>> kept_offsets(ref, np.array([[0.5, 1.0]]), np.array([[1.0, 1.5]]), off).tolist()
        [0.5, 0.0]
    """
    keep = channel_errors(ref, after) < channel_errors(ref, before)
    if not keep.any():
        return None
    return np.where(keep, offset, 0.0)


def sample_cap(per_sample: int, max_values: int = MAX_INPUT_VALUES) -> int:
    """How many samples a search scores on, for inputs of ``per_sample`` values each:
    ``min(MAX_SAMPLES, max(MIN_SAMPLES, max_values // per_sample))`` (``max_values``: the
    format's budget of input values, :data:`MAX_INPUT_VALUES` for ESP-DL v1).

    Example:
        >>> sample_cap(96 * 96 * 3), sample_cap(8 * 8), sample_cap(10**7), sample_cap(6912, 2**18)
        (75, 512, 32, 37)
    """
    return min(MAX_SAMPLES, max(MIN_SAMPLES, int(max_values) // max(1, int(per_sample))))


def search_samples(x: np.ndarray, max_values: int = MAX_INPUT_VALUES) -> np.ndarray:
    """The first samples of ``x`` a search scores on (:func:`sample_cap`).

    Example:
        >>> search_samples(np.zeros((1000, 8, 8, 1))).shape[0], search_samples(
        ...     np.zeros((100, 96, 96, 3))).shape[0]
        (512, 75)
    """
    return x[: sample_cap(int(np.prod(np.shape(x)[1:])) or 1, max_values)]


def sample_rule(per_sample: int, max_values: int = MAX_INPUT_VALUES) -> str:
    """The rule :func:`search_samples` follows, in words, for inputs of ``per_sample`` values
    (the export's warning and ``--data``'s help say it).

    Example:
        >>> print(sample_rule(96 * 96 * 3))
        the search takes the first min(512, max(32, 2**21 // values per sample)) samples given:
        75 at 27648 values per sample
    """
    power = int(max_values).bit_length() - 1
    return (
        f"the search takes the first min({MAX_SAMPLES}, max({MIN_SAMPLES}, 2**{power} // "
        f"values per sample)) samples given: {sample_cap(per_sample, max_values)} at "
        f"{per_sample} values per sample"
    )


def snr_text(err: float) -> str:
    """A relative error as the SNR in dB the notes print (``inf`` for no error).

    Example:
        >>> snr_text(0.001), snr_text(0.0)
        ('30.0', 'inf')
    """
    return "inf" if err == 0 else f"{-10 * np.log10(err):.1f}"


def describe_changes(start: dict[tuple[str, str], int], best: dict[tuple[str, str], int]) -> str:
    """The variables the search moved, ``layer side old->new`` (``none`` when none).

    Example:
        >>> describe_changes({("c", "output"): -5, ("", "input"): -7},
        ...                  {("c", "output"): -6, ("", "input"): -7})
        'c output -5->-6'
    """
    moved = [
        f"{name or 'model input'} {side} {start[(name, side)]}->{v}"
        for (name, side), v in best.items()
        if v != start[(name, side)]
    ]
    return ", ".join(moved) if moved else "none"


def search_note(
    used: int,
    given: int,
    per_sample: int,
    candidates: int,
    judge: str,
    errors: tuple[float, float],
    changed: str,
    *,
    max_values: int = MAX_INPUT_VALUES,
    extra: str = "",
    rule: str | None = None,
) -> str:
    """The export's warning saying what the search did: samples (and the rule), candidates,
    the output SNR with the range rule and searched, what changed (``extra``: more, e.g. the
    corrected biases; ``rule``: how the samples were taken, when not :func:`sample_rule`).

    Example:
        >>> search_note(64, 256, 64, 40, "the chip simulator", (0.01, 0.001), "none")[:60]
        'exponents searched on 64 of 256 calibration samples (the sea'
    """
    base, best = errors
    return (
        f"exponents searched on {used} of {given} calibration samples "
        f"({rule or sample_rule(per_sample, max_values)}; "
        f"{candidates} candidates, {judge} as judge): output SNR {snr_text(base)} dB "
        f"with the range rule, {snr_text(best)} dB searched; changed: {changed}" + extra
    )
