"""Cross-rank merge of calibration statistics (amct_bridge.calibration.merge), framework-free:
ranks are threads of this process joined by a real barrier collective (merge.in_threads)."""

import numpy as np
import pytest

from amct_bridge.calibration.merge import (
    agree,
    check_shards,
    in_threads,
    merge_observers,
    merge_ranges,
)
from amct_bridge.errors import CalibrationError
from amct_bridge.quant.observers import make_observer


def _batches(seed: int, n: int = 6) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # ReLU-like data with a heavy tail whose range differs per batch (grids must move)
    return [
        np.maximum(rng.standard_t(4, 4000) * (1 + 0.3 * k), -0.5).astype(np.float32)
        for k in range(n)
    ]


@pytest.mark.parametrize(
    "algorithm,options",
    [
        ("minmax", {}),
        ("hfmg", {"num_of_bins": 1024}),
        ("ifmr", {}),
        ("percentile", {"max_percentile": 0.999, "min_percentile": 0.999}),
    ],
)
@pytest.mark.parametrize("world", [2, 3])
def test_merge_equals_single_process_over_the_union(algorithm, options, world):
    shards = [_batches(10 + r) for r in range(world)]
    single = make_observer(algorithm, **options)
    for shard in shards:
        for batch in shard:
            single.update(batch)

    def rank(r, gather):
        mine = make_observer(algorithm, **options)
        for batch in shards[r]:
            mine.update(batch)
        before = mine.state_dict()
        merged = merge_observers([mine], gather)[0]
        assert mine.state_dict() == before  # the rank's own observer is untouched
        return merged

    merged = in_threads(world, rank)
    for m in merged:
        assert not isinstance(m, BaseException), m
        assert (m.count, m.batches) == (single.count, single.batches)
        assert m.observed_range() == single.observed_range()  # exact
    ref_scale, ref_offset = single.factors()
    factors = [m.factors() for m in merged]
    assert len(set(factors)) == 1  # every rank computes the same factors
    scale, offset = factors[0]
    if algorithm == "minmax":
        assert (scale, offset) == (ref_scale, ref_offset)
    else:  # docs/keras.md, docs/quantization.md: merged histograms within 0.5 % of scale_d
        assert abs(scale - ref_scale) <= 0.005 * ref_scale, (scale, ref_scale)
        assert abs(offset - ref_offset) <= 1


def test_a_rank_without_batches_and_ema():
    data = _batches(3, 4)

    def rank(r, gather):
        obs = make_observer("ema", momentum=0.5)
        for batch in data[r * 2 : r * 2 + 2] if r < 2 else []:
            obs.update(batch)
        return merge_observers([obs], gather)[0]

    merged = in_threads(3, rank)
    a, b = make_observer("ema", momentum=0.5), make_observer("ema", momentum=0.5)
    for batch in data[:2]:
        a.update(batch)
    for batch in data[2:]:
        b.update(batch)
    ref = a.merge(b)  # the observers' own merge: batch-weighted mean of the EMA states
    for m in merged:
        assert m.batches == 4 and m.clip_range() == pytest.approx(ref.clip_range(), rel=1e-12)


def test_merge_ranges_drops_unseen():
    held = [
        np.array([[np.inf, -1.0], [-np.inf, 2.0]]),
        np.array([[-3.0, 0.0], [0.5, 5.0]]),
    ]
    out = in_threads(2, lambda r, gather: merge_ranges(held[r], gather))
    for o in out:
        assert o.tolist() == [[-3.0, -1.0], [0.5, 5.0]]


def test_a_failing_rank_fails_every_rank_by_name():
    def rank(r, gather):
        error = ValueError("layer 'conv1': input of batch 3 contains NaN") if r == 1 else None
        agree(gather, error, "the calibration merge")
        return "went on"

    out = in_threads(3, rank, timeout=20)
    for result in out:
        assert isinstance(result, CalibrationError), result
        assert "rank 1 of 3 failed in the calibration merge" in str(result)
        assert "layer 'conv1': input of batch 3 contains NaN" in str(result)
    assert isinstance(out[1].__cause__, ValueError)  # the failed rank keeps its own error


def test_a_rank_error_that_says_no_record_written_says_it_once():
    """Issue 33 §5: the session's own NaN error ends "; no record written", and the merged
    message added it again ("...; no record written; no record written")."""
    text = "layer 'c1': input of batch 1 contains NaN or Inf (min nan, max nan); no record written"

    def rank(r, gather):
        agree(gather, CalibrationError(text) if r == 1 else None, "calibration step 2")

    for result in in_threads(2, rank, timeout=20):
        message = str(result)
        assert message == f"rank 1 of 2 failed in calibration step 2: {text}", message
        assert message.count("no record written") == 1

    def both(r, gather):  # several ranks: each rank's text without it, then once at the end
        agree(gather, CalibrationError(text.replace("'c1'", f"'c{r}'")), "the merge")

    for result in in_threads(2, both, timeout=20):
        assert str(result).count("no record written") == 1, str(result)
        assert str(result).endswith("(min nan, max nan); no record written")

    empty = "no calibration batch was seen; no record written (empty dataset or steps=0?)"
    out = in_threads(2, lambda r, gather: agree(gather, CalibrationError(empty), "the merge"))
    assert str(out[0]) == f"all 2 ranks failed in the merge: {empty}"


def test_ranks_with_other_points_are_refused():
    out = in_threads(2, lambda r, gather: agree(gather, None, "the merge", layout=f"net{r}"))
    assert all(isinstance(o, CalibrationError) and "different tensors" in str(o) for o in out)


def test_rank_count_must_divide_the_data():
    check_shards(12, 3)
    with pytest.raises(CalibrationError, match=r"10 samples, which 4 ranks .*drop 2 or add 2"):
        check_shards(10, 4)


def test_merge_observed_channel_and_site_ranges():
    from amct_bridge.calibration.merge import merge_observed
    from amct_bridge.calibration.protocol import Point
    from amct_bridge.calibration.session import Observed

    def rank(r, gather):
        obs = make_observer("minmax")
        obs.update(np.array([-1.0 - r, 2.0 + 3 * r]))
        point = Point("conv", "input", None, channel_axis=1, channels=3, calls=2)
        chans = np.array([[-1.0, -2.0 * r, 0.0], [1.0, 2.0, 3.0 + r]], np.float32)
        sites = [[-1.0, 1.0 + r], [-1.0 - r, 2.0]]
        mine = [Observed(point, obs, channel_range=chans, sites=sites)]
        merged, total = merge_observed(mine, 3 + r, gather)
        assert mine[0].sites == sites and mine[0].observer is obs  # inputs untouched
        return merged[0], total

    for merged, total in in_threads(2, rank):
        assert total == 7
        assert merged.observer.observed_range() == (-2.0, 5.0)
        assert merged.channel_range.tolist() == [[-1.0, -2.0, 0.0], [1.0, 2.0, 4.0]]
        assert merged.sites == [[-1.0, 2.0], [-2.0, 2.0]]
