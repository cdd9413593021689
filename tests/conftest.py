"""Shared test setup: quiet TensorFlow logs, paths of bundled data."""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

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
