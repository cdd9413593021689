"""``amct-bridge prune-groups`` on a saved .keras model: table, JSON, record file, errors."""

from __future__ import annotations

import json

import keras
import pytest
from keras import layers

from amct_bridge.cli import main
from amct_bridge.graph.selective import unpack_mask
from amct_bridge.records import load


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    x = keras.Input((6, 6, 3))
    y = layers.Conv2D(8, 3, name="c1")(x)
    y = layers.BatchNormalization(name="bn")(y)
    y = layers.Conv2D(4, 1, name="c2")(layers.ReLU(name="relu")(y))
    model = keras.Model(x, layers.Dense(2, name="fc")(layers.GlobalAveragePooling2D(name="gap")(y)))
    path = tmp_path_factory.mktemp("model") / "m.keras"
    model.save(path)
    return path


def test_table_lists_groups_and_refusals(model_path, capsys):
    assert main(["prune-groups", str(model_path)]) == 0
    out = capsys.readouterr().out
    assert "group 1: 8 channels" in out
    assert "consumer  c2    Conv2D            [0, 8)" in out
    assert "fc  [0, 2)  MODEL_OUTPUT  at model output" in out


def test_json_and_record_with_selective_masks(model_path, tmp_path, capsys):
    record_path = tmp_path / "prune.txt"
    code = main(
        [
            "prune-groups",
            str(model_path),
            "--json",
            "--selective",
            "--with-mask",
            "--record",
            str(record_path),
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["name"] for g in data["groups"] for p in g["producers"]] == ["c1", "c2"]
    assert data["groups"][0]["consumers"][-1] == {
        "name": "c2",
        "type": "Conv2D",
        "begin": 0,
        "end": 8,
    }
    assert [s["name"] for s in data["selective"]["layers"]] == ["c1", "c2", "fc"]
    record = load(record_path)
    assert len(record.prune_records) == 2 + 3
    fc = record.prune_records[-1].selective_prune
    mask = unpack_mask(fc.get("selective_mask"), tuple(fc.get("mask_shape")))
    assert mask.shape == (4, 2) and mask.sum() == 4


def test_missing_model_is_a_clear_error(tmp_path, capsys):
    assert main(["prune-groups", str(tmp_path / "nope.keras")]) == 2
    assert "nope.keras: model file not found" in capsys.readouterr().err
