"""Exported layers whose outputs must share one exponent (they meet at a Concat-like layer).

The ESP-DL v1 runtime's Concat (and Max2D / Min2D) keeps the exponent of its inputs and asserts
that all inputs have the same one. A chain's output exponent is chosen from its own range, so
two branches meeting at a Concatenate would trip that assertion on the chip. Chains reaching
the same multi-input exponent-keeping layer (through MaxPool, Reshape, ReLU... or other such
layers) are grouped, and every chain in a group gets the group's largest exponent (covers
all ranges: nothing saturates, the finer branches lose a little precision).

Example:
    >>> import numpy as np
    >>> from amct_bridge.espdl.plan import plan_chains
    >>> from amct_bridge.espdl.source import SourceLayer
    >>> w = {"kernel": np.ones((1, 1, 1, 1), np.float32)}
    >>> layers = [SourceLayer("in", "input"), SourceLayer("a", "conv2d", ["in"], weights=w),
    ...           SourceLayer("b", "conv2d", ["in"], weights=w),
    ...           SourceLayer("cat", "runtime", ["a", "b"], attrs={"keeps_exponent": True})]
    >>> groups, loose = shared_exponent_groups(layers, plan_chains(layers)[0])
    >>> groups, loose
    ([['a', 'b']], [])
"""

from __future__ import annotations

from amct_bridge.espdl.plan import Chain
from amct_bridge.espdl.source import SourceLayer, keeps_exponent


class _Sources:
    """Which chain ends (and which other layers) a tensor's exponent comes from."""

    def __init__(self, layers: list[SourceLayer], chains: list[Chain]) -> None:
        self.by_name = {layer.name: layer for layer in layers}
        self.lasts = {chain.last for chain in chains}

    def of(self, name: str, seen: set[str]) -> tuple[set[str], set[str]]:
        """(chain ends, non-chain layers) that ``name``'s exponent is inherited from."""
        if name in self.lasts:
            return {name}, set()
        layer = self.by_name.get(name)
        if layer is None or not keeps_exponent(layer) or name in seen:
            return set(), {name}
        seen.add(name)
        ends: set[str] = set()
        others: set[str] = set()
        for src in layer.inputs:
            e, o = self.of(src, seen)
            ends |= e
            others |= o
        return ends, others


def shared_exponent_groups(
    layers: list[SourceLayer], chains: list[Chain]
) -> tuple[list[list[str]], list[str]]:
    """Groups of chain ends (``Chain.last``) that must share an exponent, plus warnings.

    A warning names each multi-input layer that also reads a tensor we do not export (a model
    input, an Add...): the user must give that tensor the group's exponent by hand.
    """
    sources = _Sources(layers, chains)
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    loose = []
    for layer in layers:
        if not (keeps_exponent(layer) and len(layer.inputs) > 1):
            continue
        ends, others = sources.of(layer.name, set())
        members = sorted(ends)
        for other in members[1:]:
            parent[find(other)] = find(members[0])
        if members and others:
            loose.append(
                f"layer {layer.name!r} ({layer.kind or layer.op}) needs one exponent on all its "
                f"inputs, but {', '.join(sorted(repr(o) for o in others))} is not an exported "
                f"layer: give it the exponent of {members[0]!r}"
            )
    order = {chain.last: i for i, chain in enumerate(chains)}
    groups: dict[str, list[str]] = {}
    for end in parent:
        groups.setdefault(find(end), []).append(end)
    result = [sorted(g, key=order.__getitem__) for g in groups.values() if len(g) > 1]
    return sorted(result, key=lambda g: order[g[0]]), loose
