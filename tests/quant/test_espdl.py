"""ESP-DL power-of-two math against hand-worked values and a brute-force exponent search."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amct_bridge.errors import QuantError
from amct_bridge.quant.espdl import (
    auto_exponent,
    channel_exponents,
    dequantize_pow2,
    quantize_pow2,
    range_to_exponent,
    scale_offset_to_exponent,
)


def brute_exponent(absmax: float, bits: int) -> int:
    """Smallest e in a wide window with absmax <= (2^(w-1)-1) * 2^e (exact float64 products)."""
    qmax = 2 ** (bits - 1) - 1
    return next(e for e in range(-160, 160) if absmax <= qmax * 2.0**e)


def test_documented_examples():
    assert auto_exponent([1.0], 8) == -6
    assert auto_exponent([127 / 128], 8) == -7
    assert auto_exponent(np.zeros((3, 3)), 8) == 0
    assert auto_exponent([-1.0, 0.25], 16) == brute_exponent(1.0, 16) == -14


@settings(max_examples=300, deadline=None)
@given(
    st.floats(min_value=1e-30, max_value=1e30, allow_nan=False, allow_infinity=False),
    st.sampled_from([8, 16]),
)
def test_auto_exponent_matches_brute_force(absmax, bits):
    assert auto_exponent([absmax, -absmax / 3], bits) == brute_exponent(absmax, bits)


def test_exact_at_powers_of_two():
    for e in range(-20, 10):
        assert auto_exponent([127 * 2.0**e], 8) == e
        assert auto_exponent([np.nextafter(127 * 2.0**e, np.inf)], 8) == e + 1


def test_quantize_half_to_even_and_clip():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 200.0, -200.0]) * 2.0**-3
    assert quantize_pow2(x, -3, 8).tolist() == [0, 2, 2, 0, -2, 127, -128]
    assert quantize_pow2(x, -3, 16).tolist() == [0, 2, 2, 0, -2, 200, -200]
    assert quantize_pow2(x, -3, 16).dtype == np.int16


def test_quantize_per_channel_and_roundtrip():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 3, 4, 5)) * np.array([1.0, 0.01, 10.0, 1e-6, 0.0])
    exps = channel_exponents(w, axis=3, bits=8)
    expected = [
        max(brute_exponent(np.abs(w[..., c]).max(), 8), -15) if np.abs(w[..., c]).max() else 0
        for c in range(5)
    ]
    assert exps.tolist() == expected
    assert exps[3] == -15 and exps[4] == 0
    q = quantize_pow2(w, exps, 8, axis=3)
    back = dequantize_pow2(q, exps, axis=3)
    err = np.abs(back - w)
    step = 2.0 ** exps.astype(float)
    # Channels that are not clamped never saturate: error <= half a step.
    for c in (0, 1, 2, 4):
        assert err[..., c].max() <= step[c] / 2 + 1e-12


def test_range_and_scale_offset_conversion():
    assert range_to_exponent(0.0, 6.0, 8) == brute_exponent(6.0, 8) == -4
    assert range_to_exponent(-3.0, 0.5, 16) == brute_exponent(3.0, 16)
    # ReLU6 record -> covers [0, 6]
    assert scale_offset_to_exponent(6 / 255, -128) == -4
    # asymmetric range [-1, 3] recorded by AMCT: covers 3 exactly at w=8 -> 3 <= 127 * 2^-5
    scale, offset = 4 / 255, -128 + 64
    lo, hi = (-128 - offset) * scale, (127 - offset) * scale
    assert scale_offset_to_exponent(scale, offset, 8, 8) == brute_exponent(max(-lo, hi), 8)
    assert scale_offset_to_exponent(scale, offset, 8, 16) == brute_exponent(max(-lo, hi), 16)


@pytest.mark.parametrize(
    "call",
    [
        lambda: auto_exponent([1.0, np.nan]),
        lambda: auto_exponent([np.inf]),
        lambda: auto_exponent([1.0], 4),
        lambda: range_to_exponent(1.0, -1.0),
        lambda: scale_offset_to_exponent(0.0, 0),
        lambda: scale_offset_to_exponent(0.1, 300),
    ],
)
def test_bad_input_raises_quant_error(call):
    with pytest.raises(QuantError):
        call()


def test_error_names_tensor():
    with pytest.raises(QuantError, match="conv1/bias"):
        auto_exponent([np.nan], name="conv1/bias")
