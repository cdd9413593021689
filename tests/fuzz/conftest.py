"""Fuzz targets' setup: hypothesis profiles (see fuzz_support) and the end-of-run figures.

``make fuzz`` (``HYPOTHESIS_PROFILE=long``) and ``pytest tests/fuzz`` (``ci``) end with a table
of calls per target and how each ended: ``ok``, a documented error type, or ``UNEXPECTED <type>``
(a failure; hypothesis shrinks it and pytest reports the failing example). Not ``make test``:
its pytest-xdist workers keep their counts.
"""

from __future__ import annotations

from fuzz_support import CASES, PROFILE


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the per-target case counts of the fuzz run (nothing if no fuzz target ran)."""
    if not CASES:
        return
    tr = terminalreporter
    tr.section(f"fuzz figures (HYPOTHESIS_PROFILE={PROFILE})")
    total = unexpected = 0
    for target in sorted(CASES):
        counts = CASES[target]
        n = sum(counts.values())
        bad = sum(v for k, v in counts.items() if k.startswith("UNEXPECTED"))
        total, unexpected = total + n, unexpected + bad
        detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        tr.write_line(f"{target:<28} {n:>7} calls  ({detail})")
    failed = [r.nodeid for r in tr.stats.get("failed", []) if "tests/fuzz/" in r.nodeid]
    tr.write_line(
        f"total: {total} calls, {unexpected} unexpected outcomes (incl. shrinking), "
        f"{len(failed)} failing fuzz tests"
    )
    for nodeid in failed:
        tr.write_line(f"FAILED {nodeid} (its shrunk example is in the failure report above)")
