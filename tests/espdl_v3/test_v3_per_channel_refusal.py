"""esp32p4 per-channel filter exponents (what esp-ppq writes for Conv/Gemm on ESP-DL >= 3.3.1):
the file reads and round-trips; the simulator computes them on the PIE-V2 chips (esp32p4,
esp32s31: each output channel shifted by its own ``e_out - e_w[c] - e_in``, half to even) and
refuses the node by name on the chips without a per-channel kernel, instead of computing with
one of the exponents. Our exporter writes one exponent per filter on every target
(docs/espdl-v3.md, "Per-channel weight exponents")."""

from __future__ import annotations

import numpy as np
import pytest

from amct_bridge.espdl.v3 import read_espdl, simulate_espdl, write_espdl
from amct_bridge.espdl.v3.model import EspdlError, EspdlModel, Node, Tensor, ValueInfo


def _gemm(exponents: list[int]) -> EspdlModel:
    w = Tensor("w", np.array([[[[64, 64], [-64, 64]]]], np.int8), exponents, "layout ==> NHWC")
    return EspdlModel(
        [Node("fc", "Gemm", ["x", "w"], ["fc"], {"quant_type": "S8"})],
        {"w": w},
        inputs=[ValueInfo("x", [1, 2], 3, [-6])],
        outputs=[ValueInfo("fc", [1, 2], 3, [-5])],
        metadata={"target": "esp32p4"},
    )


def test_per_channel_filter_is_read_and_simulated_on_esp32p4(tmp_path):
    path = tmp_path / "pc.espdl"
    write_espdl(_gemm([-6, -7]), path)
    back = read_espdl(path)
    assert back.initializers["w"].exponents == [-6, -7]  # read as written
    # channel 0 is w [1, 1] at 2^-6 (shift -5 + 6 + 6 = 7), channel 1 is w [-1, 1] at 2^-7
    # (shift 8); integers: w = [64, 64] and [-64, 64], accumulators x . w
    # x = [1, 2]: 192 / 128 = 1.5 -> 2, 64 / 256 -> 0; x = [1, 4]: 320 / 128 = 2.5 -> 2 (half
    # to even), 192 / 256 -> 1; x = [3, 5]: 512 / 128 = 4, 128 / 256 = 0.5 -> 0 (half to even)
    x = np.int8([[1, 2], [1, 4], [3, 5]])
    want = [[2, 0], [2, 1], [4, 0]]
    assert simulate_espdl(back, x, "esp32p4").outputs["fc"].tolist() == want
    assert simulate_espdl(back, x, "esp32s31").outputs["fc"].tolist() == want


@pytest.mark.parametrize("target", ["esp32s3", "c"])
def test_per_channel_filter_is_refused_without_a_per_channel_kernel(tmp_path, target):
    path = tmp_path / "pc.espdl"
    write_espdl(_gemm([-6, -7]), path)
    with pytest.raises(EspdlError, match=r"node 'fc' \(Gemm\): filter 'w' has 2 per-channel"):
        simulate_espdl(read_espdl(path), np.int8([[1, 2]]), target)


def test_per_tensor_filter_still_simulates():
    # x = [1, 2] at 2^-6, w = [[1, -1], [1, 1]] at 2^-6: y = [3, 1] * 2^-6 = [0.046875, 0.015625]
    # at 2^-5: [1.5, 0.5] -> half to even on esp32p4: [2, 0]
    got = simulate_espdl(_gemm([-6]), np.int8([[1, 2]]), "esp32p4").outputs["fc"]
    assert got.tolist() == [[2, 0]]
