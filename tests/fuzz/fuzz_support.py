"""Shared by the fuzz targets: hypothesis profiles, the "documented error or success" contract,
a hang guard and per-target case counts (printed by tests/fuzz/conftest.py at the end).

Profiles (``HYPOTHESIS_PROFILE``, default ``ci``): ``ci`` runs few, derandomized examples so the
whole tests/fuzz directory stays well under a minute inside ``make test``; ``long`` is the
``make fuzz`` campaign (about 10 minutes; scale it with ``FUZZ_SCALE``, e.g. ``0.5`` or ``3``).
Settings are applied per test (``fuzz_settings``), never with ``settings.load_profile``, so the
other hypothesis tests of the suite keep their own defaults.

Example:
    >>> from fuzz_support import attempt
    >>> attempt("doc", int, "3")
    (3, None)
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections import Counter, defaultdict

from hypothesis import HealthCheck, settings

from amct_bridge.errors import AmctBridgeError

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
SCALE = float(os.environ.get("FUZZ_SCALE", "1"))
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "ci",
    max_examples=10,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=_SLOW_OK,
    print_blob=True,
)
settings.register_profile(
    "long", max_examples=100, deadline=None, suppress_health_check=_SLOW_OK, print_blob=True
)

#: Examples per target: (ci, long). The long figures give about 10 minutes on 2 shared cores.
_EXAMPLES = {
    "fast": (25, 5000),  # protobuf / text / JSON targets (3-30 ms per case)
    "medium": (30, 10000),  # numpy exporter + coefficient writer + chip simulator (~5 ms)
    "keras": (2, 400),  # random Keras graph: build, discover, perturb, calibrate, export (~1 s)
}

#: Seconds one case may take before it counts as a hang (SIGALRM interrupts it).
HANG_SECONDS = {"fast": 10, "medium": 30, "keras": 120}

#: target -> Counter of outcomes ("ok", an AmctBridgeError subclass name, "UNEXPECTED ...").
CASES: dict[str, Counter] = defaultdict(Counter)


def fuzz_settings(kind: str) -> settings:
    """Hypothesis settings of a ``kind`` ("fast", "medium", "keras") target in this profile.

    Example:
        >>> fuzz_settings("fast").max_examples >= 1
        True
    """
    ci, long = _EXAMPLES[kind]
    n = ci if PROFILE == "ci" else max(1, int(long * SCALE))
    return settings(settings.get_profile(PROFILE), max_examples=n)


class Hang(Exception):
    """A case ran longer than its HANG_SECONDS (not an AmctBridgeError: the test fails)."""


@contextlib.contextmanager
def no_hang(seconds: float):
    """Raise :class:`Hang` in the block if it runs longer than ``seconds`` (main thread only).

    Example:
        >>> with no_hang(5):
        ...     pass
    """
    if seconds <= 0 or not hasattr(signal, "setitimer"):
        yield
        return

    def _alarm(signum, frame):
        raise Hang(f"no result after {seconds} s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def attempt(label: str, fn, /, *args, kind: str = "fast", **kwargs):
    """The fuzz contract for one call: ``(result, None)`` on success, ``(None, error)`` when it
    raised an AmctBridgeError subclass with a message; any other exception (or a hang) is
    re-raised for hypothesis to shrink. Each outcome is counted under ``label``.

    Example:
        >>> from amct_bridge.errors import RecordError
        >>> def refuse():
        ...     raise RecordError("x")
        >>> attempt("doc", refuse)[1].args, CASES["doc"]["RecordError"] >= 1
        (('x',), True)
    """
    try:
        with no_hang(HANG_SECONDS[kind]):
            result = fn(*args, **kwargs)
    except AmctBridgeError as err:
        if not str(err).strip():
            CASES[label]["UNEXPECTED empty message"] += 1
            raise AssertionError(f"{type(err).__name__} without a message") from err
        CASES[label][type(err).__name__] += 1
        return None, err
    except BaseException as err:
        CASES[label][f"UNEXPECTED {type(err).__name__}"] += 1
        raise
    CASES[label]["ok"] += 1
    return result, None
