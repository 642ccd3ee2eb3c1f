"""What the scenario's collective algorithm runs where the choice matters most: one
micro-batch's tensor-parallel collective (the run summary names it under ``auto`` on
a node whose NVSwitch reduces, where NCCL's default may take NVLS)."""

from __future__ import annotations

from ..ir.units import us_to_s
from ..ir.vocabulary import ALL_REDUCE, REDUCE_SCATTER
from ..scenario import Scenario
from . import collectives
from .collectives import Fabric
from .placement import StageComm, placement_of


def tp_choice(scenario: Scenario, cluster) -> tuple[str, str] | None:
    """(collective kind, algorithm name as `collectives.choices` gives it) of one
    micro-batch's tensor-parallel collective in stage 0's first TP group: an all-reduce,
    or under sequence parallelism a reduce-scatter (its all-gather chooses alike: the
    same bytes the other way). None with one tensor rank. ``cluster``: the run's
    (topologies.Cluster or a pattern of it)."""
    placement = placement_of(scenario)
    if placement.tensor == 1:
        return None
    fabric = Fabric.of(
        cluster,
        us_to_s(scenario.cluster.collective_base_latency_us),
        scenario.cluster.nvls_fraction,
    )
    kind = REDUCE_SCATTER if scenario.parallel.sequence_parallel else ALL_REDUCE
    message_bytes = StageComm(scenario, fabric, placement, 0).activation_bytes
    group = placement.tp_group(0, 0)
    pick = collectives.chosen(
        scenario.network.collective_algorithm, kind, [group], message_bytes, fabric
    )
    return None if pick is None else (kind, pick[0])
