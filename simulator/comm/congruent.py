"""Exact mode's congruent TP groups: one lane for the group's T GPUs.

In exact mode (``network.symmetry = false``) every GPU is simulated. The T GPUs of a
tensor-parallel group run the same ops; they meet at every TP collective, so they
arrive at each together, and they differ only in the links their own transfers take
(tensor rank j's pipeline sends and data-parallel ring leave by its own NIC). When
nothing tells the ranks apart, every GPU of the group does the same thing at the same
time, and the group is simulated as one lane (`Lane.copies` = T) whose transfers are the
T ranks' transfers as one coupled flow (placement.StageComm's whole-group transfers:
each rank's flows on its own links, multiplicity 1): the same rates, the same ends, the
same spans, which the reports give to each of the T GPUs (`per_gpu`).

What tells the ranks apart, and keeps a lane per GPU (the lowering falls back to it):

- a perturbation that is not the same on every GPU of a group (`collapsible`): one
  GPU's ``slow_gpu``, ``jitter`` (a draw per GPU), a NIC or link (it carries one rank's
  traffic). A slow node or a node of another GPU model slows every GPU of the groups
  in it alike, so those collapse. One rank touched anywhere reaches every group: its
  group's data-parallel ring starts late for that rank only, so every group of the stage
  differs by rank at the end, and its pipeline sends reach the neighbouring stages;
- a layout where ranks are not alike: context or expert parallelism (groups across
  ranks), FSDP's side lane, a TP group across nodes or on a mesh NVLink;
- links: if two ranks' transfers would share a link, or one rank's links are not
  position for position of the same bandwidth as another's (`RankLinks`, checked on
  every coupled transfer as it is built), the lowering starts again with a lane per GPU.
  Rates computed for one coupled flow then equal exact mode's T flows' to the bit: the
  flows' links fall in the same link classes and are filled in the same rounds.

The counts exact mode reports are kept: each coupled transfer started counts T
transfers (`exact_transfers`), each span of the lane T spans.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ..ir.flows import Collective, Transfer
from ..ir.ops import Lane, Workload
from ..ir.vocabulary import TP_COMM
from ..scenario import Scenario
from ..scenario.perturbation import GPU_TYPE, SLOW_GPU


class NotCongruent(Exception):
    """The ranks of a TP group are not alike on the network: lower a lane per GPU."""


def collapsible(scenario: Scenario) -> bool:
    """Whether exact mode may simulate each TP group as one lane (module docstring): the
    layout and the perturbations treat every rank of a group alike. The links are
    checked while lowering (`RankLinks`)."""
    par, cl = scenario.parallel, scenario.cluster
    t = par.tensor_model_parallel_size
    if scenario.network.symmetry or t == 1:
        return False
    if par.cp_size > 1 or scenario.model.moe:
        return False
    if scenario.training.data_parallel_sharding == "full":
        return False
    if cl.nvlink_topology != "nvswitch" or cl.gpus_per_node % t:
        return False
    return all(
        p.kind in (SLOW_GPU, GPU_TYPE) and p.node is not None for p in scenario.perturbations
    )


class RankLinks:
    """Which tensor rank's transfers use each link, over every coupled transfer of a
    collapsed lowering: a link used by two ranks, or a rank's transfer not like rank
    0's link for link (bandwidth, multiplicity), bytes and latency, raises NotCongruent."""

    def __init__(self, capacities: Sequence[float]) -> None:
        self.capacities = capacities
        self.owner: dict[int, int] = {}

    def check(self, parts: Sequence[Collective | Transfer | None]) -> None:
        """``parts``: rank j's transfer or collective at index j."""
        given = [(p,) if isinstance(p, Transfer) else p for p in parts]
        phases = [p for p in given if p is not None]
        if len(phases) < len(given):
            if not phases:
                return
            raise NotCongruent("a rank has no transfer where another has one")
        first = phases[0]
        capacities, owner = self.capacities, self.owner
        for rank, mine in enumerate(phases):
            if len(mine) != len(first):
                raise NotCongruent("ranks' collectives differ in phases")
            for a, b in zip(first, mine, strict=True):
                if (
                    len(a.links) != len(b.links)
                    or a.mults != b.mults
                    or a.bytes_per_flow != b.bytes_per_flow
                    or a.latency_s != b.latency_s
                ):
                    raise NotCongruent("ranks' transfers differ in shape")
                for x, y in zip(a.links, b.links, strict=True):
                    if capacities[x] != capacities[y]:
                        raise NotCongruent("ranks' links differ in bandwidth")
                for link in b.links:
                    if owner.setdefault(link, rank) != rank:
                        raise NotCongruent(f"link {link} carries two ranks' transfers")


def per_gpu(lanes: Sequence[Lane]) -> list[Lane]:
    """The lanes as the reports see them: a lane standing for a congruent TP group
    (``copies`` > 1) as one lane per GPU, each with the group lane's ops."""
    if all(lane.copies == 1 for lane in lanes):
        return list(lanes)
    out = []
    for lane in lanes:
        out.append(lane._replace(copies=1) if lane.copies > 1 else lane)
        out.extend(lane._replace(gpu=lane.gpu + k, copies=1) for k in range(1, lane.copies))
    return out


def copies_of(lanes: Sequence[Lane]) -> dict[int, int]:
    """GPU -> copies, for the GPUs whose lanes stand for more than themselves."""
    return {lane.gpu: lane.copies for lane in lanes if lane.copies > 1}


def exact_transfers(
    workload: Workload,
    simulated: int,
    positions: Callable[[Lane], Iterable[int]] | None = None,
) -> int:
    """The transfers exact mode would have started, from those a collapsed run started:
    each coupled transfer of a collapsed lane (a pipeline send, a data-parallel or tied
    collective: every rank's, one flow) stands for T (one per rank), per phase; a TP
    collective is one transfer in both. Counted once per rendezvous. ``positions``: the
    positions on each lane of the ops that started them (all of its ops if None)."""
    extra = 0
    ops = workload.ops
    for lane in workload.lanes:
        if lane.copies == 1:
            continue
        chosen = lane.ops if positions is None else [lane.ops[i] for i in positions(lane)]
        for index in chosen:
            op = ops[index]
            transfer = op.transfer
            if transfer is None or op.kind == TP_COMM:
                continue
            if op.rendezvous != -1 and op.rendezvous != index:
                continue
            phases = 1 if type(transfer) is Transfer else len(transfer)
            extra += (lane.copies - 1) * phases
    return simulated + extra
