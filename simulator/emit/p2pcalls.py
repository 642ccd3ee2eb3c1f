"""The framework's blocking pipeline p2p calls on a stage's lane (schedules.p2p says
where they sit in an order; docs/frameworks.md §1, §2 their sources): each call's
transfers as ops that meet the other stage's (a rendezvous), then the lane waits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepsim.schedules import INTERLEAVED, Step, stage_of
from stepsim.schedules.p2p import (
    Call,
    deepspeed_calls,
    megatron_calls,
    megatron_interleaved_calls,
)

from ..ir.flows import Transfer
from ..ir.keys import P2P_KEY
from ..ir.vocabulary import ALL_GATHER, PP_SEND
from ..scenario import Scenario, frameworks

if TYPE_CHECKING:
    from .gpuops import GpuOps
    from .lowering import _Stage


def blocking_call(stage: _Stage, call: Call) -> None:
    """One blocking p2p call of the framework: a member op per transfer (its
    rendezvous with the other stage's op for it, keys.P2P_KEY), then the lane waits for all
    of them. DeepSpeed sends a partitioned tensor's meta message first, as a call of
    its own (frameworks.md §1(b), §2(b))."""
    transfers = call.transfers
    first = transfers[0]
    if len(transfers) == 1:  # a call of this shape made before: made again from it
        made = stage.p2p_calls.get((first.direction, first.kind, first.chunk))
        if made is not None:
            _again(stage, first, made)
            return
    gpu = stage.gpu
    sequential = stage.p2p == frameworks.SEQUENTIAL_BLOCKING
    label = " + ".join(f"{x.direction} {x.kind}{x.microbatch}" for x in transfers)
    receives_whole_grad = first.kind == "B" and first.direction == "recv" and not stage.gather["B"]
    regather = sequential and stage.regather and receives_whole_grad
    if regather:
        # DeepSpeed <= 0.5.3 re-gathers its output in _exec_recv_grads, before receiving
        stage.tp(f"B{first.microbatch} regather", first.microbatch, ALL_GATHER, ())
    parts = ["data"]
    if sequential and stage.gather[first.kind] and gpu.comm.tp(ALL_GATHER, gpu.d):
        parts = ["meta", "data"]
    if len(transfers) == 1:
        _first(stage, first, label, regather, len(parts) == 2)
        return
    add, lane, who = gpu.builder.add, gpu.lane, stage.who
    for part in parts:
        keys = []
        for x in transfers:
            transfer, sender, suffix, pair = _site(stage, x, part)
            keys.append(
                add(
                    lane,
                    PP_SEND,
                    f"{x.direction} {x.kind}{x.microbatch}{suffix}",
                    microbatch=x.microbatch,
                    transfer=transfer,
                    blocking=False,
                    rendezvous=(P2P_KEY, pair or who, sender, x.kind, x.microbatch, part),
                )
            )
        gpu.barrier(label, keys, first.microbatch)


# A call of one transfer, made once per direction, kind and sending chunk and then again
# from what the first made (`_first`, `_again`): whether it re-gathers first, its meta
# part's site (None: no meta message), its data part's, and the ops after the meta op
# as rows for WorkloadBuilder.replay, or () where they cannot be replayed
Made = tuple[bool, tuple | None, tuple, tuple[tuple, ...]]


def _first(stage: _Stage, x, label: str, regather: bool, meta: bool) -> None:
    """A call of one transfer (``label`` its own) seen first: after the re-gather, if any,
    the ops `blocking_call`'s loop adds, [meta op, barrier,] op, barrier, one by one;
    what later calls of its direction, kind and chunk share is kept (`Made`). All but
    the meta op share the call's label and micro-batch: they are recorded as one body."""
    meta_site = _site(stage, x, "meta") if meta else None
    deps = _meta_op(stage, x, label, meta_site)
    site = _site(stage, x, "data")
    builder, lane, mb = stage.gpu.builder, stage.gpu.lane, x.microbatch
    mark = builder.mark()
    _data(stage, x, label, deps, site)
    rows = builder.body_since(mark, lane, label, mb, deps, (PP_SEND,)) or ()
    stage.p2p_calls[(x.direction, x.kind, x.chunk)] = (regather, meta_site, site, rows)


def _again(stage: _Stage, x, made: Made) -> None:
    """A call of one transfer whose shape `_first` made: the same ops, those after the
    meta op replayed (the member op's rendezvous named for this call). MT-NLG makes
    21,760 such calls; this takes about half the time of adding their ops one by one."""
    regather, meta_site, site, rows = made
    mb = x.microbatch
    label = f"{x.direction} {x.kind}{mb}"
    if regather:
        stage.tp(f"B{mb} regather", mb, ALL_GATHER, ())
    deps = _meta_op(stage, x, label, meta_site)
    if not rows:
        _data(stage, x, label, deps, site)
        return
    name = (P2P_KEY, site[3] or stage.who, site[1], x.kind, mb, "data")
    stage.gpu.builder.replay(stage.gpu.lane, label, mb, deps, rows, lambda kind: name)


def _meta_op(stage: _Stage, x, label: str, site: tuple | None) -> tuple[int, ...]:
    """DeepSpeed's meta message's member op, if the call has one (``site``); the deps of
    the data part: the meta op, or none."""
    if site is None:
        return ()
    return (_member(stage, x, label, site, "meta"),)


def _data(stage: _Stage, x, label: str, deps: tuple[int, ...], site: tuple) -> None:
    """A call's data part: the barrier on its meta op (``deps``, if any), the member op,
    the barrier on it."""
    gpu, mb = stage.gpu, x.microbatch
    if deps:
        gpu.barrier(label, deps, mb)
    gpu.barrier(label, [_member(stage, x, label, site, "data")], mb)


def _member(stage: _Stage, x, label: str, site: tuple, part: str) -> int:
    """The call's member op of ``part`` (meta or data) at ``site``: the transfer,
    non-blocking, met by the peer's op of the same rendezvous."""
    transfer, sender, suffix, pair = site
    mb = x.microbatch
    return stage.gpu.builder.add(
        stage.gpu.lane,
        PP_SEND,
        label + suffix,
        microbatch=mb,
        transfer=transfer,
        blocking=False,
        rendezvous=(P2P_KEY, pair or stage.who, sender, x.kind, mb, part),
    )


def _site(stage: _Stage, x, part: str) -> tuple[Transfer, int, str, tuple[int, int] | None]:
    """`p2p_site`, looked up once per direction, kind, sending chunk and part."""
    key = (x.direction, x.kind, x.chunk, part)
    site = stage.p2p_sites.get(key)
    if site is None:
        site = stage.p2p_sites[key] = p2p_site(stage, x, part)
    return site


def p2p_site(stage: _Stage, x, part: str) -> tuple[Transfer, int, str, tuple[int, int] | None]:
    """What every transfer of a call with this direction, kind, sending chunk and part
    shares: the transfer, the sender's virtual stage, the label's suffix and, in mixed
    mode (perturbations' fast path), the name its rendezvous takes (None: this GPU's own)."""
    gpu, p = stage.gpu, stage.pipeline
    # ranks form a ring under interleaving: rank p - 1's chunk k feeds rank 0's k + 1
    step = 1 if x.kind == "F" else -1
    sender = stage.stage if x.direction == "send" else (stage.stage - step) % p
    receiver = (sender + step) % p
    nbytes = stage.p2p_bytes[x.kind] if part == "data" else meta_bytes(gpu)
    transfer = gpu.comm.between(sender, receiver, gpu.j, gpu.d, nbytes)
    pair = None  # the rendezvous is named by this GPU's (tensor rank, replica)
    if gpu.coupled_with(receiver if x.direction == "send" else sender):
        # mixed mode, a whole TP group at an end: one rendezvous of every tensor rank
        transfer = gpu.comm.replica_between(sender, receiver, gpu.d, nbytes)
        pair = (0, gpu.d)
    suffix = " meta" if part == "meta" else ""
    return transfer, stage_of(sender, x.chunk, p, stage.placement), suffix, pair


def meta_bytes(gpu: GpuOps) -> float:
    """DeepSpeed's PartitionedTensor meta message, a LongTensor of the tensor's rank,
    shape, part count and part bounds: about (8 + T) int64 (pipe/engine.py `to_meta`;
    the exact length is not verified, and only its latency matters)."""
    return 8.0 * (8 + gpu.comm.placement.tensor)


def p2p_items(scenario: Scenario, orders: list[list[Step]]) -> list[list[Step | Call]]:
    """Each rank's passes with its framework's blocking p2p calls between them
    (schedules.p2p), or the passes alone under `overlapped`."""
    mode, p = scenario.training.mechanism("pipeline_p2p"), len(orders)
    if mode == frameworks.BATCHED_BLOCKING and scenario.training.schedule == INTERLEAVED:
        v = scenario.parallel.virtual_pipeline_model_parallel_size
        group = scenario.training.microbatch_group_size_per_vp_stage
        return megatron_interleaved_calls(orders, v, group)
    if mode == frameworks.BATCHED_BLOCKING:
        return [megatron_calls(order, stage, p) for stage, order in enumerate(orders)]
    if mode == frameworks.SEQUENTIAL_BLOCKING:
        return [deepspeed_calls(stage, p, scenario.num_microbatches) for stage in range(p)]
    return [list(order) for order in orders]
