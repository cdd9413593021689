"""Cost of the cross-rank merge of ``QuantCalibration`` in a 2-worker data-parallel run.

Run: ``.venv/bin/python benchmarks/bench_mindspore_dp.py [--batches N] [--algorithm A] [--task T]``
(``msrun`` from the interpreter's ``bin`` is put first on PATH).

``msrun --worker_num=2`` of tests/mindspore/ms_dp_worker.py (GRAPH_MODE, its tiny conv net,
``N`` batches of 4 per rank, ``Model.eval`` or ``Model.train``) with the callback. Each rank
times, inside the run:

* ``merge``: what the end of the run adds for the ranks: the ok/error agreement, the merge of
  every observer (summaries, per-channel ranges, histograms on the common grid; three to five
  AllGathers) and the agreement after rank 0 wrote;
* ``per-step agreement``: the one small AllGather per step with which the ranks agree none
  failed (so a failing rank stops all at once): the first (it also sets up the collective) and
  the median of the others (each also waits for the slower rank: a sync point);

and prints them against the whole ``Model.eval`` / ``train`` call of that rank. The first
AllGather of a process also sets up the collective (about 1-2 s measured): it is paid by the
first step's agreement.

Measured (this 2-core VM, shared): see docs/mindspore.md, "Data-parallel runs".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import msrun_command, msrun_env  # noqa: E402

WORKER = Path(__file__).resolve().parents[1] / "tests" / "mindspore" / "ms_dp_worker.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=24, help="batches per rank")
    parser.add_argument("--algorithm", default="hfmg", choices=["minmax", "hfmg", "ifmr"])
    parser.add_argument("--task", default="eval", choices=["eval", "train"])
    args = parser.parse_args()
    env = msrun_env(WORKER.parents[2])
    case = "bench" if args.task == "eval" else "bench-train"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        cmd = msrun_command(
            out / "log",
            [
                str(WORKER),
                str(out),
                case,
                args.algorithm,
                str(args.batches * 2 * 4),
            ],
        )
        done = subprocess.run(cmd, env=env, cwd=out, capture_output=True, text=True, timeout=600)
        if done.returncode:
            sys.exit(done.stdout[-2000:] + done.stderr[-2000:])
        reports = [json.loads((out / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    print(
        f"2 workers, {args.task}, {args.algorithm}, {args.batches} batches of 4 per rank "
        "(GRAPH_MODE)"
    )
    print(
        f"{'rank':>4} {'run s':>8} {'merge s':>8} {'merge/run':>9} {'agree s':>8} "
        f"{'first ms':>8} {'median ms':>9} {'agree/run':>9}"
    )
    for r, rep in enumerate(reports):
        if "error" in rep:
            sys.exit(f"rank {r}: {rep['error']}")
        (one,) = rep["runs"].values()
        if "error" in one:
            sys.exit(f"rank {r}: {one['error']}")
        run, merge, agree = one["run_seconds"], rep["merge_seconds"], rep["steps_agree_seconds"]
        each = sorted(rep["agree_each"][1:]) or [0.0]
        first = rep["agree_each"][0] if rep["agree_each"] else 0.0
        # the first agreement also sets up the collective; each one also waits for the slower
        # rank's step (a sync point), so the median is the steady figure
        print(
            f"{r:>4} {run:8.2f} {merge:8.3f} {merge / run:9.3f} {agree:8.3f} "
            f"{1000 * first:8.1f} {1000 * each[len(each) // 2]:9.2f} {agree / run:9.3f}"
        )


if __name__ == "__main__":
    main()
