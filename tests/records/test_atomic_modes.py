"""Outputs get the mode an ordinary write would give them (issue 14, bug 2)."""

import os
import stat
from contextlib import contextmanager

import numpy as np

from amct_bridge.espdl.writer import write_directory
from amct_bridge.records import LayerFactors, Record, save
from amct_bridge.records.atomic import atomic_write_bytes, current_umask
from amct_bridge.records.calibration import CalibrationStats, save_stats


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _record() -> Record:
    record = Record(flavor="inner")
    record.layers["fc"] = LayerFactors(scale_d=0.5, offset_d=-128, scale_w=[0.1], offset_w=[0])
    return record


def test_current_umask_reads_without_changing_it():
    with umask(0o027):
        assert current_umask() == 0o027
        assert current_umask() == 0o027  # reading did not reset it


def test_new_record_and_sidecar_follow_the_umask(tmp_path):
    for mask in (0o022, 0o002, 0o077):
        with umask(mask):
            path = tmp_path / f"record_{mask:o}.txt"
            save(_record(), path)
            save_stats(CalibrationStats(algorithm="minmax", batches=1), tmp_path / f"s{mask:o}")
            expected = 0o666 & ~mask
            assert _mode(path) == expected, oct(_mode(path))
            assert _mode(tmp_path / f"s{mask:o}") == expected


def test_overwrite_keeps_the_existing_mode(tmp_path):
    path = tmp_path / "record.txt"
    path.write_text("old")
    os.chmod(path, 0o640)
    with umask(0o077):  # the existing file's mode wins over the umask, as with open("w")
        save(_record(), path)
    assert _mode(path) == 0o640
    assert "fc" in path.read_text()
    os.chmod(path, 0o604)
    atomic_write_bytes(path, b"x")
    assert _mode(path) == 0o604


def test_no_temp_file_left_after_a_write(tmp_path):
    atomic_write_bytes(tmp_path / "a", b"1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_export_directory_files_follow_the_umask(tmp_path):
    buf = np.zeros(2, np.float32).tobytes()
    with umask(0o022):
        write_directory(tmp_path / "out", {"config.json": b"{}", "a.bin": buf})
    assert _mode(tmp_path / "out") == 0o755
    assert _mode(tmp_path / "out" / "config.json") == 0o644
