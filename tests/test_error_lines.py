"""Error lines stay bounded and printable whatever the input holds (issue 32): a one-line
1.1 MB record gave a 2.2 MB error, a layer name with a NUL put a NUL byte on stderr."""

from __future__ import annotations

import subprocess
import sys

from amct_bridge.cli import MAX_ERROR_CHARS, error_text


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "amct_bridge", *args], capture_output=True, timeout=120
    )


def test_a_huge_one_line_record_gives_a_bounded_error(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text("x" * 1_100_000)
    done = _run("validate", str(path))
    assert done.returncode == 2
    err = done.stderr.decode()
    assert err.startswith("amct-bridge validate: error: ") and str(path) in err
    assert len(err) < MAX_ERROR_CHARS + 200
    assert "more characters)" in err


def test_control_characters_are_escaped():
    assert error_text("layer 'a\x00b\x1b[2J' refused") == "layer 'a\\x00b\\x1b[2J' refused"
    assert error_text("two\nlines") == "two\nlines"  # multi-line lists stay readable


def test_a_nul_in_an_error_never_reaches_stderr(tmp_path):
    path = tmp_path / "nul.espdl"
    path.write_bytes(b"EDL9\x00\x00name")  # a bad magic of bytes
    done = _run("espdl-run", str(path / "\x01x"))  # a path with a control character
    assert done.returncode == 2 and b"\x00" not in done.stderr and b"\x01" not in done.stderr
