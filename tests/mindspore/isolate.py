"""Run a test in a fresh interpreter: for tests that leave MindSpore in a state that changes
later tests' graphs.

Found here: after a MindIR export of a network with ``out += y`` (InplaceAddExt), and a GRAPH_MODE
``Model`` run of another network, a third network's ``nn.ReLU6`` cell exports with the scope
``Default/ReLU6-op0`` instead of ``Default/3-ReLU6/ReLU6-op0``, so its primitive reads as a
functional op (MindSpore 2.10, CPU). A user's process meets it only in that sequence; the suite
must not depend on which tests a worker ran before.

Also for a test whose ``gc.collect()`` would pay for every earlier test's garbage in a
long-lived worker (tests/keras/test_kept_step.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

_FLAG = "AMCT_BRIDGE_ISOLATED"


def in_fresh_process(request) -> bool:
    """True in the parent: the test ran (and passed) in a subprocess; False in the child.

    Use: ``if in_fresh_process(request): return`` at the top of the test.
    """
    if os.environ.get(_FLAG) == request.node.nodeid:
        return False
    root = str(request.config.rootpath)
    env = {**os.environ, _FLAG: request.node.nodeid}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
        + [request.node.nodeid],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert " passed" in done.stdout, done.stdout[-2000:]
    return True
