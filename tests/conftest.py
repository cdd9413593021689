"""Shared test setup: quiet TensorFlow logs, paths of bundled data, the ``once`` fixture for
costly fixtures several modules read, the order of the slowest files, and the garbage
collector kept off the long-lived objects (see the hooks at the end)."""

import fcntl
import gc
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One thread per TensorFlow kernel: `make test`'s two workers already fill the two cores, and
# two pools of two threads each contend (two Keras files, twice at once: 49 s -> 46 s each).
# Results are compared at stated tolerances, which other thread counts and CPUs fit as well.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

DATA = Path(__file__).parent / "data"

# Helper modules beside the tests (quant_reference.py, calib_models.py, ...) are imported by
# basename; importlib mode does not put their folders on sys.path, so do it here.
sys.path[:0] = [
    str(d) for d in sorted(Path(__file__).parent.iterdir()) if d.is_dir() and d.name != "data"
]


@pytest.fixture
def data_dir() -> Path:
    """tests/data (real files, each with its source and license in a README)."""
    return DATA


@pytest.fixture(scope="session")
def once(tmp_path_factory) -> Callable[[str, Callable[[Path], object]], Path]:
    """``once(name, make)``: a folder that ``make(folder)`` filled once in this test session,
    for costly fixtures that several test modules read (a trained model, an msrun). Under
    pytest-xdist the workers share the session's temp root: the first to ask makes it while
    holding a lock, the others wait and read the same files. The readers must not write there.

    >>> folder = once("digits_cnn", lambda f: (f / "x.txt").write_text("1"))  # doctest: +SKIP
    """
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base

    def get(name: str, make: Callable[[Path], object]) -> Path:
        folder, done = root / f"once-{name}", root / f"once-{name}.done"
        with open(root / f"once-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)  # another worker's failed attempt
                folder.mkdir()
                make(folder)
                done.touch()
        return folder

    return get


#: The test files that take longest (``pytest --durations=0``, summed per file, on a quiet 2-core
#: machine, 2026-12-07), costliest first. They are
#: dealt alternately to the starts of the two halves that ``-n 2 --dist worksteal`` gives its
#: workers (xdist splits the collection in contiguous halves and steals from their ends), so
#: neither worker is left running a long test alone at the end. Order only: a file renamed or
#: removed here is ignored.
SLOW_FIRST = (
    "mindspore/test_ms_dataparallel.py",
    "mindspore/test_ms_v3_twins_rnn.py",
    "mindspore/test_ms_v3_upsample.py",
    "keras/test_qat.py",
    "mindspore/test_ms_qat.py",
    "mindspore/test_ms_qat_digits.py",
    "mindspore/test_ms_v3_twins_conv.py",
    "mindspore/test_espdl_export.py",
    "mindspore/test_espdl_dense_head.py",
    "espdl_v3/test_v3_keras_applications.py",
    "mindspore/test_espdl_eval.py",
    "mindspore/test_calibration_errors.py",
    "test_demo.py",
    "mindspore/test_graph.py",
    "mindspore/test_calibration.py",
    "mindspore/test_graph_back_to_back.py",
    "keras/test_distributed.py",
    "mindspore/test_ms_v3_layer_norm.py",
    "calibration/test_keras_pins.py",
    "keras/test_native_ops.py",
    "espdl/test_relu6.py",
)


def pytest_collection_modifyitems(session, config, items) -> None:
    """Start each worker's half with its share of the slowest files (:data:`SLOW_FIRST`);
    the tests of a file stay together, so module fixtures are built once per worker."""
    root = Path(__file__).parent
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    slow: dict[int, list] = {}
    rest = []
    for item in items:
        try:
            name = Path(str(item.path)).relative_to(root).as_posix()
        except ValueError:
            name = ""
        if name in rank:
            slow.setdefault(rank[name], []).append(item)
        else:
            rest.append(item)
    if not slow:
        return
    halves: list[list] = [[], []]
    for i, key in enumerate(sorted(slow)):
        halves[i % 2].extend(slow[key])
    k = max(0, len(items) // 2 - len(halves[0]))
    items[:] = halves[0] + rest[:k] + halves[1] + rest[k:]


def _freeze() -> None:
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session) -> None:
    """Move everything the imports made (TensorFlow, Keras, MindSpore, the test modules) out of
    the garbage collector's reach. MindSpore runs ``gc.collect()`` before every graph compile and
    TensorFlow's tracing triggers full collections; each walked these millions of long-lived
    objects again (a fifth of ``tests/mindspore/test_calibration.py``'s time). Objects the tests
    make are still collected as before."""
    _freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a module's last test (its fixtures torn down): collect its garbage, then freeze what
    survives (module caches, TensorFlow's registries), so the next modules' collections skip it.
    Measured on tests/mindspore + tests/keras with ``-n 2``: time in the collector 90 s -> 16 s,
    the run 414 s -> 361 s, each worker's peak memory unchanged (2.0 GB)."""
    yield
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        _freeze()
