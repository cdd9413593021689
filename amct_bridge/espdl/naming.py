"""Layer names -> C identifiers, unique and deterministic.

convert.py pastes layer names into C++ (``get_<name>_filter``, ``<name>_filter_element``) and
file names (``<name>_filter.npy``) without checking them, so every name we write must be a C
identifier that cannot escape the output directory. Rules, in order: every character outside
``[A-Za-z0-9_]`` (``/`` of nested models included) becomes ``_``; runs of ``_`` collapse and
leading/trailing ``_`` go (C++ reserves ``__`` and ``_X``); an empty result becomes ``layer``; a
digit-leading result or a C/C++ keyword gets the prefix ``l_``; a name already taken gets ``_2``,
``_3``... in the order given. So every result matches ``[A-Za-z][A-Za-z0-9]*(_[A-Za-z0-9]+)*``.

Example:
    >>> list(c_identifiers(["block1/conv.1", "block1_conv_1", "2nd", "int"]).values())
    ['block1_conv_1', 'block1_conv_1_2', 'l_2nd', 'l_int']
"""

from __future__ import annotations

import re

#: C++ keywords (and NULL): never a generated identifier (ESP-DL v1 C++ and file names).
CPP_KEYWORDS = frozenset(
    """alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
    char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
    co_return co_yield decltype default delete do double dynamic_cast else enum explicit export
    extern false float for friend goto if inline int long mutable namespace new noexcept not
    not_eq nullptr operator or or_eq private protected public register reinterpret_cast requires
    restrict return short signed sizeof static static_assert static_cast struct switch template
    this thread_local throw true try typedef typeid typename union unsigned using virtual void
    volatile wchar_t while xor xor_eq NULL""".split()
)

_NOT_IDENT = re.compile(r"[^A-Za-z0-9_]+")
_UNDERSCORES = re.compile(r"_+")
_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9]*(_[A-Za-z0-9]+)*\Z")


def c_identifier(name: str) -> str:
    """One name as a C identifier (not yet made unique).

    Example:
        >>> c_identifier("model/../conv 1")
        'model_conv_1'
    """
    ident = _UNDERSCORES.sub("_", _NOT_IDENT.sub("_", name)).strip("_")
    if not ident:
        return "layer"
    if not ident[0].isalpha() or ident in CPP_KEYWORDS:
        ident = "l_" + ident
    return ident


def is_c_identifier(name: str) -> bool:
    """True if ``name`` is safe to paste into C++ and into a file name.

    Example:
        >>> is_c_identifier("conv_1"), is_c_identifier("../x"), is_c_identifier("a__b")
        (True, False, False)
    """
    return bool(_IDENT.match(name)) and name not in CPP_KEYWORDS


def c_identifiers(names: list[str]) -> dict[str, str]:
    """Map each name to a unique C identifier, deterministically in the given order.

    Example:
        >>> c_identifiers(["a-b", "a_b", "a.b"])
        {'a-b': 'a_b', 'a_b': 'a_b_2', 'a.b': 'a_b_3'}
    """
    taken: set[str] = set()
    result: dict[str, str] = {}
    for name in names:
        base = c_identifier(name)
        ident, k = base, 1
        while ident in taken:
            k += 1
            ident = f"{base}_{k}"
        taken.add(ident)
        result[name] = ident
    return result
