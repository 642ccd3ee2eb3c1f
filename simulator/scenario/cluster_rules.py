"""The cluster's rules (GPU record, NVLink topology, NVLS, the fabrics' shapes), apart
from `rules` to keep each module small; `rules` runs them in its order."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir.vocabulary import NVLS
from .errors import ScenarioError
from .gpu import GpuSpec

if TYPE_CHECKING:
    from .spec import ClusterSpec, Scenario


def check_cluster(cluster: ClusterSpec) -> None:
    if not isinstance(cluster.gpu, GpuSpec):
        # the file names a preset and the loader looks it up; in Python, the record itself
        raise ScenarioError(
            key="cluster.gpu",
            value=cluster.gpu,
            rule="must be a GpuSpec (a GPU record such as "
            "stepsim.scenario.presets.GPUS['a100-sxm4-80gb']), not a name",
        )
    gpn, topology = cluster.gpus_per_node, cluster.nvlink_topology
    if topology == "all-to-all" and gpn > 7:
        raise ScenarioError(
            key="cluster.gpus_per_node",
            value=gpn,
            rule="must be <= 7 for cluster.nvlink_topology='all-to-all' (6 NVLink lanes per GPU)",
        )
    if topology == "hybrid-cube-mesh" and gpn != 8:
        raise ScenarioError(
            key="cluster.gpus_per_node",
            value=gpn,
            rule="must be 8 for cluster.nvlink_topology='hybrid-cube-mesh'",
        )
    if cluster.nvls_efficiency and topology != "nvswitch":
        raise ScenarioError(
            key="cluster.nvls_efficiency",
            value=cluster.nvls_efficiency,
            rule=f"must be 0 for cluster.nvlink_topology={topology!r} (NVLS reduces in an "
            "NVSwitch)",
        )
    if cluster.fabric == "rail-only" and cluster.num_nodes > cluster.nodes_per_leaf:
        raise ScenarioError(
            key="cluster.num_nodes",
            value=cluster.num_nodes,
            rule=f"must be <= cluster.nodes_per_leaf={cluster.nodes_per_leaf}: a rail-only fabric "
            "has one switch per rail, holding nodes_per_leaf nodes (raise it to the switch's "
            "ports, or use cluster.fabric='multi-plane')",
        )
    planes = cluster.fabric_planes
    if planes is not None and cluster.nics_per_node % planes:
        raise ScenarioError(
            key="cluster.fabric_planes",
            value=planes,
            rule=f"must divide cluster.nics_per_node={cluster.nics_per_node} (NIC k on plane k "
            "mod fabric_planes)",
        )
    if cluster.nics_per_node > gpn:
        raise ScenarioError(
            key="cluster.nics_per_node",
            value=cluster.nics_per_node,
            rule=f"must be <= cluster.gpus_per_node={gpn}",
        )


def check_nvls(scenario: Scenario) -> None:
    """`nvls` asks for the NVSwitch's in-switch reduction, which only NVSwitch
    generation 3 and later have (NCCL refuses NCCL_ALGO=NVLS where it is missing)."""
    if scenario.network.collective_algorithm == NVLS and scenario.cluster.nvls_fraction == 0:
        raise ScenarioError(
            key="network.collective_algorithm",
            value=NVLS,
            rule=f"needs an NVSwitch that reduces (NVLS: H100/H200/H800/B200/GB200 nodes); "
            f"cluster.node={scenario.cluster.node!r} has none (or set cluster.nvls_efficiency)",
        )
