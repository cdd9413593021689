"""Shared steps of the tests/espdl_v3/test_v3_lower_*.py files: check a written ``.espdl`` as
``espdl-run --check`` does, quantize test data at the file's input exponent, and export a
calibrated Keras net for each target and feature type, comparing the simulated chip with Keras
run on the chip's own quantized input."""

from __future__ import annotations

import numpy as np

from amct_bridge.cli import main
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.keras import calibrate, export_espdl

#: (target, feature_type): the issue's two targets at both widths.
COMBOS = (("esp32s3", "s8"), ("esp32s3", "s16"), ("esp32p4", "s8"), ("esp32p4", "s16"))


def assert_self_check(back) -> None:
    """``espdl-run --check``: the simulator computes the file's own embedded test outputs."""
    sim = simulate_espdl(back, None)
    assert back.test_outputs
    for t in back.test_outputs:
        np.testing.assert_array_equal(sim.outputs[t.name], t.data)


def chip_input(back, data: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(the integers the chip reads, their float values) for ``data`` at the file's input
    exponent, rounded half to even and saturated to ``bits``."""
    step = 2.0 ** back.inputs[0].exponent
    top = 2 ** (bits - 1)
    q = np.clip(np.round(data / step), -top, top - 1).astype(np.int8 if bits == 8 else np.int16)
    return q, q * step


def check_lowering(model, data, tmp_path, s8_bound, capsys=None, combos=COMBOS):
    """Calibrate ``model`` on ``data``, export it for each (target, feature type), check each
    file, and compare every model output of the simulated chip with Keras: s16 within 1 % of
    the output's range and the arg max of a class vector equal on >= 95 % of the inputs (the
    issue's bar), s8 within ``s8_bound``. Returns (the v3 op types written, the largest error
    per (target, feature type))."""
    record = tmp_path / "r.txt"
    calibrate(model, data, record, algorithm="minmax")
    names = [t._keras_history.operation.name for t in model.outputs]
    seen, worst = set(), {}
    for target, ft in combos:
        bits = 8 if ft == "s8" else 16
        out = tmp_path / f"{target}_{ft}.espdl"
        res = export_espdl(
            model, record, out, format="espdl", target=target, feature_type=ft,
            test_input=data[:1],
        )  # fmt: skip
        assert "refused" not in {x.status for x in res.layers}
        back = read_espdl(out)
        seen |= {n.op_type for n in back.nodes}
        assert_self_check(back)
        q, xq = chip_input(back, data, bits)
        chip = simulate_espdl(back, q)
        refs = model.predict(xq.astype(data.dtype), verbose=0)
        refs = refs if isinstance(refs, list) else [refs]
        assert sorted(i.name for i in back.outputs) == sorted(names)
        errors = []
        for info in back.outputs:
            ref = np.asarray(refs[names.index(info.name)], np.float64)
            got = (chip.outputs[info.name] * 2.0**info.exponent).reshape(ref.shape)
            errors.append(np.abs(got - ref).max() / max(np.ptp(ref), 1e-12))
            if bits == 16 and ref.ndim == 2 and ref.shape[1] > 1:
                agree = np.mean(got.argmax(1) == ref.argmax(1))
                assert agree >= 0.95, (target, info.name, agree)
        worst[target, ft] = max(errors)
        assert worst[target, ft] <= (0.01 if bits == 16 else s8_bound), (target, ft, errors)
    if capsys is not None:  # the CLI's check on one of the files
        capsys.readouterr()
        assert main(["espdl-run", str(tmp_path / f"{combos[-1][0]}_{combos[-1][1]}.espdl"),
                     "--check"]) == 0  # fmt: skip
        assert "test outputs equal" in capsys.readouterr().out
    return seen, worst
