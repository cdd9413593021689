"""Two processes calibrating into the same record path at once.

Each worker process (this file run as a script) calibrates the same tiny Keras model on its own
data, first into its own directory (its reference), then into a shared path in rounds: at each
round's start signal both write at the same moment (round 0: a real calibration, ``predict``
with the callback; later rounds: the session's end-of-run write again). After each round the
shared record must be, byte for byte, one worker's reference record, and its sidecar that same
worker's sidecar (a record beside the other run's sidecar would pair factors with ranges they
were not computed from); no temp file may be left.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from amct_bridge.records import load, validate
from amct_bridge.records.calibration import load_stats, sidecar_path

ROUNDS = 30


def _wait_for(paths: list[Path], workers: list, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"workers did not reach {paths}"
        dead = [w for w in workers if w.poll() is not None]
        assert not dead, [w.stdout.read().decode()[-3000:] for w in dead]
        time.sleep(0.001)


def test_two_processes_one_record_path(tmp_path):
    shared = tmp_path / "shared" / "record.txt"
    shared.parent.mkdir()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, str(k), str(tmp_path), str(shared)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for k in (1, 2)
    ]
    winners = []
    try:
        _wait_for([tmp_path / f"ready{k}" for k in (1, 2)], workers, 240)
        own = {k: tmp_path / f"own{k}" / "record.txt" for k in (1, 2)}
        refs = {k: (p.read_bytes(), sidecar_path(p).read_bytes()) for k, p in own.items()}
        assert refs[1][0] != refs[2][0] and refs[1][1] != refs[2][1]  # the runs differ
        for r in range(ROUNDS):
            (tmp_path / f"go{r}").touch()
            _wait_for([tmp_path / f"done{k}_{r}" for k in (1, 2)], workers, 120)
            got = (shared.read_bytes(), sidecar_path(shared).read_bytes())
            assert got in (refs[1], refs[2]), f"round {r}: not one worker's record + sidecar"
            winners.append(1 if got == refs[1] else 2)
            assert sorted(os.listdir(shared.parent)) == ["record.txt", "record.txt.calib.json"]
        outputs = [w.communicate(timeout=60)[0].decode() for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    assert [w.returncode for w in workers] == [0, 0], outputs
    rec = load(shared)
    assert set(rec.layers) == {"fc1", "fc2"} and validate(rec) == []
    assert set(load_stats(sidecar_path(shared)).layers) == {"fc1", "fc2"}
    print("last writer per round:", winners)


def _worker(k: int, root: Path, shared: Path) -> None:
    """Calibrate into ``root/own<k>``, then into ``shared`` at each round's signal."""
    import keras
    import numpy as np

    from amct_bridge.keras import QuantCalibration, calibrate

    keras.utils.set_random_seed(0)
    inp = keras.Input((6,))
    x = keras.layers.Dense(8, activation="relu", name="fc1")(inp)
    model = keras.Model(inp, keras.layers.Dense(2, name="fc2")(x), name="tiny")
    data = np.random.default_rng(k).normal(0.0, float(k), (64, 6)).astype("float32")
    (root / f"own{k}").mkdir()
    calibrate(model, data, root / f"own{k}" / "record.txt", algorithm="minmax")
    cb = QuantCalibration(shared, algorithm="minmax")
    model.predict(data[:8], batch_size=8, verbose=0)  # trace the plain step before the race
    (root / f"ready{k}").touch()
    for r in range(ROUNDS):
        while not (root / f"go{r}").exists():
            time.sleep(0.0002)
        if r == 0:
            model.predict(data, batch_size=32, verbose=0, callbacks=[cb])
        else:
            # the write step the callback ran at the end of predict, again (same files)
            cb._session.write(cb._outputs())
        (root / f"done{k}_{r}").touch()


if __name__ == "__main__":
    _worker(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
