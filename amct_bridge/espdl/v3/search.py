"""ESP-DL v3: exponents, per-channel filters and bias corrections searched on calibration data,
the v3 chip simulator as the judge (docs/espdl-export.md, "How exponents are chosen").

:func:`search_tuning_v3` runs the export's own lowering (:mod:`amct_bridge.espdl.v3.export`'s
plan and per-layer lowering, one layer at a time) and, as each layer is written, its nodes on
the calibration inputs with the simulator's kernels (the integers
:func:`~amct_bridge.espdl.v3.simulate.simulate_espdl` computes). What it may choose: the
exponents the range rule takes from calibrated ranges (the output of every Conv, Gemm, Add,
pool, activation..., the model input's), per-tensor filter exponents, the logits' exponent of a
conv/dense whose activation is a node of its own (a ``Dense(activation="softmax")`` head: the
range rule only estimates it from the probabilities), per-channel filter exponents on esp32p4
(per conv/dense), and bias corrections (:func:`~amct_bridge.espdl.exponent_search.bias_offsets`,
kept per channel where they lower its error). Three stages, every candidate a real lowering run
on the chip's kernels, nothing estimated:

1. layer by layer in execution order, each layer's choices by the error of its own output
   against the float model's, given the chip values of the layers before it (cheap: one layer
   is lowered and run per candidate);
2. the model output's error decides what stays: from the better of the range rule and stage 1,
   blocks of layers take the other's choices where that lowers the output error (halved where
   it does not: clipping an exponent is kept only when the output gains);
3. coordinate descent (:func:`~amct_bridge.espdl.exponent_search.coordinate_search`) on the
   output error over the model input's exponent and the last layers' choices.

A change is kept only when the output error drops, so the result is never worse than the
range rule on the calibration data. The output compared is the model's first output, or a
classifier head's logits (``linear``: a softmax / sigmoid head is judged by its logits, as v1).

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange
    >>> w = np.float32([[0.3, -0.2], [0.1, 0.4]])
    >>> layers = [SourceLayer("in", "input", attrs={"shape": (2,)}),
    ...           SourceLayer("fc", "dense", ["in"], "Dense", {"kernel": w},
    ...                       {"model_output": True})]
    >>> x = np.random.default_rng(0).uniform(-1, 1, (64, 2)).astype(np.float32)
    >>> st = CalibrationStats(layers={"fc": LayerStats("Dense", TensorRange(-1, 1),
    ...                                                TensorRange(-0.7, 0.7))})
    >>> t = search_tuning_v3(layers, x, {"fc": x @ w}, stats=st, target="c")
    >>> t.notes[0].startswith("exponents searched on 64 of 64 calibration samples")
    True
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from amct_bridge.errors import AmctBridgeError
from amct_bridge.espdl.exponent_search import (
    MIN_SAMPLES,
    SEARCH_SPAN,
    CalibrationData,
    Tuning,
    bias_offsets,
    coordinate_search,
    describe_changes,
    kept_offsets,
    relative_error,
    search_note,
    search_samples,
)
from amct_bridge.espdl.exponents import ExponentFinder
from amct_bridge.espdl.source import SourceLayer
from amct_bridge.espdl.v3.evaluation import quantize_input
from amct_bridge.espdl.v3.export import (
    V3ExportResult,
    _emit,
    _plan,
    check_layer_bits,
    check_options_v3,
    export_layers_v3,
)
from amct_bridge.espdl.v3.lowering import Emitter
from amct_bridge.espdl.v3.lowering.registry import lowering_for
from amct_bridge.espdl.v3.lowering.rnn import lower_rnn
from amct_bridge.espdl.v3.mixed import export_auto
from amct_bridge.espdl.v3.model import EspdlModel
from amct_bridge.espdl.v3.ops import OPS, Context
from amct_bridge.espdl.v3.ops.conv import PER_CHANNEL_TARGETS
from amct_bridge.espdl.v3.simulate import _run_node

__all__ = [
    "V3_MAX_INPUT_VALUES",
    "V3_RNN_SAMPLES",
    "export_searched",
    "recurrent",
    "search_tuning_v3",
    "v3_search_samples",
]

#: The v3 search's budget of input values (:func:`~amct_bridge.espdl.exponent_search.
#: sample_cap`): a 48x48x3 model gets 37 samples, 32x32x3 85, 96x96x3 the minimum of 32, 8x8
#: digits 512 (every layer's statistics have many values per sample: its positions).
V3_MAX_INPUT_VALUES = 2**18
#: The samples a model with GRU / LSTM layers is scored on: the runtime (and the simulator)
#: runs them at batch 1, so the search runs every node once per sample, a Python loop per
#: sample and per time step (a few ms a sample for a 16-step GRU where a batched Conv takes
#: microseconds a sample); the floor every other model gets (``MIN_SAMPLES``) keeps a
#: candidate at about the cost of a batched one.
V3_RNN_SAMPLES = MIN_SAMPLES
#: Steps a logits exponent may move coarser (the range rule only estimates it).
PREACTIVATION_SPAN = 8
_JUDGE = "the ESP-DL v3 chip simulator"
#: Emitter attributes no lowering changes (not copied per layer).
_STATIC = frozenset({"layers", "by_name", "consumers", "chains", "fused", "finder", "tuning"})
_FINDER_STATIC = frozenset({"layers", "consumers", "record", "stats", "overrides"})
#: What a failed candidate raises: it scores inf.
_REFUSED = (AmctBridgeError, ArithmeticError, ValueError, KeyError, IndexError)

Key = tuple[str, str]


def _copy_emitter(em: Emitter) -> Emitter:
    """A copy of ``em`` whose containers can grow without touching ``em``'s (the arrays and
    written nodes are shared: lowerings only add)."""
    twin = copy.copy(em)
    for name, value in vars(em).items():
        if name not in _STATIC and isinstance(value, list | dict | set):
            setattr(twin, name, copy.copy(value))
    finder = copy.copy(em.finder)
    for name, value in vars(em.finder).items():
        if name not in _FINDER_STATIC and isinstance(value, list | dict | set):
            setattr(finder, name, copy.copy(value))
    vars(finder).pop("range_exponent", None)  # the dry run's recording wrapper stays there
    twin.finder = finder
    return twin


@dataclass
class _State:
    """The export after ``index`` layers and the chip values of every tensor written."""

    em: Emitter
    values: dict[str, np.ndarray]
    index: int


@dataclass
class _Site:
    """A layer with choices: its exponent keys, what its output is compared with, and (a conv
    / dense) its filter choices and bias correction."""

    index: int
    keys: list[Key] = field(default_factory=list)
    compare: str | None = None  # framework layer whose float output the site's tensor is
    head: str | None = None  # conv/dense head (filter, per-channel, bias)
    linear_above: float | None = None  # bias_offsets' mode
    correct_bias: bool = False
    per_channel: bool = False


class _Forward:
    """export.py's lowering loop, resumable after any layer, each layer's nodes run on the
    calibration inputs as soon as they are written."""

    def __init__(self, layers: list[SourceLayer], x: np.ndarray, linear, options: dict) -> None:
        record, stats = options.get("record"), options.get("stats")
        self.target = options.get("target", "esp32s3")
        self.bits = check_options_v3(self.target, options.get("feature_type", "s8"))
        keys = {s.name: s.attrs.get("record_key", s.name) for s in layers}

        def skip_fusion(name: str) -> bool:
            factors = record.layers.get(keys.get(name, name)) if record else None
            return bool(factors and factors.skip_fusion)

        self.layers, self.x, self.linear = layers, x, frozenset(linear)
        self.record, self.stats = record, stats
        self.chains, self.fused = _plan(layers, skip_fusion)
        self.layer_bits = check_layer_bits(options.get("layer_bits"), layers, self.fused)
        self.steps = 0  # layers lowered and run (the search's cost)
        # GRU / LSTM run at batch 1: every tensor then holds one batch-1 value per sample
        # (shape [samples, *the node's own shape]) and every node runs once per sample
        self.per_sample = recurrent(layers)

    def start(self) -> _State:
        em = Emitter(
            self.layers,
            self.record,
            self.stats,
            self.bits,
            self.target,
            self.chains,
            self.fused,
            self.layer_bits,
        )
        return _State(em, {}, 0)

    def step(self, state: _State, tuning: Tuning, copy_state: bool = True) -> tuple[_State, list]:
        """Lower and run layer ``state.index`` with ``tuning``: the next state and its nodes."""
        em = _copy_emitter(state.em) if copy_state else state.em
        values = dict(state.values) if copy_state else state.values
        em.tune(tuning)
        layer = self.layers[state.index]
        first = len(em.nodes)
        _emit(em, layer)
        nodes = em.nodes[first:]
        self.steps += 1
        if layer.op == "input" and layer.name in em.inputs:
            probe = EspdlModel([], {}, inputs=[em.infos[layer.name]])
            q = quantize_input(probe, self.x, self.target)
            values[layer.name] = q[:, None] if self.per_sample else q
        if nodes:
            model = EspdlModel(
                nodes,
                em.inits,
                value_info=list(em.infos.values()),
                metadata={"target": self.target},
            )
            ctx = Context(model, self.target)
            if self.per_sample:
                self.run_per_sample(ctx, nodes, values)
            else:
                ctx.values = values  # written in place: the node outputs
                self.run_nodes(ctx, nodes)
        return _State(em, values, state.index + 1), nodes

    @staticmethod
    def run_nodes(ctx: Context, nodes: list) -> None:
        """Run ``nodes`` in order, their outputs written into ``ctx.values``."""
        for node in nodes:
            fn = OPS.get(node.op_type)
            if fn is None:
                raise AmctBridgeError(f"node {node.name!r}: op {node.op_type!r} not simulated")
            for name, value in zip(node.outputs, _run_node(ctx, node, fn), strict=False):
                if name:
                    ctx.values[name] = value

    def run_per_sample(self, ctx: Context, nodes: list, values: dict) -> None:
        """Run ``nodes`` once per sample (``values`` hold ``[samples, ...]``, each sample's
        value as the chip's batch-1 tensor), the outputs stacked into ``values``."""
        written = {n for node in nodes for n in node.outputs if n}
        reads = {n for node in nodes for n in node.inputs if n in values and n not in written}
        outs: dict[str, list[np.ndarray]] = {n: [] for n in written}
        for s in range(len(self.x)):
            ctx.values = {n: values[n][s] for n in reads}
            self.run_nodes(ctx, nodes)
            for n in written:
                if n in ctx.values:
                    outs[n].append(ctx.values[n])
        values.update({n: np.stack(v) for n, v in outs.items() if len(v) == len(self.x)})

    def run(
        self, state: _State, tuning: Tuning, keep: set[int] = frozenset()
    ) -> tuple[_State, dict[int, _State]]:
        """Lower and run the layers from ``state`` to the end; the states before the layers
        in ``keep`` are kept."""
        kept = {}
        while state.index < len(self.layers):
            if state.index in keep:
                kept[state.index] = state
            state = self.step(state, tuning)[0]
        return state, kept

    def tensor(self, em: Emitter, name: str) -> str | None:
        """The chip tensor compared with the float output of layer ``name``: its output, or
        for a head in ``linear`` its Conv/Gemm node's (the logits before the activation)."""
        if name in self.linear:
            for node in reversed(em.nodes):
                if node.name == name and node.op_type in ("Conv", "Gemm"):
                    return node.outputs[0]
        return em.tensor_of.get(name)

    def real(self, state: _State, tensor: str) -> np.ndarray:
        """The chip values of ``tensor`` as reals."""
        return state.values[tensor].astype(np.float64) * 2.0 ** state.em.exps[tensor]


def v3_search_samples(x: np.ndarray, layers: list[SourceLayer]) -> np.ndarray:
    """The calibration samples the v3 search scores, float32: the first
    :data:`V3_RNN_SAMPLES` of a model with GRU / LSTM layers (:func:`recurrent`), else the first
    :func:`~amct_bridge.espdl.exponent_search.search_samples` of :data:`V3_MAX_INPUT_VALUES`.
    The adapters take the same samples for their float references.

    Example:
        >>> v3_search_samples(np.zeros((600, 8, 8, 1)), []).shape
        (512, 8, 8, 1)
    """
    x = np.asarray(x, np.float32)
    return x[:V3_RNN_SAMPLES] if recurrent(layers) else search_samples(x, V3_MAX_INPUT_VALUES)


def recurrent(layers: list[SourceLayer]) -> bool:
    """True when ``layers`` hold a layer lowered to GRU / LSTM nodes (the runtime runs them at
    batch 1: the search scores such a model one sample at a time, on :data:`V3_RNN_SAMPLES`).

    Example:
        >>> recurrent([SourceLayer("gru", "runtime", kind="GRU")]), recurrent([])
        (True, False)
    """
    for layer in layers:
        entry = lowering_for(layer)
        if entry is not None and entry.lower is lower_rnn:
            return True
    return False


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Two bias corrections (None: none) are the same."""
    return (a is None) == (b is None) and (a is None or np.array_equal(a, b))


def _refs(floats, names: list[str]) -> dict[str, np.ndarray]:
    got = floats(names) if callable(floats) else dict(floats)
    return {k: np.asarray(v) for k, v in got.items() if v is not None}


class _Search:
    """The three stages of the module docstring on one model."""

    def __init__(self, fwd: _Forward, refs: dict, output: str, sites: list[_Site]) -> None:
        self.fwd, self.refs, self.output, self.sites = fwd, refs, output, sites
        self.homes = {key: site.index for site in sites for key in self.site_keys(site)}
        self.heads = {site.head: site.index for site in sites if site.head}
        self.keep = {site.index for site in sites} | {0}
        self.judged = 0
        self.local_runs = 0
        self.starts: dict[Key, int] = {}
        self.best: dict = {}
        self.best_err = math.inf
        self.best_states: dict[int, _State] = {}

    # --- scoring

    def error(self, state: _State, name: str) -> float:
        """The relative error of the chip tensor compared with layer ``name``'s float output."""
        tensor = self.fwd.tensor(state.em, name)
        if tensor is None or tensor not in state.values:
            return math.inf
        ref = self.refs[name]
        return relative_error(ref, self.fwd.real(state, tensor).reshape(ref.shape))

    def output_error(self, state: _State) -> float:
        return self.error(state, self.output)

    # --- choices -> Tuning

    def tuning(self, choice: dict) -> Tuning:
        """The Tuning of a choice (``values``, ``offsets``, ``per_channel``): only what differs
        from the range rule (so that an unchanged key takes the rule's own path)."""
        values, starts = choice["values"], self.starts
        exponents = {k: v for k, v in values.items() if v != starts[k] and k[1] != "per_channel"}
        channels = frozenset(k[0] for k, v in values.items() if k[1] == "per_channel" and v)
        return Tuning(exponents, dict(choice["offsets"]), per_channel=channels)

    # --- stage 1

    def local(self, start: _State, rule: dict) -> tuple[dict, _State, dict[int, _State]]:
        """Stage 1: each site's choices by its own output error, in execution order."""
        choice = {"values": dict(rule["values"]), "offsets": {}}
        by_index = {site.index: site for site in self.sites}
        state, kept = start, {}
        while state.index < len(self.fwd.layers):
            if state.index in self.keep:
                kept[state.index] = state
            site = by_index.get(state.index)
            if site is not None and site.compare in self.refs:
                state = self.choose(site, state, choice)
            else:
                state = self.fwd.step(state, self.tuning(choice))[0]
        return choice, state, kept

    def choose(self, site: _Site, before: _State, choice: dict) -> _State:
        """The site's exponents (and per-channel filter, bias correction) with the lowest
        error of its own output; returns the state after it."""
        cache: dict = {}

        def run(values: dict, offsets: dict) -> tuple[float, _State | None]:
            key = (tuple(sorted(values.items(), key=repr)), id(offsets))
            if key in cache:
                return cache[key][0]
            trial = {"values": {**choice["values"], **values}, "offsets": offsets}
            self.local_runs += 1
            try:
                after = self.fwd.step(before, self.tuning(trial))[0]
                result = self.error(after, site.compare), after
            except _REFUSED:
                result = math.inf, None
            cache[key] = result, offsets  # the offsets kept alive: their id is the key
            return result

        plain = {k: v for k, v in choice["offsets"].items() if k != site.head}
        filt = (site.head, "filter")
        done: dict = {}

        def corrected(values: dict) -> tuple[float, dict]:
            key = tuple(sorted(values.items(), key=repr))
            if key not in done:
                err, state = run(values, plain)
                fixed = plain
                if site.correct_bias and state is not None:
                    fixed = self.correct(site, run, values, plain, state)
                done[key] = (err, plain) if fixed is plain else (run(values, fixed)[0], fixed)
            return done[key]

        best = {k: choice["values"][k] for k in site.keys if k in choice["values"]}
        flag = (site.head, "per_channel")
        if site.per_channel:  # each filter form at its own bias correction: the correction
            # of one's error would only hurt the other
            best[flag] = choice["values"][flag]
            flipped = {**best, flag: 1 - best[flag]}
            if corrected(flipped)[0] < corrected(best)[0]:
                best = flipped
        # finer only: the range rule's exponent covers the calibrated range, a coarser one
        # only doubles the step (stage 3 tries both on the output); the estimated logits'
        # exponent both ways
        spans = {k: (SEARCH_SPAN, 0) for k in best}
        spans.update(
            {k: (SEARCH_SPAN, PREACTIVATION_SPAN) for k in best if k[1] == "preactivation"}
        )
        pre = [k for k in site.keys if k[1] == "preactivation" and k in best]
        if pre:  # an estimated logits' range may clip: the correction of clipped logits would
            # only hurt unclipped ones, so each candidate at its own
            found, _, _ = coordinate_search(
                {k: best[k] for k in pre},
                lambda v: corrected({**best, **v})[0],
                spans=spans,
                passes=1,
            )
            best.update(found)
        offsets = corrected(best)[1]
        moot = {filt} if best.get(flag) else set()
        keys = [k for k in site.keys if k in best and k not in moot and k not in pre]
        if keys:
            found, _, _ = coordinate_search(
                {k: best[k] for k in keys},
                lambda v: run({**best, **v}, offsets)[0],
                spans=spans,
                passes=1,
            )
            best.update(found)
        choice["values"].update(best)
        if site.correct_bias:  # what the chosen exponents leave
            offsets = self.correct(site, run, best, offsets)
        choice["offsets"] = offsets
        err, after = run(best, offsets)
        if after is None:  # the rule's own choice always runs: a bug guard
            raise AmctBridgeError(f"the export of layer {site.compare!r} failed in the search")
        return after

    def correct(self, site: _Site, run: Callable, values: dict, offsets: dict, state=None) -> dict:
        """Add the site's per-channel mean chip error to its bias where that lowers the
        channel's error (v1's correction, on one layer); ``offsets`` itself when nothing
        gains."""
        if state is None:
            state = run(values, offsets)[1]
            if state is None:
                return offsets
        ref = self.refs[site.compare]
        got = self.fwd.real(state, self.fwd.tensor(state.em, site.compare)).reshape(ref.shape)
        offset = bias_offsets(ref, got, linear_above=site.linear_above)
        previous = offsets.get(site.head, np.zeros_like(offset))
        trial = {**offsets, site.head: previous + offset}
        after = run(values, trial)[1]
        if after is None:
            return offsets
        fixed = self.fwd.real(after, self.fwd.tensor(after.em, site.compare)).reshape(ref.shape)
        kept = kept_offsets(ref, got, fixed, offset)
        if kept is None:
            return offsets
        if np.array_equal(kept, offset):
            return trial  # run already: its result is cached under this dict
        return {**offsets, site.head: previous + kept}

    # --- stages 2 and 3: the output is the judge

    def judge(self, choice: dict) -> float:
        """The output error of ``choice``, run from the first layer where it differs from the
        best so far; a strictly lower error makes it the best (as coordinate_search keeps)."""
        first = self.first_change(choice)
        if first is None:
            return self.best_err
        start = max(i for i in self.best_states if i <= first)
        self.judged += 1
        try:
            state, kept = self.fwd.run(self.best_states[start], self.tuning(choice), self.keep)
            err = self.output_error(state)
        except _REFUSED:
            return math.inf
        if err < self.best_err:
            self.best = {"values": dict(choice["values"]), "offsets": dict(choice["offsets"])}
            self.best_err = err
            self.best_states = {
                **{i: s for i, s in self.best_states.items() if i <= start},
                **kept,
            }
        return err

    def first_change(self, choice: dict) -> int | None:
        best = self.best
        moved = [self.homes[k] for k, v in choice["values"].items() if best["values"][k] != v]
        for head in set(choice["offsets"]) | set(best["offsets"]):
            if not _same(choice["offsets"].get(head), best["offsets"].get(head)):
                moved.append(self.heads[head])
        return min(moved) if moved else None

    def toggle(self, other: dict) -> None:
        """Stage 2: blocks of sites take ``other``'s choices where the output error drops;
        a block that does not gain is halved (breadth first, within a budget)."""
        units = [s for s in self.sites if self.differs(s, other)]
        budget = math.ceil(math.sqrt(len(units)) / 4) + 2  # halves, then a few quarters
        half = len(units) // 2  # all of them is ``other`` itself, already scored
        queue = [units[:half], units[half:]] if len(units) > 1 else []
        while queue and budget > 0:
            block = queue.pop(0)
            trial = {"values": dict(self.best["values"]), "offsets": dict(self.best["offsets"])}
            for site in block:
                for key in self.site_keys(site):
                    trial["values"][key] = other["values"][key]
                if site.head is not None:
                    if site.head in other["offsets"]:
                        trial["offsets"][site.head] = other["offsets"][site.head]
                    else:
                        trial["offsets"].pop(site.head, None)
            budget -= 1
            before = self.best_err
            if self.judge(trial) < before or len(block) == 1:
                continue
            half = len(block) // 2
            queue += [block[:half], block[half:]]

    def site_keys(self, site: _Site) -> list[Key]:
        keys = list(site.keys)
        if site.per_channel:
            keys.append((site.head, "per_channel"))
        return keys

    def differs(self, site: _Site, other: dict) -> bool:
        if any(self.best["values"][k] != other["values"][k] for k in self.site_keys(site)):
            return True
        return not _same(self.best["offsets"].get(site.head), other["offsets"].get(site.head))

    def refine(self, span: int) -> int:
        """Stage 3: coordinate descent on the output error over the model input's exponent and
        the last two sites' exponents; returns the candidates scored."""
        tail = [s for s in self.sites if s.keys or s.per_channel][-2:]
        inputs = [s for s in self.sites if self.fwd.layers[s.index].op == "input"]
        keys = [k for s in (*inputs, *tail) for k in self.site_keys(s)]
        keys = list(dict.fromkeys(keys))
        if not keys:
            return 0
        # per-channel is 0 or 1 whatever the start; a filter exponent under per-channel is moot
        spans = {
            k: (self.best["values"][k], 1 - self.best["values"][k])
            for k in keys
            if k[1] == "per_channel"
        }
        spans.update({k: (span, PREACTIVATION_SPAN) for k in keys if k[1] == "preactivation"})
        keys = [
            k
            for k in keys
            if not (k[1] == "filter" and self.best["values"].get((k[0], "per_channel")))
        ]

        def score(values: dict) -> float:
            trial = {"values": {**self.best["values"], **values}, "offsets": self.best["offsets"]}
            return self.judge(trial)

        start = {k: self.best["values"][k] for k in keys}
        _, _, tried = coordinate_search(
            start, score, span=span, passes=1, spans=spans, start_score=self.best_err
        )
        return tried


def _sites(fwd: _Forward) -> tuple:
    """The dry run (the range rule): the sites with their keys and start values, the states
    before them, the rule's final state. Records which sidecar keys each layer's lowering
    reads (the first layer that reads a key is its site)."""
    state = fwd.start()
    asked: dict[Key, tuple[int, int]] = {}
    plain = state.em.finder.range_exponent
    current = [0]

    def recording(name: str, side: str):
        found = plain(name, side)
        if found is not None and not ExponentFinder.is_zero_range(found):
            asked.setdefault((name, side), (current[0], int(found[0])))
        return found

    state.em.finder.range_exponent = recording  # this run only: copies drop it
    rule = Tuning()
    states, nodes_of = {}, {}
    while state.index < len(fwd.layers):
        index = current[0] = state.index
        before = _State(_copy_emitter(state.em), dict(state.values), index)
        asked_before = len(asked)
        state, nodes = fwd.step(state, rule, copy_state=False)
        nodes_of[index] = nodes
        if index == 0 or len(asked) > asked_before or fwd.layers[index].name in fwd.chains:
            states[index] = before  # a site may start here: kept for stage 1
    del state.em.finder.range_exponent
    em = state.em
    starts: dict[Key, int] = {}
    sites: dict[int, _Site] = {}
    for key, (index, exp) in asked.items():
        starts[key] = exp
        sites.setdefault(index, _Site(index)).keys.append(key)
    for index, layer in enumerate(fwd.layers):
        chain = fwd.chains.get(layer.name)
        node = next((n for n in nodes_of[index] if n.name == layer.name), None)
        if chain is None or node is None or node.op_type not in ("Conv", "Gemm"):
            continue
        site = sites.setdefault(index, _Site(index))
        site.head = layer.name
        filt = em.inits.get(node.inputs[1])
        if filt is not None and len(filt.exponents) == 1:
            starts[(layer.name, "filter")] = int(filt.exponents[0])
            site.keys.insert(0, (layer.name, "filter"))
        pre = node.outputs[0]
        compare = chain.last if layer.name not in fwd.linear else layer.name
        if pre.endswith("/linear"):
            starts[(layer.name, "preactivation")] = int(em.exps[pre])
            site.keys.insert(1, (layer.name, "preactivation"))
        site.compare = compare
        site.correct_bias = fwd.tensor(em, compare) == pre
        site.linear_above = 0.0 if node.attributes.get("activation") == "Relu" else None
        if fwd.target in PER_CHANNEL_TARGETS:
            site.per_channel = True
            starts[(layer.name, "per_channel")] = 0
    for index, site in sites.items():
        if site.compare is None:
            layer = fwd.layers[index]
            site.compare = layer.name
    return sorted(sites.values(), key=lambda s: s.index), starts, states, state


def search_tuning_v3(
    layers: list[SourceLayer],
    x: np.ndarray,
    floats: dict[str, np.ndarray] | Callable[[list[str]], dict[str, np.ndarray]],
    *,
    output: str | None = None,
    linear: frozenset[str] | set[str] = frozenset(),
    given: int | None = None,
    bias_correction: bool = True,
    per_channel: bool = True,
    span: int = SEARCH_SPAN,
    **options: Any,
) -> Tuning:
    """Exponents, per-channel filters (esp32p4) and bias corrections minimising the v3 chip's
    output error on ``x`` (the module docstring).

    Args:
        layers: the model as :class:`~amct_bridge.espdl.source.SourceLayer` list.
        x: calibration inputs, float, as the chip takes them (NHWC, after host-side layers; the
            first :func:`~amct_bridge.espdl.exponent_search.search_samples` of
            :data:`V3_MAX_INPUT_VALUES` are used; a model with GRU / LSTM layers: the first
            :data:`V3_RNN_SAMPLES`, each run on its own, as the runtime runs batch 1).
        floats: the float model's outputs on ``x`` by framework layer name, or a function of
            the names wanted giving them.
        output: the layer whose output is judged (None: the first model output).
        linear: layers whose ``floats`` are before their own activation (a head's logits).
        given: how many samples the user gave (the note says "75 of 256").
        bias_correction, per_channel: also correct biases / try per-channel filters (esp32p4).
        span: steps an exponent may move from the range rule's.
        **options: :func:`~amct_bridge.espdl.v3.export.export_layers_v3`'s record, stats,
            target, feature_type, skip_unsupported.

    Returns:
        the Tuning to export with; with a note only (nothing changed) when the search cannot
        run (several model inputs, no float output).

    Example:
        >>> # see the module docstring
    """
    given = len(x) if given is None else int(given)
    x = v3_search_samples(x, layers)
    options = {k: v for k, v in options.items() if k not in ("test_input", "seed", "overwrite")}
    export_layers_v3(layers, None, **options)  # refuses what the export refuses, as it would
    inputs = [s for s in layers if s.op == "input"]
    if len(inputs) != 1:
        return Tuning(notes=[f"exponents not searched: the model has {len(inputs)} inputs"])
    fwd = _Forward(layers, x, linear, options)
    try:
        sites, starts, states, end = _sites(fwd)
    except _REFUSED as err:
        return Tuning(notes=[f"exponents not searched: the simulator cannot run it ({err})"])
    if output is None:
        output = next((s.name for s in layers if s.attrs.get("model_output")), layers[-1].name)
    names = list(dict.fromkeys([output, *(s.compare for s in sites if s.compare)]))
    # the float outputs on the samples scored (an adapter may give them on more: a recurrent
    # model is scored on fewer)
    refs = {k: v[: len(x)] for k, v in _refs(floats, names).items()}
    refs[inputs[0].name] = x  # the input's own error: its quantization
    if output not in refs or fwd.tensor(end.em, output) is None:
        return Tuning(notes=[f"exponents not searched: no float output of {output!r}"])
    for name in list(refs):  # a float output the chip tensor does not match: not compared
        tensor = fwd.tensor(end.em, name)
        if tensor is None or tensor not in end.values or refs[name].size != end.values[tensor].size:
            if name == output:
                return Tuning(notes=[f"exponents not searched: no chip tensor for {output!r}"])
            del refs[name]
    for site in sites:  # per-channel filters and bias corrections where asked
        site.per_channel = site.per_channel and per_channel
        site.correct_bias = site.correct_bias and bias_correction
    search = _Search(fwd, refs, output, sites)
    search.starts = starts
    rule = {"values": dict(starts), "offsets": {}}
    rule_err = search.output_error(end)
    local, local_end, local_states = search.local(states[0], rule)
    local_err = search.output_error(local_end)
    if local_err < rule_err:
        search.best, search.best_err, search.best_states = local, local_err, local_states
        other = rule
    else:
        search.best, search.best_err = rule, rule_err
        search.best_states = {i: s for i, s in states.items() if i in search.keep}
        other = local
    search.toggle(other)
    search.refine(span)
    tried = search.judged + search.local_runs
    best = search.best
    tuning = search.tuning(best)
    per_sample = int(np.prod(x.shape[1:])) or 1
    changed = describe_changes(
        {k: v for k, v in starts.items() if k[1] != "per_channel"},
        {k: v for k, v in best["values"].items() if k[1] != "per_channel"},
    )
    rnn_rule = None
    if fwd.per_sample:
        rnn_rule = (
            f"the search takes the first {V3_RNN_SAMPLES} samples given of a model with GRU / "
            "LSTM layers, run one at a time as the runtime runs them"
        )
    extra = ""
    if tuning.per_channel:
        extra += f"; per-channel filters: {', '.join(sorted(tuning.per_channel))}"
    if tuning.bias_offsets:
        extra += f"; biases corrected: {', '.join(tuning.bias_offsets)}"
    tuning.notes.append(
        search_note(
            len(x),
            given,
            per_sample,
            tried,
            _JUDGE,
            (rule_err, search.best_err),
            changed,
            max_values=V3_MAX_INPUT_VALUES,
            extra=extra,
            rule=rnn_rule,
        )
    )
    return tuning


def export_searched(
    layers: list[SourceLayer],
    out: Any,
    *,
    calibration: CalibrationData | None,
    search: bool = True,
    **options: Any,
) -> V3ExportResult:
    """:func:`search_tuning_v3` on ``calibration``, then
    :func:`~amct_bridge.espdl.v3.export.export_layers_v3` with its choices (the adapters'
    ``export_espdl(format="espdl", calibration_data=x)``). ``feature_type="auto"`` (with
    ``max_drop``) first picks the int16 layers on ``calibration``
    (:func:`amct_bridge.espdl.v3.mixed.export_auto`), then searches at those widths;
    ``search=False``: the range rule's exponents.

    Example:
        >>> # see search_tuning_v3
    """

    def tune(opts: dict) -> Tuning:
        return search_tuning_v3(
            layers,
            calibration.x,
            calibration.floats,
            output=calibration.output,
            linear=calibration.linear,
            given=calibration.given,
            **opts,
        )

    if options.get("feature_type") == "auto" or "max_drop" in options:
        tuned = tune if search and calibration is not None else None
        return export_auto(layers, out, calibration=calibration, tune=tuned, **options)
    if not search or calibration is None:
        return export_layers_v3(layers, out, **options)
    return export_layers_v3(layers, out, tuning=tune(options), **options)
