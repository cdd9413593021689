"""Fuzz: random small Keras graphs (fuzz_keras) through graph extraction, pruning discovery,
prune records, calibration and ESP-DL export. Each call succeeds or raises an AmctBridgeError;
what succeeds is checked:

- groups satisfy the channel-flow invariants: producer ranges are ``width`` channels inside the
  layer, consumer ranges ``width * multiplier``, no channel of a layer is in two groups, and
  (as tests/keras_graph/test_real_perturbation.py) perturbing root channel i of every producer
  changes, in every layer not after a closing consumer, only channels the group names for i;
- the prune record and the calibration record validate and read back;
- the export's written set passes the preview / consistency check and runs on the chip
  simulator (fuzz_checks).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import keras
import numpy as np
from fuzz_checks import check_chip, check_written
from fuzz_keras import build, keras_specs
from fuzz_support import attempt, fuzz_settings
from hypothesis import example, given
from hypothesis import strategies as st

from amct_bridge.keras import calibrate, export_espdl, extract_graph, prune_discovery, prune_record
from amct_bridge.keras.prune import find_layer, kernel_variable
from amct_bridge.records import load, validate

CONV1 = {"k": 1, "stride": 1, "padding": "same", "bias": False, "activation": None, "filters": 1}
#: Found by this fuzzer (shrunk): Add([c, c]) lost its repeated input in the Keras adapter, and
#: the chip simulator raised IndexError on the one-input Add2D.
ADD_SAME_TWICE = {
    "shape": (2, 2, 1),
    "steps": [("conv", {**CONV1, "named": True}, [0]), ("add", {"named": True}, [1, 1])],
    "seed": 0,
    "closing_head": False,
}

DW2 = {**CONV1, "mult": 2, "named": True}
#: Found by the first long campaign (shrunk): a depthwise (multiplier 2) after another one;
#: dw4's range counts 2 input channels per root channel (``multiplier``), each giving 2 outputs.
#: The record was right; this file's check ignored ``multiplier`` on a depthwise member.
STACKED_MULTIPLIERS = {
    "shape": (2, 2, 1),
    "steps": [
        ("conv", {**CONV1, "named": True}, [0]),
        ("dw", DW2, [1]),
        ("dw", DW2, [2]),
        ("conv", {**CONV1, "named": True}, [3]),
    ],
    "seed": 0,
    "closing_head": False,
}


def positions(member, i: int) -> set[int]:
    """Channels of ``member``'s node that carry root channel i (as test_real_perturbation, plus
    a depthwise after another multiplier: ``multiplier`` input channels per root channel, each
    giving ``depth_multiplier`` outputs; the fuzzer's first campaign found the helper lacked it)."""
    mult, stride, tiles = member.attr("multiplier") or 1, member.attr("stride") or 0, 1
    if member.attr("depth_multiplier"):
        m = member.attr("depth_multiplier")
        ins = range(member.begin + i * mult, member.begin + (i + 1) * mult)
        return {c * m + j for c in ins for j in range(m)}
    tiles = member.attr("tile") or 1
    first = member.begin + i * mult
    return {first + j + t * stride for j in range(mult) for t in range(tiles)}


def node_channels(graph, name: str) -> int:
    node = graph.node(name)
    return max(graph.channels(t) or 0 for t in [*node.inputs, *node.outputs])


def check_ranges(graph, found) -> None:
    """Structural channel-flow invariants of every group."""
    taken: dict[str, set[int]] = {}
    for group in found.groups:
        assert group.width > 0 and group.producers
        for p in group.producers:
            assert 0 <= p.begin < p.end <= node_channels(graph, p.name), p
            assert p.end - p.begin == group.width, (p, group.width)
            mine = set(range(p.begin, p.end))
            assert not taken.get(p.name, set()) & mine, f"{p.name}: channels in two groups"
            taken.setdefault(p.name, set()).update(mine)
        for m in group.consumers:
            assert 0 <= m.begin < m.end, m
            limit = node_channels(graph, m.name)
            for i in range(group.width):
                assert positions(m, i) and max(positions(m, i)) < limit, (m, i, limit)


def downstream(graph, starts: set[str]) -> set[str]:
    seen = set(starts)
    for node in graph:
        if any((p := graph.producer_of(t)) is not None and p.name in seen for t in node.inputs):
            seen.add(node.name)
    return seen


def changed(before: np.ndarray, after: np.ndarray) -> set[int]:
    diff = np.abs(after - before).reshape(-1, before.shape[-1]).max(axis=0)
    return set(np.flatnonzero(diff > 0).tolist())  # untouched channels are bit-identical


def check_perturbation(model, graph, found, data) -> None:
    """Perturb root channel width // 2 of each group: nothing outside the group may change."""
    names = [n.name for n in graph if n.is_layer and len(n.outputs) == 1]
    probe = keras.Model(model.input, [model.get_layer(n).output for n in names])
    base = [np.asarray(v) for v in probe(data)]
    for group in found.groups:
        i = group.width // 2
        free = downstream(graph, {m.name for m in group.consumers if m.closing})
        saved = []
        for p in group.producers:
            var = kernel_variable(find_layer(model, p.name))
            w = np.asarray(var).copy()
            saved.append((var, w.copy()))
            w[..., p.begin + i] += 1.0  # Conv2D HWIO and Dense IO: output channel last
            var.assign(w)
        after = [np.asarray(v) for v in probe(data)]
        for var, w in saved:
            var.assign(w)
        producers = {p.name: p.begin + i for p in group.producers}
        for name, b, a in zip(names, base, after, strict=True):
            if name in free:
                continue
            got = changed(b, a)
            if name in producers:
                assert got <= {producers[name]}, (name, got)  # a ReLU may hide the change
                continue
            allowed = set()
            for m in group.consumers:
                if m.name == name and not m.closing:
                    allowed |= positions(m, i)
            assert got <= allowed, (group.producers[0].name, name, sorted(got - allowed))


def check_discovery(model, data) -> None:
    graph, err = attempt("keras.extract_graph", extract_graph, model, kind="keras")
    if err is not None:
        return
    found, err = attempt("keras.prune_discovery", prune_discovery, model, graph, kind="keras")
    if err is not None:
        return
    check_ranges(graph, found)
    check_perturbation(model, graph, found, data)
    record, err = attempt("keras.prune_record", prune_record, model, kind="keras")
    if err is None:
        assert validate(record) == [], [str(p) for p in validate(record)]
        assert len(record.prune_records) == len(found.groups)


@fuzz_settings("keras")
@given(
    keras_specs(),
    st.sampled_from(["minmax", "ifmr", "hfmg"]),
    st.booleans(),
    st.sampled_from(["s8", "s16"]),
)
@example(spec=ADD_SAME_TWICE, algorithm="minmax", skip=False, ftype="s8")
@example(spec=STACKED_MULTIPLIERS, algorithm="minmax", skip=False, ftype="s8")
def test_random_keras_graphs_discover_calibrate_and_export(spec, algorithm, skip, ftype):
    model = build(spec)
    rng = np.random.default_rng(spec["seed"])
    data = rng.uniform(0, 1, (8, *spec["shape"])).astype(np.float32)
    check_discovery(model, data)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "record.txt"
        _, err = attempt(
            "keras.calibrate",
            calibrate,
            model,
            data,
            path,
            algorithm=algorithm,
            batch_size=4,
            kind="keras",
        )
        if err is not None:
            return
        record = load(path)
        assert validate(record) == [], [str(p) for p in validate(record)]
        out = Path(tmp) / "espdl"
        options = {"feature_type": ftype, "granularity": "per-tensor", "target": "esp32"}
        result, err = attempt(
            "keras.export_espdl",
            export_espdl,
            model,
            path,
            out,
            skip_unsupported=skip,
            kind="keras",
            **options,
        )
        if err is not None:
            assert not out.exists()
            return
        check_written(result, out, options)
        check_chip(result, out, data[:2], "esp32")


def test_layer_reading_one_tensor_twice_keeps_both_inputs(tmp_path):
    """Regression (found by this fuzzer): Add([c, c]) and Concatenate([c, c]) read ``c`` twice;
    the exported chip graph must too (2c, and twice the channels), as Keras computes."""
    from amct_bridge.espdl.v1.chip import simulate_chip
    from amct_bridge.keras.espdl_weights import source_layers

    data = np.random.default_rng(0).uniform(0, 1, (8, 2, 2, 1)).astype(np.float32)
    for merge in (keras.layers.Add(name="m"), keras.layers.Concatenate(name="m")):
        x = keras.Input((2, 2, 1))
        c = keras.layers.Conv2D(2, 1, name="c")(x)
        model = keras.Model(x, merge([c, c]))
        assert source_layers(model)[-1].inputs == ["c", "c"]
        path = tmp_path / f"{merge.name}.txt"
        calibrate(model, data, path, algorithm="minmax")
        result = export_espdl(model, path, None)
        out = simulate_chip(result, data[:2]).output
        want = model.predict(data[:2], verbose=0)
        assert out.values.shape == want.shape
        assert np.abs(out.values * 2.0**out.exponent - want).max() <= 2 * 2.0**out.exponent
