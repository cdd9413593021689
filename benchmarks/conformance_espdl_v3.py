"""Run every ``.espdl`` file of a folder through the simulator's check and print the table.

Each file is read, simulated on its embedded test inputs for the target in its metadata (or
``--target``), and its outputs compared with its test outputs under ``dl::Model::test()``'s rule
(:mod:`amct_bridge.espdl.v3.check`: int8 exact, int16 ±1, float32 within 2e-5), exactly as
``amct-bridge espdl-run FILE --check`` does. A file is

- ``equal``: every output within the rule (``exact`` counts the files where every value is
  exact, ``tolerance`` those where some value used the rule's tolerance: an int16 value one
  off, a float32 value within 2e-5 but not equal);
- ``different``: an output beyond the rule;
- ``refused``: the reader or the simulator refused it with a clear error (the reason is listed);
- ``crash``: any other exception (a bug).

Rows are ``<folder>`` groups (``--by target``: the first path component, as in Espressif's
suite ``esp32s3_8``; ``--by op``: the second). Without ``--quiet`` every non-equal file is
listed with its first difference or reason.

Example:
    python benchmarks/conformance_espdl_v3.py ../shared/fixtures/espdl_v3/ops_test
    python benchmarks/conformance_espdl_v3.py tests/data/espdl_v3/ops_test --by op --quiet
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import traceback
from pathlib import Path

from amct_bridge.errors import AmctBridgeError
from amct_bridge.espdl.v3 import read_espdl, simulate_espdl
from amct_bridge.espdl.v3.check import check_outputs

KINDS = ("equal", "exact", "tolerance", "different", "refused", "crash")


def check_file(path: Path, target: str | None = None) -> tuple[str, str]:
    """(outcome, detail) of one file: exact, tolerance, different, refused or crash."""
    try:
        model = read_espdl(path)
        if not model.test_outputs:
            return "refused", "no test outputs"
        result = simulate_espdl(model, None, target)
        expected = {t.name: t.data for t in model.test_outputs}
        want_exp = {t.name: t.exponent for t in model.test_outputs if len(t.exponents) == 1}
        checks = check_outputs(result.outputs, expected, result.exponents, want_exp)
    except AmctBridgeError as exc:
        return "refused", str(exc).replace(str(path), "").lstrip(": ")
    except Exception:  # noqa: BLE001 - a crash is what this script counts
        return "crash", traceback.format_exc(limit=-2).strip().splitlines()[-1]
    bad = [c for c in checks if not c.ok]
    if bad:
        return "different", bad[0].first or ""
    if all(c.exact == c.size for c in checks):
        return "exact", ""
    off = sum(c.within - c.exact for c in checks)
    return "tolerance", f"{off} value(s) within the rule's tolerance, not exact"


def main(argv: list[str] | None = None) -> int:
    """Check a folder and print the table; exit 1 when a file differs or crashes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--by", choices=("target", "op"), default="target")
    parser.add_argument("--target", help="simulate every file for this chip")
    parser.add_argument("--quiet", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    files = sorted(args.folder.rglob("*.espdl"))
    if not files:
        print(f"{args.folder}: no .espdl files", file=sys.stderr)
        return 2
    rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    details: list[tuple[str, str, str]] = []
    start = time.perf_counter()
    for path in files:
        rel = path.relative_to(args.folder)
        parts = rel.parts
        key = parts[0] if args.by == "target" or len(parts) < 3 else parts[1]
        if len(parts) < 2:
            key = "."
        outcome, detail = check_file(path, args.target)
        rows[key][outcome] += 1
        if outcome in ("exact", "tolerance"):
            rows[key]["equal"] += 1
        else:
            details.append((outcome, str(rel), detail))
    seconds = time.perf_counter() - start
    width = max(len(k) for k in rows) + 2
    header = f"{'':{width}}{'files':>7}" + "".join(f"{k:>11}" for k in KINDS)
    print(header)
    total: collections.Counter = collections.Counter()
    for key in sorted(rows):
        total.update(rows[key])
        count = sum(rows[key][k] for k in KINDS[1:])
        print(f"{key:{width}}{count:>7}" + "".join(f"{rows[key][k]:>11}" for k in KINDS))
    count = sum(total[k] for k in KINDS[1:])
    print(f"{'total':{width}}{count:>7}" + "".join(f"{total[k]:>11}" for k in KINDS))
    print(f"{len(files)} files in {seconds:.1f} s")
    if not args.quiet:
        for outcome, rel, detail in sorted(details):
            print(f"{outcome}: {rel}: {detail}")
    return 1 if total["different"] or total["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
