"""merge_tracked / differing (QAT ranges across ranks), ranks simulated by in_threads: the
steps-weighted mean of the ranks' EMAs is the EMA of their mean batch extremes (the reason the
MindSpore adapter merges EMAs at save only), unseen rows and learned rows that differ."""

import numpy as np

from amct_bridge.calibration.merge import differing, in_threads, merge_tracked
from amct_bridge.quant.qat import ema_update


def _ema(extremes: np.ndarray, decay: float) -> tuple[float, float]:
    lo = hi = 0.0
    for step, (a, b) in enumerate(extremes):
        lo, hi = ema_update(lo, hi, a, b, decay, first=step == 0)
    return lo, hi


def test_mean_of_rank_emas_is_the_ema_of_mean_extremes():
    rng = np.random.default_rng(3)
    steps, decay = 7, 0.9
    batches = [np.sort(rng.normal(0, 2, (steps, 2)), axis=1) for _ in range(2)]  # (min, max)
    held = [np.array([[*_ema(b, decay), steps]]) for b in batches]
    out = in_threads(2, lambda r, gather: merge_tracked(held[r], [False], gather))
    merged, differ = out[0]
    assert np.array_equal(merged, out[1][0]) and differ == []
    expect = _ema((batches[0] + batches[1]) / 2, decay)  # one EMA of the ranks' mean extremes
    np.testing.assert_allclose(merged[0, :2], expect, rtol=1e-5)
    assert merged[0, 2] == 2 * steps


def test_unseen_rows_and_learned_rows():
    held = [
        np.array([[1.0, 2.0, 0.0], [-1.0, 1.0, 2.0], [-2.0, 3.0, 2.0]]),
        np.array([[5.0, 6.0, 0.0], [-1.0, 1.0, 2.0], [-4.0, 3.0, 2.0]]),
    ]
    learned = [False, True, True]
    out = in_threads(2, lambda r, gather: merge_tracked(held[r], learned, gather))
    for r, (merged, differ) in enumerate(out):
        assert merged[0].tolist() == [*held[r][0, :2], 0.0]  # no rank saw it: kept, seen 0
        assert merged[1].tolist() == [-1.0, 1.0, 4.0]  # equal learned range: as is
        assert merged[2].tolist() == [-3.0, 3.0, 4.0] and differ == [2]  # differ: mean, listed


def test_differing():
    held = [np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.5, 3.0])]
    assert in_threads(2, lambda r, gather: differing(held[r], gather)) == [[1], [1]]
