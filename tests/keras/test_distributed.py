"""MirroredStrategy, 2 logical CPUs: replicas merged, record equals the single-device one.
MultiWorkerMirroredStrategy, 2 local worker processes: each worker records its own batches."""

import json
import os
import socket
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


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for sock in socks:
        sock.bind(("localhost", 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    return ports


@pytest.fixture(scope="module")
def worker_records(tmp_path_factory):
    """Two MultiWorkerMirroredStrategy workers on localhost, one process each."""
    out = tmp_path_factory.mktemp("multiworker")
    cluster = {"worker": [f"localhost:{port}" for port in _free_ports(2)]}
    procs = []
    for index in range(2):
        config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = dict(os.environ, PYTHONPATH=str(HERE), TF_CONFIG=json.dumps(config))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "multiworker_run.py"), str(out), "minmax", "hfmg"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=400)
        assert proc.returncode == 0, stderr[-3000:]
        line = next(ln for ln in stdout.splitlines() if ln.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT ") :]))
    return results


def test_multiworker_each_worker_records_its_own_batches(worker_records):
    """Each worker's record is the single-device record of the data that worker read (its
    buffers are local, as documented); the two workers' records differ."""
    assert [r["task"] for r in worker_records] == [0, 1]
    assert all(r["workers"] == 2 for r in worker_records)
    for result in worker_records:
        for algorithm in ("minmax", "hfmg"):
            assert result[algorithm]["worker"] == result[algorithm]["single"], algorithm
    assert worker_records[0]["minmax"]["worker"] != worker_records[1]["minmax"]["worker"]
