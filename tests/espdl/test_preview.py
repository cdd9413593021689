"""The preview reproduces the real convert.py outputs (goldens) and the documented rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from amct_bridge.errors import ExportError
from amct_bridge.espdl.v1.layout import element_order
from amct_bridge.espdl.v1.preview import load_set, preview_layer, preview_set, tool_output

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN = DATA / "espdl_v1_golden"
SETS = {"s8_set": GOLDEN / "s8_set", "tutorial": DATA / "espdl_v1_tutorial"}
GOLDEN_FILES = sorted(p.name for p in GOLDEN.glob("*.json"))


def test_every_golden_file_is_covered():
    assert len(GOLDEN_FILES) == 6


@pytest.mark.parametrize("golden", GOLDEN_FILES)
def test_preview_reproduces_golden_exactly(golden):
    set_name, chip, q, _ = golden.split(".")
    config, arrays = load_set(SETS[set_name])
    previews = preview_set(config, arrays, target=chip, per_channel=q == "q1")
    expected = json.loads((GOLDEN / golden).read_text())
    got = tool_output(previews)
    assert list(got["arrays"]) == list(expected["arrays"])
    for name, arr in expected["arrays"].items():
        assert got["arrays"][name] == arr, name
    assert got["constants"] == expected["constants"]


def _entry(**kw):
    return {"operation": "conv2d", "feature_type": "s8", **kw}


def test_rounding_is_half_to_even_and_clipped():
    # e = -1 (explicit): x / 0.5 = 0.5, 1.5, 2.5, -0.5, 300, -300
    w = np.array([0.25, 0.75, 1.25, -0.25, 150.0, -150.0], np.float32).reshape(1, 1, 1, 6)
    p = preview_layer("a", _entry(filter_exponent=-1), {"a_filter": w})
    assert p.filter.values.tolist() == [0, 2, 2, 0, 127, -128]
    assert p.filter.saturated == 2
    assert p.filter.zeroed == 2


def test_auto_exponent_boundaries():
    # max 1.0 -> 1/127 -> -6 ; max 127/128 -> 2^-7 exactly -> -7 ; all zero -> 0
    for peak, exp in [(1.0, -6), (127 / 128, -7), (0.0, 0)]:
        w = np.array([peak, -peak / 3], np.float32).reshape(1, 1, 1, 2)
        assert preview_layer("a", _entry(), {"a_filter": w}).filter.exponent == exp


def test_non_int_filter_exponent_is_ignored_like_the_tool():
    w = np.ones((1, 1, 1, 2), np.float32)
    for bad in ["-3", -3.0, True]:
        assert (
            preview_layer("a", _entry(filter_exponent=bad), {"a_filter": w}).filter.exponent == -6
        )


def test_per_channel_clamp_and_int16_bias():
    w = np.zeros((1, 1, 2, 2), np.float32)
    w[..., 0] = 1e-7  # auto exponent -30 -> clamped to -15
    w[..., 1] = 1.0  # -6
    b = np.array([0.001, 0.5], np.float32)
    entry = _entry(bias="True", input_exponent=-7)
    p = preview_layer("a", entry, {"a_filter": w, "a_bias": b}, per_channel=True)
    assert p.filter.exponent.tolist() == [-15, -6]
    assert p.filter.values.tolist() == [0, 0, 64, 64]  # NHWC: channel 0 rounds to 0
    # bias exponents: -7 + e_w + 4 -> -18, -9 ; int16
    assert p.bias.exponent.tolist() == [-18, -9]
    assert p.bias.values.tolist() == [round(0.001 * 2**18), 256]
    assert p.bias.ctype == "int16_t"


def test_s3_blocks_hand_example():
    # N = 18 s8 output channels: 16 in one block (H, W, C, 16) then 2 channels NHWC.
    q = np.arange(2 * 18).reshape(1, 1, 2, 18)
    got = element_order(q, "conv2d", "esp32s3", "s8").tolist()
    block = [q[0, 0, c, n] for c in range(2) for n in range(16)]
    rest = [q[0, 0, c, n] for n in (16, 17) for c in range(2)]
    assert got == block + rest
    dw = np.arange(2 * 10).reshape(1, 2, 10, 1)  # s16, g=8: (1, H, W, 8) then HWC of 2
    got = element_order(dw, "depthwise_conv2d", "esp32s3", "s16").tolist()
    assert got == [dw[0, x, c, 0] for x in range(2) for c in range(8)] + [
        dw[0, x, c, 0] for x in range(2) for c in (8, 9)
    ]


def test_fully_connected_accepts_2d():
    w = np.ones((3, 2), np.float32)
    p = preview_layer("f", {"operation": "fully_connected", "feature_type": "s16"}, {"f_filter": w})
    assert p.filter.shape == (1, 1, 3, 2)


@pytest.mark.parametrize(
    "entry, arrays, message",
    [
        ({"operation": "conv3d", "feature_type": "s8"}, {}, "not implemented"),
        ({"operation": "conv2d", "feature_type": "u8"}, {}, "feature_type"),
        (_entry(), {}, "a_filter.npy"),
        (_entry(), {"a_filter": np.ones((2, 2))}, "4-D"),
        (_entry(bias="True"), {"a_filter": np.ones((1, 1, 1, 1))}, "a_bias.npy is missing"),
        (
            _entry(bias="True"),
            {"a_filter": np.ones((1, 1, 1, 1)), "a_bias": np.ones(1)},
            "output_exponent",
        ),
        (_entry(activation={"type": "ReLU6"}), {"a_filter": np.ones((1, 1, 1, 1))}, "ReLU6"),
        (_entry(activation={"type": "PReLU"}), {"a_filter": np.ones((1, 1, 1, 1))}, "PReLU"),
    ],
)
def test_preview_errors(entry, arrays, message):
    with pytest.raises(ExportError, match=message):
        preview_layer("a", entry, arrays)


def test_s16_per_channel_refused():
    entry = {"operation": "conv2d", "feature_type": "s16"}
    with pytest.raises(ExportError, match="per-channel"):
        preview_layer("a", entry, {"a_filter": np.ones((1, 1, 1, 1))}, per_channel=True)
