"""End to end: amct_bridge.keras.calibrate writes record + sidecar, export reads them."""

from __future__ import annotations

import json
import math

import keras
import numpy as np
from espdl_stats import layer_activations

from amct_bridge.espdl import export
from amct_bridge.keras.calibrate import calibrate
from amct_bridge.records import load


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

    res = export(record, model, tmp_path / "espdl", skip_unsupported=True)  # sidecar found
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


def test_calibrate_then_export_mobilenet_v2(mobilenet, tmp_path):
    model, data, acts, _ = mobilenet
    record = tmp_path / "record.txt"
    calibrate(model, data, record, algorithm="minmax", batch_size=2)
    res = export(record, model, tmp_path / "espdl", skip_unsupported=True, target="esp32s3")
    assert len(res.layers) == 53 and len(res.skipped) == 35
    readers: dict[str, list] = {}
    for layer in model.layers[1:]:
        for t in layer.input if isinstance(layer.input, list) else [layer.input]:
            readers.setdefault(t._keras_history.operation.name, []).append(layer)
    only_add = sorted(
        name
        for name, users in readers.items()
        if all(isinstance(u, keras.layers.Add) for u in users)
    )
    bounded = [x for x in res.layers if x.sources["output_exponent"].startswith("bound")]
    # only BNs read by nothing but an Add lack a calibrated range (the sidecar has no BN entries)
    assert sorted(x.fused[-1] for x in bounded) == only_add
    assert len(only_add) == 10
    assert len(res.warnings) == len(bounded)
    for x in res.layers:
        last = x.fused[-1]
        if x in bounded:  # a bound: never below the true range
            assert x.entry["output_exponent"] >= ref_exponent(acts[last][1])
        else:
            assert x.entry["output_exponent"] == ref_exponent(acts[last][1]), x.name
