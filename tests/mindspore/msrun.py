"""Start a test worker script under ``msrun`` with 2 CPU workers and read each rank's report
(``<out>/ranks/rank<r>.json``), for the data-parallel tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(worker: Path, out: Path, args: list[str], timeout: float) -> list[dict]:
    """Every rank's report, in rank order; the run must end (well) within ``timeout``. msrun
    starts ``python`` from PATH: the venv's ``bin/`` goes first (docs/mindspore.md)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [
        "msrun",
        f"--worker_num={WORLD}",
        f"--local_worker_num={WORLD}",
        f"--master_port={_free_port()}",
        f"--log_dir={out / 'log'}",
        "--join=True",
        str(worker),
        str(out),
        *args,
    ]
    done = subprocess.run(cmd, env=env, cwd=out, capture_output=True, text=True, timeout=timeout)
    logs = "".join(
        p.read_text(errors="replace")[-3000:] for p in sorted((out / "log").glob("worker_*.log"))
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:] + logs
    return read_reports(out, logs)


def read_reports(out: Path, logs: str = "") -> list[dict]:
    """``<out>/ranks/rank<r>.json`` of every rank, in rank order."""
    reports = []
    for r in range(WORLD):
        path = out / "ranks" / f"rank{r}.json"
        assert path.exists(), logs or f"{path} is missing"
        reports.append(json.loads(path.read_text()))
    return reports
