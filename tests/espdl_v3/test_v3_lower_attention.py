"""Issue 30: Keras MultiHeadAttention -> the runtime's Gemm projections, per-head Reshape /
Transpose, MatMul of two activations (scores, context), Softmax and the output Gemm
(amct_bridge/espdl/v3/lowering/attention.py).

A Transformer block (MultiHeadAttention(num_heads=2, key_dim=8) on 8 tokens of 16 features,
residual Add, LayerNormalization, a ReLU feed-forward, pooling and a 4-way head), calibrated;
the ranges inside the attention (scaled query, key, value, scores, probabilities, context)
measured at export time by running its Keras sublayers on ``calibration_data`` (the
calibration observes the layer's input and output only; ``exponents="max"``: the range rule
elsewhere, no exponent search, so that this lowering is what is tested). Exported for esp32s3
and esp32p4,
written, read back and checked as ``espdl-run --check`` does, then the simulated chip (one
sample per run, batch 1) against Keras float on the chip's own quantized input: s16 within 1 %
of the range (the attention's output and the head's), arg max equal on >= 95 %; s8 within 4 %
(measured: about 1.5 to 2 %). Without calibration_data the ranges are bounds (noted): s16 still
within 1 %."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from v3_checks import assert_self_check, chip_input

from amct_bridge.cli import main
from amct_bridge.errors import ExportError
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.keras import calibrate, export_espdl

L = keras.layers
TOKENS, FEATURES, SAMPLES = 8, 16, 48
CASES = [(t, ft) for t in ("esp32s3", "esp32p4") for ft in ("s8", "s16")]


def _block() -> keras.Model:
    x = keras.Input((TOKENS, FEATURES), name="tokens")
    a = L.MultiHeadAttention(num_heads=2, key_dim=8, name="mha")(x, x)
    h = L.LayerNormalization(name="ln1")(L.Add(name="res1")([x, a]))
    f = L.Dense(32, activation="relu", name="ff1")(h)
    h = L.LayerNormalization(name="ln2")(L.Add(name="res2")([h, L.Dense(16, name="ff2")(f)]))
    return keras.Model(x, L.Dense(4, name="head")(L.GlobalAveragePooling1D(name="gap")(h)))


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    keras.utils.set_random_seed(0)
    model = _block()
    # random biases (Keras initializes them to zeros): a misplaced bias shows
    rng = np.random.default_rng(2)
    mha = model.get_layer("mha")
    mha.set_weights([w if w.ndim > 2 else rng.normal(0, 0.3, w.shape) for w in mha.get_weights()])
    data = rng.normal(0, 1, (SAMPLES, TOKENS, FEATURES)).astype("float32")
    record = tmp_path_factory.mktemp("mha") / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    return model, record, data


def _run(model, back, data, bits):
    """Keras on the chip's quantized input, and the simulated chip, one sample per run:
    {tensor: (chip, keras)} for the attention's output and the head's."""
    q, xq = chip_input(back, data, bits)
    xq = xq.astype("float32")
    runs = [simulate_espdl(back, q[i : i + 1]).values for i in range(len(q))]
    out = {}
    for name in ("mha", "head"):
        chip = np.concatenate([r[name] for r in runs]) * 2.0 ** back.value(name).exponent
        probe = keras.Model(model.inputs, model.get_layer(name).output)
        out[name] = (chip, probe.predict(xq, verbose=0))
    return out


@pytest.mark.parametrize(("target", "ft"), CASES)
def test_transformer_block_exports_and_follows_keras(block, tmp_path, target, ft):
    model, record, data = block
    out = tmp_path / "block.espdl"
    res = export_espdl(model, record, out, format="espdl", target=target, feature_type=ft,
                       test_input=data[:1], calibration_data=data, exponents="max")  # fmt: skip
    assert {x.status for x in res.layers} <= {"exported", "fused"}
    mha = next(x for x in res.layers if x.name == "mha")
    ops = [n.op_type for n in res.model.nodes if n.name in mha.nodes]
    assert ops.count("Gemm") == 4 and ops.count("MatMul") == 2 and "Softmax" in ops
    assert res.exponents["mha/scores"][1] == "its range on calibration_data"
    back = read_espdl(out)
    assert_self_check(back)  # espdl-run --check: the file's own test values
    bits = 8 if ft == "s8" else 16
    for name, (chip, ref) in _run(model, back, data, bits).items():
        err = np.abs(chip - ref).max() / np.ptp(ref)
        assert err <= (0.01 if bits == 16 else 0.04), (name, err)
        if name == "head" and bits == 16:
            assert np.mean(chip.argmax(1) == ref.argmax(1)) >= 0.95


def test_without_calibration_data_the_ranges_are_bounds(block, tmp_path, capsys):
    model, record, data = block
    out = tmp_path / "block.espdl"
    res = export_espdl(model, record, out, format="espdl", target="esp32p4", feature_type="s16",
                       test_input=data[:1])  # fmt: skip
    note = next(n for n in res.notes if "'mha'" in n)
    assert "bounds from the calibrated input range" in note and "calibration_data" in note
    back = read_espdl(out)
    for name, (chip, ref) in _run(model, back, data, 16).items():
        assert np.abs(chip - ref).max() <= 0.01 * np.ptp(ref), name
    capsys.readouterr()
    assert main(["espdl-run", str(out), "--check"]) == 0
    assert "test outputs equal: 1/1" in capsys.readouterr().out


def test_cross_attention_with_its_own_key_and_value_dim(tmp_path):
    """Query, value and key from three layers, value_dim 4 != key_dim 8, an output of 12."""
    keras.utils.set_random_seed(1)
    x = keras.Input((6, 10), name="x")
    q, v, k = (L.Dense(12, name=n)(x) for n in ("q_in", "v_in", "k_in"))
    mha = L.MultiHeadAttention(2, 8, value_dim=4, output_shape=12, name="cross")
    model = keras.Model(x, L.Dense(3, name="fc")(mha(q, v, key=k)))
    data = np.random.default_rng(3).normal(0, 1, (24, 6, 10)).astype("float32")
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    res = export_espdl(model, record, None, format="espdl", target="esp32s3", feature_type="s16",
                       calibration_data=data, exponents="max")  # fmt: skip
    cross = next(x for x in res.layers if x.name == "cross")
    gemms = [n for n in res.model.nodes if n.op_type == "Gemm" and n.name in cross.nodes]
    assert [n.inputs[0] for n in gemms[:3]] == ["q_in", "k_in", "v_in"]
    step = 2.0 ** res.model.inputs[0].exponent
    qx = np.clip(np.round(data / step), -32768, 32767).astype(np.int16)
    runs = [simulate_espdl(res.model, qx[i : i + 1]).values for i in range(len(qx))]
    chip = np.concatenate([r["cross"] for r in runs]) * 2.0 ** res.model.value("cross").exponent
    xq = (qx * step).astype("float32")
    ref = keras.Model(model.inputs, mha.output).predict(xq, verbose=0)
    assert chip.shape == ref.shape == (24, 6, 12)
    assert np.abs(chip - ref).max() <= 0.01 * np.ptp(ref)


@pytest.mark.parametrize(
    ("call", "why"),
    [
        ({"use_causal_mask": True}, "use_causal_mask: the ESP-DL v3 runtime's Softmax takes no"),
        ({"return_attention_scores": True}, "return_attention_scores"),
    ],
)
def test_attention_the_runtime_cannot_run_is_refused(tmp_path, call, why):
    x = keras.Input((4, 8), name="x")
    out = L.MultiHeadAttention(2, 4, name="mha")(x, x, **call)
    if isinstance(out, tuple):  # the output and the scores
        out = out[0]
    model = keras.Model(x, L.Dense(2, name="fc")(out))
    record = tmp_path / "r.txt"
    calibrate(model, np.ones((2, 4, 8), "float32"), record, algorithm="minmax")
    with pytest.raises(ExportError, match=rf"layer 'mha' \(MultiHeadAttention\): .*{why}"):
        export_espdl(model, record, None, format="espdl", target="c")
