"""The engine's look over a workload's ops at set-up (engine.core): which ops meet at
each rendezvous, and which transfers are always alone on their links."""

from __future__ import annotations

from ..ir.flows import Collective, Transfer
from ..ir.ops import Workload


def alone(workload: Workload) -> set[int]:
    """The single-phase collectives (by id) that never share a link with another transfer
    while they run: blocking ops of one lane, in no rendezvous, whose links no op of
    another lane, no non-blocking op and no collective of several phases or members
    crosses. A lane runs one blocking op at a time, so such a transfer is alone on its
    links from start to end: `Network.start_alone` (symmetric mode's tensor-parallel
    collectives on a stage's NVLink, about half of a large run's transfers)."""
    return scan(workload)[1]


def scan(workload: Workload) -> tuple[dict[int, list[int]], set[int]]:
    """The engine's one pass over the ops at set-up: exact mode's collectives (each
    rendezvous's member ops by its first member) and the transfers that are `alone`."""
    members: dict[int, list[int]] = {}
    # each distinct transfer object (a stage reuses one per kind) by id: its phases (which
    # keep it, so its id stays unique), and the lane that owns it, or -1 when it cannot be
    # alone (one that can is a collective of one phase)
    phases_of: dict[int, Collective] = {}
    owner_of: dict[int, int] = {}
    get = owner_of.get
    for op in workload.ops:
        transfer = op.transfer
        if transfer is None:
            if op.rendezvous < 0:
                continue
            members.setdefault(op.rendezvous, []).append(op.index)
            continue
        owner = op.lane  # a blocking single-phase collective of its lane alone
        if op.rendezvous >= 0:
            members.setdefault(op.rendezvous, []).append(op.index)
            owner = -1
        elif not op.blocking or type(transfer) is not tuple or len(transfer) != 1:
            owner = -1
        key = id(transfer)
        known = get(key)
        if known is None:
            owner_of[key] = owner
            phases_of[key] = (transfer,) if type(transfer) is Transfer else transfer
        elif known != owner:
            owner_of[key] = -1
    link_owner: dict[int, int] = {}
    for key, phases in phases_of.items():
        owner = owner_of[key]
        for phase in phases:
            for link in phase.links:
                if link_owner.setdefault(link, owner) != owner:
                    link_owner[link] = -1
    return members, {
        key
        for key, owner in owner_of.items()
        if owner >= 0 and all(link_owner[link] == owner for link in phases_of[key][0].links)
    }
