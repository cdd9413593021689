"""Issue 30, MindSpore: a Transformer block exports to ESP-DL v3.

The block (pre-LN, on (N, T, D) tokens): nn.LayerNorm, q / k / v nn.Dense, scores
``ops.matmul(q, k.swapaxes(1, 2)) * scale``, nn.Softmax(-1), context ``ops.matmul(attn, v)``,
an output nn.Dense, the residual add, then nn.LayerNorm and a GELU MLP (``nn.GELU()``, the
tanh approximation, MindSpore's default) with its residual add. The functional matmuls are the
core's ``Matmul`` (the v3 MatMul of two activations), the swap of k's axes its ``Transpose``.

- The calibration observes both matmuls' outputs: the context one at the input of the output
  Dense, the scores one at the Softmax's input divided by the scale (no cell sees ``q @ kᵀ``
  itself); both checked against the product computed here from the cells' own outputs.
- The block exports for esp32s3 and esp32p4 at s8 and s16, the written file passes
  ``espdl-run --check``, and at s16 the simulated chip follows MindSpore's float output within
  1 % of its range.
- Its Keras twin (exact GELU on both sides, same weights, ``keras.ops.matmul``, the raw Keras
  ops renamed as the MindSpore graph names them): both exports of one record hold the same
  integers.
- ``ops.BatchMatMul(transpose_b=True)(q, k) / 4.0`` and ``a @ v``: the flag becomes a Transpose
  before the MatMul, the division a scale the calibration sees through.
- A matmul of NCHW maps is refused with the reason (the chip holds them NHWC).
"""

from __future__ import annotations

import json
import math

import keras
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops
from ms_v3_helpers import (
    COMBOS,
    chip_error,
    export_checked,
    rename_ops,
    twin_exports_equal,
)

import amct_bridge.mindspore as ams
from amct_bridge.errors import ExportError
from amct_bridge.mindspore.espdl_weights import source_layers
from amct_bridge.records.calibration import sidecar_path

L = keras.layers
T, D = 6, 8


class Block(nn.Cell):
    """A pre-LN Transformer block on (N, T, D) tokens (module docstring)."""

    def __init__(self, exact_gelu: bool = False) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm((D,), epsilon=1e-5)
        self.q, self.k, self.v = nn.Dense(D, D), nn.Dense(D, D), nn.Dense(D, D)
        self.softmax = nn.Softmax(-1)
        self.proj = nn.Dense(D, D)
        self.ln2 = nn.LayerNorm((D,), epsilon=1e-5)
        self.fc1 = nn.Dense(D, 2 * D)
        self.gelu = nn.GELU(approximate=not exact_gelu)
        self.fc2 = nn.Dense(2 * D, D)
        self.scale = 1.0 / math.sqrt(D)

    def construct(self, x):
        h = self.ln1(x)
        scores = ops.matmul(self.q(h), self.k(h).swapaxes(1, 2)) * self.scale
        x = x + self.proj(ops.matmul(self.softmax(scores), self.v(h)))
        return x + self.fc2(self.gelu(self.fc1(self.ln2(x))))


def _block(exact_gelu: bool = False) -> Block:
    ms.set_seed(5)
    net = Block(exact_gelu)
    rng = np.random.default_rng(3)
    for ln in (net.ln1, net.ln2):  # gamma and beta that are not 1 and 0
        ln.gamma.set_data(ms.Tensor(rng.uniform(0.5, 1.5, (D,)).astype(np.float32)))
        ln.beta.set_data(ms.Tensor(rng.uniform(-0.3, 0.3, (D,)).astype(np.float32)))
    net.set_train(False)
    return net


def _x(n: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.5, 1.5, (n, T, D)).astype(np.float32)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    net = _block()
    record = tmp_path_factory.mktemp("block") / "record.txt"
    ams.calibrate(net, _x(), record, algorithm="minmax")
    return net, record


def test_the_sidecar_has_both_matmul_outputs(calibrated):
    net, record = calibrated
    layers = json.loads(sidecar_path(record).read_text())["layers"]
    x = ms.Tensor(_x())
    h = net.ln1(x)
    q, k, v = (cell(h).asnumpy() for cell in (net.q, net.k, net.v))
    scores = q @ k.transpose(0, 2, 1)  # numpy: no amct_bridge code
    e = np.exp(scores * net.scale - (scores * net.scale).max(-1, keepdims=True))
    context = (e / e.sum(-1, keepdims=True)) @ v
    for name, want in (("matmulext_op0", scores), ("matmulext_op1", context)):
        got = layers[name]["output"]
        assert layers[name]["kind"] == "Matmul"
        assert (got["min"], got["max"]) == pytest.approx((want.min(), want.max()), rel=1e-5)


@pytest.mark.parametrize(("target", "feature_type"), COMBOS)
def test_block_exports_and_follows_the_net(calibrated, tmp_path, target, feature_type):
    net, record = calibrated
    x = _x()
    res, model = export_checked(net, record, tmp_path / "b.espdl", x, target, feature_type)
    assert {r.status for r in res.layers} == {"exported"}, res.skipped
    kinds = {r.name: r.kind for r in res.layers}
    assert kinds["matmulext_op0"] == kinds["matmulext_op1"] == "Matmul"
    assert kinds["transpose_op0"] == "Transpose" and kinds["gelu"] == "Activation"
    # the calibrated range gives the scores' exponent, not the bound of the product's sum
    assert res.exponents["matmulext_op0"][1] == "sidecar output range of 'matmulext_op0'"
    nodes = {n.name: n for n in model.nodes}
    matmul = nodes["matmulext_op0"]
    assert matmul.op_type == "MatMul" and matmul.inputs == ["q", "transpose_op0"]
    assert [model.value(t).shape for t in matmul.inputs] == [[1, T, D], [1, D, T]]
    assert nodes["transpose_op0"].attributes["perm"] == [0, 2, 1]
    assert nodes["gelu"].op_type == "LUT"  # the tanh GELU's own table, s8 and s16
    assert [list(v.shape) for v in model.outputs] == [[1, T, D]]
    if feature_type == "s16":
        err, span = chip_error(model, net, x, target)
        assert err <= 0.01 * span, (err, span)


def _keras_twin(net: Block) -> keras.Model:
    x = keras.Input((T, D), name="input0")
    h = L.LayerNormalization(epsilon=1e-5, name="ln1")(x)
    q, k, v = (L.Dense(D, name=n)(h) for n in ("q", "k", "v"))
    scores = keras.ops.matmul(q, keras.ops.transpose(k, (0, 2, 1))) * net.scale
    context = keras.ops.matmul(L.Softmax(name="softmax")(scores), v)
    y = x + L.Dense(D, name="proj")(context)
    f = L.Dense(2 * D, name="fc1")(L.LayerNormalization(epsilon=1e-5, name="ln2")(y))
    model = keras.Model(x, y + L.Dense(D, name="fc2")(L.Activation("gelu", name="gelu")(f)))
    names = ["transpose_op0", "matmulext_op0", "muls_op0", "matmulext_op1", "add_op0", "add_op1"]
    rename_ops(model, names)
    kinds = [type(op).__name__ for op in model.operations if not isinstance(op, L.Layer)]
    assert kinds == ["Transpose", "Matmul", "Multiply", "Matmul", "Add", "Add"], kinds
    for layer in model.layers:  # the same weights: Dense (out, in) -> (in, out)
        cell = getattr(net, layer.name, None)
        if isinstance(cell, nn.LayerNorm):
            layer.set_weights([cell.gamma.asnumpy(), cell.beta.asnumpy()])
        elif isinstance(cell, nn.Dense):
            layer.set_weights([cell.weight.asnumpy().T, cell.bias.asnumpy()])
    return model


def test_keras_twin_exports_equal_integers(tmp_path):
    net = _block(exact_gelu=True)  # Keras' "gelu" is the exact one
    model = _keras_twin(net)
    x = _x(seed=1)
    np.testing.assert_allclose(model.predict(x, verbose=0), net(ms.Tensor(x)).asnumpy(), atol=1e-5)
    # MindSpore's record (the Keras calibration observes no LayerNormalization input, so a
    # Keras-calibrated block has no range for its model input)
    record = tmp_path / "record.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    twin_exports_equal(model, net, record, tmp_path, x, x, (1, T, D))


class FlaggedAttention(nn.Cell):
    """``ops.BatchMatMul(transpose_b=True)(q, k) / 4.0``, nn.Softmax, ``a @ v``, a Dense head."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm((D,))
        self.q, self.k, self.v = nn.Dense(D, D), nn.Dense(D, D), nn.Dense(D, D)
        self.bmm = ops.BatchMatMul(transpose_b=True)
        self.softmax = nn.Softmax(-1)
        self.out = nn.Dense(D, 4)

    def construct(self, x):
        h = self.ln(x)
        return self.out(self.softmax(self.bmm(self.q(h), self.k(h)) / 4.0) @ self.v(h))


def test_batch_matmul_transpose_flag_and_division(tmp_path):
    ms.set_seed(6)
    net = FlaggedAttention()
    net.set_train(False)
    layers = {s.name: s for s in source_layers(net, (1, T, D), format="espdl")}
    # MindIR holds one Reshape(h, (-1, D)) for q, k and v (the compiler merged them), scoped
    # under q: each Dense still reads the LayerNorm's (N, T, D) output, not q's inside
    for name in ("q", "k", "v"):
        assert (layers[name].inputs, layers[name].attrs["input_rank"]) == (["ln"], 3), name
    flagged = layers["batchmatmul_op0/transpose_b"]
    assert (flagged.kind, flagged.inputs, flagged.attrs["perm"]) == ("Transpose", ["k"], (0, 2, 1))
    assert layers["batchmatmul_op0"].inputs == ["q", "batchmatmul_op0/transpose_b"]
    assert layers["matmulext_op0"].kind == "Matmul"
    x = _x()
    record = tmp_path / "record.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    seen = json.loads(sidecar_path(record).read_text())["layers"]["batchmatmul_op0"]["output"]
    h = net.ln(ms.Tensor(x))
    scores = net.q(h).asnumpy() @ net.k(h).asnumpy().transpose(0, 2, 1)
    assert (seen["min"], seen["max"]) == pytest.approx((scores.min(), scores.max()), rel=1e-5)
    res, model = export_checked(net, record, tmp_path / "f.espdl", x, "esp32p4", "s16")
    assert {r.status for r in res.layers} == {"exported"}, res.skipped
    assert {"Transpose", "MatMul", "Softmax"} <= {n.op_type for n in model.nodes}
    err, span = chip_error(model, net, x, "esp32p4")
    assert err <= 0.01 * span, (err, span)


class MapProduct(nn.Cell):
    """A matmul of two NCHW maps (over W): not what the chip's NHWC tensors hold."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1, has_bias=True)
        self.b = nn.Conv2d(3, 4, 1, has_bias=True)

    def construct(self, x):
        return ops.matmul(self.a(x), self.b(x))


def test_matmul_of_nchw_maps_is_refused_with_the_reason(tmp_path):
    net = MapProduct()
    net.set_train(False)
    x = np.random.default_rng(0).uniform(-1, 1, (4, 3, 8, 8)).astype(np.float32)
    record = tmp_path / "record.txt"
    ams.calibrate(net, x, record, algorithm="minmax")
    with pytest.raises(ExportError) as err:
        ams.export_espdl(net, record, tmp_path / "m.espdl", sample_input=(1, 3, 8, 8),
                         format="espdl")  # fmt: skip
    message = str(err.value)
    assert "layer 'matmulext_op0' (MatMulExt): functional MatMulExt of shapes" in message, message
    assert "product of two token tensors (N, T, D)" in message and "NHWC" in message
    assert not (tmp_path / "m.espdl").exists()
