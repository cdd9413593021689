"""Power-of-two QAT in Keras (``quantize_aware(..., power_of_two=True)``): the in-graph math
against the core's numpy reference and the ESP-DL exporter's own rules, TQT's threshold
gradient by hand, and on scikit-learn's digits the ESP-DL v3 export of the trained model:
its exponents are the trained ones, the simulated esp32s3 chip computes the QAT model's own
integers, and its accuracy is not below post-training quantization's.

Independent references: ``amct_bridge.quant.espdl`` (the exporter's exponent rules),
``amct_bridge.espdl.v3`` (the bit-exact chip simulator), numpy formulas written here.
"""

from __future__ import annotations

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from amct_bridge.errors import QuantError
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.espdl.v3.evaluation import quantize_input
from amct_bridge.keras import calibrate, export_espdl
from amct_bridge.keras.qat import (
    QATObserve,
    QATQuant,
    link_quantizers,
    qat_record,
    quantize_aware,
    save_qat_record,
    strip_qat,
)
from amct_bridge.keras.qat.fake_quant import (
    fake_quant_pow2,
    threshold_exponent,
    weight_exponent,
)
from amct_bridge.keras.qat.sidecar import pow2_quantizers
from amct_bridge.quant import qat as core
from amct_bridge.quant.espdl import auto_exponent, range_to_exponent
from amct_bridge.records import load, validate
from amct_bridge.records.calibration import load_stats, sidecar_path

TARGET = "esp32s3"


# --- the math --------------------------------------------------------------------------------


def test_fake_quant_matches_the_numpy_reference_and_the_chip_rounding():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 4, 4000).astype(np.float32)
    x[:8] = [0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 500.0, -500.0]  # ties (at e = 0) and clipping
    for e in (-7, -3, 0, 2):
        got = np.asarray(fake_quant_pow2(x, float(e)))
        want = core.fake_quant_pow2(x, e)
        assert np.array_equal(got, want), e
        # by hand: half up (esp32s3 / C kernels), int8 saturation
        q = np.clip(np.floor(x.astype(np.float64) / 2.0**e + 0.5), -128, 127)
        assert np.array_equal(want, (q * 2.0**e).astype(np.float32)), e
    assert core.fake_quant_pow2(np.float32([-0.5, -1.5]), 0).tolist() == [0.0, -1.0]


def test_threshold_and_weight_exponents_are_the_exporters_rule():
    """The exponent of a threshold t is the smallest e with t <= 127 * 2^e (the exporter's
    range_to_exponent); a kernel's is the exporter's auto_exponent, also at exact powers of two
    and one float32 ulp either side of them."""
    for t in (0.01, 0.5, 1.0, 6.0, 127 / 64, 100.0, 127.0, 128.0):
        want = range_to_exponent(-t, t)
        assert core.threshold_exponent(np.log2(t)) == want, t
        assert float(threshold_exponent(np.float32(np.log2(t)))) == want, t
    kernels = []
    for k in (-9, -6, -1, 0, 3):
        top = np.float32(127 * 2.0**k)
        for v in (top, np.nextafter(top, np.float32(0)), np.nextafter(top, np.float32(1e9))):
            kernels.append(np.float32([[0.1 * v, -v], [0.0, 0.5 * v]]))
    kernels.append(np.random.default_rng(1).normal(0, 0.2, (3, 3, 4, 8)).astype(np.float32))
    kernels.append(np.zeros((2, 2), np.float32))
    for kernel in kernels:
        want = auto_exponent(kernel, 8)
        assert float(weight_exponent(kernel)) == want
        assert core.weight_exponent(kernel) == want


def test_tqt_gradient_of_the_log2_threshold():
    """d y / d log2 t = ln 2 * 2^e * (q - x / 2^e) inside the range, ln 2 * 2^e * qmin / qmax
    where clipped (Jain et al. 2020, the straight-through ceil); d y / d x: 1 inside, 0 out."""
    x = tf.constant(np.float32([0.3, -0.7, 2.2, 9.0, -20.0]))
    log2t = tf.Variable(np.float32(np.log2(6.0)))  # e = -4, range [-8, 7.9375]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = fake_quant_pow2(x, threshold_exponent(log2t))
        total = tf.reduce_sum(y * np.float32([1, 2, 3, 4, 5]))
    s = 2.0**-4
    v = x.numpy().astype(np.float64) / s
    q = np.clip(np.floor(v + 0.5), -128, 127)
    inside = (v >= -128) & (v <= 127)
    per = math.log(2) * s * np.where(inside, q - v, q)
    want = float(np.sum(per * [1, 2, 3, 4, 5]))
    assert tape.gradient(total, log2t).numpy() == pytest.approx(want, rel=1e-5)
    assert tape.gradient(total, x).numpy().tolist() == [1, 2, 3, 0, 0]


def test_options_that_cannot_train_one_exponent_per_tensor_are_refused():
    with pytest.raises(QuantError, match="dst_type must be 'INT8'"):
        quantize_aware(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), "INT4",
                       power_of_two=True)  # fmt: skip
    x = keras.Input((4,))
    shared = keras.layers.Dense(4, name="shared")
    model = keras.Model(x, shared(keras.layers.ReLU()(shared(x))))
    with pytest.raises(QuantError, match="'shared' is called at several nodes"):
        quantize_aware(model, power_of_two=True)


# --- digits: PTQ vs power-of-two QAT on the v3 chip ------------------------------------------


def small_net() -> keras.Model:
    """Conv+BN+ReLU, SeparableConv+BN+swish, Add, MaxPool, Conv+hard-swish, GAP, Dense,
    Softmax: every kind of quantizer (own input, fed input, separable mid, value-keeping ReLU
    and max pool, requantizing Add, lookup-table activations, float Softmax output)."""
    layers = keras.layers
    x = keras.Input((8, 8, 1), name="image")
    a = layers.Conv2D(8, 3, padding="same", use_bias=False, name="c1")(x)
    a = layers.ReLU(name="r1")(layers.BatchNormalization(name="bn1")(a))
    b = layers.SeparableConv2D(8, 3, padding="same", use_bias=False, name="sep")(a)
    b = layers.Activation("swish", name="sw2")(layers.BatchNormalization(name="bn2")(b))
    s = layers.MaxPooling2D(2, name="mp")(layers.Add(name="add")([a, b]))
    c = layers.Activation("hard_swish", name="hs3")(layers.Conv2D(16, 3, name="c3")(s))
    y = layers.Dense(10, name="fc")(layers.GlobalAveragePooling2D(name="gap")(c))
    return keras.Model(x, layers.Softmax(name="prob")(y), name="small_net")


def chip(model, record, path, x):
    """Export ``model`` as v3 (esp32s3, s8) and run the simulator on ``x``."""
    res = export_espdl(model, record, path, format="espdl", target=TARGET, feature_type="s8")
    espdl = read_espdl(path)
    return res, espdl, simulate_espdl(espdl, quantize_input(espdl, x, TARGET), TARGET)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Standardized digits (rare strokes are 10-20 sigma outliers), a float model briefly
    trained, its PTQ export, and 2 epochs of power-of-two QAT with its export."""
    keras.utils.set_random_seed(0)
    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[..., None]
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, data.target, test_size=0.25, random_state=0, stratify=data.target
    )
    mean, std = x_tr.mean(axis=0), x_tr.std(axis=0) + 0.01
    x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    loss = "sparse_categorical_crossentropy"
    model = small_net()
    model.compile(keras.optimizers.Adam(1e-2), loss)
    model.fit(x_tr, y_tr, epochs=6, batch_size=64, verbose=0)
    out = tmp_path_factory.mktemp("pow2")
    calibrate(model, x_tr[:256], out / "ptq.txt")
    _, _, ptq = chip(model, out / "ptq.txt", out / "ptq.espdl", x_te)
    qat = quantize_aware(model, power_of_two=True)
    qat.compile(keras.optimizers.Adam(1e-3), loss)
    qat.fit(x_tr, y_tr, epochs=2, batch_size=64, verbose=0)
    save_qat_record(qat, out / "qat.txt")
    stripped = strip_qat(qat)
    res, espdl, sim = chip(stripped, out / "qat.txt", out / "qat.espdl", x_te)
    return dict(
        model=model, qat=qat, stripped=stripped, res=res, espdl=espdl, sim=sim, ptq=ptq,
        x=x_te, y=y_te, record=out / "qat.txt",
    )  # fmt: skip


def accuracy(probs, y) -> float:
    return float(np.mean(np.argmax(probs, axis=1) == y))


#: trained quantizer (pow2_quantizers' names) -> the chip tensor it gives (c1 + its ReLU are one
#: Conv on the chip, named after the ReLU; a separable conv is two Convs)
CHIP_TENSORS = {
    "c1:input": "image",
    "c1": "r1",
    "sep:mid": "sep/depthwise",
    "sep": "sep/pointwise",
    "sw2": "sw2",
    "add": "add",
    "c3": "c3",
    "hs3": "hs3",
    "gap": "gap",
    "fc": "fc",
}


def trained_exponents(qat) -> dict[str, int]:
    return {
        name: core.threshold_exponent(float(np.asarray(log2t)))
        for name, (log2t, _) in pow2_quantizers(qat).items()
    }


def test_the_exported_exponents_are_the_trained_ones(trained):
    qat, sim, espdl = trained["qat"], trained["sim"], trained["espdl"]
    own = trained_exponents(qat)
    assert sorted(own) == sorted(CHIP_TENSORS)
    for name, tensor in CHIP_TENSORS.items():
        assert sim.exponents[tensor] == own[name], name
    assert sim.exponents["mp"] == own["add"]  # the max pool keeps the Add's grid
    # weights: per tensor, at the exponent the QAT graph used for the trained kernel
    filters = {n.name: espdl.initializers[n.inputs[1]].exponents for n in espdl.nodes
               if n.op_type in ("Conv", "Gemm")}  # fmt: skip
    sep = qat.get_layer("sep").layer
    kernels = {
        "c1": qat.get_layer("c1").layer.kernel,
        "sep/depthwise": sep.depthwise_kernel,
        "sep/pointwise": sep.pointwise_kernel,
        "c3": qat.get_layer("c3").layer.kernel,
        "fc": qat.get_layer("fc").layer.kernel,
    }
    assert filters == {name: [int(weight_exponent(k))] for name, k in kernels.items()}
    assert trained["res"].warnings == []


def test_the_chip_computes_the_qat_models_integers(trained):
    """Tolerance: every integer of every tensor equal (measured: all equal, the Softmax
    probabilities within 4e-7), at most one step in 0.1 % of a tensor allowed."""
    qat, sim, x = trained["qat"], trained["sim"], trained["x"]
    tensors = {"r1": "r1", "sep": "sep/pointwise", "sw2": "sw2", "add": "add", "mp": "mp",
               "c3": "c3", "hs3": "hs3", "gap": "gap", "fc": "fc"}  # fmt: skip
    probe = keras.Model(qat.input, [qat.get_layer(n).output for n in tensors])
    for (layer, tensor), value in zip(tensors.items(), probe.predict(x, verbose=0), strict=True):
        e = sim.exponents[tensor]
        steps = np.abs(sim.values[tensor].reshape(value.shape) * 2.0**e - value) / 2.0**e
        assert steps.max() <= 1 and np.mean(steps == 0) >= 0.999, (layer, steps.max())
    probs = qat.predict(x, verbose=0)
    assert np.abs(sim.outputs["prob"] - probs).max() < 1e-5
    assert np.array_equal(sim.outputs["prob"].argmax(axis=1), probs.argmax(axis=1))


def test_chip_accuracy_after_pow2_qat_is_not_below_ptq(trained):
    """Measured (450 test images; the float model is briefly trained, so part of the gain is
    the two QAT epochs): seed 0 float 0.940, PTQ chip 0.940, pow2-QAT chip 0.951; seeds 1-3
    PTQ 0.922 / 0.909 / 0.924, pow2-QAT 0.949 / 0.947 / 0.958."""
    y = trained["y"]
    ptq = accuracy(trained["ptq"].outputs["prob"], y)
    pow2 = accuracy(trained["sim"].outputs["prob"], y)
    float_acc = accuracy(trained["model"].predict(trained["x"], verbose=0), y)
    assert pow2 >= ptq, (float_acc, ptq, pow2)
    assert pow2 >= float_acc - 0.01, (float_acc, ptq, pow2)


def test_record_and_sidecar_carry_the_trained_exponents(trained):
    qat, record_path = trained["qat"], trained["record"]
    record = load(record_path)
    assert validate(record) == [] and list(record.layers) == [
        "c1", "sep/depthwise", "sep/pointwise", "c3", "fc",
    ]  # fmt: skip
    e = trained_exponents(qat)
    inputs = {"c1": e["c1:input"], "sep/depthwise": e["c1"], "sep/pointwise": e["sep:mid"],
              "c3": e["add"], "fc": e["gap"]}  # fmt: skip
    for key, f in record.layers.items():
        assert (f.scale_d, f.offset_d, f.dst_type) == (2.0 ** inputs[key], 0, "INT8"), key
        assert len(f.scale_w) == 1 and f.offset_w == [0]
    kernel = np.asarray(qat.get_layer("c3").layer.kernel)
    assert record.layers["c3"].scale_w == [2.0 ** auto_exponent(kernel)]
    stats = load_stats(sidecar_path(record_path))
    assert stats.algorithm == "qat-pow2-learned"
    doc = json.loads(sidecar_path(record_path).read_text())["layers"]
    for node, exponent in (("c1", e["c1"]), ("bn1", e["c1"]), ("r1", e["c1"]), ("add", e["add"]),
                           ("mp", e["add"]), ("gap", e["gap"]), ("fc", e["fc"])):  # fmt: skip
        rng = doc[node]["output"]
        assert range_to_exponent(rng["min"], rng["max"]) == exponent, node
        assert rng["observed_max"] <= rng["max"] + 1e-6 or node == "fc"
    assert doc["r1"]["output"]["min"] == 0.0  # a ReLU's range starts at 0
    assert range_to_exponent(doc["c1"]["input"]["min"], doc["c1"]["input"]["max"]) == e["c1:input"]


# --- starting point, saving ------------------------------------------------------------------


def tiny() -> keras.Model:
    keras.utils.set_random_seed(3)
    x = keras.Input((6, 6, 1))
    y = keras.layers.ReLU(name="r")(keras.layers.Conv2D(4, 3, name="conv")(x))
    y = keras.layers.Activation("sigmoid", name="sig")(keras.layers.Conv2D(4, 3, name="c2")(y))
    return keras.Model(x, keras.layers.Dense(3, name="fc")(keras.layers.Flatten()(y)))


def test_init_record_starts_every_threshold_at_the_calibration(tmp_path):
    """From a PTQ record and its sidecar: before any training step each quantizer already
    has the exponent the PTQ export gives that tensor (TQT's calibrated start)."""
    model = tiny()
    x = np.random.default_rng(0).normal(0, 1, (32, 6, 6, 1)).astype(np.float32)
    calibrate(model, x, tmp_path / "ptq.txt", algorithm="minmax")
    qat = quantize_aware(model, power_of_two=True, init_record=tmp_path / "ptq.txt")
    quantizers = pow2_quantizers(qat)
    stats = load_stats(sidecar_path(tmp_path / "ptq.txt"))
    for node in ("conv", "c2", "sig", "fc"):
        rng = stats.layers[node].output
        got = core.threshold_exponent(float(np.asarray(quantizers[node][0])))
        assert got == range_to_exponent(rng.min, rng.max), node
    f = load(tmp_path / "ptq.txt").layers["conv"]
    lo, hi = core.record_range(f.scale_d, f.offset_d, 8)
    got = core.threshold_exponent(float(np.asarray(quantizers["conv:input"][0])))
    assert got == range_to_exponent(lo, hi)
    # the first forward pass already quantizes (no pass-through of an unseen range)
    y = qat.predict(x[:4], verbose=0)
    assert not np.allclose(y, model.predict(x[:4], verbose=0), atol=1e-7)


def test_a_saved_pow2_qat_model_loads_and_computes_the_same(tmp_path):
    model = tiny()
    x = np.random.default_rng(1).normal(0, 1, (16, 6, 6, 1)).astype(np.float32)
    qat = quantize_aware(model, power_of_two=True, activation_range="ema")
    qat.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse")
    qat.fit(x, np.zeros((16, 3)), batch_size=8, epochs=1, verbose=0)
    kinds = {type(layer).__name__ for layer in qat.layers}
    assert {"QATQuant", "QATObserve"} <= kinds
    assert not qat.get_layer("r").quantize_output  # value-keeping: conv's quantizer holds it
    assert qat.get_layer("sig").quantize_output and qat.get_layer("c2").input_source == "conv"
    qat.save(tmp_path / "qat.keras")
    again = link_quantizers(keras.saving.load_model(tmp_path / "qat.keras"))
    assert isinstance(again.get_layer("c2"), QATQuant)
    assert isinstance(again.get_layer("sig"), QATObserve)
    assert np.array_equal(again.predict(x, verbose=0), qat.predict(x, verbose=0))
    assert qat_record(again).layers == qat_record(qat).layers


def test_esp_dl_v1_export_takes_the_trained_exponents(tmp_path):
    """ESP-DL v1 (Conv + BN + ReLU, Dense): the chains' exponents are the trained ones and the
    record's power-of-two scale_w is not taken for another model's (v1 stores a bias at the
    output exponent, unlike v3's e_in + e_w: bit-exactness is v3's)."""
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 1))
    y = keras.layers.Conv2D(4, 3, use_bias=False, name="c1")(x)
    y = keras.layers.ReLU(name="r1")(keras.layers.BatchNormalization(name="bn1")(y))
    model = keras.Model(x, keras.layers.Dense(10, name="fc")(keras.layers.Flatten()(y)))
    data = np.random.default_rng(0).normal(size=(64, 8, 8, 1)).astype(np.float32)
    qat = quantize_aware(model, power_of_two=True)
    qat.compile(optimizer="adam", loss="mse")
    qat.fit(data, np.zeros((64, 10)), batch_size=16, verbose=0)
    save_qat_record(qat, tmp_path / "qat.txt")
    res = export_espdl(strip_qat(qat), tmp_path / "qat.txt", tmp_path / "v1", feature_type="s8")
    assert not [w for w in res.warnings if "scale_w" in w]
    report = json.loads((tmp_path / "v1" / "export.json").read_text())
    got = {layer["name"]: (layer["input_exponent"], layer["output_exponent"])
           for layer in report["layers"]}  # fmt: skip
    e = trained_exponents(qat)
    assert got == {"c1": (e["c1:input"], e["c1"]), "fc": (e["c1"], e["fc"])}
