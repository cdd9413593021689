"""Framework-free graph IR and channel-pruning discovery.

Example:
    >>> from amct_bridge.graph import Graph, Node, TensorInfo
    >>> Graph().nodes
    []
"""

from amct_bridge.graph.ir import Graph, Node, TensorInfo

__all__ = ["Graph", "Node", "TensorInfo"]
