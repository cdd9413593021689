"""HFMG's kept search ranges in the switching case of issue 33 §5, against no kept ranges.

Run: ``.venv/bin/python benchmarks/bench_hfmg_switching.py [--cycles 8] [--paths calibrate]``.

One MobileNetV2 (alpha 0.35, 96x96, 256 images, batch 32: ``bench_ptq.py``'s model) calibrated
in cycles of minmax, ifmr, hfmg, minmax, ifmr, hfmg-cleared: the last call clears HFMG's kept
ranges first (``hfmg._SEARCHES.clear()``), so it searches every histogram as before the ranges
were kept. Each call is timed against a warm ``predict`` timed just before it, in wall time and
in CPU time (``time.process_time``, all threads). Printed per call kind: the median ratios over
the cycles after the first (each plan's first trace), with their range and the best seconds,
then the per-cycle paired hfmg/hfmg-cleared wall time and CPU ratio with their medians, and
the load average before and after.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from bench_ptq import PATHS, make_model  # noqa: E402

from amct_bridge.quant import hfmg  # noqa: E402

CYCLE = ("minmax", "ifmr", "hfmg", "minmax", "ifmr", "hfmg-cleared")


def run_path(path: str, x: np.ndarray, cycles: int, out: str) -> dict[str, np.ndarray]:
    """``cycles + 1`` cycles of :data:`CYCLE`; per call kind, rows of (wall ratio, CPU ratio,
    wall seconds), the first cycle left out."""
    timer = PATHS[path]
    model = make_model()
    model.predict(x[:32], batch_size=32, verbose=0)  # build and trace the plain step
    runs: dict[str, list[tuple[float, float, float]]] = {}
    for cycle in range(cycles + 1):
        for kind in CYCLE:
            algo = kind.split("-")[0]
            wall, cpu = time.perf_counter(), time.process_time()
            model.predict(x, batch_size=32, verbose=0)
            base_wall, base_cpu = time.perf_counter() - wall, time.process_time() - cpu
            if kind == "hfmg-cleared":
                hfmg._SEARCHES.clear()
            wall, cpu = time.perf_counter(), time.process_time()
            timer(model, x, os.path.join(out, f"{kind}.txt"), algo)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if cycle:
                runs.setdefault(kind, []).append((wall / base_wall, cpu / base_cpu, wall))
    del model
    gc.collect()
    return {kind: np.array(rows) for kind, rows in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=8, help="timed cycles after the first")
    parser.add_argument("--paths", default=",".join(PATHS), help="calibrate and/or callback")
    parser.add_argument("--images", type=int, default=256)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (args.images, 96, 96, 3)).astype("float32")
    out = tempfile.mkdtemp()
    for path in args.paths.split(","):
        load = os.getloadavg()[0]
        runs = run_path(path, x, args.cycles, out)
        print(f"\n{path}: {args.cycles} cycles of {', '.join(CYCLE)}; x warm predict")
        for kind, rows in runs.items():
            wall, cpu = rows[:, 0], rows[:, 1]
            print(
                f"{kind:<13} wall {np.median(wall):5.2f} [{wall.min():.2f}-{wall.max():.2f}]"
                f"  cpu {np.median(cpu):5.2f} [{cpu.min():.2f}-{cpu.max():.2f}]"
                f"  best {rows[:, 2].min():.3f} s"
            )
        kept, cleared = runs["hfmg"], runs["hfmg-cleared"]
        paired_wall, paired_cpu = kept[:, 2] / cleared[:, 2], kept[:, 1] / cleared[:, 1]
        print(
            f"hfmg / hfmg-cleared per cycle: wall s {np.round(paired_wall, 2).tolist()} "
            f"(median {np.median(paired_wall):.2f}); CPU ratio {np.round(paired_cpu, 2).tolist()} "
            f"(median {np.median(paired_cpu):.2f})"
        )
        print(f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
