"""Shared steps of the tests/mindspore/test_ms_v3_*.py files: export a calibrated MindSpore net
as ESP-DL v3, check the written file as ``espdl-run --check`` does, compare the simulated chip
with the net's own float output, and compare a MindSpore export with its Keras twin's.
"""

from __future__ import annotations

from pathlib import Path

import keras
import mindspore as ms
import numpy as np

import amct_bridge.keras as akeras
import amct_bridge.mindspore as ams
from amct_bridge.cli import main
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl

#: (target, feature_type) of the issue's "done when": esp32s3 and esp32p4, s8 and s16.
COMBOS = [(t, f) for t in ("esp32s3", "esp32p4") for f in ("s8", "s16")]


def export_checked(net, record, out: Path, x: np.ndarray, target: str, feature_type: str):
    """Export ``net`` (NCHW input ``x``, its first sample the embedded test input) to ``out``;
    the written file must pass ``espdl-run --check`` (the simulator recomputes its test
    outputs). Returns (export result, the file read back)."""
    res = ams.export_espdl(
        net,
        record,
        out,
        sample_input=(1, *x.shape[1:]),
        format="espdl",
        target=target,
        feature_type=feature_type,
        test_input=x[:1],
    )
    assert main(["espdl-run", str(out), "--check"]) == 0
    return res, read_espdl(out)


def chip_error(
    model, net, x: np.ndarray, target: str, channels_first: bool | None = None
) -> tuple[float, float]:
    """(largest |chip - float|, float output range) over ``x`` for the model's first output:
    the input is quantized at the file's input exponent, the net runs on the same quantized
    values (so only the chip's own arithmetic differs). ``channels_first``: ``x`` is NCHW / NCW
    (the chip's NHWC / NWC moved back for the net); default: rank 4 only (a rank-3 input is a
    sequence (N, T, D), as the chip holds it)."""
    info = model.inputs[0]
    bits = 8 if info.elem_type == 3 else 16
    step = 2.0**info.exponent
    moved = x.ndim == 4 if channels_first is None else channels_first
    chip_x = np.moveaxis(x, 1, -1) if moved else x
    rounded = np.rint(chip_x / step) if target == "esp32p4" else np.floor(chip_x / step + 0.5)
    q = np.clip(rounded, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    sim = simulate_espdl(model, q.astype(np.int8 if bits == 8 else np.int16), target)
    out = model.outputs[0]
    chip = sim.outputs[out.name] * 2.0**out.exponent
    xq = q * step
    back = np.moveaxis(xq, -1, 1) if moved else xq
    want = net(ms.Tensor(back.astype(np.float32))).asnumpy()
    if want.ndim == 4 or (moved and want.ndim == 3):
        want = np.moveaxis(want, 1, -1)
    assert chip.shape == want.shape, (chip.shape, want.shape)
    return float(np.abs(chip - want).max()), float(np.ptp(want))


def same_integers(keras_file: Path, ms_file: Path) -> None:
    """The two ``.espdl`` files hold the same nodes, integers, exponents and test values."""
    k, m = read_espdl(keras_file), read_espdl(ms_file)
    assert {n.name: n.op_type for n in k.nodes} == {n.name: n.op_type for n in m.nodes}
    assert k.initializers.keys() == m.initializers.keys()
    for name, tensor in k.initializers.items():
        np.testing.assert_array_equal(tensor.data, m.initializers[name].data, err_msg=name)
        assert tensor.exponents == m.initializers[name].exponents, name
    assert {v.name: v.exponents for v in k.value_info} == {
        v.name: v.exponents for v in m.value_info
    }
    assert [(v.name, v.shape) for v in k.outputs] == [(v.name, v.shape) for v in m.outputs]
    np.testing.assert_array_equal(k.test_inputs[0].data, m.test_inputs[0].data)
    np.testing.assert_array_equal(k.test_outputs[0].data, m.test_outputs[0].data)


def rename_ops(model, names: list[str]) -> None:
    """Give a Keras model's raw ops (``x + 3.0`` is an op named ``add``, ``add_1``... by a
    session-wide counter), in call order, the names the MindSpore graph gives the same ops
    (``add_op0``), so one record and sidecar serve both."""
    raw = [op for op in model.operations if not isinstance(op, keras.layers.Layer)]
    assert len(raw) == len(names), [op.name for op in raw]
    for op, name in zip(raw, names, strict=True):
        op.name = name


def twin_exports_equal(model, net, record: Path, tmp_path: Path, keras_x, ms_x, sample_input):
    """Export ``record`` from the Keras twin ``model`` (test input ``keras_x[:1]``) and from
    ``net`` (``ms_x[:1]``, ``sample_input``) for esp32s3 s8 and esp32p4 s16: each pair of files
    holds the same integers (:func:`same_integers`). Returns the last MindSpore file."""
    for target, feature_type in (("esp32s3", "s8"), ("esp32p4", "s16")):
        options = {"format": "espdl", "target": target, "feature_type": feature_type}
        k_out, m_out = tmp_path / f"k_{target}.espdl", tmp_path / f"m_{target}.espdl"
        akeras.export_espdl(model, record, k_out, test_input=keras_x[:1], **options)
        ams.export_espdl(net, record, m_out, sample_input=sample_input, test_input=ms_x[:1],
                         **options)  # fmt: skip
        same_integers(k_out, m_out)
    return m_out
