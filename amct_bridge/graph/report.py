"""Human table and JSON views of a pruning discovery (used by ``amct-bridge prune-groups``).

Example:
    >>> from amct_bridge.graph.groups import Discovery, Member, PruneGroup
    >>> d = Discovery([PruneGroup(4, [Member("c1", "Conv2D", 0, 4)],
    ...                           [Member("c2", "Conv2D", 0, 4, closing=True)])])
    >>> print(format_table(d))
    group 1: 4 channels
      producer  c1  Conv2D  [0, 4)
      consumer  c2  Conv2D  [0, 4)
    1 group(s), 0 refusal(s)
"""

from __future__ import annotations

from typing import Any

from amct_bridge.graph.groups import Discovery, Member, Refusal
from amct_bridge.graph.ir import Node


def _range(m: Member) -> str:
    text = f"[{m.begin}, {m.end})"
    extra = " ".join(f"{k}={v}" for k, v in m.attrs)
    return f"{text} {extra}" if extra else text


def _rows(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]


def format_table(
    discovery: Discovery,
    selective: tuple[list[Node], list[Refusal]] | None = None,
) -> str:
    """Groups (producers, consumers with ranges), refusals with reasons, and 2:4 layers.

    Args:
        discovery: result of ``discover_groups``.
        selective: ``selective_candidates(graph)`` to list 2:4-eligible layers too, or None.
    """
    lines = []
    for i, group in enumerate(discovery.groups, 1):
        lines.append(f"group {i}: {group.width} channels")
        rows = [["producer", m.name, m.op_type, _range(m)] for m in group.producers]
        rows += [["consumer", m.name, m.op_type, _range(m)] for m in group.consumers]
        lines.extend(_rows(rows))
    if discovery.refusals:
        lines.append("refused:")
        lines.extend(
            _rows(
                [
                    [r.layer, f"[{r.begin}, {r.end})", r.reason.value, r.detail]
                    for r in discovery.refusals
                ]
            )
        )
    if selective is not None:
        eligible, refused = selective
        lines.append(f"2:4 selective pruning: {len(eligible)} eligible layer(s)")
        rows = [
            [n.layer, n.kind, "mask_shape " + str(list(n.params["kernel_shape"]))] for n in eligible
        ]
        rows += [[r.layer, r.detail.split(" ")[0], r.reason.value] for r in refused]
        if rows:
            lines.extend(_rows(rows))
    lines.append(f"{len(discovery.groups)} group(s), {len(discovery.refusals)} refusal(s)")
    return "\n".join(lines)


def _member(m: Member) -> dict[str, Any]:
    out = {"name": m.name, "type": m.op_type, "begin": m.begin, "end": m.end}
    out.update(dict(m.attrs))
    return out


def to_json(
    discovery: Discovery, selective: tuple[list[Node], list[Refusal]] | None = None
) -> dict[str, Any]:
    """A JSON-ready dict: ``groups``, ``refusals`` and (if given) ``selective``.

    Example:
        >>> to_json(Discovery())
        {'groups': [], 'refusals': []}
    """
    out: dict[str, Any] = {
        "groups": [
            {
                "width": g.width,
                "producers": [_member(m) for m in g.producers],
                "consumers": [_member(m) for m in g.consumers],
            }
            for g in discovery.groups
        ],
        "refusals": [_refusal(r) for r in discovery.refusals],
    }
    if selective is not None:
        eligible, refused = selective
        out["selective"] = {
            "layers": [
                {"name": n.layer, "kind": n.kind, "mask_shape": list(n.params["kernel_shape"])}
                for n in eligible
            ],
            "refusals": [_refusal(r) for r in refused],
        }
    return out


def _refusal(r: Refusal) -> dict[str, Any]:
    return {
        "layer": r.layer,
        "begin": r.begin,
        "end": r.end,
        "reason": r.reason.value,
        "detail": r.detail,
    }
