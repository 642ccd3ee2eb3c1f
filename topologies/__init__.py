"""Cluster graphs (drawn as a `Drawing`) and their frozen form with links and routes."""

from .cluster import Cluster, Link, build_graph
from .fabric import FABRICS, PLANAR, FabricShape, cable_count
from .node import GPU, NIC, NVLINK_TOPOLOGIES, NVSWITCH, SWITCH, NodeShape
from .pattern import PatternCluster, one_switch
from .tree_pattern import TreePatternCluster

# a cluster in any of its frozen forms: the whole graph, or its repeating unit counted
AnyCluster = Cluster | PatternCluster | TreePatternCluster

__all__ = [
    "AnyCluster",
    "FABRICS",
    "PLANAR",
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
