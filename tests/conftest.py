"""Shared test setup: quiet TensorFlow logs, paths of bundled data."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DATA = Path(__file__).parent / "data"


@pytest.fixture
def data_dir() -> Path:
    """tests/data (real files, each with its source and license in a README)."""
    return DATA
