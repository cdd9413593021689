"""ESP-DL v1: exponents and bias corrections searched on calibration data, the chip as the judge.

:func:`search_tuning` exports the model with the range rule (a dry run) and runs it on the
calibration data with the bit-exact chip simulator's kernels (:class:`CachedChip`: the same
integers as :func:`amct_bridge.espdl.v1.chip.simulate_chip`). First, layer by layer in execution
order, the per-channel mean error of each conv/dense's chip output is added to its bias
(:func:`~amct_bridge.espdl.exponent_search.bias_offsets`) where that lowers the channel's
error: the runtime's floors bias every layer by −½ step. Then each exponent the runtime lets us
choose (:func:`adjustable_exponents`) moves while the chip's output error drops
(:func:`amct_bridge.espdl.exponent_search.coordinate_search`), and the biases are corrected
again for what the new exponents leave. Every candidate is a full export (convert.py's
quantization of the coefficients, the Add2D / Concat rules, the bias at the chosen output
exponent) run on the chip: nothing is estimated. The result never has a larger output error on
the calibration data than the range rule (docs/espdl-export.md, "How exponents are chosen").

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
    >>> w = np.float32([[0.3, -0.2], [0.1, 0.4]])
    >>> layers = [SourceLayer("in", "input", attrs={"shape": (2,)}),
    ...           SourceLayer("fc", "dense", ["in"], "Dense", {"kernel": w}, {"input_rank": 2})]
    >>> x = np.random.default_rng(0).uniform(-1, 1, (64, 2)).astype(np.float32)
    >>> r = TensorRange(-1, 1)
    >>> stats = CalibrationStats(layers={"fc": LayerStats("Dense", r, r)})
    >>> t = search_tuning(layers, x, {"fc": x @ w}, stats=stats)
    >>> t.exponents[("fc", "output")] < -6  # finer than the range rule's -6 for [-1, 1]
    True
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from amct_bridge.errors import ExportError
from amct_bridge.espdl.exponent_search import (  # noqa: F401 (the sample rule's names stay here)
    MAX_INPUT_VALUES,
    MAX_SAMPLES,
    MIN_SAMPLES,
    SEARCH_SPAN,
    Tuning,
    bias_offsets,
    coordinate_search,
    describe_changes,
    kept_offsets,
    relative_error,
    sample_cap,
    sample_rule,
    search_note,
    search_samples,
)
from amct_bridge.espdl.v1 import chip as chip_sim
from amct_bridge.espdl.v1.chip import ChipTensor
from amct_bridge.espdl.v1.export import export_layers
from amct_bridge.espdl.v1.network import INPUT, REQUANTIZING, WEIGHTED, Network
from amct_bridge.espdl.v1.network import network_from_result as _network

Key = tuple[str, str]


def _source(layer: Any) -> str:
    """The framework layer whose output the chip layer computes (its last fused one)."""
    return layer.fused[-1] if layer.fused else layer.source


def _reads_input(net: Network, layer: Any) -> bool:
    """True when ``layer`` reads the model input, maybe through exponent-keeping layers."""
    by_name = {x.name: x for x in net.layers}
    name = layer.inputs[0]
    while name != INPUT:
        producer = by_name[name]
        if not producer.keeps_exponent:
            return False
        name = producer.inputs[0]
    return True


def adjustable_exponents(net: Network) -> tuple[dict[Key, int], dict[Key, list[Key]]]:
    """The exponents of ``net`` the runtime lets us choose, with their current values.

    Returns (variables, keys): a variable is ``(layer, "output")`` for a requantizing layer
    (conv, dense, Add2D, pools: the layer its output belongs to, as the sidecar names it),
    ``(conv, "filter")`` for a per-tensor filter, ``("", "input")`` for the model input;
    ``keys`` lists the :class:`~amct_bridge.espdl.exponent_search.Tuning` keys each one sets
    (the input's exponent is the input exponent of every conv reading it).

    Example:
        >>> from amct_bridge.espdl.v1.network import NetLayer
        >>> net = Network("s8", False, [NetLayer("r", "ReLU", [INPUT])], input_exponent=-7)
        >>> adjustable_exponents(net)
        ({}, {})
    """
    variables: dict[Key, int] = {}
    keys: dict[Key, list[Key]] = {}
    readers = [x.source for x in net.layers if x.kind in WEIGHTED and _reads_input(net, x)]
    if readers and net.input_exponent is not None:
        variables[("", "input")] = int(net.input_exponent)
        keys[("", "input")] = [(name, "input") for name in readers]
    shared = _shared_outputs(net)
    for layer in net.layers:
        if layer.kind not in REQUANTIZING or layer.output_exponent is None:
            continue
        key = (_source(layer), "output")
        group = shared.get(layer.name)
        if group is None:
            variables[key], keys[key] = int(layer.output_exponent), [key]
        elif group[0] == layer.name:  # one variable for the group, at its first member
            members = [net.layer(name) for name in group]
            variables[key] = max(int(x.output_exponent) for x in members)
            keys[key] = [(_source(x), "output") for x in members]
        if layer.kind in WEIGHTED and not net.per_channel and layer.filter is not None:
            fkey = (layer.source, "filter")
            variables[fkey], keys[fkey] = int(layer.filter.exponent), [fkey]
    return variables, keys


def _shared_outputs(net: Network) -> dict[str, list[str]]:
    """Requantizing layers whose outputs meet at a Concat / Max2D / Min2D (through
    exponent-keeping layers) -> their group in execution order: the runtime wants one exponent
    there, so the export raises them all to the largest and they move together."""
    by_name = {x.name: x for x in net.layers}
    order = {x.name: i for i, x in enumerate(net.layers)}
    parent: dict[str, str] = {}

    def find(a: str) -> str:
        while parent.setdefault(a, a) != a:
            a = parent[a]
        return a

    def producer(name: str) -> str | None:
        while name in by_name and by_name[name].keeps_exponent:
            if len(by_name[name].inputs) != 1:
                return None
            name = by_name[name].inputs[0]
        return name if name in by_name and by_name[name].kind in REQUANTIZING else None

    for layer in net.layers:
        if layer.kind in ("Concat", "Max2D", "Min2D"):
            ends = [p for p in (producer(s) for s in layer.inputs) if p is not None]
            for other in ends[1:]:
                parent[find(other)] = find(ends[0])
    groups: dict[str, list[str]] = {}
    for name in parent:
        groups.setdefault(find(name), []).append(name)
    return {
        name: sorted(group, key=order.__getitem__)
        for group in groups.values()
        if len(group) > 1
        for name in group
    }


def _fingerprint(layer: Any, inputs: list[bytes]) -> bytes:
    """A digest of everything a chip layer's output depends on: its class, attributes,
    exponents and integers, and the digests of its inputs."""
    h = hashlib.blake2b(digest_size=16)
    fixed = (layer.kind, layer.output_exponent, layer.activation, sorted(layer.attrs.items()))
    h.update(repr(fixed).encode())
    for tensor in (layer.filter, layer.bias, layer.alpha):
        if tensor is not None:
            h.update(np.asarray(tensor.exponent, np.int64).tobytes())
            h.update(np.ascontiguousarray(tensor.values, np.int64).tobytes())
        h.update(b"|")
    for key in inputs:
        h.update(key)
    return h.digest()


class CachedChip:
    """:func:`~amct_bridge.espdl.v1.chip.simulate_chip`'s layer loop on fixed inputs, reusing
    the outputs of layers whose integers, exponents and inputs did not change since an earlier
    run (a search changes one exponent at a time: the layers before it are the same). Each
    layer runs the simulator's own kernel (``chip._run``): the same integers as
    ``simulate_chip`` (tests/espdl/test_exponent_search.py checks it).

    Example:
        >>> from amct_bridge.espdl.v1.network import NetLayer
        >>> net = Network("s8", False, [NetLayer("r", "ReLU", [INPUT])], input_exponent=0)
        >>> CachedChip(np.array([[-3.0, 4.0]]), "esp32").run(net)["r"].values.tolist()
        [[0, 4]]
    """

    def __init__(self, x: np.ndarray, target: str | None, budget: int = 2**28) -> None:
        self.x, self.target, self.budget = x, target, budget
        self.cache: OrderedDict[bytes, tuple[np.ndarray, int]] = OrderedDict()
        self.bytes = 0

    def run(self, net: Network) -> dict[str, ChipTensor]:
        """Every layer's output (batch axis first) by chip layer name."""
        target = self.target or net.target or "esp32"
        q, e_in, _ = chip_sim._input(net, self.x, None)
        values, exps = {INPUT: q}, {INPUT: e_in}
        keys = {INPUT: repr(("input", e_in, net.feature_type, target)).encode()}
        out: dict[str, ChipTensor] = {}
        dtype = np.int8 if net.bits == 8 else np.int16
        for layer in net.layers:
            ins = [exps[s] for s in layer.inputs]
            key = _fingerprint(layer, [keys[s] for s in layer.inputs])
            hit = self.cache.get(key)
            if hit is None:
                if layer.kind == "Concat" and len(set(ins)) > 1:
                    raise ExportError(f"chip layer {layer.describe()}: input exponents {ins}")
                xs = [values[s] for s in layer.inputs]
                y = chip_sim._run(layer, xs, ins, net.bits, target).astype(np.float32, copy=False)
                e_out = max(ins) if layer.keeps_exponent else layer.output_exponent
                hit = (y, int(e_out))
                self._store(key, hit)
            else:
                self.cache.move_to_end(key)
            values[layer.name], exps[layer.name], keys[layer.name] = hit[0], hit[1], key
            out[layer.name] = ChipTensor(hit[0], hit[1], False, dtype)
        return out

    def _store(self, key: bytes, entry: tuple[np.ndarray, int]) -> None:
        self.cache[key] = entry
        self.bytes += entry[0].nbytes
        while self.bytes > self.budget and len(self.cache) > 1:  # least recently used first
            _, (old, _) = self.cache.popitem(last=False)
            self.bytes -= old.nbytes


class _Judge:
    """Exports a candidate (dry run) and runs it on the calibration data."""

    def __init__(self, layers: list, x: np.ndarray, options: dict, output: str | None) -> None:
        self.export = lambda tuning: export_layers(layers, None, tuning=tuning, **options)
        self.chip = CachedChip(x, options.get("target"))
        self.output = output

    def run(self, tuning: Tuning | None) -> tuple[Network, dict[str, ChipTensor]]:
        net = _network(self.export(tuning))
        return net, self.chip.run(net)

    def output_layer(self, net: Network) -> Any:
        """The chip layer computing the model's (first) output."""
        for name in net.outputs:
            layer = net.layer(name)
            if self.output in (layer.source, *layer.fused):
                return layer
        return net.layer(net.outputs[0])


def _expand(values: dict[Key, int], keys: dict[Key, list[Key]]) -> dict[Key, int]:
    return {k: v for var, v in values.items() for k in keys[var]}


def search_tuning(
    layers: list,
    x: np.ndarray,
    floats: dict[str, np.ndarray] | Callable[[list[str]], dict[str, np.ndarray]],
    *,
    output: str | None = None,
    bias_correction: bool = True,
    span: int = SEARCH_SPAN,
    passes: int = 2,
    given: int | None = None,
    **options: Any,
) -> Tuning:
    """Exponents (and bias corrections) minimising the chip's output error on ``x``.

    Args:
        layers: the model as :class:`~amct_bridge.espdl.source.SourceLayer` list.
        x: calibration inputs, float, NHWC as the chip takes them (the first
            :func:`search_samples` are used).
        floats: the float model's outputs on ``x`` (NHWC) by framework layer name, or a
            function of the names wanted giving them: the model's output is the reference,
            each conv/dense's output the reference of its bias correction.
        output: the framework layer of the model's first output (None: the chip's first).
        bias_correction: also correct the biases (see the module docstring).
        span, passes: as :func:`~amct_bridge.espdl.exponent_search.coordinate_search`.
        given: how many samples the user gave, when ``x`` was cut before (the note says
            "75 of 256"); default ``len(x)``.
        **options: :func:`~amct_bridge.espdl.v1.export.export_layers`'s options (record,
            stats, feature_type, granularity, target, skip_unsupported).

    Returns:
        the :class:`~amct_bridge.espdl.exponent_search.Tuning` to export with (empty, with a
        note, when the export has no chip graph or the float output is missing).

    Example:
        >>> # see the module docstring
    """
    given = len(x) if given is None else int(given)
    x = search_samples(np.asarray(x, np.float32))
    judge = _Judge(layers, x, options, output)
    try:
        net, chip = judge.run(None)
    except ExportError as err:
        return Tuning(notes=[f"exponents not searched: the chip cannot run the export ({err})"])
    out = judge.output_layer(net)
    wanted = [_source(layer) for layer in net.layers]
    refs = floats(wanted) if callable(floats) else dict(floats)
    if _source(out) not in refs:
        return Tuning(notes=[f"exponents not searched: no float output of {_source(out)!r}"])
    ref = np.asarray(refs[_source(out)], np.float64)

    def error(result: dict[str, ChipTensor]) -> float:
        return relative_error(ref, result[out.name].to_float().reshape(ref.shape))

    start, keys = adjustable_exponents(net)
    base_error = error(chip)
    # the floors' bias first (it is most of the s8 error), so that the exponents are chosen
    # for corrected biases; the offsets are real values, they hold at any exponent
    tuning = Tuning(_expand(start, keys))
    best_error = base_error
    if bias_correction:
        best_error = _correct_biases(judge, tuning, refs, error, best_error)
    offsets = dict(tuning.bias_offsets)

    def score(values: dict[Key, int]) -> float:
        try:
            return error(judge.run(Tuning(_expand(values, keys), offsets))[1])
        except ExportError:  # e.g. an exponent convert.py or the runtime would refuse
            return float("inf")

    best, best_error, tried = coordinate_search(start, score, span=span, passes=passes)
    tuning = Tuning(_expand(best, keys), offsets)
    if bias_correction:  # what the new exponents' floors and steps leave
        best_error = _correct_biases(judge, tuning, refs, error, best_error)
    per_sample = int(np.prod(x.shape[1:])) or 1
    biases = tuning.bias_offsets
    tuning.notes.append(
        search_note(
            len(x),
            given,
            per_sample,
            tried,
            "the chip simulator",
            (base_error, best_error),
            describe_changes(start, best),
            extra=f"; biases corrected: {', '.join(biases)}" if biases else "",
        )
    )
    return tuning


def _correct_biases(
    judge: _Judge,
    tuning: Tuning,
    refs: dict,
    error: Callable[[dict[str, ChipTensor]], float],
    err: float,
) -> float:
    """Add each conv/dense's per-channel mean chip error to its bias, in execution order,
    where it lowers that channel's error; undo it all if the output error grows."""
    before = dict(tuning.bias_offsets)
    net, chip = judge.run(tuning)
    for layer in [x for x in net.layers if x.kind in WEIGHTED]:
        source = _source(layer)
        if source not in refs:
            continue
        ref = np.asarray(refs[source], np.float64)
        got = chip[layer.name].to_float().reshape(ref.shape)
        linear = None if layer.activation is None else 0.0
        offset = bias_offsets(ref, got, linear_above=linear)
        previous = tuning.bias_offsets.get(layer.source, np.zeros_like(offset))
        trial = Tuning(tuning.exponents, {**tuning.bias_offsets, layer.source: previous + offset})
        _, trial_chip = judge.run(trial)
        kept = kept_offsets(ref, got, trial_chip[layer.name].to_float(), offset)
        if kept is None:
            continue
        tuning.bias_offsets[layer.source] = previous + kept
        chip = trial_chip if np.array_equal(kept, offset) else judge.run(tuning)[1]
    new_err = error(chip)
    if new_err > err:
        tuning.bias_offsets.clear()
        tuning.bias_offsets.update(before)
        return err
    return new_err
