"""Raw ops (``x + y``, ``keras.ops.multiply``, ``keras.ops.concatenate``) carry Keras' own names in
every output: graph IR, record, sidecar, prune records, ``prune-groups --json``, ESP-DL files.

The reference names come from Keras itself (``model.operations`` and the op behind each
KerasTensor), never from our code: Keras names every op (``add``, ``multiply_1``...; counted per
process, so they are read, not hard-coded) and keeps the names through save/load.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from keras import layers, ops

from amct_bridge.cli import main
from amct_bridge.espdl.naming import c_identifier
from amct_bridge.keras import calibrate, export_espdl, prune_record
from amct_bridge.keras.graph import extract_graph
from amct_bridge.records import load
from amct_bridge.records.calibration import load_stats, sidecar_path


def kname(t: keras.KerasTensor) -> str:
    """Keras' name of the op that produced ``t`` (what ``model.operations`` lists)."""
    return t._keras_history.operation.name


def build(multiply: bool = True) -> tuple[keras.Model, dict[str, str]]:
    """x + y, ops.multiply, ops.concatenate and a nested model with its own raw add.

    Returns the model and {role: Keras name} of the raw ops (nested: ``"inner/<name>"``).
    """
    keras.utils.set_random_seed(5)
    xi = keras.Input((6, 6, 4))
    inner_sum = layers.Conv2D(4, 1, name="ci")(xi) + xi
    inner = keras.Model(xi, inner_sum, name="inner")
    x = keras.Input((6, 6, 3))
    a = layers.Conv2D(4, 3, padding="same", name="c1")(x)
    b = layers.Conv2D(4, 1, name="c2")(a)
    s = a + b
    m = ops.multiply(s, b) if multiply else a
    k = ops.concatenate([s, m], axis=-1)
    n = inner(layers.Conv2D(4, 1, name="c3")(k))
    out = layers.Dense(3, name="fc")(layers.GlobalAveragePooling2D(name="gap")(n))
    names = {"add": kname(s), "cat": kname(k), "inner_add": "inner/" + kname(inner_sum)}
    if multiply:
        names["mul"] = kname(m)
    return keras.Model(x, out, name="outer"), names


def keras_walk(model: keras.Model, prefix: str = "") -> list[str]:
    """Every operation of the model in Keras' own order, nested models recursed as outer/inner."""
    names = []
    for op in model.operations:
        if isinstance(op, keras.layers.InputLayer):
            continue
        if isinstance(op, keras.Model):
            names += keras_walk(op, f"{prefix}{op.name}/")
        else:
            names.append(prefix + op.name)
    return names


def data(n: int = 8) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (n, 6, 6, 3)).astype("float32")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    model, names = build()
    tmp = tmp_path_factory.mktemp("raw_names")
    record = tmp / "record.txt"
    calibrate(model, data(), record, algorithm="minmax", batch_size=4)
    path = tmp / "m.keras"
    model.save(path)
    return model, names, record, path


def test_keras_names_the_raw_ops():
    """What Keras gives (the premise): names of their kind, listed by model.operations."""
    model, names = build()
    assert names["add"].startswith("add") and names["mul"].startswith("multiply")
    assert names["cat"].startswith("concatenate") and names["inner_add"].startswith("inner/add")
    assert set(names.values()) <= set(keras_walk(model))


def test_graph_nodes_are_the_keras_operations(built):
    model, names, _, _ = built
    graph = extract_graph(model)
    assert [n.name for n in graph] == keras_walk(model)
    raw = [n.name for n in graph if not n.is_layer]
    assert raw == [names["add"], names["mul"], names["cat"], names["inner_add"]]


def test_two_models_in_one_process_each_keep_their_own_names():
    """Keras counts op names per process: the same code twice gives two sets of names, and each
    graph uses its own model's names (unique within the model)."""
    (m1, n1), (m2, n2) = build(), build()
    assert n1["add"] != n2["add"]
    for model, names in ((m1, n1), (m2, n2)):
        graph_names = [n.name for n in extract_graph(model)]
        assert set(names.values()) <= set(graph_names)
        assert len(set(graph_names)) == len(graph_names)


def test_record_and_sidecar_keys(built):
    model, names, record, _ = built
    # the record holds quantizable layers only: Keras layer names, nested outer/inner
    assert list(load(record).layers) == ["c1", "c2", "c3", "inner/ci", "fc"]
    # the sidecar's runtime entries (Add, Concatenate) are the raw ops, by Keras' names
    order = ["c1", "c2", names["add"], names["cat"], "c3", "inner/ci", names["inner_add"]]
    assert list(load_stats(sidecar_path(record)).layers) == [*order, "gap", "fc"]


def test_prune_records_and_cli_json(built, capsys):
    model, names, _, path = built
    members = {n.name for r in prune_record(model).prune_records for n in r.consumers}
    assert set(names.values()) <= members
    assert main(["prune-groups", str(path), "--json"]) == 0  # the saved model, loaded by the CLI
    doc = json.loads(capsys.readouterr().out)
    listed = [c["name"] for g in doc["groups"] for c in g["consumers"]]
    assert set(names.values()) <= set(listed)
    assert not any("_op" in name for name in listed)


def test_names_survive_save_and_load(built, tmp_path):
    model, names, record, path = built
    loaded = keras.models.load_model(path)
    assert keras_walk(loaded) == keras_walk(model)
    again = tmp_path / "record.txt"
    calibrate(loaded, data(), again, algorithm="minmax", batch_size=4)
    assert list(load(again).layers) == list(load(record).layers)
    runtime = {names["add"], names["cat"], names["inner_add"]}
    assert runtime <= set(load_stats(sidecar_path(again)).layers)
    assert list(load_stats(sidecar_path(again)).layers) == list(
        load_stats(sidecar_path(record)).layers
    )
    # same factors too: the loaded model is the same model
    assert load(again).layers == load(record).layers
    ours = [[n.name for n in r.consumers] for r in prune_record(loaded).prune_records]
    assert ours == [[n.name for n in r.consumers] for r in prune_record(model).prune_records]


def test_espdl_export_json_and_names_json(tmp_path):
    model, names = build(multiply=False)  # Multiply has no ESP-DL v1 chip layer
    record = tmp_path / "record.txt"
    calibrate(model, data(), record, algorithm="minmax", batch_size=4)
    out = tmp_path / "espdl"
    export_espdl(model, record, out)
    report = json.loads((out / "export.json").read_text())
    sources = [names["add"], names["cat"], names["inner_add"], "gap"]
    runtime = report["runtime_layers"]
    assert [r["source"] for r in runtime] == sources
    assert [r["name"] for r in runtime] == [c_identifier(s) for s in sources]
    assert f'"{c_identifier(names["add"])}")' in runtime[0]["cpp"]
    chip = {x["source"]: x["name"] for x in report["graph"]["layers"]}  # the chip graph
    assert {s: chip[s] for s in sources} == {s: c_identifier(s) for s in sources}
    chains = ["c1", "c2", "c3", "inner/ci", "fc"]
    assert json.loads((out / "names.json").read_text()) == {c_identifier(n): n for n in chains}
    assert list(json.loads((out / "config.json").read_text())) == [c_identifier(n) for n in chains]


def test_invented_name_only_where_keras_gives_none():
    """An op Keras left without a name gets <snake_kind>_op<k>, skipping names that are taken."""
    x = keras.Input((4,))
    a = layers.Dense(4, name="add_op0")(x)  # a layer already holding the first invented name
    s = a + a
    model = keras.Model(x, layers.Dense(2, name="fc")(s))
    s._keras_history.operation.name = ""  # as an op built with name="" (Keras allows it)
    graph = extract_graph(model)
    assert [n.name for n in graph] == ["add_op0", "add_op1", "fc"]
    assert graph.node("add_op1").kind == "Add" and not graph.node("add_op1").is_layer


def test_rewrites_copy_raw_ops(tmp_path):
    """simulate / replace_relu6 / QAT clone the model: its raw ops (x + y, ops.multiply,
    ops.concatenate, one in a nested model) are copied with their names, not a KeyError (a
    new user's simulate() of a model with ``a + b`` raised one). The simulated raw-op model
    equals the same model built with Add/Multiply/Concatenate layers, same weights and record."""
    from amct_bridge.keras import quantize_aware, replace_relu6, simulate

    model, names = build()
    x = np.random.default_rng(0).uniform(-1, 1, (16, 6, 6, 3)).astype("float32")
    record = calibrate(model, x, tmp_path / "r.txt", algorithm="minmax")
    sim = simulate(model, record)
    ops_of = {op.name for op in sim.operations} | {
        f"inner/{op.name}" for op in sim.get_layer("inner").operations
    }
    assert set(names.values()) <= ops_of
    assert {op.name for op in replace_relu6(model).operations} == {
        op.name for op in model.operations
    }
    qat = quantize_aware(model)
    assert set(names.values()) - {names["inner_add"]} <= {op.name for op in qat.operations}

    # the same function with layers instead of raw ops: what simulate must compute
    twin = _layer_twin(model)
    np.testing.assert_allclose(twin.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    want = simulate(twin, record).predict(x, verbose=0)
    np.testing.assert_allclose(sim.predict(x, verbose=0), want, atol=1e-6)


def _layer_twin(model: keras.Model) -> keras.Model:
    """:func:`build`'s model with Add / Multiply / Concatenate layers, its weights copied."""
    xi = keras.Input((6, 6, 4))
    inner = keras.Model(xi, layers.Add()([layers.Conv2D(4, 1, name="ci")(xi), xi]), name="inner")
    x = keras.Input((6, 6, 3))
    a = layers.Conv2D(4, 3, padding="same", name="c1")(x)
    b = layers.Conv2D(4, 1, name="c2")(a)
    s = layers.Add()([a, b])
    k = layers.Concatenate(axis=-1)([s, layers.Multiply()([s, b])])
    n = inner(layers.Conv2D(4, 1, name="c3")(k))
    out = layers.Dense(3, name="fc")(layers.GlobalAveragePooling2D(name="gap")(n))
    twin = keras.Model(x, out, name="outer")
    for name in ("c1", "c2", "c3", "fc"):
        twin.get_layer(name).set_weights(model.get_layer(name).get_weights())
    ci = model.get_layer("inner").get_layer("ci").get_weights()
    twin.get_layer("inner").get_layer("ci").set_weights(ci)
    return twin
