"""How refusals and repeated warnings are worded for a user: a summary by kind first, each
explanation once with the layers it applies to, and what to do next (the CLI flag and the Python
argument, replace_relu6, ESP-DL v3).

A keras.applications model can have ~100 refused layers (EfficientNetV2B0, MobileNetV3,
ConvNeXt) and the same 300-character explanation 17 times (ResNet50V2's pre-activation
BatchNormalization): a plain list of one line per layer buries what matters.

Example:
    >>> from amct_bridge.espdl.plan import Problem
    >>> print(refusal_message([Problem("t", "Activation", "activation 'tanh': no such layer")]))
    ... # doctest: +NORMALIZE_WHITESPACE
    ESP-DL v1 cannot take these layers:
      layer 't' (Activation): activation 'tanh': no such layer
    to export the rest, pass --skip-unsupported (Python: skip_unsupported=True): the layers above
    are left out (listed in export.json) for the host to compute; or export ESP-DL v3 instead
    (--format espdl), whose runtime has more layers
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from amct_bridge.espdl.plan import Problem

#: Lists with at least this many refused layers start with a summary by kind.
SUMMARY_FROM = 4

#: A warning repeated for at least this many layers is printed once, with the first layers.
REPEAT_FROM = 3

#: How many layer names a grouped warning shows (the full list: -v, export.json, the sidecar).
FIRST_FEW = 5

SKIP_HINT = (
    "to export the rest, pass --skip-unsupported (Python: skip_unsupported=True): the layers "
    "above are left out (listed in export.json) for the host to compute; or export ESP-DL v3 "
    "instead (--format espdl), whose runtime has more layers"
)


def label(problem: Problem) -> str:
    """The short name a refusal is counted under in the summary: the problem's ``topic`` (e.g.
    ``ReLU6``), else the kind and the refused activation (``Activation (hard_silu)``), else
    the kind.

    Example:
        >>> label(Problem("a", "Activation", "activation 'hard_silu': no such layer"))
        'Activation (hard_silu)'
        >>> label(Problem("c", "Conv2D", "groups 96: not supported by the ESP-DL v1 exporter"))
        'Conv2D (groups)'
    """
    if problem.topic:
        return problem.topic
    found = re.match(r"activation '([^']+)'", problem.reason)
    if found:
        return f"{problem.kind} ({found.group(1)})"
    # a short leading clause names what is refused ("groups 96: ...", "dilation (2, 2): ...")
    clause = problem.reason.split(":", 1)[0]
    words = re.sub(r"[\d(),.\s]+", " ", clause).split()
    if ":" in problem.reason and 0 < len(words) <= 3 and problem.kind not in clause:
        return f"{problem.kind} ({' '.join(words)})"
    return problem.kind


def summary(problems: list[Problem]) -> str:
    """``N layers: 18 Activation (hard_silu), 14 Multiply, ...``, most frequent first.

    Example:
        >>> summary([Problem("a", "Multiply", "x"), Problem("b", "Multiply", "x"),
        ...          Problem("c", "LSTM", "y")])
        '3 layers: 2 Multiply, 1 LSTM'
    """
    counts = Counter(label(p) for p in problems)
    kinds = ", ".join(f"{n} {kind}" for kind, n in counts.most_common())
    return f"{len(problems)} layer{'s' if len(problems) != 1 else ''}: {kinds}"


def grouped_lines(problems: Iterable[Problem], prefix: str = "") -> list[str]:
    """One line per distinct explanation, in the order of its first layer: ``layer 'x' (Kind):
    reason`` for one layer, ``N layers (Kind): 'a', 'b', ...: reason`` for several.

    Example:
        >>> grouped_lines([Problem("b1", "BatchNormalization", "no fold"),
        ...                Problem("r", "ReLU", "ReLU6"),
        ...                Problem("b2", "BatchNormalization", "no fold")])
        ["2 layers (BatchNormalization): 'b1', 'b2': no fold", "layer 'r' (ReLU): ReLU6"]
    """
    groups: dict[tuple[str, str], list[Problem]] = {}
    for problem in problems:
        groups.setdefault((problem.kind, problem.reason), []).append(problem)
    lines = []
    for (kind, reason), members in groups.items():
        if len(members) == 1:
            lines.append(f"{prefix}{members[0]}")
        else:
            names = ", ".join(repr(p.layer) for p in members)
            lines.append(f"{prefix}{len(members)} layers ({kind}): {names}: {reason}")
    return lines


def refusal_message(problems: list[Problem], runtime: str = "ESP-DL v1") -> str:
    """The error text of an export that refuses ``problems`` (not empty): a header (with a
    summary by kind when the list is long), the grouped explanations, then what helps.

    Example:
        >>> p = [Problem(f"m{i}", "Multiply", "no Mul") for i in range(4)]
        >>> for line in refusal_message(p).splitlines()[:2]:
        ...     print(line)
        ESP-DL v1 cannot take 4 layers: 4 Multiply:
          4 layers (Multiply): 'm0', 'm1', 'm2', 'm3': no Mul
    """
    if len(problems) >= SUMMARY_FROM:
        head = f"{runtime} cannot take {summary(problems)}:"
    else:
        head = f"{runtime} cannot take these layers:"
    return "\n".join([head, *grouped_lines(problems, "  "), SKIP_HINT])


def _template(message: str) -> str:
    """``message`` with its quoted names and numbers blanked: warnings that differ only there
    say the same thing about different layers."""
    text = re.sub(r"'[^']*'", "'_'", message)
    return re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "#", text)


def _first_name(message: str) -> str | None:
    found = re.search(r"'([^']*)'", message)
    return found.group(1) if found else None


def group_repeated(
    messages: list[str], *, repeat_from: int = REPEAT_FROM, first_few: int = FIRST_FEW
) -> tuple[list[str], list[list[str]]]:
    """Fold warnings that say the same thing about many layers into one line each.

    Returns the lines to print (a repeated warning becomes its first occurrence plus
    ``(and N more layers alike: 'b', 'c', ...)``) and, per folded line, every message it
    stands for (for -v / a file holding the full list). Messages repeated fewer than
    ``repeat_from`` times are kept as they are, in their order.

    Example:
        >>> lines, full = group_repeated([f"layer 'c{i}': bias 0 rounds" for i in range(4)])
        >>> lines, len(full[0])
        (["layer 'c0': bias 0 rounds (and 3 more layers alike: 'c1', 'c2', 'c3')"], 4)
    """
    by_template: dict[str, list[str]] = {}
    for message in messages:
        by_template.setdefault(_template(message), []).append(message)
    lines: list[str] = []
    folded: list[list[str]] = []
    for members in by_template.values():
        if len(members) < repeat_from:
            lines.extend(members)
            continue
        names = [repr(n) for n in map(_first_name, members[1:]) if n is not None]
        shown = ", ".join(names[:first_few]) + (", ..." if len(names) > first_few else "")
        more = len(members) - 1
        lines.append(f"{members[0]} (and {more} more layers alike: {shown})")
        folded.append(members)
    return lines, folded


def chip_cannot_run(graph_error: str | None) -> str:
    """The closing warning of an export without a chip graph (e.g. ``--skip-unsupported`` left
    out a layer between two chip layers): config.json and the coefficients are written, but
    the chip cannot run the model as one network.

    Example:
        >>> chip_cannot_run("layer 'p' (ZeroPadding2D): its input 'a' was skipped")
        ... # doctest: +ELLIPSIS
        "the chip cannot run this export as one network: layer 'p' (ZeroPadding2D): its ...
    """
    why = graph_error or "no chip graph"
    return (
        f"the chip cannot run this export as one network: {why}. config.json and the "
        "coefficients are written (convert.py takes them), but espdl-eval cannot simulate it "
        "and no C++ model class is written: compute the skipped layers on the host between the "
        "chip's parts, replace them in the model, or export ESP-DL v3 (--format espdl)"
    )
