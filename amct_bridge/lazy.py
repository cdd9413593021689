"""Names a package exports from submodules that are imported on first use (PEP 562), so that
``import amct_bridge.mindspore`` imports no framework until a name is used.

Example:
    >>> __getattr__, __dir__ = lazy_exports("json", {"dumps": "json"})
    >>> __getattr__("dumps")([1])
    '[1]'
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, table: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``table`` maps a name to its module.

    The first use binds the name in the package (so a submodule of the same name, bound by its
    import, is replaced by the function it exports).

    Example:
        >>> getattr_, dir_ = lazy_exports("json", {"loads": "json"})
        >>> getattr_("loads")("[2]"), "loads" in dir_()
        ([2], True)
    """

    def __getattr__(name: str) -> Any:
        if name in table:
            value = getattr(importlib.import_module(table[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
