"""Copy the representative subset of Espressif's operator test suite into this folder.

Rule (README.md): for every 8-bit target folder and every op, the smallest file; for the 16-bit
folders, the smallest file of every op on each target when all three are under 60 KB, else on
one target only (rotating c, esp32s3, esp32p4 over the ops in name order). Files already here
(copied for a specific test) are kept.

Example:
    python tests/data/espdl_v3/ops_test/select_subset.py ../shared/fixtures/espdl_v3/ops_test
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

SMALL = 60_000
SIXTEEN = ("c_16", "esp32s3_16", "esp32p4_16")


def select(suite: Path) -> list[Path]:
    """The files of ``suite`` that the rule keeps, as paths relative to it."""
    smallest: dict[tuple[str, str], Path] = {}
    for path in sorted(suite.glob("*/*/*.espdl")):
        key = (path.parent.parent.name, path.parent.name)
        if key not in smallest or path.stat().st_size < smallest[key].stat().st_size:
            smallest[key] = path
    chosen = [p for (folder, _), p in smallest.items() if folder.endswith("_8")]
    ops16 = sorted({op for (folder, op) in smallest if folder.endswith("_16")})
    for i, op in enumerate(ops16):
        have = [smallest[(f, op)] for f in SIXTEEN if (f, op) in smallest]
        if all(p.stat().st_size < SMALL for p in have):
            chosen += have
        else:
            rotation = SIXTEEN[i % 3 :] + SIXTEEN[: i % 3]
            chosen.append(next(smallest[(f, op)] for f in rotation if (f, op) in smallest))
    return sorted(p.relative_to(suite) for p in chosen)


def main(suite: Path) -> None:
    """Copy the selection next to this script."""
    here = Path(__file__).parent
    total = 0
    for rel in select(suite):
        target = here / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(suite / rel, target)
        total += target.stat().st_size
    print(f"{len(select(suite))} files, {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
