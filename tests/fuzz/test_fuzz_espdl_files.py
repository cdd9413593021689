"""Fuzz: mutated ``.espdl`` files through ``amct-bridge espdl-run FILE --check``
(:mod:`fuzz_espdl_files`), in a child process under a 3 GB address-space limit.

Every case must end in success (exit 0/1) or one clean error line naming the file (exit 2):
no internal error, no hang, no MemoryError. ``make test`` runs a few cases of each of the eight
kinds; ``make fuzz`` (``HYPOTHESIS_PROFILE=long``) runs 1,500 of each (about 6 minutes), a new
seed per day, and docs/errors.md gives its figures.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

from fuzz_espdl_files import KINDS, main
from fuzz_support import CASES, PROFILE, SCALE

RUNNER = Path(__file__).with_name("fuzz_espdl_files.py")
#: Cases per kind: (ci, long).
CASES_PER_KIND = (12, 1500)


def test_mutated_espdl_files_get_clean_answers():
    ci, long = CASES_PER_KIND
    cases = ci if PROFILE == "ci" else max(1, int(long * SCALE))
    # ci: the same cases every run; long: a new seed each day, still reproducible from the report
    seed = 1 if PROFILE == "ci" else int(datetime.date.today().strftime("%Y%m%d"))
    run = subprocess.run(
        [sys.executable, str(RUNNER), "--seed", str(seed), "--cases", str(cases)],
        capture_output=True,
        text=True,
        timeout=600 + 2 * cases * len(KINDS),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    for kind, counts in result["counts"].items():
        for outcome, n in counts.items():
            label = outcome if outcome in ("success", "clean") else f"UNEXPECTED {outcome}"
            CASES[f"espdl-file:{kind}"][label] += n
    assert set(result["counts"]) == set(KINDS)
    assert sum(sum(c.values()) for c in result["counts"].values()) == cases * len(KINDS)
    assert not result["failures"], json.dumps(result["failures"][:5], indent=1)


def test_runner_reports_a_crash_as_a_failure(tmp_path, monkeypatch, capsys):
    """The campaign can fail: a plain error inside the simulator is counted as ``internal``
    (here every node divides by zero, past the simulator's own guard)."""
    from amct_bridge.espdl.v3 import simulate

    def broken(ctx, node, fn):
        return 1 // 0

    monkeypatch.setattr(simulate, "_run_node", broken)
    main(["--seed", "1", "--cases", "5", "--memory-gb", "0"])
    result = json.loads(capsys.readouterr().out)
    assert any(f["outcome"] == "internal" for f in result["failures"])
