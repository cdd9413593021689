"""Every ``--mindspore`` command runs with TensorFlow and Keras unimportable (a MindSpore-only
install, ``amct-bridge[mindspore]``): calibrate, report, prune-groups, export-espdl.
``prune-groups --mindspore`` imported the Keras adapter first and stopped with exit 70."""

from __future__ import annotations

import os
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


BAD_NET = """
from mindspore import nn, ops


class Bad(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def construct(self, x):
        return ops.matmul(self.conv(x), ops.ones((5, 7)))  # 8 columns meet 5 rows


def bad():
    return Bad()
"""


def test_mindspore_compile_log_only_with_verbose(tmp_path):
    """A failed compile: MindSpore's C++ stack and source dump (20 lines) came before our
    one-line summary; it is behind -v now, and the summary says so."""
    (tmp_path / "badnet.py").write_text(BAD_NET)
    cmd = [sys.executable, "-m", "amct_bridge", "prune-groups", "--mindspore", "badnet.py:bad"]
    cmd += ["--input-shape", "1,3,8,8"]
    # an in-process main() of an earlier test may have set GLOG_v here: not for these
    env = {k: v for k, v in os.environ.items() if k != "GLOG_v"}
    run = {"cwd": tmp_path, "capture_output": True, "text": True, "timeout": 300, "env": env}
    quiet = subprocess.run(cmd, **run)
    assert quiet.returncode == 2, quiet.stderr
    assert "[ERROR]" not in quiet.stderr and "C++ Call Stack" not in quiet.stderr
    assert "MindIR export failed" in quiet.stderr and "rerun with -v" in quiet.stderr
    loud = subprocess.run([*cmd, "-v"], **run)
    assert loud.returncode == 2
    assert "C++ Call Stack" in loud.stderr and "analyze_fail.ir" in loud.stderr
