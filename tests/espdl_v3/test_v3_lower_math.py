"""Issue 30: keras.ops math (divide, sqrt, exp, log, power, negative), reductions (max, min,
sum, mean over axes, keepdims both ways), GlobalMaxPooling1D, Embedding and padded average
pools, each in a tiny net exported for esp32s3 and esp32p4 at s8 and s16, written, read back
and checked as ``espdl-run --check`` does (the embedded test outputs are what the simulator
computes for the file read back), and every model output of the simulated chip compared with
the Keras float model run on the chip's own quantized input: s16 within 1 % of the output's
range (the issue's bar); s8 within the bound stated per test (a step of a 255-level format is
0.4 % of a range it fills, and outputs such as sqrt(b) on [1, 2] fill a third of theirs).
Refusals name the layer and the runtime's reason."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from v3_checks import check_lowering

from amct_bridge.errors import ExportError
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.keras import calibrate, export_espdl

L = keras.layers
ops = keras.ops
COMBOS = (("esp32s3", "s8"), ("esp32s3", "s16"), ("esp32p4", "s8"), ("esp32p4", "s16"))


def _check(model, data, tmp_path, s8_bound, capsys=None) -> tuple[set, dict]:
    """The v3 op types written and the largest error per (target, feature type)."""
    return check_lowering(model, data, tmp_path, s8_bound, capsys)


def _calibrated(model, data, tmp_path):
    calibrate(model, data, tmp_path / "r.txt", algorithm="minmax")
    return tmp_path / "r.txt"


def test_divide_sqrt_exp_log_power_negative_follow_keras(tmp_path, capsys):
    keras.utils.set_random_seed(0)
    x = keras.Input((6, 6, 4), name="x")
    a = L.Conv2D(4, 1, name="a")(x)
    b = L.Activation("sigmoid", name="sig")(L.Conv2D(4, 1, name="bc")(x)) * 3.0 + 0.5
    outs = [
        ops.divide(a, b), a / 4.0, 2.0 / b,  # Div of two tensors, by a number, of a number
        ops.sqrt(b), ops.exp(a), ops.log(b),
        ops.power(a, 2.0), b**a, ops.power(2.0, a),  # Pow: number / tensor on either side
        ops.negative(a), -b,
    ]  # fmt: skip
    data = np.random.default_rng(1).uniform(-1, 1, (32, 6, 6, 4)).astype("float32")
    seen, worst = _check(keras.Model(x, outs), data, tmp_path, 0.05, capsys)
    assert {"Div", "Sqrt", "Exp", "Log", "Pow", "Neg"} <= seen
    assert "Gather" not in seen and max(worst.values()) > 0  # a real comparison, not 0 == 0


def test_unary_ops_carry_an_int8_table_and_compute_in_int16(tmp_path):
    """s8: the Sqrt/Exp/Log nodes carry a 256-entry table (their loaders run it as the LUT
    module), each entry the exact rounding of the float function; s16: no table (the module
    computes in float32)."""
    x = keras.Input((8,), name="x")
    y = ops.exp(L.Dense(8, name="fc")(x))
    model = keras.Model(x, y)
    data = np.random.default_rng(0).uniform(-1, 1, (16, 8)).astype("float32")
    record = _calibrated(model, data, tmp_path)
    for ft, size in (("s8", 256), ("s16", None)):
        res = export_espdl(model, record, None, format="espdl", target="c", feature_type=ft)
        node = next(n for n in res.model.nodes if n.op_type == "Exp")
        lut = node.attributes.get("lut")
        if size is None:
            assert lut is None
            continue
        table = res.model.initializers[lut]
        assert table.data.size == size
        e_in = res.exponents["fc"][0]
        e_out = res.exponents[node.outputs[0]][0]
        xs = np.arange(-128, 128) * 2.0**e_in
        expect = np.clip(np.floor(np.exp(xs) * 2.0**-e_out + 0.5), -128, 127)
        np.testing.assert_array_equal(table.data.reshape(-1), expect)


def test_reductions_keepdims_both_ways_and_global_max_pool_1d(tmp_path):
    keras.utils.set_random_seed(0)
    x = keras.Input((4, 5, 6), name="x")
    a = L.Conv2D(6, 1, name="a")(x)
    seq = L.Reshape((20, 6), name="seq")(a)
    outs = [
        ops.max(a, axis=(1, 2)), ops.min(a, axis=-1, keepdims=True),
        ops.sum(a, axis=1), ops.mean(a, axis=[1, 2], keepdims=True),
        ops.max(a, axis=(1, 3)),  # axes alternating into 4 groups: the runtime's limit
        ops.mean(seq, axis=1), L.GlobalMaxPooling1D(name="gmp")(seq),
    ]  # fmt: skip
    data = np.random.default_rng(1).uniform(-1, 1, (32, 4, 5, 6)).astype("float32")
    seen, _ = _check(keras.Model(x, outs), data, tmp_path, 0.02)
    assert {"ReduceMax", "ReduceMin", "ReduceSum", "ReduceMean", "MaxPool"} <= seen


def test_reduction_refusals_name_the_layer_and_the_reason(tmp_path):
    x = keras.Input((4, 3), name="x")
    a = L.Dense(3, name="fc")(x)
    data = np.random.default_rng(0).uniform(-1, 1, (8, 4, 3)).astype("float32")
    cases = {
        "over axis None: it reduces the batch axis": ops.sum(a),
        "with initial=0.0: the ESP-DL v3 ReduceMax has no initial value": ops.max(
            a, axis=1, initial=0.0
        ),
        "Divide of 1 tensor(s) and 0 number(s) and a constant array": ops.divide(
            a, np.full((4, 3), 2.0, "float32")
        ),
    }
    for words, y in cases.items():
        model = keras.Model(x, [a, y])
        name = y._keras_history.operation.name
        record = _calibrated(model, data, tmp_path)
        with pytest.raises(ExportError) as err:
            export_espdl(model, record, None, format="espdl")
        assert f"layer {name!r}" in str(err.value) and words in str(err.value), str(err.value)


def test_embedding_is_a_table_lookup_of_the_integer_input(tmp_path):
    """The runtime's Gather takes constant indices only, so an Embedding is one LUT per
    feature on the model's integer input: int8 indices at exponent 0, int16 at -10 (the
    index · 1024, a 65-entry table of step 1024 for 20 rows)."""
    keras.utils.set_random_seed(0)
    t = keras.Input((6,), dtype="int32", name="tokens")
    e = L.Embedding(20, 8, name="emb")(t)
    y = L.Dense(4, name="fc")(L.GlobalAveragePooling1D(name="gap")(e))
    model = keras.Model(t, [e, y])
    data = np.random.default_rng(0).integers(0, 20, (32, 6)).astype("int32")
    seen, _ = _check(model, data, tmp_path, 0.02)
    assert {"LUT", "Concat"} <= seen and "Gather" not in seen
    for ft, exponent, entries in (("s8", 0, 256), ("s16", -10, 65)):
        back = read_espdl(tmp_path / f"esp32s3_{ft}.espdl")
        assert back.inputs[0].exponent == exponent
        luts = [n for n in back.nodes if n.op_type == "LUT"]
        assert len(luts) == 8
        assert {back.initializers[n.attributes["lut"]].data.size for n in luts} == {entries}
    # the table rows themselves: the chip's 'emb' output is the table quantized at its
    # exponent, exactly
    table = model.get_layer("emb").get_weights()[0]
    back = read_espdl(tmp_path / "esp32p4_s16.espdl")
    idx = data[:4]
    chip = simulate_espdl(back, (idx * 1024).astype(np.int16))
    e_out = back.outputs[[o.name for o in back.outputs].index("emb")].exponent
    expect = np.rint(table[idx] * 2.0**-e_out)
    np.testing.assert_array_equal(chip.outputs["emb"].reshape(expect.shape), expect)


def test_embedding_refusals(tmp_path):
    t = keras.Input((5,), dtype="int32", name="tokens")
    big = L.Embedding(200, 4, name="big")(t)
    model = keras.Model(t, L.Dense(2, name="fc")(L.Flatten(name="fl")(big)))
    data = np.random.default_rng(0).integers(0, 200, (8, 5)).astype("int32")
    record = _calibrated(model, data, tmp_path)
    with pytest.raises(ExportError, match=r"layer 'big' \(Embedding\): Embedding 200 rows: an "
                       r"int8 input holds indices up to 127 \(export s16"):  # fmt: skip
        export_espdl(model, record, None, format="espdl", feature_type="s8")
    res = export_espdl(model, record, None, format="espdl", feature_type="s16")
    assert res.model.inputs[0].exponent == -7  # 199 · 2^7 fits int16

    masked = L.Embedding(10, 4, mask_zero=True, name="masked")(t)
    model = keras.Model(t, L.Dense(2, name="fc2")(L.GlobalAveragePooling1D(name="gap")(masked)))
    record = _calibrated(model, data % 10, tmp_path)
    with pytest.raises(ExportError, match=r"layer 'masked'.*mask_zero=True: the ESP-DL v3 "
                       "runtime carries no mask"):  # fmt: skip
        export_espdl(model, record, None, format="espdl")


def test_padded_average_pools_follow_keras_at_the_borders(tmp_path):
    """AveragePooling1D/2D(padding="same") that pad: AveragePool (whole-kernel divisor) times
    the constant border factor kernel area / real cells."""
    keras.utils.set_random_seed(0)
    x = keras.Input((7, 7, 3), name="x")
    c = L.Conv2D(4, 1, name="c")(x)
    p3 = L.AveragePooling2D(3, strides=1, padding="same", name="ap3")(c)
    p2 = L.AveragePooling2D(2, padding="same", name="ap2")(c)  # 7 -> 4: pads after only
    s = L.Reshape((49, 3), name="s")(x)
    p1 = L.AveragePooling1D(3, strides=2, padding="same", name="ap1")(s)
    model = keras.Model(x, [p3, p2, p1])
    data = np.random.default_rng(0).uniform(-1, 1, (32, 7, 7, 3)).astype("float32")
    seen, _ = _check(model, data, tmp_path, 0.03)
    assert {"AveragePool", "Mul"} <= seen
    back = read_espdl(tmp_path / "esp32s3_s8.espdl")
    factor = back.initializers["ap3/border_factor"]
    ratio = factor.data.reshape(7, 7) * 2.0**factor.exponent
    np.testing.assert_array_equal(ratio[[0, 0, 3], [0, 3, 3]], [9 / 4, 9 / 6, 1.0])
    # the corners, from the chip's own conv output: the border factor gives the average of
    # the 4 real cells within (9/4 + 1) / 2 steps (the pool's rounding times the factor, and
    # the Mul's), where the AveragePool alone gives their sum / 9
    q = np.round(data / 2.0 ** back.inputs[0].exponent)
    chip = simulate_espdl(back, q.astype(np.int8))
    e = back.outputs[[o.name for o in back.outputs].index("ap3")].exponent
    got = chip.outputs["ap3"][:, 0, 0] * 2.0**e
    conv = chip.values["c"].astype(np.float64) * 2.0 ** chip.exponents["c"]
    cells = conv[:, :2, :2]
    assert np.abs(got - cells.mean(axis=(1, 2))).max() <= (9 / 4 + 1) / 2 * 2.0**e
    assert np.abs(cells.sum(axis=(1, 2)) / 9 - cells.mean(axis=(1, 2))).max() > 8 * 2.0**e


def test_depth_to_space_lambda_is_refused_and_reshape_permute_exports(tmp_path):
    """keras.ops has no depth_to_space: in a Lambda or a custom layer it cannot be read and
    is refused by name; written as Reshape + Permute + Reshape layers it exports."""
    import tensorflow as tf

    class PixelShuffle(L.Layer):
        def call(self, t):
            return tf.nn.depth_to_space(t, 2)

    keras.utils.set_random_seed(0)
    x = keras.Input((4, 4, 8), name="x")
    c = L.Conv2D(8, 1, name="c")(x)
    data = np.random.default_rng(0).uniform(-1, 1, (16, 4, 4, 8)).astype("float32")
    refusals = {
        L.Lambda(lambda t: tf.nn.depth_to_space(t, 2), name="d2s_lambda"): (
            "layer 'd2s_lambda' (Lambda): Keras Lambda is not translated by the ESP-DL v3 "
            "exporter (its Python function cannot be read",
            "a depth_to_space as Reshape + Permute + Reshape layers",
        ),
        PixelShuffle(name="shuffle"): (
            "layer 'shuffle' (PixelShuffle): Keras PixelShuffle is not translated by the "
            "ESP-DL v3 exporter",
        ),
    }
    for layer, words in refusals.items():
        model = keras.Model(x, layer(c))
        record = _calibrated(model, data, tmp_path)
        with pytest.raises(ExportError) as err:
            export_espdl(model, record, None, format="espdl")
        assert all(w in str(err.value) for w in words), str(err.value)
    # depth_to_space(c, 2) as layers (DCR: channel = (row offset, column offset, c')):
    y = L.Reshape((4, 4, 2, 2, 2), name="split")(c)
    y = L.Permute((1, 3, 2, 4, 5), name="interleave")(y)
    y = L.Reshape((8, 8, 2), name="merge")(y)
    model = keras.Model(x, y)
    conv = keras.Model(x, c).predict(data[:2], verbose=0)
    expect = tf.nn.depth_to_space(conv, 2).numpy()
    np.testing.assert_allclose(model.predict(data[:2], verbose=0), expect, rtol=1e-6)
    seen, _ = _check(model, data, tmp_path, 0.01)
    assert {"Reshape", "Transpose"} <= seen
