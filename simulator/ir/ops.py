"""What runs: ops with durations or transfers, dependencies and lanes. Pure data.

A `Workload` is a list of lanes, one per simulated GPU stream, each an ordered
list of ops. An op waits for its ``deps`` (ops anywhere), then:

- ``compute`` kinds (forward, backward, recompute, optimizer) hold the lane
  for ``duration_s``;
- a communication op with ``blocking=True`` (tensor-parallel all-reduce,
  non-overlapped gradient sync) holds the lane until its transfer is done;
- a communication op with ``blocking=False`` (pipeline send, overlapped
  gradient bucket) is launched and the lane moves on; whoever needs it lists
  it in ``deps``;
- a ``barrier`` only waits for its deps.

In exact mode a collective is one op on each member GPU's lane, all naming the
first of them in ``rendezvous``: the transfer starts when the last member
reaches its op, and every member's op ends with it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple

from .flows import Collective, Transfer
from .keys import OpKey


class Op(NamedTuple):
    index: int  # type: ignore[assignment]  # shadows tuple.index; renaming changes the API
    lane: int
    kind: str
    label: str
    microbatch: int  # -1 when the op belongs to no micro-batch
    duration_s: float  # compute ops
    transfer: Transfer | Collective | None  # comm ops
    blocking: bool
    deps: tuple[int, ...]
    flops: float  # FLOPs executed on the lane's GPU (recomputation included)
    rendezvous: int  # a collective's first member op, or -1: no other lane takes part


class Lane(NamedTuple):
    index: int  # type: ignore[assignment]  # shadows tuple.index; renaming changes the API
    gpu: int  # index of the GPU in the cluster
    stream: str
    stage: int
    stands_for: int  # how many real GPUs this lane represents (itself included)
    ops: tuple[int, ...]
    # exact mode's congruent TP group (comm/congruent.py): this lane simulates GPUs
    # gpu to gpu + copies - 1 at once, each of which the reports show as its own lane
    copies: int = 1


class Workload(NamedTuple):
    ops: tuple[Op, ...]
    lanes: tuple[Lane, ...]


# builds a named tuple from a tuple of its fields, skipping the Python-level __new__
_new = tuple.__new__


class WorkloadBuilder:
    """Collects ops lane by lane; deps may name ops by key (keys.py) before they exist."""

    def __init__(self) -> None:
        self._ops: list[Op] = []
        self._lanes: list[list] = []
        self._keys: dict[object, int] = {}
        self._rendezvous: dict[object, int] = {}
        self._unresolved: list[int] = []  # ops with deps, resolved in build()

    def lane(
        self, *, gpu: int, stream: str, stage: int, stands_for: int = 1, copies: int = 1
    ) -> int:
        self._lanes.append([gpu, stream, stage, stands_for, [], copies])
        return len(self._lanes) - 1

    def add(
        self,
        lane: int,
        kind: str,
        label: str,
        *,
        microbatch: int = -1,
        duration_s: float = 0.0,
        transfer: Transfer | Collective | None = None,
        blocking: bool = True,
        deps: Sequence[object] = (),
        flops: float = 0.0,
        key: object = None,
        rendezvous: object = None,
    ) -> int:
        """Add an op; ``rendezvous`` names a collective that the ops of several lanes
        share (every member passes the same name)."""
        index = len(self._ops)
        first = -1 if rendezvous is None else self._rendezvous.setdefault(rendezvous, index)
        if deps:
            deps = tuple(deps)
            self._unresolved.append(index)
        else:
            deps = ()
        self._ops.append(
            _new(
                Op,
                (
                    index,
                    lane,
                    kind,
                    label,
                    microbatch,
                    duration_s,
                    transfer,
                    blocking,
                    deps,
                    flops,
                    first,
                ),
            )
        )
        self._lanes[lane][4].append(index)
        if key is not None:
            if key in self._keys:
                raise ValueError(f"two ops share the key {key!r}")
            self._keys[key] = index
        return index

    def name_last(self, lane: int, key: object) -> None:
        """Let later ops depend on the last op added to ``lane`` by ``key``."""
        if key in self._keys:
            raise ValueError(f"two ops share the key {key!r}")
        self._keys[key] = self._lanes[lane][4][-1]

    def last_key(self, lane: int) -> OpKey:
        """A key for the last op added to ``lane`` (naming it if needed)."""
        index = self._lanes[lane][4][-1]
        key = OpKey(index)
        self._keys.setdefault(key, index)
        return key

    # -- repeated bodies: a layer's ops, the same in every pass but for label and
    # micro-batch, added again without going through the code that made them ---------

    def mark(self) -> tuple[int, int]:
        """Where the ops and keys stand now, for `body_since`."""
        return len(self._ops), len(self._keys)

    def body_since(
        self,
        mark: tuple[int, int],
        lane: int,
        label: str,
        mb: int,
        deps: Sequence[object],
        rendezvous_kinds: Collection[str] = (),
    ) -> tuple[tuple, ...] | None:
        """The ops added since ``mark`` as rows for `replay`: if they are all on ``lane``,
        of this label and micro-batch, named by no key, the first waits for ``deps`` and
        the others only for ops of the body itself (by index: a barrier on a transfer
        launched alongside compute), and those in a rendezvous are of ``rendezvous_kinds``
        (whose rendezvous names `replay` asks for again); else None (they cannot be
        replayed)."""
        start, num_keys = mark
        if len(self._keys) != num_keys:
            return None
        added = self._ops[start:]
        deps = tuple(deps)
        rows = []
        for n, op in enumerate(added):
            joins = op.rendezvous != -1
            back: tuple[int, ...] = ()
            if n and op.deps:  # earlier ops of the body, as offsets from its first
                if not all(isinstance(d, int) and start <= d < start + n for d in op.deps):
                    return None
                back = tuple(d - start for d in op.deps)
            if (
                op.lane != lane
                or op.label != label
                or op.microbatch != mb
                or (joins and op.kind not in rendezvous_kinds)
                or (n == 0 and op.deps != deps)
            ):
                return None
            rows.append((op.kind, op.duration_s, op.transfer, op.blocking, op.flops, joins, back))
        if deps and not rows:
            return None
        return tuple(rows)

    def replay(
        self,
        lane: int,
        label: str,
        mb: int,
        deps: Sequence[object],
        rows: tuple[tuple, ...],
        rendezvous: Callable[[str], object],
    ) -> None:
        """Add the ops of ``rows`` (from `body_since`) for this label and micro-batch, the
        first waiting for ``deps``: the same ops the code that made the rows would add.
        ``rendezvous(kind)`` names the rendezvous of each row that joined one."""
        ops, lane_ops = self._ops, self._lanes[lane][4]
        index = len(ops)
        first_deps: tuple[object, ...] = ()
        if deps:
            first_deps = tuple(deps)
            self._unresolved.append(index)
        start = index
        for kind, duration_s, transfer, blocking, flops, joins, back in rows:
            first = self._rendezvous.setdefault(rendezvous(kind), index) if joins else -1
            if back:
                first_deps = tuple(start + offset for offset in back)
            ops.append(
                _new(
                    Op,
                    (
                        index,
                        lane,
                        kind,
                        label,
                        mb,
                        duration_s,
                        transfer,
                        blocking,
                        first_deps,
                        flops,
                        first,
                    ),
                )
            )
            lane_ops.append(index)
            index += 1
            first_deps = ()

    def build(self) -> Workload:
        ops, keys = self._ops, self._keys
        for index in self._unresolved:
            op = ops[index]
            try:
                deps = tuple(d if isinstance(d, int) else keys[d] for d in op.deps)
            except KeyError as exc:
                raise ValueError(f"op {op.label!r} depends on unknown op {exc.args[0]!r}") from None
            ops[index] = _new(Op, (*op[:8], deps, *op[9:]))  # op._replace(deps=deps)
        lanes = tuple(
            Lane(i, gpu, stream, stage, stands_for, tuple(op_ids), copies)
            for i, (gpu, stream, stage, stands_for, op_ids, copies) in enumerate(self._lanes)
        )
        return Workload(tuple(ops), lanes)
