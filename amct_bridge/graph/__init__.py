"""Framework-free graph IR and channel-pruning discovery.

Example:
    >>> from amct_bridge.graph import Graph, discover_groups
    >>> discover_groups(Graph()).groups
    []
"""

from amct_bridge.graph.groups import Discovery, Member, PruneGroup, Refusal, discover_groups
from amct_bridge.graph.ir import Graph, Node, TensorInfo
from amct_bridge.graph.reasons import Reason

__all__ = [
    "Discovery",
    "Graph",
    "Member",
    "Node",
    "PruneGroup",
    "Reason",
    "Refusal",
    "TensorInfo",
    "discover_groups",
]
