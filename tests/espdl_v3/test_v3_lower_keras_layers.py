"""Issue 30: Keras layers the ESP-DL v3 export now lowers to the runtime's ops, each in a tiny
net exported for esp32s3 and esp32p4, written, read back and checked as `espdl-run --check`
does (the embedded test outputs are what the simulator computes for the file read back), and
the simulated chip compared with the Keras float model run on the chip's own quantized input:
s16 within 1 % of the output range and the arg max equal on >= 95 % of the inputs (the issue's
bar); s8 within the error its 255 steps per tensor allow (bound stated per test)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from v3_checks import check_lowering

from amct_bridge.errors import ExportError
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.keras import calibrate, export_espdl

L = keras.layers
TARGETS = ("esp32s3", "esp32p4")


def _check(model, tmp_path, s8_bound, *, data=None, samples=32, ops=(), capsys=None):
    """Calibrate, export for both targets and feature types, check; returns the op types."""
    if data is None:
        rng = np.random.default_rng(1)
        data = rng.uniform(-1, 1, (samples, *model.input_shape[1:])).astype("float32")
    seen, _ = check_lowering(model, data, tmp_path, s8_bound, capsys)
    assert set(ops) <= seen, seen
    return seen


def test_dilated_convs_2d_and_1d(tmp_path, capsys):
    keras.utils.set_random_seed(0)
    x = keras.Input((12, 12, 3))
    y = L.Conv2D(8, 3, dilation_rate=2, padding="same", activation="relu", name="d2")(x)
    y = L.Conv2D(8, 3, dilation_rate=(1, 3), name="d13")(y)
    y = L.Reshape((-1, 8), name="seq")(y)
    y = L.Conv1D(6, 3, dilation_rate=2, padding="causal", name="d1")(y)
    y = L.Dense(4, name="fc")(L.Flatten(name="fl")(y))
    seen = _check(keras.Model(x, y), tmp_path, 0.06, ops={"Conv", "Gemm"}, capsys=capsys)
    assert "Conv" in seen


def test_elu_gelu_and_tabulated_activations(tmp_path):
    keras.utils.set_random_seed(0)
    x = keras.Input((16,))
    h = L.Dense(16, name="fc1")(x)
    e = L.Activation("elu", name="elu")(h)
    g = L.Activation("gelu", name="gelu")(h)
    k = L.ELU(0.5, name="elu_layer")(h)
    s = L.Activation("softplus", name="softplus")(h)
    d = L.Dense(8, activation="gelu", name="fc_gelu")(h)
    y = L.Concatenate(name="cat")([e, g, k, s, d])
    y = L.Dense(5, name="out")(y)
    data = np.random.default_rng(0).normal(0, 2, (64, 16)).astype("float32")
    seen = _check(keras.Model(x, y), tmp_path, 0.06, data=data)
    assert {"Elu", "Gelu", "LUT"} <= seen  # s8 the runtime's ops, s16 LUT tables


def test_maximum_minimum_cropping_and_bilinear_upsampling(tmp_path):
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3))
    a = L.Conv2D(6, 3, padding="same", name="a")(x)
    b = L.Conv2D(6, 3, padding="same", name="b")(x)
    m = L.Maximum(name="max")([a, b])
    n = L.Minimum(name="min")([a, b, L.Conv2D(6, 1, name="c")(x)])
    c = L.Cropping2D(((1, 0), (0, 2)), name="crop")(m)
    u = L.UpSampling2D(2, interpolation="bilinear", name="bil")(n)
    p = L.MaxPooling2D(2, name="mp")(u)
    y = L.Concatenate(name="cat")([L.Flatten(name="f1")(c), L.Flatten(name="f2")(p)])
    y = L.Dense(4, name="fc")(y)
    ops = {"ReduceMax", "ReduceMin", "Slice", "Concat"}
    seen = _check(keras.Model(x, y), tmp_path, 0.06, ops=ops)
    assert "Resize" in seen and "Pad" in seen  # s8: Resize linear; s16: edge Pad + Conv


def test_unet_with_transposed_convs_and_fpn_upsampling(tmp_path):
    keras.utils.set_random_seed(0)
    x = keras.Input((16, 16, 3))
    e1 = L.Conv2D(8, 3, padding="same", activation="relu", name="e1")(x)
    p1 = L.MaxPooling2D(name="p1")(e1)
    e2 = L.Conv2D(16, 3, padding="same", activation="relu", name="e2")(p1)
    p2 = L.MaxPooling2D(name="p2")(e2)
    b = L.Conv2D(16, 3, padding="same", activation="relu", name="b")(p2)
    u2 = L.Conv2DTranspose(16, 2, strides=2, name="u2")(b)  # valid, kernel = stride
    d2 = L.Conv2D(16, 3, padding="same", activation="relu", name="d2")(
        L.Concatenate(name="c2")([u2, e2])
    )
    u1 = L.Conv2DTranspose(8, 3, strides=2, padding="same", name="u1")(d2)
    u1 = L.BatchNormalization(name="u1_bn")(u1)
    u1 = L.ReLU(name="u1_relu")(u1)
    up = L.UpSampling2D(2, name="fpn_up")(b)  # FPN-style nearest upsampling + add
    lat = L.Conv2D(16, 1, name="lat")(e2)
    fpn = L.Add(name="fpn_add")([up, lat])
    head = L.Conv2D(8, 1, name="fpn_head")(L.UpSampling2D(2, name="fpn_up2")(fpn))
    y = L.Conv2D(2, 1, name="seg")(L.Concatenate(name="c1")([u1, e1, head]))
    model = keras.Model(x, y)
    bn = model.get_layer("u1_bn")
    bn.set_weights(
        [w + np.random.default_rng(2).uniform(0.1, 0.5, w.shape) for w in bn.get_weights()]
    )
    seen = _check(model, tmp_path, 0.08, samples=16, ops={"InsertZeros", "Conv", "Concat"})
    assert "Relu" not in seen  # the BN and ReLU after a transposed conv fold into its Conv


def test_transposed_conv_1d_valid(tmp_path):
    keras.utils.set_random_seed(0)
    x = keras.Input((10, 4))
    y = L.Conv1DTranspose(6, 3, strides=2, name="t1")(x)
    y = L.Dense(3, name="fc")(L.Flatten(name="fl")(y))
    _check(keras.Model(x, y), tmp_path, 0.06, ops={"InsertZeros", "Conv"})


def test_rms_normalization_and_depthwise_groups(tmp_path):
    keras.utils.set_random_seed(0)
    x = keras.Input((6, 6, 8))
    y = L.Conv2D(8, 3, groups=8, padding="same", name="dw_as_groups")(x)  # ConvNeXt's form
    y = L.RMSNormalization(name="rms")(y)
    y = L.Dense(4, name="fc")(L.Flatten(name="fl")(y))
    model = keras.Model(x, y)
    model.get_layer("rms").set_weights([np.linspace(0.5, 1.5, 8).astype("float32")])
    seen = _check(model, tmp_path, 0.06, ops={"RMSNormalization", "Conv"})
    assert "Conv" in seen


def test_grouped_conv_is_refused_with_the_runtime_reason(tmp_path):
    x = keras.Input((6, 6, 4))
    y = L.Conv2D(8, 3, groups=2, name="grouped")(x)
    model = keras.Model(x, L.Dense(2, name="fc")(L.Flatten(name="fl")(y)))
    data = np.random.default_rng(0).uniform(-1, 1, (8, 6, 6, 4)).astype("float32")
    calibrate(model, data, tmp_path / "r.txt", algorithm="minmax")
    with pytest.raises(ExportError) as err:
        export_espdl(model, tmp_path / "r.txt", tmp_path / "m.espdl", format="espdl")
    assert (
        "layer 'grouped' (Conv2D): Conv2D with groups 2 (not depthwise): the ESP-DL v3 "
        "runtime's Conv runs group 1 or depthwise (group = channels = filters) only; split the "
        "layer into 2 convs on channel slices and concatenate their outputs" in str(err.value)
    )
    assert not (tmp_path / "m.espdl").exists()


def _transformer_block() -> keras.Model:
    keras.utils.set_random_seed(0)
    d = 16
    x = keras.Input((8, d), name="tokens")
    q = L.Dense(d, name="q")(x)
    k = L.Dense(d, name="k")(x)
    v = L.Dense(d, name="v")(x)
    kt = keras.ops.transpose(k, (0, 2, 1))
    scores = keras.ops.matmul(q, kt) * (1.0 / np.sqrt(d))
    attn = L.Softmax(name="attn")(scores)
    ctx = keras.ops.matmul(attn, v)
    h = L.LayerNormalization(name="ln1")(L.Add(name="res1")([x, L.Dense(d, name="o")(ctx)]))
    f = L.Dense(2 * d, activation="gelu", name="ff1")(h)
    h = L.LayerNormalization(name="ln2")(L.Add(name="res2")([h, L.Dense(d, name="ff2")(f)]))
    y = L.Dense(4, name="cls")(L.GlobalAveragePooling1D(name="gap")(h))
    return keras.Model(x, y)


def test_transformer_block_with_layer_norm_attention_and_gelu(tmp_path):
    model = _transformer_block()
    data = np.random.default_rng(0).normal(0, 1, (64, 8, 16)).astype("float32")
    ops = {"MatMul", "Softmax", "Transpose", "LayerNormalization", "Gemm"}
    _check(model, tmp_path, 0.1, data=data, ops=ops)


def test_convnext_tiny_exports_with_nothing_refused(tmp_path):
    """keras.applications ConvNeXtTiny: its depthwise convs are Conv2D(groups=C) (a depthwise
    conv), its LayerScale a per-channel Mul, its LayerNormalization and GELU Dense lowered."""
    keras.utils.set_random_seed(0)
    model = keras.applications.ConvNeXtTiny(weights=None, input_shape=(32, 32, 3), classes=4)
    data = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    calibrate(model, data, tmp_path / "r.txt", algorithm="minmax")
    out = tmp_path / "m.espdl"
    res = export_espdl(model, tmp_path / "r.txt", out, format="espdl", test_input=data[:1])
    assert "refused" not in {x.status for x in res.layers}
    back = read_espdl(out)
    kinds = {x.kind for x in res.layers if x.status == "exported"}
    assert {"LayerScale", "LayerNormalization"} <= kinds
    assert {"Mul", "LayerNormalization", "Gelu", "Conv"} <= {n.op_type for n in back.nodes}
    sim = simulate_espdl(back, None)
    for t in back.test_outputs:
        np.testing.assert_array_equal(sim.outputs[t.name], t.data)
