"""From a scenario to a workload: Megatron-style TP/PP/DP as ops on lanes.

One lane per pipeline stage is simulated: tensor rank 0 of replica 0 (placement.py
says where ranks sit). Every GPU of the stage does the same work at the same time,
and each communication op carries the flows of all the groups the lane stands for
(see collectives.py), so the network sees the whole cluster's traffic. Exact mode
(``network.symmetry = false``) lowers every GPU instead.

Per micro-batch and stage (Megatron-LM):
- forward: [embedding] then per layer: attention block, TP all-reduce, MLP
  block, TP all-reduce; [logits + loss]; send activations to the next stage;
- backward: [loss + logits backward] then per layer, last first: [recompute
  the layer's forward (full) or its attention core (selective)], MLP backward,
  TP all-reduce, attention backward, TP all-reduce; [embedding backward]; send
  gradients to the previous stage;
- with sequence parallelism each all-reduce becomes an all-gather before the
  block and a reduce-scatter after it, with layernorm and dropout sharded.

Pipeline tensors are b*s*h elements per stage boundary. With
`scatter_gather_tensors_in_pipeline` each tensor rank sends its 1/T shard over its
own NIC and the receiver all-gathers the tensor over TP (a blocking collective at
the start of the pass that needs it); without, each sends the whole tensor. How the
transfers meet the stages' lanes is `pipeline_p2p`: a non-blocking send when the pass
ends (`overlapped`), or the framework's blocking calls (`schedules.p2p`), each a
rendezvous of the sender's and the receiver's ops. docs/frameworks.md has the sources.
How gradients meet across data-parallel replicas, and the optimizer step, is the
data-parallel strategy's (dataparallel.py).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from functools import partial
from typing import TypeVar

from stepsim.schedules import (
    Step,
    holder_of,
    pipeline_ends,
    stage_of,
    step_label,
)
from stepsim.schedules.p2p import (
    Call,
)

from ..comm.classes import ClassComm, Partition
from ..comm.collectives import Fabric
from ..comm.congruent import NotCongruent, RankLinks, collapsible
from ..comm.placement import StageComm, placement_of
from ..cost.compute import ComputeModel, OverlapGemms
from ..cost.kernels import ZERO, Work
from ..cost.orders import stage_orders
from ..cost.params import rank_moe_flags
from ..ir.flows import Members
from ..ir.keys import AsyncTpKey, PipelineKey
from ..ir.ops import Workload, WorkloadBuilder
from ..ir.units import us_to_s
from ..ir.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    BACKWARD,
    CP_COMM,
    DP_SYNC,
    FORWARD,
    PP_SEND,
    RECOMPUTE,
    RECOMPUTE_FULL,
    RECOMPUTE_SELECTIVE,
    REDUCE_SCATTER,
    TP_COMM,
    WEIGHT,
)
from ..scenario import Scenario, frameworks
from .alike import AlikeBuilder, NotAlike, shareable
from .cp_ops import ContextOps
from .dataparallel import NO_PASS
from .gpuops import GpuOps
from .moe_ops import MoeBlock
from .offload import Offload
from .overlap import Pairing
from .p2pcalls import Made, blocking_call, p2p_items
from .strategy import strategy_for

T = TypeVar("T")

# a forward's output to hand over once its F&B pair has run: hand_over's arguments
# (label, micro-batch, pass kind, virtual stage, the virtual stage it goes to)
HandOver = tuple[str, int, str, int, int]


def lower(
    scenario: Scenario,
    cluster,
    touched: frozenset[int] = frozenset(),
    split: frozenset[tuple[int, int]] | None = None,
    collapse: bool | None = None,
    share: bool = True,
    memo: dict | None = None,
) -> Workload:
    """Build the ops of one training iteration: one compute lane per pipeline stage
    (symmetric mode) or per GPU (exact mode, ``network.symmetry = false``). Raises
    collectives.LayoutError when the layout's congruent groups are not alike.
    ``touched`` (symmetric mode, run/perturb.py): replicas whose every GPU is
    lowered besides the representative, which stands for the rest: the (replica, stage)
    TP groups in ``split`` (default: all of them) a lane per GPU as in exact mode, the
    others one lane each standing for the group. ``collapse`` (exact mode): one lane
    per TP group where its ranks are alike (congruent.py; None: where
    `congruent.collapsible` says so, False: a lane per GPU). ``share`` (exact mode, a
    lane per GPU): a stage's GPUs added from one GPU's record where they are alike
    (alike.py; the same workload, to the bit), False: each lowered on its own.
    ``memo`` (symmetric mode): the transfers built, shared with other lowerings of the
    same scenario but for its number of micro-batches (collectives.Pattern)."""
    if collapse is None:
        collapse = collapsible(scenario)
    if collapse and not scenario.network.symmetry:
        try:
            return _lower(scenario, cluster, frozenset(), frozenset(), collapse=True)
        except NotCongruent:
            pass  # two ranks' transfers unlike: every GPU its own lane
    share = share and shareable(scenario)
    return _lower(scenario, cluster, touched, split, share=share, memo=memo)


def lower_classes(
    scenario: Scenario, cluster, partition: Partition, members: Members, built: dict | None = None
) -> Workload:
    """Class mode (comm/classes.py): a lane per class of each stage's GPUs, named and met
    as exact mode's GPU (rank class, replica class); ``members`` receives what each
    coupled transfer is made of, for the network's certificate; ``built`` keeps the
    members' own transfers for the next lowering of the same scenario."""
    placement = placement_of(scenario)
    fabric = Fabric.of(
        cluster,
        us_to_s(scenario.cluster.collective_base_latency_us),
        scenario.cluster.nvls_fraction,
    )
    compute = ComputeModel(scenario)
    builder = WorkloadBuilder()
    orders = stage_orders(scenario)
    items = p2p_items(scenario, orders)
    for stage, order in enumerate(orders):
        comm = ClassComm(scenario, fabric, placement, stage, partition, members, built)
        for d in range(len(partition.replicas)):
            for j in range(len(partition.ranks)):
                _Stage(GpuOps(builder, comm, j, d), scenario, compute).lower(order, items[stage])
    return builder.build()


def _lower(
    scenario: Scenario,
    cluster,
    touched: frozenset[int],
    split: frozenset[tuple[int, int]] | None,
    collapse: bool = False,
    share: bool = False,
    memo: dict | None = None,
) -> Workload:
    placement = placement_of(scenario)
    fabric = Fabric.of(
        cluster,
        us_to_s(scenario.cluster.collective_base_latency_us),
        scenario.cluster.nvls_fraction,
        memo,
    )
    compute = ComputeModel(scenario)
    builder = AlikeBuilder() if share else WorkloadBuilder()
    orders = stage_orders(scenario)
    if scenario.network.symmetry:
        ranks = [(0, 0)]
    else:
        ranks = [(j, d) for d in range(placement.data) for j in range(placement.tensor)]
    items = p2p_items(scenario, orders)
    touched = touched if scenario.network.symmetry else frozenset()
    if split is None:
        split = frozenset((d, s) for d in touched for s in range(placement.pipeline))
    if collapse:  # exact mode: each TP group one lane, every replica (congruent.py)
        ranks, touched = [], frozenset(range(placement.data))
        split, links = frozenset(), RankLinks(cluster.capacities)
    for stage, order in enumerate(orders):
        if collapse:
            comm = StageComm(scenario, fabric, placement, stage, exclude=touched, ranks=links)
            whole = StageComm(
                scenario, fabric, placement, stage, joint=comm, group=True, ranks=links
            )
            for d in range(placement.data):
                _Stage(GpuOps(builder, whole, 0, d), scenario, compute).lower(order, items[stage])
            continue
        comm = StageComm(scenario, fabric, placement, stage, exclude=touched, split=split)
        if isinstance(builder, AlikeBuilder):  # exact mode: the GPUs from one's record
            try:
                builder.lower_alike(
                    comm, ranks, partial(_lower_gpu, scenario, compute, order, items[stage])
                )
                continue
            except NotAlike:
                pass  # each GPU on its own
        for j, d in ranks:
            _Stage(GpuOps(builder, comm, j, d), scenario, compute).lower(order, items[stage])
        if touched:
            exact = StageComm(scenario, fabric, placement, stage, joint=comm)
            whole = StageComm(scenario, fabric, placement, stage, joint=comm, group=True)
            for d in sorted(touched):
                lanes = range(placement.tensor) if (d, stage) in split else [None]
                for t in lanes:
                    gpu = (
                        GpuOps(builder, exact, t, d)
                        if t is not None
                        else GpuOps(builder, whole, 0, d)
                    )
                    _Stage(gpu, scenario, compute).lower(order, items[stage])
    return builder.build()


def _lower_gpu(
    scenario: Scenario,
    compute: ComputeModel,
    order: Sequence[Step],
    items: Sequence[Step | Call],
    gpu: GpuOps,
) -> None:
    """One GPU's passes (`_Stage.lower`), for alike.AlikeBuilder to record."""
    _Stage(gpu, scenario, compute).lower(order, items)


class _Stage:
    """The ops of one simulated GPU of a pipeline stage, pass by pass in its schedule's
    order: compute, tensor-parallel collectives and pipeline hand-overs here; the
    gradient sync and (FSDP) parameter gathers by its data-parallel strategy
    (dataparallel.py), called around each pass, each layer and at the end.

    With v chunks per rank, chunk k holds virtual stage ``stage_of(rank, k)`` and
    ``scenario.chunk_layers[rank][k]`` layers (L / (p v), or Megatron-Core's uneven
    split, stages.stage_layers); a chunk sends to the rank holding the next virtual stage, or,
    when that is itself (the turn of ZB-V's V), hands over with no transfer."""

    def __init__(self, gpu: GpuOps, scenario: Scenario, compute: ComputeModel) -> None:
        self.gpu, self.stage, self.who = gpu, gpu.stage, gpu.who
        self.pipeline = gpu.comm.placement.pipeline
        training, p = scenario.training, self.pipeline
        v = scenario.parallel.virtual_pipeline_model_parallel_size
        self.num_chunks = v
        self.placement = training.placement
        self.split = training.split_backward
        self.virtual = [stage_of(self.stage, k, p, self.placement) for k in range(v)]
        # whether each chunk's stage is its pipeline's first (embedding) and last (loss)
        self.ends = [pipeline_ends(s, p, v, self.placement) for s in self.virtual]
        counts = scenario.chunk_layers[self.stage]
        # rank-local layer indices: chunk k's follow chunk k-1's
        self.chunk_starts = [sum(counts[:k]) for k in range(v + 1)]
        self.sequence_parallel = scenario.parallel.sequence_parallel
        self.recompute = training.recompute_granularity
        self.modules = training.recomputed  # what a selective backward repeats
        # the async TP all-reduce needs the weight gradient right after the input's
        self.async_tp = (
            training.mechanism("async_tensor_model_parallel_allreduce") and not self.split
        )
        # userbuffers overlap: only SP's collectives, only where there is a TP group
        self.overlap_tp = (
            training.tp_comm_overlap
            and self.sequence_parallel
            and gpu.comm.tp(ALL_GATHER, gpu.d) is not None
        )
        self.async_count = 0
        # host time before each pass's compute: a fit on measured iterations (0: none)
        self.overhead_s = scenario.instruction_overhead_s
        self.layer, self.extras = compute.layer(), compute.extras()
        # context parallelism: the attention core's steps and what surrounds them
        self.cp = None
        if scenario.parallel.cp_size > 1:
            self.cp = ContextOps(compute, self.overlap_tp, self.split)
        self.dp = strategy_for(gpu, scenario, compute)
        # mixture of experts: which rank-local layers are MoE layers, and their MLP block
        moe = scenario.model.moe
        self.moe_flags = rank_moe_flags(scenario, self.stage) if moe else None
        self.moe = MoeBlock(compute, gpu.ep_rank(scenario)) if moe else None
        # F&B pairs with their MoE layers interleaved (overlap_moe_expert_parallel_comm)
        self.pairing = Pairing(gpu, scenario, compute) if training.moe_overlap else None
        # activation offloading: the copies to host memory and back (offload.py)
        self.offload = Offload(gpu, scenario) if training.offloaded_layers else None
        self.p2p = training.mechanism("pipeline_p2p")
        self.blocking = self.p2p != frameworks.OVERLAPPED
        # what crosses a stage boundary per tensor rank, and whether the receiver
        # all-gathers it over TP (frameworks.md §2); under SP the tensor already is 1/T
        comm, sp = gpu.comm, self.sequence_parallel
        scatter = training.mechanism("scatter_gather_tensors_in_pipeline") and not sp
        grads = scatter and training.mechanism("pipeline_grads_partitioned")
        self.gather = {"F": scatter, "B": grads}
        self.p2p_bytes = {
            kind: comm.shard_bytes if partitioned or sp else comm.activation_bytes
            for kind, partitioned in self.gather.items()
        }
        self.regather = scatter and training.mechanism("pipeline_regather_output")
        # a layer's ops by pass kind, whether its first waits and whether it is an MoE
        # layer: rows to replay, or () when they cannot be replayed (layer_body)
        self.bodies: dict[tuple[str, bool, bool], tuple[tuple, ...]] = {}
        # a pass's layers by pass kind, whether the first waits and chunk (pass_body)
        self.passes: dict[tuple[str, bool, int], tuple[tuple, ...]] = {}
        # the kinds whose rendezvous a replay names again: in exact mode a TP (or CP)
        # collective's, by its group and count; in mixed mode the data-parallel
        # buckets', which join the joint rendezvous
        self.replay_kinds: tuple[str, ...] = (TP_COMM, CP_COMM) if gpu.exact else ()
        if gpu.comm.mixed:
            self.replay_kinds = (*self.replay_kinds, DP_SYNC)
        self.p2p_sites: dict[tuple[str, str, int, str], tuple] = {}
        # a blocking p2p call of one transfer by direction, kind and sending chunk: what
        # the first made, for the others (p2pcalls.Made)
        self.p2p_calls: dict[tuple[str, str, int], Made] = {}

    # -- small builders -----------------------------------------------------------------

    def tp(self, label: str, mb: int, kind: str, deps: Sequence[object]) -> Sequence[object]:
        """A TP collective if the group has more than one GPU; returns deps not yet used."""
        transfer = self.gpu.comm.tp(kind, self.gpu.d)
        if transfer is None:
            return deps
        self.gpu.collective(self.gpu.lane, TP_COMM, label, transfer, microbatch=mb, deps=deps)
        return ()

    def host(self, kind: str, label: str, mb: int, deps: Sequence[object]) -> list[object]:
        """A pass's host overhead (scenario/fitted.py) once its input has come: the
        compute lane waits that long; returns the deps its next op still needs."""
        if not self.overhead_s:
            return list(deps)
        self.gpu.work(kind, label, mb, Work(duration_s=self.overhead_s, flops=0.0), deps)
        return []

    def block(
        self,
        kind: str,
        label: str,
        mb: int,
        w: Work,
        gemms: OverlapGemms,
        deps: Sequence[object] = (),
    ) -> None:
        """A block and its TP collective (an all-gather before it under SP). ``deps`` go
        on the block's first op, so nothing starts before its input arrives. With
        --tp-comm-overlap the all-gather runs alongside the GEMM it feeds and the
        reduce-scatter alongside the GEMM producing it (on the SMs it leaves)."""
        if not self.overlap_tp:
            if self.sequence_parallel:
                deps = self.tp(label, mb, ALL_GATHER, deps)
            self.middle(kind, label, mb, w, deps, gemms)
            self.tp(label, mb, REDUCE_SCATTER if self.sequence_parallel else ALL_REDUCE, ())
            return
        self.alongside(kind, label, mb, ALL_GATHER, gemms.gather, deps)
        self.middle(kind, label, mb, w - gemms.gather - gemms.scatter, (), gemms)
        self.alongside(kind, label, mb, REDUCE_SCATTER, gemms.scatter_shared)

    def middle(self, kind: str, label: str, mb: int, w: Work, deps, gemms: OverlapGemms) -> None:
        """A block's compute between its TP collectives; with context parallelism the
        attention block's core is its steps and exchanges (cp_ops.py)."""
        if self.cp is None or gemms is not self.layer.attention_overlap:
            self.gpu.work(kind, label, mb, w, deps)
        else:
            self.cp.lower_block(self.gpu, kind, label, mb, w, deps)

    def alongside(
        self, kind: str, label: str, mb: int, collective: str, w: Work, deps: Sequence[object] = ()
    ) -> None:
        """A TP collective and the compute ``w`` at once; what follows waits for both."""
        gpu = self.gpu
        self.async_count += 1
        key = AsyncTpKey(self.who, self.stage, self.async_count)
        transfer = gpu.comm.tp(collective, gpu.d)
        gpu.collective(
            gpu.lane, TP_COMM, label, transfer, microbatch=mb, blocking=False, key=key, deps=deps
        )
        gpu.work(kind, label, mb, w)
        gpu.barrier(label, [key], mb)

    def backward_block(
        self, label: str, mb: int, w: Work, last_weight: Work, gemms: OverlapGemms, deps
    ) -> None:
        """A block's backward. With the async TP all-reduce (and with --tp-comm-overlap,
        TE's bulk overlap), the input gradient's collective runs while the weight
        gradient of the block's first GEMM computes, and what follows waits for it; an
        all-gather under SP stays in front, or with --tp-comm-overlap runs alongside the
        GEMM it feeds (the projection's or fc2's dX)."""
        kind = REDUCE_SCATTER if self.sequence_parallel else ALL_REDUCE
        gpu = self.gpu
        if gpu.comm.tp(kind, gpu.d) is None:  # no TP group
            self.middle(BACKWARD, label, mb, w, deps, gemms)
            return
        if self.overlap_tp:
            self.alongside(BACKWARD, label, mb, ALL_GATHER, gemms.gather_backward, deps)
            w, deps = w - gemms.gather_backward, ()
        elif self.sequence_parallel:
            deps = self.tp(label, mb, ALL_GATHER, deps)
        if not (self.async_tp or (self.overlap_tp and not self.split)):
            self.middle(BACKWARD, label, mb, w, deps, gemms)
            self.tp(label, mb, kind, ())
            return
        self.middle(BACKWARD, label, mb, w - last_weight, deps, gemms)
        self.alongside(BACKWARD, label, mb, kind, last_weight)

    def hand_over(self, label: str, mb: int, kind: str, virtual: int, to: int) -> None:
        """Make this pass's output available to virtual stage ``to``: a pipeline send, or
        nothing but a name when this rank holds that stage too."""
        gpu = self.gpu
        other = holder_of(to, self.pipeline, self.placement)[0]
        if other == self.stage:
            gpu.builder.name_last(gpu.lane, PipelineKey(self.who, virtual, kind, mb))
            return
        if self.blocking:
            return  # sent by the framework's call after the pass (self.call)
        key = PipelineKey(self.who, virtual, kind, mb)
        gpu.builder.add(
            gpu.lane,
            PP_SEND,
            label,
            microbatch=mb,
            transfer=gpu.comm.send_to(other, gpu.j, gpu.d, self.p2p_bytes[kind]),
            blocking=False,
            key=key,
        )

    def received(self, virtual: int, kind: str, mb: int) -> list[object]:
        """The key(s) of virtual stage ``virtual``'s output of pass ``kind`` for this GPU."""
        holder = holder_of(virtual, self.pipeline, self.placement)[0]
        return [PipelineKey(who, virtual, kind, mb) for who in self.gpu.peers(holder)]

    def receive(self, label: str, mb: int, kind: str, deps: Sequence[object]) -> list[object]:
        """At the start of a pass that received ``kind`` (F: an activation, B: a
        gradient): the TP all-gather of the 1/T shards when the tensor came scattered;
        returns the deps the pass's first op still needs."""
        if self.gather[kind] and self.gpu.comm.tp(ALL_GATHER, self.gpu.d) is not None:
            return list(self.tp(f"{label} gather", mb, ALL_GATHER, deps))
        return list(deps)

    def call(self, call: Call) -> None:
        """One blocking p2p call of the framework (p2pcalls.blocking_call)."""
        blocking_call(self, call)

    def layers(self, chunk: int) -> list[int]:
        """The rank-local indices of a chunk's layers, in forward order."""
        return list(range(self.chunk_starts[chunk], self.chunk_starts[chunk + 1]))

    # -- the stage ----------------------------------------------------------------------

    def lower(self, order: Sequence[Step], items: Sequence[Step | Call]) -> None:
        """The rank's passes in ``order``; ``items`` the same passes with the p2p calls
        between them (p2p_items). Under a split schedule a B whose W the order does not
        hold is a full backward: its input-gradient part, its W at once, then its send."""
        weights = {(s.microbatch, s.chunk) for s in order if s.kind == "W"}
        full = {
            i
            for i, s in enumerate(order)
            if s.kind == "B" and (s.microbatch, s.chunk) not in weights
        }
        # the pass that completes a chunk's gradients last: a W, or a full backward
        last_grad = {s.chunk: i for i, s in enumerate(order) if s.kind == "W" or i in full}

        def grad_flags(i: int) -> tuple[bool, bool | None]:
            """A B's (last_microbatch, then_weight): a full one in a split order runs its
            W at once, and is its chunk's last gradient when no later W is."""
            last = last_grad.get(order[i].chunk) == i
            return (False, last) if self.split and i in full else (last, None)

        self.grad_flags = grad_flags
        position, lowered = -1, -1
        deferred: HandOver | None = None
        for step in items:
            if isinstance(step, Call):
                self.call(step)
                continue
            position += 1
            if position == lowered:  # the backward of a pair run overlapped
                continue
            after = order[position + 1] if position + 1 < len(order) else None
            pair = after if after is not None and after.overlapped else None
            if step.kind == "F" and pair is not None and self.pairing is not None:
                backward = self.backward_steps(pair, *self.grad_flags(position + 1))
                deferred = self.pairing.pair(self.forward_steps(step, pair), backward)
                lowered = position + 1
            elif step.kind == "F":
                deferred = self.forward(step, pair)
            elif step.kind == "B":
                _drain(self.backward_steps(step, *self.grad_flags(position)))
            else:
                self.weight(step, last_grad.get(step.chunk) == position)
            if deferred is not None and (step.overlapped or position + 1 == lowered):
                self.hand_over(*deferred)  # the F&B's forward output leaves after the pair
                deferred = None
        self.dp.finish()

    def forward(self, step: Step, pair: Step | None = None) -> HandOver | None:
        return _drain(self.forward_steps(step, pair))

    def forward_steps(
        self, step: Step, pair: Step | None = None
    ) -> Generator[None, None, HandOver | None]:
        """The forward pass, as a generator that pauses between layer parts when its
        pair's passes interleave (overlap.Pairing); ends with the deferred hand-over. With
        ``pair`` (the backward it runs with, an F&B) it starts once that backward's input
        has come too, and its output leaves after the pair: the hand-over is returned for
        the caller to make then."""
        mb, virtual = step.microbatch, self.virtual[step.chunk]
        label = step_label(step, self.num_chunks)
        first, last = self.ends[step.chunk]
        recv: list[object] = []
        if not first:
            own = [] if self.blocking else self.received(virtual - 1, "F", mb)
            recv = self.receive(label, mb, "F", own)
        if pair is not None and not self.ends[pair.chunk][1] and not self.blocking:
            after = self.virtual[pair.chunk] + 1
            recv += self.received(after, "B", pair.microbatch)
        recv = self.host(FORWARD, label, mb, recv)
        layers = self.layers(step.chunk)
        dp = self.dp.forward_pass(label, mb, step.chunk, layers)
        if first:
            self.gpu.work(FORWARD, label, mb, self.extras.embedding_forward, recv + dp.first())
            recv = []
        offload = self.offload
        if dp is NO_PASS and offload is None and (self.pairing is None or pair is None):
            if layers:  # nothing comes between the layers
                self.pass_body("F", label, mb, recv, step.chunk, layers)
                recv = []
        else:
            for n, index in enumerate(layers):
                deps = recv + dp.before_layer(index)
                if offload is not None:
                    deps += offload.before_forward(index)
                if self.pairing is None or pair is None:
                    self.layer_body("F", label, mb, deps, index)
                else:
                    yield from self.pairing.layer(self, "F", label, mb, deps, index)
                if offload is not None:
                    offload.after_forward(label, mb, index)
                dp.after_layer(n, index)
                recv = []
        if last:  # after the received input when the chunk holds no layer (a layout's "L")
            self.gpu.work(FORWARD, label, mb, self.extras.output_forward, recv)
        elif pair is not None:
            return (label, mb, "F", virtual, virtual + 1)
        else:
            self.hand_over(label, mb, "F", virtual, virtual + 1)
        return None

    def backward_steps(
        self, step: Step, last_microbatch: bool, then_weight: bool | None = None
    ) -> Generator[None, None, None]:
        """The backward pass, or under a split schedule its input-gradient part (B); with
        ``then_weight`` (whether it is the chunk's last gradient) its W follows at once,
        before the send: a full backward in a split schedule. A generator, as
        `forward_steps`; it pauses only in a pair run overlapped (``step.overlapped``)."""
        mb, virtual = step.microbatch, self.virtual[step.chunk]
        label = step_label(step, self.num_chunks)
        first, last = self.ends[step.chunk]
        recv: list[object] = []
        if not last:
            own = [] if self.blocking else self.received(virtual + 1, "B", mb)
            if self.regather and (self.gather["B"] or self.p2p != frameworks.SEQUENTIAL_BLOCKING):
                own = list(self.tp(f"{label} regather", mb, ALL_GATHER, own))  # own output
            recv = self.receive(label, mb, "B", own)
        recv = self.host(BACKWARD, label, mb, recv)
        order = list(reversed(self.layers(step.chunk)))
        dp = self.dp.backward_pass(label, mb, step.chunk, order, last_microbatch)
        split = self.split
        if last:
            output = self.extras.output_backward
            if split:
                output = output - self.extras.output_weight
            self.gpu.work(BACKWARD, label, mb, output, recv + dp.first())
            recv = []
        pairing = self.pairing if step.overlapped else None
        offload = self.offload
        if dp is NO_PASS and offload is None and pairing is None:
            if order:  # nothing comes between the layers
                self.pass_body("B", label, mb, recv, step.chunk, order)
                recv = []
        else:
            for n, index in enumerate(order):
                deps = recv + dp.before_layer(index)
                if offload is not None:
                    deps += offload.before_backward(label, mb, index)
                if pairing is not None:
                    yield from pairing.layer(self, "B", label, mb, deps, index)
                else:
                    self.layer_body("B", label, mb, deps, index)
                dp.after_layer(n, index)
                recv = []
        if first:  # after the received gradient when no layer is between; its dropout's
            # backward is B's, the table's gradient W's under a split schedule
            embedding = self.extras.embedding_backward
            if split:
                embedding = embedding - self.extras.embedding_weight
            self.gpu.work(BACKWARD, label, mb, embedding, recv)
        dp.end()
        if then_weight is not None:
            self.weight(Step("W", mb, step.chunk), then_weight, label)
        if not first:
            self.hand_over(label, mb, "B", virtual, virtual - 1)

    def pass_body(
        self, kind: str, label: str, mb: int, deps: list[object], chunk: int, layers: list[int]
    ) -> None:
        """A pass's ``layers`` (rank-local, in the pass's order) where nothing comes
        between them (no data-parallel hooks: dataparallel.NO_PASS; no offloading, no
        pairing): `layer_body` for each, the first waiting for ``deps``. Alike in every
        pass of the kind over the chunk, so after the first they are replayed as one body:
        the same ops and rendezvous names as their layer bodies replayed one by one.
        Where a layer's body cannot be replayed, neither can the pass's."""
        shape = (kind, bool(deps), chunk)
        rows = self.passes.get(shape)
        gpu = self.gpu
        builder = gpu.builder
        if rows:
            builder.replay(gpu.lane, label, mb, deps, rows, gpu.rendezvous)
            return
        mark, every, wait = builder.mark(), True, deps
        for index in layers:
            every = self.layer_body(kind, label, mb, list(deps), index) and every
            deps = []
        if rows is None:
            body = builder.body_since(mark, gpu.lane, label, mb, wait, self.replay_kinds)
            self.passes[shape] = body if every and body else ()

    def layer_body(self, kind: str, label: str, mb: int, deps: list[object], index: int) -> bool:
        """A layer's ops in a forward (F) or backward (B) pass, its first waiting for
        ``deps``. They are alike in every pass of the stage but for label and micro-batch
        (what the blocks add depends on the stage's layer, layout and mechanisms only),
        so the first body of each kind is made by the blocks and recorded, and later
        ones are replayed from the record (WorkloadBuilder.replay): the same ops at a
        fraction of the cost, in exact mode with their TP collectives' rendezvous named
        again in order. Bodies that name ops (asynchronous TP, --tp-comm-overlap) are made
        by the blocks every time. MoE and dense layers (rank-local ``index``) are two shapes."""
        moe = self.moe_flags is not None and self.moe_flags[index]
        shape = (kind, bool(deps), moe)
        rows = self.bodies.get(shape)
        gpu = self.gpu
        builder = gpu.builder
        if rows:
            builder.replay(gpu.lane, label, mb, deps, rows, gpu.rendezvous)
            return True
        mark = builder.mark()
        if kind == "F":
            self.forward_layer(label, mb, deps, moe)
        else:
            self.backward_layer(label, mb, deps, moe)
        if rows is None:
            body = builder.body_since(mark, gpu.lane, label, mb, deps, self.replay_kinds)
            # exact mode: an MoE layer's expert collectives are named by their group too,
            # which a replay (naming by kind alone) cannot do: made by the blocks each time
            rows = self.bodies[shape] = () if moe and gpu.exact else body or ()
        return bool(rows)

    def forward_layer(self, label: str, mb: int, deps: list[object], moe: bool = False) -> None:
        layer = self.layer
        self.block(FORWARD, label, mb, layer.attention_forward, layer.attention_overlap, deps)
        self.mlp(FORWARD, label, mb, moe)

    def mlp(self, kind: str, label: str, mb: int, moe: bool) -> None:
        """The MLP block, or an MoE layer's (moe_ops.py) in its place."""
        if moe and self.moe is not None:
            self.moe.forward(self, kind, label, mb, ())
        else:
            self.block(kind, label, mb, self.layer.mlp_forward, self.layer.mlp_overlap)

    def backward_layer(self, label: str, mb: int, recv: list[object], moe: bool = False) -> None:
        layer = self.layer
        mlp, attention = layer.mlp_backward, layer.attention_backward
        if self.split:
            mlp, attention = mlp - layer.mlp_weight, attention - layer.attention_weight
        if self.recompute == RECOMPUTE_FULL:
            self.block(RECOMPUTE, label, mb, layer.attention_forward, layer.attention_overlap, recv)
            self.mlp(RECOMPUTE, label, mb, moe)
            recv = []
        elif self.recompute == RECOMPUTE_SELECTIVE:
            recv = self.selective(label, mb, recv, moe)
        if moe and self.moe is not None:
            self.moe.backward(self, label, mb, recv)
        else:
            self.backward_block(label, mb, mlp, layer.mlp_last_weight, layer.mlp_overlap, recv)
        self.backward_block(
            label, mb, attention, layer.attention_last_weight, layer.attention_overlap, ()
        )

    def selective(self, label: str, mb: int, recv: list[object], moe: bool) -> list[object]:
        """What a selective backward repeats before the layer's backward
        (`training.recompute_modules`, Megatron-Core's checkpointed modules): the attention
        core (under context parallelism with its exchanges), the norms and MLA's
        up-projections as compute; a dense MLP with its TP collectives; an MoE layer whole
        (moe: its dispatcher's all-to-alls again), its shared experts with their TP
        collectives, or its experts' activation (moe_act). Returns the deps not yet used."""
        modules, layer, gpu = self.modules, self.layer, self.gpu
        if "core_attn" in modules and self.cp is not None:
            self.cp.lower(gpu, RECOMPUTE, label, mb, recv)  # its exchanges again
            recv = []
            modules = modules - {"core_attn"}
        work = layer.selective_forward(modules)
        if work.duration_s or work.flops:
            gpu.work(RECOMPUTE, label, mb, work, recv)
            recv = []
        if moe and self.moe is not None:
            w = self.moe.work
            if "moe" in modules:
                self.moe.forward(self, RECOMPUTE, label, mb, recv)
                return []
            if "shared_experts" in modules and w.shared.duration_s:
                gpu.work(RECOMPUTE, label, mb, ZERO, recv)  # waits for the input, if any
                recv = []
                self.moe.shared(self, RECOMPUTE, label, mb, w.shared)
            if "moe_act" in modules:
                gpu.work(RECOMPUTE, label, mb, w.act, recv)
                recv = []
        elif "mlp" in modules:
            self.block(RECOMPUTE, label, mb, layer.mlp_module_forward, layer.mlp_overlap, recv)
            recv = []
        return recv

    def weight(self, step: Step, last_microbatch: bool, label: str | None = None) -> None:
        """The weight-gradient part (W) of a split backward: no communication but what
        the data-parallel strategy adds after each layer. ``label``: a full backward's."""
        mb = step.microbatch
        if label is None:  # a pass of its own (a full backward's W had its host time)
            label = step_label(step, self.num_chunks)
            self.host(WEIGHT, label, mb, ())
        first, last = self.ends[step.chunk]
        if last:
            self.gpu.work(WEIGHT, label, mb, self.extras.output_weight)
        order = list(reversed(self.layers(step.chunk)))
        dp = self.dp.weight_pass(label, mb, step.chunk, order, last_microbatch)
        flags = self.moe_flags  # set exactly when ``moe`` is
        for n, index in enumerate(order):
            moe = self.moe if flags is not None and flags[index] else None
            self.gpu.work(
                WEIGHT, label, mb, moe.work.weight if moe is not None else self.layer.mlp_weight
            )
            self.gpu.work(WEIGHT, label, mb, self.layer.attention_weight)
            if first and n == len(order) - 1:
                self.gpu.work(WEIGHT, label, mb, self.extras.embedding_weight)
            dp.after_layer(n, index)
        if first and not order:  # a layout's embedding-only first stage
            self.gpu.work(WEIGHT, label, mb, self.extras.embedding_weight)


def _drain(steps: Generator[None, None, T]) -> T:
    """Run a pass's generator to its end; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value
