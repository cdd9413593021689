"""End to end: amct_bridge.keras.calibrate writes record + sidecar, export reads them."""

from __future__ import annotations

import json
import math

import keras
import numpy as np
import pytest
from espdl_stats import layer_activations

from amct_bridge.keras import export_espdl
from amct_bridge.keras.calibrate import calibrate
from amct_bridge.records import load
from amct_bridge.records.calibration import load_stats, sidecar_path


def ref_exponent(arr: np.ndarray) -> int:
    m = float(np.max(np.abs(arr)))
    e = math.ceil(math.log2(m / 127))
    return e + 1 if m > 127 * 2.0**e else e


def test_calibrate_then_export(tmp_path):
    keras.utils.set_random_seed(7)
    x = keras.Input((10, 10, 3))
    y = keras.layers.Conv2D(8, 3, name="c1")(x)
    y = keras.layers.BatchNormalization(name="bn1")(y)
    y = keras.layers.ReLU(name="r1")(y)
    y = keras.layers.DepthwiseConv2D(3, name="dw")(y)
    y = keras.layers.BatchNormalization(name="bn2")(y)
    y = keras.layers.ReLU(6.0, name="r6")(y)
    y = keras.layers.Conv2D(6, 1, name="pw")(y)
    y = keras.layers.LeakyReLU(0.2, name="lr")(y)
    y = keras.layers.GlobalAveragePooling2D(name="gap")(y)
    y = keras.layers.Dense(4, name="fc")(y)
    model = keras.Model(x, y)
    for layer in model.layers:  # non-trivial BN statistics
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.gamma.shape[0]
            rng = np.random.default_rng(c)
            layer.set_weights(
                [
                    rng.uniform(0.5, 2, c),
                    rng.normal(0, 0.5, c),
                    rng.normal(0, 0.5, c),
                    rng.uniform(0.3, 2, c),
                ]
            )
    data = np.random.default_rng(1).uniform(0, 1, (32, 10, 10, 3)).astype("float32")
    record = tmp_path / "record.txt"
    calibrate(model, data, record, algorithm="minmax", batch_size=8)

    res = export_espdl(model, record, tmp_path / "espdl", skip_unsupported=True)  # sidecar found
    acts = layer_activations(model, data)
    config = json.loads((tmp_path / "espdl" / "config.json").read_text())
    assert list(config) == ["c1", "dw", "pw", "fc"]
    assert [p.layer for p in res.skipped] == ["r6"]
    last = {"c1": "r1", "dw": "bn2", "pw": "lr", "fc": "fc"}
    for name, layer in last.items():
        assert config[name]["output_exponent"] == ref_exponent(acts[layer][1]), name
    assert config["c1"]["input_exponent"] == ref_exponent(data)
    assert config["fc"]["input_exponent"] == ref_exponent(acts["fc"][0])  # after the average pool
    assert config["pw"]["input_exponent"] == ref_exponent(acts["pw"][0])  # the ReLU6 output
    assert res.warnings == []  # the record's scale_w match the folded weights we export
    assert set(load(record).layers) <= {layer.name for layer in model.layers}


def _only_add_readers(model) -> list[str]:
    """Layers whose output is read by nothing but Add layers (projection BNs of MobileNetV2)."""
    readers: dict[str, list] = {}
    for layer in model.layers[1:]:
        for t in layer.input if isinstance(layer.input, list) else [layer.input]:
            readers.setdefault(t._keras_history.operation.name, []).append(layer)
    return sorted(
        name
        for name, users in readers.items()
        if all(isinstance(u, keras.layers.Add) for u in users)
    )


@pytest.fixture(scope="module")
def mobilenet_calibrated(mobilenet, tmp_path_factory):
    model, data, acts, _ = mobilenet
    record = tmp_path_factory.mktemp("mnv2") / "record.txt"
    calibrate(model, data, record, algorithm="minmax", batch_size=2)
    return record


def test_calibrate_then_export_mobilenet_v2(mobilenet, mobilenet_calibrated, tmp_path):
    model, data, acts, _ = mobilenet
    record = mobilenet_calibrated
    res = export_espdl(model, record, tmp_path / "espdl", skip_unsupported=True, target="esp32s3")
    assert len(res.layers) == 53 and len(res.skipped) == 35
    stats = load_stats(sidecar_path(record))
    only_add = _only_add_readers(model)
    assert len(only_add) == 10
    for name in only_add:  # the sidecar holds each folded BN's output range
        out = stats.layers[name].output
        assert (out.min, out.max) == pytest.approx(
            (float(acts[name][1].min()), float(acts[name][1].max())), rel=1e-5, abs=1e-6
        )
    # so no output exponent is a bound through a BN any more: all are exact, no warning
    assert not [x for x in res.layers if x.sources["output_exponent"].startswith("bound")]
    assert res.warnings == []
    for x in res.layers:
        assert x.entry["output_exponent"] == ref_exponent(acts[x.fused[-1]][1]), x.name
    # the 10 Adds are reported with their own exponent (>= the exact one: raised to the inputs')
    adds = [r for r in res.runtime if r.espdl_class == "Add2D"]
    assert len(adds) == 10
    for r in adds:
        exact = ref_exponent(acts[r.source][1])
        assert r.output_exponent == max([exact, *r.input_exponents]), r.source


def test_export_mobilenet_v2_sidecar_without_bn_entries(mobilenet, mobilenet_calibrated, tmp_path):
    """An older / hand-written sidecar without BN entries: the BN-bound fallback still works."""
    model, data, acts, _ = mobilenet
    stats = load_stats(sidecar_path(mobilenet_calibrated))
    stats.layers = {k: v for k, v in stats.layers.items() if v.kind != "BatchNormalization"}
    res = export_espdl(model, load(mobilenet_calibrated), None, stats=stats, skip_unsupported=True)
    bounded = [x for x in res.layers if x.sources["output_exponent"].startswith("bound")]
    # only BNs read by nothing but an Add lack a calibrated range (others: a reader's input)
    assert sorted(x.fused[-1] for x in bounded) == _only_add_readers(model)
    assert len(res.warnings) == len(bounded)
    for x in res.layers:
        last = x.fused[-1]
        if x in bounded:  # a bound: never below the true range
            assert x.entry["output_exponent"] >= ref_exponent(acts[last][1])
        else:
            assert x.entry["output_exponent"] == ref_exponent(acts[last][1]), x.name
