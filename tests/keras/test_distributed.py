"""MirroredStrategy, 2 logical CPUs: replicas merged, record equals the single-device one."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def records():
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, str(HERE / "distributed_run.py"), "minmax", "hfmg", "ifmr"],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_two_replicas_ran(records):
    assert records["replicas"] == 2


def test_minmax_record_equals_single_device(records):
    mirrored, single = records["minmax"]["mirrored"], records["minmax"]["single"]
    assert mirrored == single
    # the extreme value only replica 1 saw made it into the record: input range [min, 9]
    assert mirrored["ca"][0] > 9.0 / 255


@pytest.mark.parametrize("algorithm, rel", [("hfmg", 0.02), ("ifmr", 0.02)])
def test_histogram_algorithms_within_tolerance(records, algorithm, rel):
    mirrored, single = records[algorithm]["mirrored"], records[algorithm]["single"]
    assert mirrored.keys() == single.keys()
    for key in single:
        (s_m, o_m, w_m), (s_s, o_s, w_s) = mirrored[key], single[key]
        assert s_m == pytest.approx(s_s, rel=rel), key
        assert abs(o_m - o_s) <= 3, key
        np.testing.assert_array_equal(w_m, w_s)
