"""Cluster graphs (networkx) and their frozen form with links and routes."""

from .cluster import GPU, IB_SWITCH, NIC, NVSWITCH, Cluster, Link, build_graph

__all__ = ["GPU", "IB_SWITCH", "NIC", "NVSWITCH", "Cluster", "Link", "build_graph"]
