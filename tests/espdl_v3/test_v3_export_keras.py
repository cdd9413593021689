"""ESP-DL v3 export of Keras models (issue 22 §2): every supported layer, read back, simulated.

The model below has every layer kind the v3 export takes; it is calibrated with the Keras
callback (real TF), exported for each target and feature type, read back with our reader and
run with our simulator. The simulated chip output is compared with the Keras float model run
on the chip's own (quantized) input. Filter layouts are checked against Espressif's files.
"""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
from espdl_v3_layouts import encode_filter

from amct_bridge.cli import main
from amct_bridge.errors import ExportError
from amct_bridge.espdl.v3 import espdl_bytes, read_espdl, simulate_espdl
from amct_bridge.espdl.v3.model import filter_file_order, filter_nhwc
from amct_bridge.espdl.v3.simulate import infer_target
from amct_bridge.keras import calibrate, export_espdl
from amct_bridge.records import LayerFactors, Record

DATA = Path(__file__).parent.parent / "data" / "espdl_v3"
#: chip output vs float output, max abs error / output range. s16: the issue's 1%. s8: each
#: per-tensor int8 tensor holds its range in 255 steps (half a step of rounding error per layer,
#: ~0.2% of the range), and the errors of ~12 quantized layers add up: 6% bounds them (measured
#: 1.0% .. 1.2% on the logits here; s16 below 0.01%).
TOLERANCE = {"s16": 0.01, "s8": 0.06}
L = keras.layers


def _every_layer_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3), name="img")
    c = L.Conv2D(8, 3, padding="same", name="c1")(x)
    b = L.BatchNormalization(name="bn")(c)
    a = L.Activation("swish", name="sw")(b)
    s = L.GlobalAveragePooling2D(keepdims=True, name="gap")(a)
    s = L.Conv2D(8, 1, activation="sigmoid", name="se")(s)
    m = L.Multiply(name="mul")([a, s])
    r = L.ReLU(6.0, name="r6")(m)
    u = L.UpSampling2D(name="up")(r)
    p = L.MaxPooling2D(name="mp")(u)
    d = L.Subtract(name="sub")([p, a])
    t = L.Activation("tanh", name="th")(d)
    cat = L.Concatenate(name="cat")([t, a])
    pad = L.ZeroPadding2D(((0, 1), (0, 1)), name="pad")(cat)
    dw = L.DepthwiseConv2D(3, strides=2, name="dw")(pad)
    dw = L.BatchNormalization(name="dw_bn")(dw)
    dw = L.ReLU(name="dw_relu")(dw)
    hs = L.Activation("hard_silu", name="hs")(dw)
    lk = L.LeakyReLU(0.1, name="lk")(hs)
    ad = L.Add(name="add")([lk, hs])
    ap = L.AveragePooling2D(2, name="ap")(ad)
    hg = L.Activation("hard_sigmoid", name="hg")(ap)
    dr = L.Dropout(0.5, name="drop")(hg)
    f = L.Flatten(name="fl")(dr)
    rs = L.Reshape((8, -1), name="rs")(f)
    f2 = L.Flatten(name="fl2")(rs)
    o = L.Dense(4, name="fc")(f2)
    sm = L.Softmax(name="sm")(o)
    return keras.Model(x, [o, sm])


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    model = _every_layer_model()
    data = np.random.default_rng(1).uniform(0, 1, (32, 8, 8, 3)).astype("float32")
    record = tmp_path_factory.mktemp("v3") / "record.txt"
    calibrate(model, data, record, algorithm="minmax")
    return model, data, record


def _float_outputs(model, x):
    return [np.asarray(y) for y in model.predict(x, verbose=0)]


@pytest.mark.parametrize("target", ["esp32s3", "esp32p4", "c"])
@pytest.mark.parametrize("feature_type", ["s8", "s16"])
def test_every_layer_exports_reads_back_and_follows_the_float_model(
    calibrated, tmp_path, target, feature_type
):
    model, data, record = calibrated
    out = tmp_path / "m.espdl"
    res = export_espdl(
        model,
        record,
        out,
        format="espdl",
        target=target,
        feature_type=feature_type,
        test_input=data[:1],
    )
    status = {x.name: x.status for x in res.layers}
    assert set(status) == {layer.name for layer in model.layers}  # nothing vanishes
    assert "refused" not in status.values()
    assert res.fused == {"bn": "c1", "pad": "dw", "dw_bn": "dw", "dw_relu": "dw"}
    assert status["drop"] == "passthrough"
    back = read_espdl(out)
    assert back.target == target
    assert espdl_bytes(back) == out.read_bytes()  # read -> write: the same file, byte for byte
    ops = {n.op_type for n in back.nodes}
    # int16 nearest upsampling is Concat + Reshape: the runtime's int16 Resize computes nothing
    assert ("Resize" in ops) == (feature_type == "s8")
    assert ops >= {"Conv", "Gemm", "Swish", "Sigmoid", "Mul", "Clip", "MaxPool",
                   "Sub", "Tanh", "Concat", "HardSwish", "LeakyRelu", "Add", "AveragePool",
                   "HardSigmoid", "Flatten", "Reshape", "Softmax", "GlobalAveragePool"}  # fmt: skip
    names = {n.name for n in back.nodes}
    assert {"c1", "se", "se/sigmoid", "dw", "fc", "sm"} <= names  # Keras names
    assert len(names) == len(back.nodes)  # unique: the loader finds attributes by node name
    if feature_type == "s8":  # int8 sigmoid-like activations run as lookup tables
        assert all("lut" in n.attributes for n in back.nodes if n.op_type in ("Sigmoid", "Tanh"))
    # embedded test values: the first sample, and what the simulator gives for it
    (test_in,) = back.test_inputs
    e_in = back.inputs[0].exponent
    bits = 8 if feature_type == "s8" else 16
    step = 2.0**e_in
    assert np.abs(test_in.data * step - data[:1]).max() <= step / 2 + 1e-9
    sim = simulate_espdl(back, None)
    for t in back.test_outputs:
        np.testing.assert_array_equal(sim.outputs[t.name], t.data)
    # the chip follows the float model on the chip's own input, on 8 samples
    q = np.clip(np.round(data[:8] / step), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    chip = simulate_espdl(back, q.astype(np.int8 if bits == 8 else np.int16))
    logits, probs = _float_outputs(model, (q * step).astype("float32"))
    e_fc = back.value("fc").exponent
    err = np.abs(chip.outputs["fc"] * 2.0**e_fc - logits).max() / np.ptp(logits)
    assert err <= TOLERANCE[feature_type], err
    assert np.abs(chip.outputs["sm"] - probs).max() <= TOLERANCE[feature_type]
    # every Conv/Gemm keeps mac_shift >= 0
    for node in back.nodes:
        if node.op_type in ("Conv", "Gemm"):
            w = back.initializers[node.inputs[1]].exponent
            shift = back.value(node.outputs[0]).exponent - w - back.value(node.inputs[0]).exponent
            assert shift >= 0, node.name


@pytest.mark.parametrize("path", sorted(DATA.glob("*.espdl")), ids=lambda p: p.name[:40])
def test_filter_order_matches_espressifs_files(path):
    """Our writer's layout is esp-ppq's: undo each published filter's order, redo it, equal."""
    model = read_espdl(path)
    target, _ = infer_target(model)
    checked = 0
    for node in model.nodes:
        if node.op_type not in ("Conv", "Gemm"):
            continue
        tensor = model.initializers[node.inputs[1]]
        group = int(node.attributes.get("group", 1))
        stored, _ = filter_file_order(filter_nhwc(tensor, group, target), group, target)
        np.testing.assert_array_equal(stored.reshape(-1), tensor.data.reshape(-1))
        assert list(stored.shape) == tensor.dims
        checked += 1
    assert checked


@pytest.mark.parametrize("target", ["esp32s3", "esp32p4", "c"])
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_filter_order_matches_the_element_by_element_encoder(target, dtype):
    rng = np.random.default_rng(0)
    for n, kernel, group in [(21, (3, 3), 1), (40, (1, 1), 1), (19, (3, 3), 19), (8, (3,), 1)]:
        c = 1 if group > 1 else 5
        w = rng.integers(-100, 100, (n, *kernel, c)).astype(dtype)
        stored, _ = filter_file_order(w, group, target)
        np.testing.assert_array_equal(stored.reshape(-1), encode_filter(w, group, target).ravel())


def test_cli_writes_a_file_espdl_run_checks(calibrated, tmp_path, capsys):
    model, data, record = calibrated
    path = tmp_path / "m.keras"
    model.save(path)
    np.save(tmp_path / "x.npy", data[:3])
    out = tmp_path / "model.espdl"
    args = ["export-espdl", "--model", str(path), "--record", str(record), "--format", "espdl"]
    args += ["--target", "esp32p4", "--feature-type", "s16", "-o", str(out)]
    assert main([*args, "--test-input", str(tmp_path / "x.npy")]) == 0
    assert f"wrote {out} (esp32p4, s16" in capsys.readouterr().out
    assert main(["espdl-run", str(out), "--check"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "test outputs equal: 2/2"
    assert main([*args]) == 2  # exists: nothing replaced without --overwrite
    assert "already exists" in capsys.readouterr().err
    v1 = ["export-espdl", "--model", str(path), "--record", str(record), "--target", "c"]
    assert main([*v1, "--out", str(tmp_path / "v1")]) == 2
    assert "--target c is an ESP-DL v3 target: add --format espdl" in capsys.readouterr().err
    typo = [*args[:-1], str(tmp_path / "typo.espdl"), "--target", "esp32s4"]
    with pytest.raises(SystemExit):  # argparse: invalid choice, with the valid ones
        main(typo)
    assert "invalid choice: 'esp32s4'" in capsys.readouterr().err
    assert not (tmp_path / "v1").exists() and not (tmp_path / "typo.espdl").exists()


def test_bad_input_is_refused_and_nothing_is_written(calibrated, tmp_path):
    model, _, record = calibrated
    out = tmp_path / "m.espdl"
    with pytest.raises(ExportError, match=r"target 'esp32s4'.*did you mean 'esp32s3'"):
        export_espdl(model, record, out, format="espdl", target="esp32s4")
    other = Record({"conv_of_another_model": LayerFactors(scale_d=0.1, offset_d=0)})
    with pytest.raises(ExportError, match="record layers not found in the model"):
        export_espdl(model, other, out, format="espdl", stats=f"{record}.calib.json")
    from amct_bridge.records.calibration import CalibrationStats, LayerStats, TensorRange

    stranger = CalibrationStats(layers={"conv9": LayerStats("Conv2D", TensorRange(0, 1))})
    with pytest.raises(ExportError, match="model input 'img': no calibrated range"):
        export_espdl(model, None, out, format="espdl", stats=stranger)
    with pytest.raises(ExportError, match="format 'espdl3'"):
        export_espdl(model, record, out, format="espdl3")
    assert not out.exists() and not list(tmp_path.iterdir())


def test_prelu_exports_for_esp32s3_and_c_and_is_refused_on_esp32p4(tmp_path):
    keras.utils.set_random_seed(3)
    x = keras.Input((4, 4, 2), name="x")
    c = L.Conv2D(3, 1, name="c")(x)
    p = L.PReLU(shared_axes=[1, 2], name="p")(c)
    model = keras.Model(x, p)
    model.get_layer("p").set_weights([np.float32([[[0.25, -0.5, 0.1]]])])
    data = np.random.default_rng(3).uniform(-1, 1, (8, 4, 4, 2)).astype("float32")
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    for target in ("esp32s3", "c"):
        out = tmp_path / f"{target}.espdl"
        export_espdl(model, record, out, format="espdl", target=target, feature_type="s16")
        back = read_espdl(out)
        assert [n.op_type for n in back.nodes] == ["Conv", "PRelu"]
        step = 2.0 ** back.inputs[0].exponent
        q = np.round(data / step).astype(np.int16)
        chip = simulate_espdl(back, q).outputs["p"] * 2.0 ** back.value("p").exponent
        want = model.predict((q * step).astype("float32"), verbose=0)
        assert np.abs(chip - want).max() <= 0.01 * np.ptp(want)
    with pytest.raises(ExportError, match="PReLU on esp32p4"):
        export_espdl(model, record, tmp_path / "p4.espdl", format="espdl", target="esp32p4")


def test_batch_norm_that_folds_into_no_conv(tmp_path):
    """Pre-activation: BN -> ReLU -> conv (DenseNet, ResNet v2) as Mul + Add per channel."""
    keras.utils.set_random_seed(4)
    x = keras.Input((4, 4, 3), name="x")
    y = L.ReLU(name="r0")(L.Conv2D(3, 1, name="c0")(x))
    b = L.BatchNormalization(name="pre_bn")(y)  # after a ReLU: folds into no conv
    c = L.Conv2D(4, 1, name="c")(L.ReLU(name="r")(b))
    model = keras.Model(x, c)
    rng = np.random.default_rng(4)
    model.get_layer("pre_bn").set_weights(
        [
            rng.uniform(0.5, 2, 3),
            rng.normal(0, 0.5, 3),
            rng.normal(0, 0.5, 3),
            rng.uniform(0.2, 2, 3),
        ]
    )
    data = rng.uniform(-1, 1, (8, 4, 4, 3)).astype("float32")
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    out = tmp_path / "m.espdl"
    res = export_espdl(model, record, out, format="espdl", target="c", feature_type="s16")
    assert {x.name: x.status for x in res.layers}["pre_bn"] == "exported"
    back = read_espdl(out)
    assert [n.op_type for n in back.nodes] == ["Conv", "Mul", "Add", "Relu", "Conv"]
    step = 2.0 ** back.inputs[0].exponent
    q = np.round(data / step).astype(np.int16)
    chip = simulate_espdl(back, q).outputs["c"] * 2.0 ** back.value("c").exponent
    want = model.predict((q * step).astype("float32"), verbose=0)
    assert np.abs(chip - want).max() <= 0.01 * np.ptp(want)


def test_refused_layers_are_named_unless_skipped(tmp_path):
    x = keras.Input((4, 4, 2), name="x")
    c = L.Conv2D(2, 1, name="c")(x)
    n = L.LayerNormalization(axis=1, name="ln")(c)  # not trailing axes: refused
    y = L.Conv2D(2, 1, name="after")(n)
    model = keras.Model(x, [y, c])
    record = tmp_path / "r.txt"
    calibrate(model, np.ones((2, 4, 4, 2), "float32"), record, algorithm="minmax")
    with pytest.raises(ExportError, match=r"layer 'ln' \(LayerNormalization\)"):
        export_espdl(model, record, tmp_path / "m.espdl", format="espdl", target="c")
    res = export_espdl(
        model, record, tmp_path / "m.espdl", format="espdl", target="c", skip_unsupported=True
    )
    why = {p.layer: p.reason for p in res.skipped}
    assert set(why) == {"ln", "after"} and "'ln'" in why["after"]
    assert [o.name for o in read_espdl(tmp_path / "m.espdl").outputs] == ["c"]


def test_mobilenet_v3_small_exports_without_skipping(tmp_path):
    """keras.applications MobileNetV3Small (weights=None, 96x96): hard_silu, its hard_sigmoid
    written as x + 3.0 -> ReLU6 -> * (1/6) (scalar operands), squeeze-excite Multiply,
    Rescaling on the host, final softmax; nothing refused (EfficientNetV2B0 and MobileNetV2:
    benchmarks/bench_espdl_v3.py)."""
    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV3Small(weights=None, input_shape=(96, 96, 3))
    data = np.random.default_rng(0).uniform(0, 255, (2, 96, 96, 3)).astype("float32")
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    out = tmp_path / "m.espdl"
    res = export_espdl(model, record, out, format="espdl", target="esp32s3", test_input=data)
    status = {x.name: x.status for x in res.layers}
    assert {layer.name for layer in model.layers} - {"input_layer"} <= set(status)
    assert "refused" not in status.values()
    # Keras numbers layer names per process ("rescaling_1" after another test's Rescaling)
    rescaling = next(x.name for x in model.layers if isinstance(x, keras.layers.Rescaling))
    assert status[rescaling] == "host"
    back = read_espdl(out)
    ops = {n.op_type for n in back.nodes}
    assert {"HardSwish", "Mul", "Add", "Clip", "GlobalAveragePool", "Softmax"} <= ops
    consts = [n for n in back.nodes if n.op_type == "Add" and n.inputs[1] in back.initializers]
    assert consts  # x + 3.0: the constant at the Add's exponent
    for node in consts:
        e = back.value(node.outputs[0]).exponent
        assert back.initializers[node.inputs[1]].data[0] * 2.0**e == 3.0
    sim = simulate_espdl(back, None)
    for t in back.test_outputs:
        np.testing.assert_array_equal(sim.outputs[t.name], t.data)


def test_espdl_eval_format_espdl(calibrated, tmp_path, capsys):
    """espdl-eval --format espdl: float / fake-quant / simulated-v3 accuracy and a row per
    named tensor; the logits' SNR recomputed here from the simulator and Keras."""
    model, data, record = calibrated
    path = tmp_path / "m.keras"
    model.save(path)
    out = tmp_path / "m.espdl"
    export_espdl(model, record, out, format="espdl", target="esp32s3", feature_type="s16")
    labels = _float_outputs(model, data)[0].argmax(axis=1)
    np.savez(tmp_path / "d.npz", x=data, y=labels)
    args = ["espdl-eval", "--format", "espdl", "--export", str(out), "--model", str(path)]
    assert main([*args, "--record", str(record), "--data", str(tmp_path / "d.npz")]) == 0
    text = capsys.readouterr().out
    assert "float accuracy:      1.0000" in text
    assert "fake-quant accuracy: " in text and "(esp32s3, bit-exact simulator)" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line[:1].isalpha()}
    assert {"bn", "sw", "se", "mul", "cat", "dw_relu", "fc", "sm"} <= set(rows)  # chain ends
    back = read_espdl(out)
    e_in = back.inputs[0].exponent
    q = np.clip(np.floor(data * 2.0**-e_in + 0.5), -32768, 32767).astype(np.int16)
    chip = simulate_espdl(back, q).outputs["fc"] * 2.0 ** back.value("fc").exponent
    ref = _float_outputs(model, data)[0]
    snr = 10 * np.log10(np.sum(ref**2) / np.sum((ref - chip) ** 2))
    assert float(rows["fc"][3]) == pytest.approx(snr, abs=0.06)
    assert main([*args[:-4], "--export", str(tmp_path), "--model", str(path), "--data",
                 str(tmp_path / "d.npz")]) == 2  # fmt: skip
