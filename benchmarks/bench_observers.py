"""Observer throughput (numpy path: batch_stats + update_stats) and bounded-vs-exact accuracy.

Run: .venv/bin/python benchmarks/bench_observers.py [--batches 5] [--size 1000000] [--no-accuracy]

Prints, for 1M-element float32 batches:
- update throughput per algorithm (elements/s) and its cost relative to minmax;
- the one-off cost of ``factors()`` (the search) per algorithm;
- the HFMG search alone (candidate trimming, then the L2 of every candidate) per ``num_of_bins``;
- ``hfmg_search`` per call, CPU time: a histogram searched for the first time against the same
  histogram again (its best range kept: a repeated calibration on the same data);
- AMCT-style exact IFMR on the same data (all activations kept, one pass per candidate) as a
  baseline for the bounded IFMR;
- the deviation of every bounded algorithm from the brute-force exact reference, in % of scale_d.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "quant"))

from _common import best_of  # noqa: E402
from quant_reference import exact_hfmg, exact_ifmr, exact_percentile  # noqa: E402

from amct_bridge.quant import hfmg  # noqa: E402
from amct_bridge.quant.factors import activation_factors  # noqa: E402
from amct_bridge.quant.hfmg import (  # noqa: E402
    NUM_OF_BINS_CHOICES,
    hfmg_search,
    l2_losses,
    search_candidates,
)
from amct_bridge.quant.observers import make_observer  # noqa: E402

ALGORITHMS = ["minmax", "ema", "percentile", "ifmr", "hfmg"]


def throughput(batches: list[np.ndarray]) -> None:
    n = sum(b.size for b in batches)
    print(f"\nupdate throughput, {len(batches)} batches x {batches[0].size:,} float32 elements")
    print(f"{'algorithm':<11} {'bins':>6} {'Melem/s':>9} {'vs minmax':>10} {'factors() ms':>13}")
    base = None
    for name in ALGORITHMS:

        def feed(name=name):
            obs = make_observer(name)
            for b in batches:
                obs.update(b)
            return obs

        seconds = best_of(feed)
        obs = feed()
        fin = best_of(lambda obs=obs: hfmg._SEARCHES.clear() or obs.factors())  # no kept range
        base = base or seconds
        print(
            f"{name:<11} {obs.bins:>6} {n / seconds / 1e6:>9.1f} {seconds / base:>9.2f}x "
            f"{fin * 1e3:>13.1f}"
        )
    raw = best_of(lambda: [(b.min(), b.max()) for b in batches])
    print(
        f"{'np.min+max':<11} {'':>6} {n / raw / 1e6:>9.1f} {raw / base:>9.2f}x  (raw numpy floor)"
    )
    allx = np.concatenate(batches)
    exact = best_of(lambda: exact_ifmr(allx), repeats=1)
    ifmr = best_of(lambda: [make_observer("ifmr").update(b) for b in batches] and None, 1)
    print(
        f"exact AMCT-style IFMR on the same {n:,} values (kept in memory, 61 passes): "
        f"{exact:.2f} s = {exact / base:.1f}x minmax; bounded IFMR update+search: "
        f"{ifmr + fin:.2f} s"
    )


def _relu_histograms(seed: int):
    """(bins, "relu" / "relu6", integer counts of 1e8 ReLU-like values) per bin count."""
    rng = np.random.default_rng(seed)
    for bins in NUM_OF_BINS_CHOICES:
        for name, x in (
            ("relu", np.maximum(rng.normal(0.3, 1.0, 2_000_000), 0.0)),
            ("relu6", np.clip(rng.normal(1.0, 2.5, 2_000_000), 0.0, 6.0)),
        ):
            yield bins, name, np.round(np.histogram(x, bins=bins)[0] * 50.0)


def hfmg_search_cost() -> None:
    """HFMG search on integer histograms of 1e8 ReLU-like values (~0.4n to 0.75n candidates)."""
    print("\nHFMG search, ReLU-like histogram of 1e8 values, 8-bit (256 destination bins)")
    print(f"{'bins':>6} {'data':<8} {'candidates':>10} {'trim ms':>8} {'L2 ms':>8}")
    for bins, name, counts in _relu_histograms(0):
        ranges = search_candidates(counts)
        trim = best_of(lambda counts=counts: search_candidates(counts), repeats=5)
        l2 = best_of(lambda c=counts, r=ranges: l2_losses(c, r, 256), repeats=5)
        print(f"{bins:>6} {name:<8} {len(ranges):>10} {trim * 1e3:>8.2f} {l2 * 1e3:>8.2f}")


def hfmg_repeat_cost(rounds: int = 15) -> None:
    """CPU time of one ``hfmg_search`` call on a histogram seen for the first time (the kept
    ranges cleared) and on the same histogram again, in interleaved rounds (medians)."""
    print(f"\nhfmg_search per call, CPU ms (median of {rounds} interleaved rounds), 8-bit")
    print(f"{'bins':>6} {'data':<8} {'first':>8} {'again':>8} {'again/first':>12}")
    for bins, name, counts in _relu_histograms(1):
        first, again = [], []
        for _ in range(rounds):
            hfmg._SEARCHES.clear()
            for times in (first, again):
                start = time.process_time()
                hfmg_search(counts, 0.0, 6.0)
                times.append(time.process_time() - start)
        a, b = np.median(first) * 1e3, np.median(again) * 1e3
        print(f"{bins:>6} {name:<8} {a:>8.3f} {b:>8.3f} {b / a:>11.3f}x")


def datasets(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "relu": np.maximum(rng.normal(0.3, 1.0, n), 0.0),
        "relu6": np.clip(rng.normal(1.0, 2.5, n), 0.0, 6.0),
        "gaussian": rng.normal(0.0, 1.0, n),
        "heavy_t3": rng.standard_t(3, n),
    }


def accuracy(n: int, parts: int) -> None:
    print(f"\ndeviation from brute force on all data ({n:,} values in {parts} growing batches),")
    print("|scale_d - exact| / exact in %, offset difference in brackets")
    print(f"{'data':<10} {'ifmr':>12} {'ifmr sym':>12} {'percentile':>12} {'hfmg 4096':>12}")
    rng = np.random.default_rng(0)
    for name, x in datasets(n, rng).items():
        x = x.astype(np.float32)
        batches = [b * np.float32(1 + 0.15 * i) for i, b in enumerate(np.array_split(x, parts))]
        allx = np.concatenate(batches)
        cells = []
        refs = [
            ("ifmr", {}, exact_ifmr(allx)),
            ("ifmr", {"activation_offset": False}, exact_ifmr(allx, symmetric=True)),
            ("percentile", {}, activation_factors(*exact_percentile(allx, 0.999999, 0.999999))),
            ("hfmg", {}, activation_factors(*exact_hfmg(allx, 4096))),
        ]
        for algo, opts, (rs, ro) in refs:
            obs = make_observer(algo, **opts)
            for b in batches:
                obs.update(b)
            s, o = obs.factors()
            cells.append(f"{abs(s - rs) / rs * 100:.3f} [{o - ro:+d}]")
        print(f"{name:<10} " + " ".join(f"{c:>12}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--no-accuracy", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(42)
    batches = [
        rng.normal(0, 1 + 0.1 * i, args.size).astype(np.float32) for i in range(args.batches)
    ]
    throughput(batches)
    hfmg_search_cost()
    hfmg_repeat_cost()
    if not args.no_accuracy:
        accuracy(1_200_000, 4)


if __name__ == "__main__":
    main()
