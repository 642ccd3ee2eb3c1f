"""The engine's look over a workload's ops at set-up (engine.core): which ops meet at
each rendezvous, and which transfers are always alone on their links."""

from __future__ import annotations

from bisect import bisect_right

from ..ir.flows import Collective, Transfer
from ..ir.ops import Workload

_NOBODY: frozenset[int] = frozenset()


def alone(workload: Workload) -> set[int]:
    """The single-phase collectives (by id) that never share a link with another transfer
    while they run. A transfer's use holds a set of lanes from before it starts until it
    ends: a blocking op of one lane not in a rendezvous, its lane; a collective (a
    rendezvous), each member lane whose op is blocking or whose next op waits for it
    (DeepSpeed's blocking p2p: a non-blocking member op and a barrier on it). A lane
    runs one op at a time, so two uses holding a common lane never run at once. A
    transfer is alone when every use of every transfer crossing any of its links
    holds a lane in common with all the others there; a non-blocking op outside a
    rendezvous, a member no lane waits for and a collective of several phases hold
    none. `Network.start_alone` runs such a transfer (symmetric mode's tensor-parallel
    collectives on a stage's NVLink, about half of a large run's transfers; DeepSpeed's
    blocking p2p pairs; exact mode's tensor-parallel collectives where no asynchronous
    one shares their NVLink)."""
    return scan(workload)[1]


def scan(workload: Workload) -> tuple[dict[int, list[int]], set[int]]:
    """The engine's one pass over the ops at set-up: exact mode's collectives (each
    rendezvous's member ops by its first member) and the transfers that are `alone`."""
    members: dict[int, list[int]] = {}
    ops = workload.ops
    # each distinct transfer object (a stage reuses one per kind) by id: its phases (which
    # keep it, so its id stays unique), and the lanes that every use of it holds (`alone`:
    # empty when it cannot be alone); a rendezvous's uses are settled once its members
    # are known
    phases_of: dict[int, Collective] = {}
    owner_of: dict[int, frozenset[int]] = {}
    own = [frozenset((lane.index,)) for lane in workload.lanes]
    get = owner_of.get

    def held_by(transfer: Transfer | Collective, owner: frozenset[int]) -> None:
        """A use of ``transfer`` holding the lanes ``owner``."""
        known = get(id(transfer))
        if known is None:
            owner_of[id(transfer)] = owner
            phases_of[id(transfer)] = (transfer,) if type(transfer) is Transfer else transfer
        elif known is not owner:
            owner_of[id(transfer)] = known & owner

    for op in ops:
        transfer = op.transfer
        if op.rendezvous >= 0:
            members.setdefault(op.rendezvous, []).append(op.index)
            continue
        if transfer is None:
            continue
        single = op.blocking and type(transfer) is tuple and len(transfer) == 1
        held_by(transfer, own[op.lane] if single else _NOBODY)
    # a rendezvous's held lanes: each member lane whose op is blocking or whose next op
    # (the builder adds it right after, or it is found in the lane's ops, which are in
    # index order) waits for it; one object per set of lanes, as owners are compared by
    # identity first
    made: dict[tuple[int, ...], frozenset[int]] = {}
    lanes_of = workload.lanes
    num_ops = len(ops)
    for indices in members.values():
        held = []
        used = []
        for index in indices:
            op = ops[index]
            if op.transfer is not None:
                used.append(op.transfer)
            if not op.blocking:
                after = ops[index + 1] if index + 1 < num_ops else None
                if after is None or after.lane != op.lane:
                    order = lanes_of[op.lane].ops
                    at = bisect_right(order, index)
                    after = ops[order[at]] if at < len(order) else None
                if after is None or index not in after.deps:
                    continue
            held.append(op.lane)
        if not used:
            continue
        lanes = made.get(tuple(held))
        if lanes is None:
            lanes = made[tuple(held)] = frozenset(held)
        for transfer in used:
            held_by(
                transfer, lanes if type(transfer) is Transfer or len(transfer) == 1 else _NOBODY
            )
    link_owner: dict[int, frozenset[int]] = {}
    for key, phases in phases_of.items():
        owner = owner_of[key]
        for phase in phases:
            for link in phase.links:
                there = link_owner.setdefault(link, owner)
                if there is not owner:
                    link_owner[link] = there & owner
    return members, {
        key
        for key, owner in owner_of.items()
        if owner and all(link_owner[link] for link in phases_of[key][0].links)
    }
