"""Cluster graphs (networkx) and their frozen form with links and routes."""

from .cluster import Cluster, Link, build_graph
from .fabric import FABRICS, FabricShape, cable_count
from .node import GPU, NIC, NVLINK_TOPOLOGIES, NVSWITCH, SWITCH, NodeShape
from .pattern import PatternCluster, one_switch
from .tree_pattern import TreePatternCluster

__all__ = [
    "FABRICS",
    "GPU",
    "NIC",
    "NVLINK_TOPOLOGIES",
    "NVSWITCH",
    "SWITCH",
    "TreePatternCluster",
    "Cluster",
    "FabricShape",
    "Link",
    "NodeShape",
    "PatternCluster",
    "build_graph",
    "cable_count",
    "one_switch",
]
