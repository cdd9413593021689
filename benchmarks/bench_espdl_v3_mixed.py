"""ESP-DL v3 mixed precision (``feature_type="auto"``): its time against a plain export, and
the held-out accuracy of all-int8, auto and all-int16.

Run: .venv/bin/python benchmarks/bench_espdl_v3_mixed.py [--max-drop 0.005] [--target esp32s3]
[--repeats 3] [--mobilenet]

Nets: the digits CNN and the swish / squeeze-excite net of bench_espdl_v3_search.py
(``--mobilenet``: also its MobileNetV2 alpha 0.35 at 48x48), trained on scikit-learn's digits
(1400 train, 397 held out), calibrated on 256 training digits; auto judges on 512. For each
net: the best of ``--repeats`` wall times of the plain s8 export (range rule) and of
``feature_type="auto"`` with ``exponents="max"`` (the choice alone) and with the search (the
choice, then the exponents searched at those widths) against the s8 search, interleaved in the
same process, with their ratios; the layers auto took to int16 and the drops it measured; the
held-out accuracy of float, all-int8, auto and all-int16 (range rule).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
from bench_espdl_v3_search import _nets, trained_net  # noqa: E402

from amct_bridge.espdl.v3 import simulate_espdl  # noqa: E402
from amct_bridge.espdl.v3.evaluation import quantize_input  # noqa: E402
from amct_bridge.keras import export_espdl  # noqa: E402


def _accuracy(res, x, y, target: str) -> float:
    out = simulate_espdl(res.model, quantize_input(res.model, x, target), target)
    pred = next(iter(out.outputs.values())).reshape(len(x), -1).argmax(-1)
    return float(np.mean(pred == y))


def main() -> None:
    """Parse the options, run the nets, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-drop", type=float, default=0.005)
    parser.add_argument("--target", default="esp32s3")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mobilenet", action="store_true")
    args = parser.parse_args()
    nets = [n for n in _nets() if args.mobilenet or not n[0].startswith("MobileNet")]
    with tempfile.TemporaryDirectory() as tmp:
        for name, size, channels, epochs, build in nets:
            model, record, x, y, train, test, _ = trained_net(
                size, channels, epochs, build, Path(tmp)
            )
            data, target = x[train[:512]], args.target
            runs = {
                "s8 plain": {},
                "auto (max)": {"feature_type": "auto", "exponents": "max"},
                "s8 searched": {"exponents": "search"},
                "auto searched": {"feature_type": "auto", "exponents": "search"},
            }
            best = dict.fromkeys(runs, float("inf"))
            results = {}
            for _ in range(args.repeats):
                for label, extra in runs.items():
                    if extra.get("feature_type") == "auto":
                        extra = {**extra, "max_drop": args.max_drop}
                    given = data if extra else None
                    start = time.perf_counter()
                    results[label] = export_espdl(
                        model,
                        record,
                        None,
                        format="espdl",
                        target=target,
                        calibration_data=given,
                        **extra,
                    )
                    best[label] = min(best[label], time.perf_counter() - start)
            s16 = export_espdl(
                model, record, None, format="espdl", target=target, feature_type="s16"
            )
            mixed = results["auto (max)"].mixed
            ref = model.predict(x[test], verbose=0).argmax(-1)
            print(f"{name} ({target}, max_drop {args.max_drop:g}):")
            print(f"  {mixed.summary()}")
            print(
                f"  time: s8 plain {best['s8 plain']:.2f} s, auto (max) {best['auto (max)']:.2f} s "
                f"(x{best['auto (max)'] / best['s8 plain']:.1f}); s8 searched "
                f"{best['s8 searched']:.2f} s, auto searched {best['auto searched']:.2f} s "
                f"(x{best['auto searched'] / best['s8 searched']:.1f})"
            )
            acc = {
                "all-int8": _accuracy(results["s8 plain"], x[test], y[test], target),
                "auto": _accuracy(results["auto (max)"], x[test], y[test], target),
                "all-int16": _accuracy(s16, x[test], y[test], target),
                "auto searched": _accuracy(results["auto searched"], x[test], y[test], target),
            }
            line = ", ".join(f"{k} {v:.4f}" for k, v in acc.items())
            print(f"  held-out accuracy: float {np.mean(ref == y[test]):.4f}, {line}")


if __name__ == "__main__":
    main()
