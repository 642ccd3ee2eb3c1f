"""Exact mode's GPUs of a stage lowered once: every other added again from that record.

In exact mode with a lane per GPU (lowering._lower) the T x D GPUs of a pipeline stage
run the same passes in the same order, and their ops differ only in what names them
and in their own transfers: the ``who`` (tensor rank j, replica d) of their keys, the
rendezvous of their TP group (named by d) and data-parallel group (named by j), their
pipeline pairs' p2p rendezvous, the transfers `StageComm` gives for their j and d, and
the numbers of their ops and lanes. Lowering each GPU through the stage's passes,
layers and blocks again cost 40 % of an exact run of 1,024 GPUs. So the stage's first
GPU is lowered once into a builder of its own, its StageComm asked through `_Asked`
(which notes how each transfer was asked for: the method and its arguments but j and
d), and `Record` keeps its ops with every name and transfer in a form to relabel. Then
every GPU of the stage, the first included, is added from the record in the order
lowering adds them (`AlikeBuilder.lower_alike`): the ops the stage code would have added,
numbered as it would have numbered them, with the transfers StageComm gives for that GPU
(the same objects where StageComm memoizes them by group). Where the record holds a name it
cannot relabel (a key of another GPU, a context- or expert-parallel rendezvous, a
transfer asked otherwise) it raises `NotAlike`, and lowering makes that stage's GPUs one
by one as before.

Two shortcuts keep the relabelled ops cheap, both giving the same numbers the stage
code gives. A TP collective's rendezvous is first reached by tensor rank 0 of the
replica (the GPUs are added replica by replica, tensor rank fastest) and a
data-parallel collective's by replica 0 of the tensor rank, at the same op of the
record (each GPU counts its collectives alike), so the first member's op number is
computed, not looked up by name; and the names that only the GPU's own ops use (its
asynchronous TP collectives, an op named by its number) resolve at once.

The check that the stage's GPUs are alike: the stage's last GPU (another tensor rank and
replica than the first) is lowered the ordinary way too, and its ops must equal the
record relabelled for it, field by field (its transfers, keys and rendezvous names
equal); any difference is `NotAlike`. Context parallelism, experts and
activation offloading are not tried (their groups and copies are named otherwise).
tests/test_alike.py compares whole workloads with and without this, to the bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any, cast

from ..comm.placement import StageComm
from ..ir.keys import (
    P2P_KEY,
    AsyncTpKey,
    BucketKey,
    CopiesKey,
    CopiesReadyKey,
    LayerKey,
    OpKey,
    PipelineKey,
    RendezvousKey,
    ShardKey,
    TiedKey,
    TiedReadyKey,
    Who,
)
from ..ir.ops import Op, WorkloadBuilder
from ..ir.vocabulary import DP_SYNC, TP_COMM
from ..scenario import Scenario
from .gpuops import GpuOps


class NotAlike(Exception):
    """The stage's GPUs cannot be added from one record: lower them one by one."""


# keys naming an op of one GPU, whose first field is that GPU's ``who``
_WHO_KEYS = (
    PipelineKey,
    LayerKey,
    AsyncTpKey,
    BucketKey,
    ShardKey,
    TiedKey,
    TiedReadyKey,
    CopiesKey,
    CopiesReadyKey,
)
assert all(fields(cls)[0].name == "who" for cls in _WHO_KEYS)
# names only the GPU's own ops use: resolved within the record, never registered
_OWN_KEYS = (AsyncTpKey, OpKey)

# builds a named tuple from a tuple of its fields, skipping the Python-level __new__
_new = tuple.__new__


def shareable(scenario: Scenario) -> bool:
    """Whether a stage's GPUs in exact mode may be added from one record: exact mode,
    no context or expert parallelism and no activation offloading (their groups and
    host copies are named otherwise than by j and d)."""
    return (
        not scenario.network.symmetry
        and scenario.parallel.cp_size == 1
        and not scenario.model.moe
        and not scenario.training.offloaded_layers
    )


# -- how a transfer was asked for -----------------------------------------------------

# (method, its arguments but the GPU's j and d)
Asking = tuple[Any, ...]


class _Asked:
    """A StageComm as one GPU's lowering asks it (GpuOps.comm), noting for every transfer
    it gives the asking (`Asking`), so that another GPU's can be asked alike (`ask`).
    Every other attribute is the StageComm's; what `ask` could not repeat raises."""

    def __init__(self, comm: StageComm, who: Who) -> None:
        self._comm, self._who = comm, who
        self.asked: dict[int, tuple[object, Asking]] = {}

    def __getattr__(self, name: str):
        return getattr(self._comm, name)

    def _own(self, j: int | None, d: int | None) -> None:
        if (j is not None and j != self._who[0]) or (d is not None and d != self._who[1]):
            raise NotAlike("a transfer of another GPU's group")

    def _note(self, transfer, asking: Asking):
        if transfer is not None:
            seen = self.asked.get(id(transfer))
            if seen is not None and seen[1] != asking:
                raise NotAlike("one transfer asked for two ways")
            self.asked[id(transfer)] = (transfer, asking)
        return transfer

    def tp(self, kind: str, d: int):
        self._own(None, d)
        return self._note(self._comm.tp(kind, d), ("tp", kind))

    def dp(self, kind: str, message_bytes: float, j: int):
        self._own(j, None)
        return self._note(self._comm.dp(kind, message_bytes, j), ("dp", kind, message_bytes))

    def tied(self, other: int, message_bytes: float, j: int, d: int):
        self._own(j, d)
        transfer = self._comm.tied(other, message_bytes, j, d)
        return self._note(transfer, ("tied", other, message_bytes))

    def send_to(self, other: int, j: int, d: int, message_bytes: float | None = None):
        return self.between(self._comm.stage, other, j, d, message_bytes)

    def between(self, src: int, dst: int, j: int, d: int, message_bytes: float | None = None):
        self._own(j, d)
        nbytes = self._comm.shard_bytes if message_bytes is None else message_bytes
        transfer = self._comm.between(src, dst, j, d, nbytes)
        return self._note(transfer, ("between", src, dst, nbytes))

    def _refused(self, *args, **kwargs):
        raise NotAlike("a transfer named otherwise than by j and d")

    cp = expert = expert_offset = replica_between = _refused


def ask(comm: StageComm, asking: Asking, j: int, d: int):
    """The transfer ``asking`` gives GPU (j, d) of the stage."""
    method = asking[0]
    if method == "tp":
        return comm.tp(asking[1], d)
    if method == "dp":
        return comm.dp(asking[1], asking[2], j)
    if method == "tied":
        return comm.tied(asking[1], asking[2], j, d)
    return comm.between(asking[1], asking[2], j, d, asking[3])


# -- one GPU's ops, to relabel --------------------------------------------------------

# a name relabelled for another GPU: ("who", class, other fields) a key of the GPU's
# own; ("p2p", rest) a blocking p2p rendezvous; ("tp", count) / ("dp", count) the
# TP / data-parallel group's rendezvous (built only to compare, `symbolic`)
Name = tuple[Any, ...]


def _name_of(key: Any, who: Who, stage: int) -> Name:
    """How ``key`` (a dep or rendezvous name of GPU ``who``) reads for another GPU."""
    cls = type(key)
    if cls in _WHO_KEYS:
        values = [getattr(key, f.name) for f in fields(cls)]
        if values[0] != who:
            raise NotAlike(f"a key of another GPU: {key!r}")
        return ("who", cls, tuple(values[1:]))
    if cls is RendezvousKey:
        assert isinstance(key, RendezvousKey)
        if key.stage == stage and key.kind == TP_COMM and key.group == who[1]:
            return ("tp", key.count)
        if key.stage == stage and key.kind == DP_SYNC and key.group == who[0]:
            return ("dp", key.count)
        raise NotAlike(f"a rendezvous named otherwise: {key!r}")
    if cls is tuple and len(key) > 2 and key[0] == P2P_KEY and key[1] == who:
        return ("p2p", key[2:])
    raise NotAlike(f"a name that does not relabel: {key!r}")


def _named(name: Name, who: Who, stage: int) -> object:
    """The key ``name`` gives GPU ``who``."""
    tag = name[0]
    if tag == "who":
        return name[1](who, *name[2])
    if tag == "p2p":
        return (P2P_KEY, who, *name[1])
    group = who[1] if tag == "tp" else who[0]
    return RendezvousKey(TP_COMM if tag == "tp" else DP_SYNC, stage, group, name[1])


class Record:
    """One GPU's ops, lowered into a builder of its own, with each name and transfer in a
    form to relabel: rows (lane, kind, label, micro-batch, duration, asking number or -1,
    blocking, deps, FLOPs, rendezvous). The deps are op numbers in the record (int: its
    own ops, named or not) and ("name", number) for an op outside it (another stage's
    output, the tied embedding's other end: a key carrying this GPU's who, `names`); the
    rendezvous is -1 (none), ("tp", count) or ("dp", count) (its TP or data-parallel
    group's) or a name number (a p2p pair's, the tied embedding's)."""

    def __init__(self, comm: StageComm, who: Who, lower_gpu: Callable[[GpuOps], None]) -> None:
        self.comm, self.stage = comm, comm.stage
        builder, asked = _lowered(comm, who, lower_gpu)
        ops, stage = builder._ops, self.stage
        gpu = comm.placement.gpu(*who, stage)
        self.lanes = [tuple(lane) for lane in builder._lanes]
        if any(lane[0] != gpu for lane in self.lanes):
            raise NotAlike("a lane of another GPU")
        own = builder._keys
        first_of = {index: key for key, index in builder._rendezvous.items()}
        askings: dict[int, int] = {}  # id(transfer) -> asking number
        self.askings: list[Asking] = []
        names: dict[object, int] = {}  # key -> name number
        self.names: list[Name] = []

        def name_number(key: object) -> int:
            number = names.get(key)
            if number is None:
                number = names[key] = len(self.names)
                self.names.append(_name_of(key, who, stage))
            return number

        rows: list[tuple[Any, ...]] = []
        for op in ops:
            slot = -1
            if op.transfer is not None:
                slot = askings.get(id(op.transfer), -1)
                if slot == -1:
                    seen = asked.asked.get(id(op.transfer))
                    if seen is None:
                        raise NotAlike("a transfer not asked of StageComm")
                    slot = askings[id(op.transfer)] = len(self.askings)
                    self.askings.append(seen[1])
            deps: list[object] = []
            for dep in op.deps:
                if isinstance(dep, int):
                    deps.append(dep)
                elif dep in own:
                    deps.append(own[dep])
                else:
                    deps.append(("name", name_number(dep)))
            rendezvous: object = -1
            if op.rendezvous != -1:
                name = _name_of(first_of[op.rendezvous], who, stage)
                rendezvous = (
                    name if name[0] in ("tp", "dp") else name_number(first_of[op.rendezvous])
                )
                if name[0] in ("tp", "dp") and op.rendezvous != op.index:
                    raise NotAlike("a GPU meets its own group twice in one collective")
            rows.append(
                (
                    op.lane,
                    op.kind,
                    op.label,
                    op.microbatch,
                    op.duration_s,
                    slot,
                    op.blocking,
                    tuple(deps),
                    op.flops,
                    rendezvous,
                )
            )
        self.rows = rows
        # the names the GPU's ops give others (pipeline outputs, tied ends), by op
        self.keys = [
            (_name_of(key, who, stage), index)
            for key, index in own.items()
            if not isinstance(key, _OWN_KEYS)
        ]

    def symbolic(self, who: Who) -> list[object]:
        """The record's ops for GPU ``who``, names and transfers as objects: what
        `_symbolic` gives for that GPU lowered the ordinary way, if they are alike."""
        stage, comm = self.stage, self.comm
        transfers = [ask(comm, asking, *who) for asking in self.askings]
        names = [_named(name, who, stage) for name in self.names]
        out = []
        for lane, kind, label, mb, duration, slot, blocking, deps, flops, meets in self.rows:
            out.append(
                (
                    lane,
                    kind,
                    label,
                    mb,
                    duration,
                    None if slot == -1 else transfers[slot],
                    blocking,
                    tuple(d if isinstance(d, int) else names[d[1]] for d in deps),
                    flops,
                    None
                    if meets == -1
                    else _named(meets, who, stage)
                    if isinstance(meets, tuple)
                    else names[meets],
                )
            )
        keys = {_named(name, who, stage): index for name, index in self.keys}
        gpu = comm.placement.gpu(*who, stage)
        return [*out, [(gpu, *lane[1:]) for lane in self.lanes], keys]


def _lowered(
    comm: StageComm, who: Who, lower_gpu: Callable[[GpuOps], None]
) -> tuple[WorkloadBuilder, _Asked]:
    """GPU ``who`` of the stage lowered the ordinary way into a builder of its own."""
    builder, asked = WorkloadBuilder(), _Asked(comm, who)
    lower_gpu(GpuOps(builder, cast(StageComm, asked), *who))
    return builder, asked


def _symbolic(comm: StageComm, who: Who, lower_gpu: Callable[[GpuOps], None]) -> list[object]:
    """GPU ``who`` lowered the ordinary way, its ops as `Record.symbolic` gives them."""
    builder, _ = _lowered(comm, who, lower_gpu)
    own = builder._keys
    first_of = {index: key for key, index in builder._rendezvous.items()}
    out: list[tuple] = []
    for op in builder._ops:
        deps = tuple(d if isinstance(d, int) else own.get(d, d) for d in op.deps)
        meets = None if op.rendezvous == -1 else first_of[op.rendezvous]
        out.append((op.lane, op.kind, op.label, op.microbatch, op.duration_s, op.transfer,
                    op.blocking, deps, op.flops, meets))  # fmt: skip
    keys = {key: index for key, index in own.items() if not isinstance(key, _OWN_KEYS)}
    return [*out, [tuple(lane) for lane in builder._lanes], keys]


class AlikeBuilder(WorkloadBuilder):
    """A WorkloadBuilder that can add a stage's GPUs from one GPU's `Record`."""

    def lower_alike(
        self,
        comm: StageComm,
        ranks: Sequence[Who],
        lower_gpu: Callable[[GpuOps], None],
    ) -> None:
        """Add GPUs ``ranks`` of the stage (replica by replica, tensor rank fastest, as
        lowering adds them) from the first one's record, checked against the last one
        lowered the ordinary way; `NotAlike` (nothing added) where they are not alike."""
        placement = comm.placement
        every = [(j, d) for d in range(placement.data) for j in range(placement.tensor)]
        if list(ranks) != every:  # the first members' numbers (`_add_alike`) need the order
            raise NotAlike("not every GPU of the stage, in lowering's order")
        record = Record(comm, ranks[0], lower_gpu)
        if len(ranks) > 1:
            last = ranks[-1]
            if record.symbolic(last) != _symbolic(comm, last, lower_gpu):
                raise NotAlike("the stage's last GPU lowers unlike its first")
        first_op: dict[Who, int] = {}  # the first op number of each GPU added
        for who in ranks:
            first_op[who] = len(self._ops)
            self._add_alike(record, who, first_op)

    def _add_alike(self, record: Record, who: Who, first_op: dict[Who, int]) -> None:
        """GPU ``who``'s ops from the record: `Record.symbolic`'s, numbered on."""
        j, d = who
        stage, comm = record.stage, record.comm
        ops, base = self._ops, len(self._ops)
        gpu = comm.placement.gpu(j, d, stage)
        lanes = [
            self.lane(gpu=gpu, stream=stream, stage=s, stands_for=stands_for, copies=copies)
            for _, stream, s, stands_for, _, copies in record.lanes
        ]
        lane_ops = [self._lanes[number][4] for number in lanes]
        transfers = [ask(comm, asking, j, d) for asking in record.askings]
        transfers.append(None)  # slot -1: no transfer
        names = [_named(name, who, stage) for name in record.names]
        # the first member of the TP group's and the data-parallel group's collectives
        # (the int objects of those ops' numbers, as the stage code's would share them)
        tp_first = first_op[(0, d)] - base
        dp_first = first_op[(j, 0)] - base
        meet = self._rendezvous.setdefault
        unresolved = self._unresolved
        index = base
        for lane, kind, label, mb, duration, slot, blocking, deps, flops, meets in record.rows:
            if deps:
                resolved = True
                out = []
                for dep in deps:
                    if dep.__class__ is int:
                        dep += base
                        out.append(ops[dep][0] if dep < index else dep)
                    else:
                        out.append(names[dep[1]])
                        resolved = False
                if not resolved:
                    unresolved.append(index)
                deps = tuple(out)
            if meets == -1:
                first = -1
            elif meets.__class__ is tuple:
                offset = tp_first if meets[0] == "tp" else dp_first
                first = ops[index + offset][0] if offset else index
            else:
                first = meet(names[meets], index)
            ops.append(
                _new(
                    Op,
                    (
                        index,
                        lanes[lane],
                        kind,
                        label,
                        mb,
                        duration,
                        transfers[slot],
                        blocking,
                        deps,
                        flops,
                        first,
                    ),
                )
            )
            lane_ops[lane].append(index)
            index += 1
        keys = self._keys
        for name, at in record.keys:
            key = _named(name, who, stage)
            if key in keys:
                raise ValueError(f"two ops share the key {key!r}")
            keys[key] = base + at
