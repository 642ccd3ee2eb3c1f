"""Typed names for the ops other ops wait for (``WorkloadBuilder`` keys and deps).

An op can be named before it exists: a forward pass waits for the previous stage's
send, which that stage lowers later. Each kind of name is a class of its own, with
named fields. They are frozen dataclasses rather than tuples or NamedTuples because a
NamedTuple equals every tuple with the same values, so two kinds of name with alike
fields could name the same op by accident; a dataclass equals only its own kind.

``who`` is the simulated GPU of a stage as (tensor rank, replica): (0, 0) alone in
symmetric mode, every GPU in exact mode.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

Who = tuple[int, int]  # (tensor rank, replica)


@dataclass(frozen=True, slots=True)
class OpKey:
    """An op by its index (``WorkloadBuilder.last_key``)."""

    index: int


@dataclass(frozen=True, slots=True)
class PipelineKey:
    """The output of pass ``kind`` ("F" or "B") of ``microbatch`` on virtual stage
    ``virtual``, for the neighbouring stage: the pipeline send, or the pass's last op
    when one rank holds both stages."""

    who: Who
    virtual: int
    kind: str
    microbatch: int


@dataclass(frozen=True, slots=True)
class LayerKey:
    """The last op of rank-local layer ``index`` in pass ``label`` (FSDP's gathers and
    reduce-scatters wait for it)."""

    who: Who
    stage: int
    label: str
    index: int


@dataclass(frozen=True, slots=True)
class AsyncTpKey:
    """A GPU's ``count``-th asynchronous tensor-parallel all-reduce, which the ops after
    the block's weight gradient wait for."""

    who: Who
    stage: int
    count: int


@dataclass(frozen=True, slots=True)
class BucketKey:
    """An overlapped gradient bucket; the optimizer step waits for all of them."""

    who: Who
    stage: int
    label: str


@dataclass(frozen=True, slots=True)
class ShardKey:
    """FSDP's parameter all-gather or gradient reduce-scatter (``kind``, a collective
    kind) of layer ``index`` in pass ``label``."""

    who: Who
    stage: int
    label: str
    kind: str
    index: int


@dataclass(frozen=True, slots=True)
class RendezvousKey:
    """Exact mode: the ``count``-th collective of kind ``kind`` that group ``group`` of
    pipeline stage ``stage`` runs. A tensor-parallel group is a replica's tensor ranks
    (``group`` = the replica), a data-parallel group a tensor rank's replicas (``group``
    = the tensor rank), a context-parallel group (tensor rank, the CP group's number), an
    expert group (its name, its offset), the mixed data-parallel group "joint" (the
    representative's lane beside a perturbed replica's). Every
    member lowers the same collectives in the same order, so their counts agree."""

    kind: str
    stage: int
    group: Hashable
    count: int


@dataclass(frozen=True, slots=True)
class TiedKey:
    """The tied embedding's gradient all-reduce between the first and the last pipeline
    stage of one (tensor rank, replica): a rendezvous of the two stages' GPUs ``who``,
    in symmetric mode too."""

    who: Who


@dataclass(frozen=True, slots=True)
class TiedReadyKey:
    """The last op of GPU ``who`` of pipeline rank ``stage`` before its gradient sync: the
    other end of the tied embedding's all-reduce waits for it (as pipeline idle) before
    joining the collective."""

    who: Who
    stage: int


# A blocking pipeline transfer (framework p2p modes): what micro-batch ``microbatch``
# sends from virtual pipeline stage ``sender`` (``kind`` F: its activation, B: its
# gradient), ``part`` "data" or DeepSpeed's "meta" message before it. The sender's and
# the receiver's ops share it as their rendezvous; ``who`` is the GPU pair's (tensor
# rank, replica). Unlike the names above it is a tuple tagged with P2P_KEY,
# (P2P_KEY, who, sender, kind, microbatch, part): DeepSpeed's engine names two per
# micro-batch and stage, and a frozen dataclass's Python __init__ and __hash__ cost a
# large run tens of milliseconds (docs/performance.md). No other name is a tuple, and
# a dataclass never equals one, so the tag keeps it apart.
P2P_KEY = "P2PKey"


@dataclass(frozen=True, slots=True)
class CopiesKey:
    """DualPipe's gradient sum of its two model copies between pipeline ranks ``low`` and
    p - 1 - ``low`` of one (tensor rank, replica): a rendezvous of the two GPUs ``who``."""

    who: Who
    low: int


@dataclass(frozen=True, slots=True)
class CopiesReadyKey:
    """The last pass of GPU ``who`` of pipeline rank ``stage`` under DualPipe: the rank
    holding the other copy of its stages waits for it before their gradient sum."""

    who: Who
    stage: int
