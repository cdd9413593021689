"""Every ``--mindspore`` command runs with TensorFlow and Keras unimportable (a MindSpore-only
install, ``amct-bridge[mindspore]``): calibrate, report, prune-groups, export-espdl.
``prune-groups --mindspore`` imported the Keras adapter first and stopped with exit 70."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

NETS = Path(__file__).resolve().parent / "nets.py"

SCRIPT = """
import sys
sys.modules["tensorflow"] = None  # import tensorflow / keras raise ImportError
sys.modules["keras"] = None
from amct_bridge.cli import main
net = sys.argv[1] + ":flatten_dense"
d = sys.argv[2]
codes = [
    main(["calibrate", "--mindspore", net, "--data", d + "/x.npy", "-o", d + "/r.txt",
          "--algorithm", "minmax"]),
    main(["prune-groups", "--mindspore", net, "--input-shape", "1,3,6,6",
          "--record", d + "/prune.txt"]),
    main(["export-espdl", "--mindspore", net, "--input-shape", "1,3,6,6",
          "--record", d + "/r.txt", "--out", d + "/espdl"]),
    main(["report", "--mindspore", net, "--record", d + "/r.txt", "--data", d + "/x.npy"]),
]
print("codes", codes, "loaded", [m for m in ("tensorflow", "keras") if sys.modules.get(m)])
"""


def test_mindspore_commands_need_no_tensorflow(tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(0, 1, (8, 3, 6, 6)).astype("f4"))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(NETS), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert "codes [0, 0, 0, 0] loaded []" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert (tmp_path / "prune.txt").is_file() and (tmp_path / "espdl" / "config.json").is_file()
