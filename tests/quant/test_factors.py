"""AMCT activation factors against hand-worked examples and an independent float64 formula."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amct_bridge.errors import QuantError
from amct_bridge.quant.factors import (
    activation_factors,
    bits_of,
    dequantize,
    fake_quantize,
    quantize,
)


def test_hand_worked_examples():
    scale, offset = activation_factors(0.0, 1.0)
    assert f"{scale:.9g}" == "0.00392156886" and offset == -128
    scale, offset = activation_factors(0.0, 6.0)
    assert scale == pytest.approx(6 / 255, rel=1e-7) and offset == -128
    assert f"{scale:.9g}" == "0.0235294122"
    # IFMR record value 0.99 * 6 / 255
    scale, _ = activation_factors(0.0, float(np.float32(0.99) * np.float32(6.0)))
    assert f"{scale:.9g}" == "0.0232941173"


def test_edge_cases():
    assert activation_factors(0.0, 0.0) == (1.0, -128)  # all zeros: scale < FLT_EPSILON -> 1
    assert activation_factors(0.0, 0.0, 16) == (1.0, -32768)
    assert activation_factors(0.0, 0.0, "INT4") == (1.0, -8)
    # a single positive value / range not containing 0 -> widened to include 0
    assert activation_factors(2.0, 2.0) == activation_factors(0.0, 2.0)
    assert activation_factors(-5.0, -1.0) == activation_factors(-5.0, 0.0)
    s, o = activation_factors(-5.0, -1.0)
    assert o == 127 and s == pytest.approx(5 / 255, rel=1e-7)
    # symmetric: |max| > |min| -> /127, else /128 (ties -> /128)
    assert activation_factors(-1.0, 2.0, symmetric=True)[0] == pytest.approx(2 / 127, rel=1e-7)
    assert activation_factors(-2.0, 2.0, symmetric=True)[0] == pytest.approx(2 / 128, rel=1e-7)
    assert activation_factors(-2.0, 1.0, 4, symmetric=True) == (pytest.approx(2 / 8), 0)


@pytest.mark.parametrize("lo,hi", [(np.nan, 1.0), (0.0, np.inf), (-np.inf, 0.0)])
def test_nan_inf_raise_naming_tensor(lo, hi):
    with pytest.raises(QuantError, match="block1/relu"):
        activation_factors(lo, hi, name="block1/relu")


def test_bad_bits():
    with pytest.raises(QuantError):
        activation_factors(0.0, 1.0, bits=7)
    assert bits_of("int16") == 16


ranges = st.tuples(
    st.floats(-1e4, 1e4, allow_nan=False, width=32), st.floats(-1e4, 1e4, allow_nan=False, width=32)
).map(sorted)


@settings(max_examples=300, deadline=None)
@given(ranges, st.sampled_from([4, 8, 16]))
def test_asymmetric_matches_float64_formula_and_offsets_in_range(rng_pair, bits):
    lo, hi = rng_pair
    scale, offset = activation_factors(lo, hi, bits)
    mx, mn = max(hi, 0.0), min(lo, 0.0)
    ref = (mx - mn) / (2**bits - 1)
    if ref >= 1.2e-7:
        assert scale == pytest.approx(ref, rel=2e-7)
        ref_off = -(2 ** (bits - 1)) + np.floor(-mn / ref + 0.5)
        assert abs(offset - ref_off) <= 1  # float32 vs float64 at .5 boundaries
    assert -(2 ** (bits - 1)) <= offset <= 2 ** (bits - 1) - 1
    assert np.isfinite(scale) and scale > 0


@settings(max_examples=200, deadline=None)
@given(ranges, st.sampled_from([4, 8, 16]), st.booleans())
def test_dequant_quant_error_at_most_half_scale_inside_clip_range(rng_pair, bits, symmetric):
    lo, hi = rng_pair
    scale, offset = activation_factors(lo, hi, bits, symmetric)
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    # The representable range is the clip range.
    c_lo, c_hi = (qmin - offset) * scale, (qmax - offset) * scale
    x = np.linspace(c_lo, c_hi, 1001).astype(np.float32)
    err = np.abs(fake_quantize(x, scale, offset, bits).astype(np.float64) - x)
    assert err.max() <= scale / 2 * (1 + 1e-5) + 1e-6 * max(abs(c_lo), abs(c_hi))
    # and the clip range covers the calibrated range (widened to 0) up to half a step
    if scale != 1.0:
        assert c_lo <= min(lo, 0.0) + scale / 2 + 1e-6 * abs(lo) and c_hi >= max(hi, 0.0) - scale


def test_quantize_per_channel():
    x = np.array([[1.0, -1.0], [0.5, 0.25]])
    q = quantize(x, [1 / 127, 1 / 254], [0, 0], 8, axis=1)
    assert q.tolist() == [[127, -128], [64, 64]]  # -254 saturates; 63.5 rounds away from 0
    back = dequantize(q, [1 / 127, 1 / 254], 0, axis=1)
    assert np.allclose(back, [[1, -128 / 254], [64 / 127, 64 / 254]])
