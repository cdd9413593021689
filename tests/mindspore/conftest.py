"""Fixtures shared by the MindSpore tests."""

from __future__ import annotations

import mindspore as ms
import pytest

MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}


@pytest.fixture(params=list(MODES))
def mode(request):
    """Each test once in GRAPH_MODE and once in PYNATIVE_MODE (``"graph"`` / ``"pynative"``);
    the context's mode is put back afterwards. Parametrize it indirectly to pick one."""
    before = ms.get_context("mode")
    ms.set_context(mode=MODES[request.param])
    yield request.param
    ms.set_context(mode=before)
