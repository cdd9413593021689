"""kill -9 in the middle of a write runs no cleanup: the temp it was filling stays. The next run
to the same path removes it, so that what is left is the complete output alone (issue 32)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from amct_bridge.espdl.writer import write_directory
from amct_bridge.records.atomic import atomic_write_bytes

# The child writes a complete temp, then is killed (SIGKILL, by itself) at the commit: the worst
# case, a whole file under a temp name. ``os.replace`` / ``os.rename`` are the commits.
CHILD = """
import os, signal, sys
from pathlib import Path
from amct_bridge.records.atomic import atomic_write_bytes
from amct_bridge.espdl.writer import write_directory
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
os.replace = die
os.rename = die
target = Path(sys.argv[2])
if sys.argv[1] == "file":
    atomic_write_bytes(target, b"x" * 547_000)
else:
    write_directory(target, {"model.json": b"{}", "w.npy": b"y" * 1000})
"""


def _killed_write(kind: str, target: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(target)], capture_output=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stderr


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_next_run_removes_what_a_killed_run_left(tmp_path, kind):
    target = tmp_path / ("model.espdl" if kind == "file" else "export")
    _killed_write(kind, target)
    stale = _left(tmp_path)
    assert stale and all(name.startswith(f".{target.name}.") for name in stale), stale
    assert not target.exists()
    if kind == "file":
        atomic_write_bytes(target, b"complete")
        assert target.read_bytes() == b"complete"
    else:
        write_directory(target, {"model.json": b"{}"})
        assert _left(target) == ["model.json"]
    assert _left(tmp_path) == [target.name]


def test_a_live_writers_temp_and_other_files_stay(tmp_path):
    target = tmp_path / "r.txt"
    live = tmp_path / f".r.txt.{os.getpid()}.abcd.tmp"  # this process is alive
    other = tmp_path / ".r.txt.notes.tmp"  # not a pid: not ours
    neighbour = tmp_path / ".s.txt.999999999.x.tmp"  # another path's temp
    for path in (live, other, neighbour):
        path.write_bytes(b"keep")
    atomic_write_bytes(target, b"new")
    assert _left(tmp_path) == sorted([target.name, live.name, other.name, neighbour.name])
