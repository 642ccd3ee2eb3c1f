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
    gpu = stage.gpu
    sequential = stage.p2p == frameworks.SEQUENTIAL_BLOCKING
    first = call.transfers[0]
    label = " + ".join(f"{x.direction} {x.kind}{x.microbatch}" for x in call.transfers)
    receives_whole_grad = first.kind == "B" and first.direction == "recv" and not stage.gather["B"]
    if sequential and stage.regather and receives_whole_grad:
        # DeepSpeed <= 0.5.3 re-gathers its output in _exec_recv_grads, before receiving
        stage.tp(f"B{first.microbatch} regather", first.microbatch, ALL_GATHER, ())
    parts = ["data"]
    if sequential and stage.gather[first.kind] and gpu.comm.tp(ALL_GATHER, gpu.d):
        parts = ["meta", "data"]
    add, lane, who, sites = gpu.builder.add, gpu.lane, stage.who, stage.p2p_sites
    for part in parts:
        keys = []
        for x in call.transfers:
            site = sites.get((x.direction, x.kind, x.chunk, part))
            if site is None:
                site = sites[(x.direction, x.kind, x.chunk, part)] = p2p_site(stage, x, part)
            transfer, sender, suffix, pair = site
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
