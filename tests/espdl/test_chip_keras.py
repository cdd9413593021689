"""Exports of real Keras models, simulated on the chip: chip graph in export.json, loaders agree,
chip output close to the float model, `amct-bridge espdl-eval` on a tiny model."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from espdl_stats import layer_activations, sidecar_from

from amct_bridge.cli import main
from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1.chip import simulate_chip
from amct_bridge.espdl.v1.export import export_layers
from amct_bridge.espdl.v1.network import load_network, network_from_result
from amct_bridge.keras.espdl_weights import source_layers

#: chip output vs float model, max abs error / max |float output|: int16 keeps ~15 bits per
#: layer, int8 ~7 (measured on this model: s16 ~3e-4, s8 ~8e-2).
TOLERANCE = {"s16": 0.005, "s8": 0.2}


def branchy() -> keras.Model:
    """Conv/BN/ReLU, depthwise, Add -> standalone ReLU, MaxPool, Concat, pools, Dense."""
    keras.utils.set_random_seed(1)
    x = keras.Input((12, 12, 3), name="img")
    y = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="c1")(x)
    z = keras.layers.DepthwiseConv2D(3, padding="same", name="dw")(y)
    z = keras.layers.BatchNormalization(name="bn")(z)
    z = keras.layers.ReLU(name="r")(z)
    z = keras.layers.Conv2D(8, 1, name="pw")(z)
    s = keras.layers.Add(name="add")([y, z])
    s = keras.layers.ReLU(name="add_relu")(s)
    p = keras.layers.MaxPooling2D(name="mp")(s)
    q = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu", name="c2")(s)
    c = keras.layers.Concatenate(name="cat")([p, q])
    a = keras.layers.AveragePooling2D(2, name="ap")(c)
    g = keras.layers.GlobalAveragePooling2D(name="gap")(a)
    g = keras.layers.Dropout(0.2, name="drop")(g)
    o = keras.layers.Dense(5, name="fc")(g)
    return keras.Model(x, o)


def export(model: keras.Model, out, **options):
    return export_layers(source_layers(model), out, **options)


@pytest.fixture(scope="module")
def model_data():
    model = branchy()
    data = np.random.default_rng(0).uniform(0, 1, (8, 12, 12, 3)).astype("float32")
    return model, data, sidecar_from(layer_activations(model, data))


@pytest.mark.parametrize(
    "ftype, granularity, target",
    [
        ("s16", "per-tensor", "esp32"),
        ("s8", "per-tensor", "esp32s3"),
        ("s8", "per-channel", "esp32"),
    ],
)
def test_export_simulates_close_to_float(model_data, tmp_path, ftype, granularity, target):
    model, data, stats = model_data
    res = export(
        model,
        tmp_path / "o",
        stats=stats,
        feature_type=ftype,
        granularity=granularity,
        target=target,
    )
    assert res.graph_error is None
    graph = json.loads((tmp_path / "o" / "export.json").read_text())["graph"]
    nodes = [(n["name"], n["class"], n["inputs"]) for n in graph["layers"]]
    assert nodes == [
        ("c1", "Conv2D", ["input"]),
        ("dw", "DepthwiseConv2D", ["c1"]),
        ("pw", "Conv2D", ["dw"]),
        ("add", "Add2D", ["c1", "pw"]),  # add_relu is fused: Add2D's activation
        ("mp", "MaxPool2D", ["add"]),
        ("c2", "Conv2D", ["add"]),
        ("cat", "Concat", ["mp", "c2"]),
        ("ap", "AvgPool2D", ["cat"]),
        ("gap", "GlobalAveragePool2D", ["ap"]),
        ("fc", "FullyConnected", ["gap"]),
    ]
    assert graph["input"]["shape"] == [12, 12, 3] and graph["outputs"] == ["fc"]
    assert graph["input"]["exponent"] == res.config["c1"]["input_exponent"]
    from_dir, from_result = load_network(tmp_path / "o"), network_from_result(res)
    for a, b in zip(from_dir.layers, from_result.layers, strict=True):
        assert (a.name, a.kind, a.inputs, a.output_exponent) == (
            b.name,
            b.kind,
            b.inputs,
            b.output_exponent,
        )
        if a.filter is not None:  # the result's previews are in the target's element order
            assert np.array_equal(a.filter.values, b.filter.values)
            assert np.array_equal(a.filter.exponent, b.filter.exponent)
    chip = simulate_chip(from_dir, data, target=target)
    assert chip.approximate_layers == ["ap", "gap"] and chip.output.approximate
    assert chip.warnings == []  # every bias matches the scale the chip adds it at
    want = model.predict(data, verbose=0)
    got = chip.output.to_float()
    assert got.shape == want.shape
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < TOLERANCE[ftype]
    # the first conv: chip integers * 2^e equal the float conv of the quantized input/weights
    c1 = from_dir.layer("c1")
    xq = chip.input.to_float()
    wq = np.ldexp(c1.filter.values.astype(np.float64), c1.filter.exponent)
    ref = keras.ops.convert_to_numpy(keras.ops.conv(xq, wq, padding="same"))
    ref = np.maximum(ref + np.ldexp(c1.bias.values.astype(np.float64), c1.bias.exponent), 0)
    step = 2.0**c1.output_exponent
    ref = np.minimum(ref, (2 ** (from_dir.bits - 1) - 1) * step)  # saturation
    diff = ref - chip["c1"].to_float()  # floor shift: the chip is below by less than one step
    assert diff.min() > -1e-3 * step and diff.max() < step * (1 + 1e-3)
    assert diff.max() > 0.5 * step  # (and it does floor: not an exact match by accident)


def test_graph_error_recorded_and_named(tmp_path):
    keras.utils.set_random_seed(2)
    x = keras.Input((6, 6, 2))
    y = keras.layers.Conv2D(3, 3, name="c")(x)
    y = keras.layers.UpSampling2D(name="up")(y)
    y = keras.layers.Conv2D(2, 1, name="d")(y)
    model = keras.Model(x, y)
    data = np.random.default_rng(1).uniform(-1, 1, (2, 6, 6, 2)).astype("float32")
    stats = sidecar_from(layer_activations(model, data))
    res = export(model, tmp_path / "o", stats=stats, skip_unsupported=True)
    assert "'up'" in res.graph_error
    report = json.loads((tmp_path / "o" / "export.json").read_text())
    assert report["graph"] is None and "'up'" in report["graph_error"]
    with pytest.raises(ExportError, match="no chip graph.*'up'") as err:
        load_network(tmp_path / "o")
    # what to do, not "pass one, or export again" (a new-user trial could not act on it)
    assert "skipped layers the graph needs (skip_unsupported)" in str(err.value)
    assert "make every layer exportable and export again" in str(err.value)
    with pytest.raises(ExportError, match="no chip graph"):
        simulate_chip(res, data)


def test_espdl_eval_cli(tmp_path, capsys):
    from amct_bridge.keras import calibrate

    keras.utils.set_random_seed(4)
    x = keras.Input((6, 6, 1))
    y = keras.layers.Conv2D(4, 3, activation="relu", name="c1")(x)
    y = keras.layers.Flatten(name="flat")(y)
    y = keras.layers.Dense(3, name="fc")(y)
    model = keras.Model(x, y)
    data = np.random.default_rng(3).uniform(0, 1, (40, 6, 6, 1)).astype("float32")
    labels = model.predict(data, verbose=0).argmax(axis=1)  # float accuracy is 1 by design
    model.save(tmp_path / "m.keras")
    record = tmp_path / "record.txt"
    calibrate(model, data, str(record), algorithm="minmax")
    np.savez(tmp_path / "val.npz", x=data, y=np.eye(3)[labels])  # one-hot labels
    out = tmp_path / "espdl"
    assert (
        main(
            [
                "export-espdl",
                "--record",
                str(record),
                "--model",
                str(tmp_path / "m.keras"),
                "--out",
                str(out),
                "--feature-type",
                "s16",
                "--target",
                "esp32s3",
            ]
        )
        == 0
    )
    capsys.readouterr()
    argv = [
        "espdl-eval",
        "--export",
        str(out),
        "--model",
        str(tmp_path / "m.keras"),
        "--record",
        str(record),
        "--data",
        str(tmp_path / "val.npz"),
        "--batch-size",
        "16",
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0] == "samples: 40"
    # the chip the export was made for, without --target (esp32 before, whatever the export)
    assert "(esp32s3, bit-exact simulator)" in lines[3]
    assert lines[1] == "float accuracy:      1.0000"
    chip_acc = float(lines[3].split()[2])
    fq_acc = float(lines[2].split()[2])
    # the chip's own argmax, computed here from the simulator directly
    net = load_network(out)
    assert net.target == "esp32s3" and simulate_chip(net, data[:2]).target == "esp32s3"
    other = simulate_chip(net, data[:2], target="esp32")
    assert other.target == "esp32" and "the export was made for esp32s3" in other.warnings[0]
    chip_pred = simulate_chip(net, data).output.values.argmax(axis=1)
    assert chip_acc == pytest.approx(float(np.mean(chip_pred == labels)))
    assert chip_acc >= 0.9 and fq_acc >= 0.9
    rows = {
        line.split()[0]: line.split()
        for line in lines[
            lines.index("per-layer error of the chip against the float model:") + 2 : -1
        ]
    }
    assert sorted(rows) == ["c1", "fc", "flat"]
    assert float(rows["c1"][3]) > 40  # int16: SNR far above 40 dB
    assert main([*argv[:-2], "--batch-size", "0"]) == 2
    assert "--batch-size 0" in capsys.readouterr().err
    # data of another shape than the export's (an export of another model)
    np.savez(tmp_path / "other.npz", x=np.zeros((4, 5, 5, 1), "float32"), y=np.zeros(4, int))
    other = [*argv[:8], str(tmp_path / "other.npz")]
    assert main(other) == 2
    err = capsys.readouterr().err
    assert (
        f"{out}: the exported network takes inputs of shape (6, 6, 1) (HWC), the data has (5, 5, 1)"
        in err
    )


def test_espdl_eval_dataset_errors(tmp_path):
    from amct_bridge.commands.espdl_eval import load_dataset
    from amct_bridge.errors import AmctBridgeError

    np.savez(tmp_path / "no_y.npz", x=np.zeros((3, 2)))
    with pytest.raises(AmctBridgeError, match="no_y.npz: expected an .npz with arrays 'x' and 'y'"):
        load_dataset(str(tmp_path / "no_y.npz"))
    np.save(tmp_path / "x.npy", np.zeros((3, 2)))
    np.save(tmp_path / "y.npy", np.array([0, 1]))
    with pytest.raises(AmctBridgeError, match="3 inputs but 2 labels"):
        load_dataset(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    np.save(tmp_path / "y.npy", np.array([[0, 1], [1, 0], [0, 1]]))  # one-hot
    assert load_dataset(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))[1].tolist() == [1, 0, 1]
    (tmp_path / "bad.npz").write_text("not numpy")
    with pytest.raises(AmctBridgeError, match="bad.npz"):
        load_dataset(str(tmp_path / "bad.npz"))
