"""Memory and lower bounds on the iteration time of a layout, all closed forms: what a
search filters and orders candidates by before it simulates any.

Two lower bounds, the search taking the larger (`iteration_lower_bound_s`):

- the *compute* bound (`compute_bound_s`): the busiest pipeline rank's compute, after
  the first micro-batch's forwards reach it;
- the *schedule* bound (`schedule_bound_s`): that, plus the pipeline's drain (the last
  backward's way back down the stages before the first rank's optimizer step) and with
  each rank's own first and last passes: for 1F1B with equal stages it is the schedule's
  whole bubble, (m + p - 1)(F + B), and (m + (p - 1)/v)(F + B) under interleaving. A
  pass holds its layers' blocking tensor-parallel collectives too, each at least its
  latency plus its bytes at its solo rate (`tp_collectives_s`).

Both read the compute model's kernel times and the schedule's orders, the schedule bound
also the TP collectives the run would build on the scenario's cluster; the proof that
each is a lower bound of the simulated iteration is in the functions' notes and
tests/test_bounds.py checks it on random small layouts and shipped scenarios.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from stepsim import schedules
from stepsim.schedules import DUAL, Step, holder_of, pipeline_ends, stage_of

from ..comm.collectives import Fabric, LayoutError
from ..comm.placement import StageComm, placement_of
from ..cost.compute import ComputeModel, LayerWork
from ..cost.memory import optimizer_sharded, stage_memory
from ..cost.moe import moe_block_work
from ..cost.orders import inflight_of, stage_orders
from ..cost.params import output_rank, stage_params_per_rank
from ..cost.schedule_costs import schedule_times
from ..engine.network import solo_rate_bytes_per_s
from ..ir.ops import Collective
from ..ir.results import StageMemory
from ..ir.units import us_to_s
from ..ir.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    RECOMPUTE_FULL,
    RECOMPUTE_SELECTIVE,
    REDUCE_SCATTER,
)
from ..run.iteration import build_cluster
from ..scenario import ClusterSpec, Scenario, ScenarioError


class RankShape(NamedTuple):
    """What the schedule bound reads of one pipeline rank's order (`pipeline_shape`)."""

    first: Step  # its first pass
    last_backward: Step | None  # its last B
    after: tuple[Step, ...]  # its passes after that B (weight gradients), in order
    # (pass, chunk, how many): F, B, W, or BW for a B whose W the order does not hold
    # under a split schedule (a full backward)
    counts: tuple[tuple[str, int, int], ...]


class PipelineShape(NamedTuple):
    """Each rank's `RankShape`, and whether some order runs overlapped F&B pairs."""

    ranks: tuple[RankShape, ...]
    overlapped: bool


def pipeline_shape(orders: Sequence[Sequence[Step]]) -> PipelineShape:
    """The shape of a schedule's orders (`stage_orders`), as the schedule bound reads it."""
    ranks = []
    overlapped = False
    for order in orders:
        weights = {(s.microbatch, s.chunk) for s in order if s.kind == "W"}
        counts: dict[tuple[str, int], int] = {}
        last = -1
        for i, step in enumerate(order):
            overlapped = overlapped or step.overlapped
            kind = step.kind
            if kind == "B":
                last = i
                if weights and (step.microbatch, step.chunk) not in weights:
                    kind = "BW"
            counts[kind, step.chunk] = counts.get((kind, step.chunk), 0) + 1
        ranks.append(
            RankShape(
                first=order[0],
                last_backward=order[last] if last >= 0 else None,
                after=tuple(order[last + 1 :]),
                counts=tuple((k, c, n) for (k, c), n in sorted(counts.items())),
            )
        )
    return PipelineShape(tuple(ranks), overlapped)


class Inflight:
    """In-flight activations per rank and the schedule's shape (`pipeline_shape`),
    cached by what they depend on (the schedule's own parameters), since building the
    orders is the slow part of the memory model and of the schedule bound."""

    def __init__(self) -> None:
        self.cache: dict[tuple, tuple[list[int], PipelineShape]] = {}

    def _entry(self, scenario: Scenario) -> tuple[list[int], PipelineShape]:
        par, tr = scenario.parallel, scenario.training
        key: tuple[object, ...] = (
            tr.schedule,
            par.pipeline_model_parallel_size,
            scenario.num_microbatches,
            par.virtual_pipeline_model_parallel_size,
            tr.microbatch_group_size_per_vp_stage,
            tr.moe_overlap and tr.schedule in (schedules.ONE_F_ONE_B, schedules.INTERLEAVED),
        )
        if tr.custom_orders is not None:
            key = (key, tr.custom_orders)
        if schedules.SCHEDULES[tr.schedule].timed:  # the order follows the op times
            key = (key, schedule_times(scenario))
        entry = self.cache.get(key)
        if entry is None:
            orders = stage_orders(scenario)
            inflight = inflight_of(orders)
            entry = self.cache[key] = (inflight, pipeline_shape(orders))
        return entry

    def __call__(self, scenario: Scenario) -> list[int]:
        return self._entry(scenario)[0]

    def shape(self, scenario: Scenario) -> PipelineShape:
        return self._entry(scenario)[1]


def memory_of(scenario: Scenario, inflight: Callable[[Scenario], list[int]]) -> list[StageMemory]:
    return [stage_memory(scenario, s, n) for s, n in enumerate(inflight(scenario))]


# the schedule bound's margin, relative: a fast-forwarded iteration (run/fastforward.py)
# is the full run's to 1e-9 of a period, and sums taken in another order differ in the
# last bits; the margin keeps a bound that meets the iteration below it
SCHEDULE_BOUND_SLACK = 1e-9


def iteration_lower_bound_s(scenario: Scenario, shape: PipelineShape | None = None) -> float:
    """A time no simulation of the scenario can beat (closed form, no simulation): the
    larger of the compute bound and the schedule bound (module notes). ``shape``: the
    schedule's (`Inflight.shape`), built here when not given."""
    model = ComputeModel(scenario)
    times = _Times(scenario, model)
    if scenario.parallel.pipeline_model_parallel_size == 1:
        return compute_bound_s(scenario, times)  # the schedule bound is no more there
    if shape is None:
        shape = pipeline_shape(stage_orders(scenario))
    bound = compute_bound_s(scenario, times, shape)
    schedule = schedule_bound_s(scenario, times, shape)
    return max(bound, schedule * (1.0 - SCHEDULE_BOUND_SLACK))


class _Times:
    """The compute model's times the bounds read, per layer and per pipeline end."""

    def __init__(self, scenario: Scenario, model: ComputeModel) -> None:
        layer, extras = model.layer(), model.extras()
        tr = scenario.training
        forward = (layer.attention_forward + layer.mlp_forward).duration_s
        backward = (layer.attention_backward + layer.mlp_backward).duration_s
        self.moe = scenario.model.moe
        if self.moe:  # dense and MoE layers: the cheaper of the two, per layer
            moe = moe_block_work(model)
            forward = min(forward, (layer.attention_forward + moe.forward).duration_s)
            backward = min(backward, (layer.attention_backward + moe.backward).duration_s)
        self.forward, self.backward = forward, backward
        self.recompute = layer.recompute_s(tr.recompute_granularity, forward, tr.recomputed)
        self.weight = (layer.attention_weight + layer.mlp_weight).duration_s
        self.extras = extras
        d = scenario.parallel.gradient_group_size  # ZeRO shards over data x context parallel
        sharded = optimizer_sharded(scenario)
        p = scenario.parallel.pipeline_model_parallel_size
        self.optimizer = [
            model.optimizer(params / d if sharded else params).duration_s
            for params in (stage_params_per_rank(scenario, s) for s in range(p))
        ]
        # per rank, a layer's blocking TP collectives in a forward and a backward pass
        self.tp_forward, self.tp_backward = (
            tp_collectives_s(scenario, layer) if p > 1 else ([0.0] * p, [0.0] * p)
        )


def least_s(collective: Collective, capacities: Sequence[float]) -> float:
    """The least time a collective takes on either network model: each phase, one after
    the other, its latency and then its bytes at its solo rate (engine/network.py: a
    flow's rate is at most its tightest link's capacity over its multiplicity there,
    and the fair-share network gives no more; the analytical model gives exactly that)."""
    total = 0.0
    for phase in collective:
        total += phase.latency_s
        if phase.bytes_per_flow > 0 and phase.links:
            rate = solo_rate_bytes_per_s(phase.links, phase.mults, capacities)
            total += phase.bytes_per_flow / rate
    return total


# the last cluster the TP term was built on, by its spec: layouts of one search share
# it (a cluster holds no layout's state; what StageComm builds once per lowering it
# keeps in its Fabric's memo, made anew for each layout)
_cluster: list = [None, None]


def _cluster_of(spec: ClusterSpec):
    """The pattern cluster of ``spec`` (symmetric mode's, run.build_cluster), kept for the
    next layout on the same cluster."""
    if _cluster[0] != spec:
        _cluster[:] = [spec, build_cluster(spec, pattern=True)]
    return _cluster[1]


def tp_collectives_s(scenario: Scenario, layer: LayerWork) -> tuple[list[float], list[float]]:
    """Per pipeline rank, the least time one dense layer's tensor-parallel collectives hold
    the rank's compute lane beyond its compute: in a forward pass, and in a backward pass
    with its recomputation (emit/lowering.py, `_Stage.block`, `backward_block`,
    `backward_layer`, `selective`). Without sequence parallelism a block (attention, MLP)
    ends with a blocking all-reduce; with it, a blocking all-gather before the block and
    a reduce-scatter after. A full recomputation repeats both blocks, a selective one
    the MLP block if it is among the recomputed modules. A backward block ends with the
    same collective, blocking, or with the asynchronous TP all-reduce (not under a split
    backward) started alongside the block's last weight-gradient GEMM, which the lane
    then waits for: that part lasts at least the longer of the two, the GEMM's time
    being counted already. Each collective is the rank's own (`StageComm.tp` on the
    cluster the run builds), at least its `least_s`.

    Zeros (no TP time counted, the bound as without it) where this is not proved: one
    tensor rank, exact mode or perturbations (the collectives are then other lanes'
    rendezvous or another cluster's), context parallelism, --tp-comm-overlap (its
    collectives run alongside GEMMs split around them), MoE models (the schedule bound
    is 0 there), and a cluster or layout the run refuses (it reports that)."""
    par, tr = scenario.parallel, scenario.training
    p = par.pipeline_model_parallel_size
    zeros = [0.0] * p
    sp = par.sequence_parallel
    if (
        par.tensor_model_parallel_size == 1
        or not scenario.network.symmetry
        or scenario.perturbations
        or par.cp_size > 1
        or scenario.model.moe
        or (tr.tp_comm_overlap and sp)
    ):
        return zeros, list(zeros)
    try:
        cluster = _cluster_of(scenario.cluster)
    except ScenarioError:  # a cluster over the limits: its runs say so
        return zeros, list(zeros)
    fabric = Fabric.of(
        cluster,
        us_to_s(scenario.cluster.collective_base_latency_us),
        scenario.cluster.nvls_fraction,
    )
    placement = placement_of(scenario)
    asynchronous = tr.mechanism("async_tensor_model_parallel_allreduce") and not tr.split_backward
    recomputed = 0  # blocks whose forward the backward repeats with their collectives
    if tr.recompute_granularity == RECOMPUTE_FULL:
        recomputed = 2
    elif tr.recompute_granularity == RECOMPUTE_SELECTIVE and "mlp" in tr.recomputed:
        recomputed = 1
    forward, backward = [], []
    for rank in range(p):
        comm = StageComm(scenario, fabric, placement, rank)
        try:
            least = {
                kind: least_s(c, cluster.capacities) if c is not None else 0.0
                for kind in ((ALL_GATHER, REDUCE_SCATTER) if sp else (ALL_REDUCE,))
                for c in (comm.tp(kind, 0),)
            }
        except LayoutError:
            return zeros, list(zeros)
        gather = least[ALL_GATHER] if sp else 0.0
        ending = least[REDUCE_SCATTER] if sp else least[ALL_REDUCE]
        block = gather + ending  # a block's collectives, forward
        if asynchronous:
            tails = sum(
                max(0.0, ending - w.duration_s)
                for w in (layer.mlp_last_weight, layer.attention_last_weight)
            )
        else:
            tails = 2 * ending
        forward.append(2 * block)
        backward.append(recomputed * block + 2 * gather + tails)
    return forward, backward


def compute_bound_s(
    scenario: Scenario, times: _Times | None = None, shape: PipelineShape | None = None
) -> float:
    """The compute bound: a time no simulation of the scenario can beat.

    A rank's compute stream runs one op at a time, so the iteration lasts at least
    the sum of its compute ops (forwards, backwards, recomputation, weight gradients,
    its embedding or output layer, its optimizer step). Rank s starts nothing before
    the first micro-batch's forward has passed virtual stages 0 .. s-1, held by ranks
    0 .. s-1 under both placements. Each rank counts its own layers (an uneven split,
    stages.stage_layers, gives ranks different counts). The bound is the largest of those
    sums over ranks; communication, bubbles and waiting only add to the simulated time.

    Under DualPipe's two model copies (the ``dual`` placement) each micro-batch passes
    through one copy, so a rank runs each chunk's passes as often as the schedule's
    orders say (``shape``, built here when not given), and rank p - 1 starts at once
    with the second copy's first stage: no wait is counted there.
    """
    if times is None:
        times = _Times(scenario, ComputeModel(scenario))
    extras = times.extras
    par, tr = scenario.parallel, scenario.training
    p = par.pipeline_model_parallel_size
    m = scenario.num_microbatches
    forward, backward, recompute = times.forward, times.backward, times.recompute
    split = tr.split_backward
    embedding = (
        extras.embedding_forward.duration_s
        + (extras.embedding_weight if split else extras.embedding_backward).duration_s
    )
    output = (extras.output_forward + extras.output_backward).duration_s
    if tr.placement == DUAL:
        if shape is None:
            shape = pipeline_shape(stage_orders(scenario))
        v = par.virtual_pipeline_model_parallel_size
        best = 0.0
        for s, ends in enumerate(shape.ranks):
            busy = times.optimizer[s]
            for kind, chunk, count in ends.counts:
                if kind != "F":  # one forward per micro-batch through the chunk
                    continue
                stage = stage_of(s, chunk, p, DUAL)
                enters, leaves = pipeline_ends(stage, p, v, DUAL)
                per_pass = scenario.chunk_layers[s][chunk] * (forward + backward + recompute)
                busy += count * (per_pass + (embedding if enters else 0.0))
                busy += count * (output if leaves else 0.0)
            best = max(best, busy)
        return best
    last = output_rank(scenario)
    best = 0.0
    fill = 0.0  # the first micro-batch's forwards on ranks before this one
    for s in range(p):
        busy = m * scenario.rank_layers(s) * (forward + backward + recompute)
        if s == 0:
            busy += m * embedding
        if s == last:
            busy += m * output
        busy += times.optimizer[s]
        best = max(best, fill + busy)
        first_chunk = scenario.chunk_layers[s][0]  # virtual stage s, both placements
        fill += first_chunk * forward + (extras.embedding_forward.duration_s if s == 0 else 0.0)
    return best


def schedule_bound_s(scenario: Scenario, times: _Times, shape: PipelineShape) -> float:
    """The schedule bound: for each rank, the forwards its first pass waits for, its
    passes, and after its last backward either its own weight gradients and optimizer
    step or the backwards that last one's gradient must still pass through down to its
    pipeline's first stage and the optimizer step of the rank holding that stage; the
    largest over ranks. 0 (no bound) for overlapped F&B pairs and MoE models, whose
    passes' compute the per-layer times below do not bound.

    Why it is a lower bound (emit/lowering.py): each pass's compute ops sit on its rank's
    one compute lane, in the order's sequence, after the input the pass waits for (the
    first op of a forward waits for the previous stage's forward output of that
    micro-batch, a backward's for the next stage's backward output) and before its output
    leaves (the hand-over follows the pass's last compute op); the optimizer step follows
    a rank's last pass. Communication, host waits and contention only delay ops; so a
    rank's first pass starts no earlier than the forwards before it take, one after the
    other, its passes take at least their compute, and the last backward's gradient needs
    the chain of backwards below it, each at least its compute. A pass's compute is the
    compute model's per-layer time times its chunk's layers, with the embedding on a
    pipeline's first stage, the output layer on its last, recomputation inside B, and the
    instruction overhead (scenario/fitted.py) of each pass; each layer also holds the
    lane for its TP collectives (`tp_collectives_s`: ops of the lane after the pass's
    input and before its hand-over)."""
    if shape.overlapped or times.moe:
        return 0.0
    par, tr = scenario.parallel, scenario.training
    p, v = par.pipeline_model_parallel_size, par.virtual_pipeline_model_parallel_size
    placement = tr.placement
    split = tr.split_backward
    host = scenario.instruction_overhead_s
    ex = times.extras
    layer_b = times.backward - (times.weight if split else 0.0) + times.recompute
    emb_w, out_w = ex.embedding_weight.duration_s, ex.output_weight.duration_s
    emb_b = ex.embedding_backward.duration_s - (emb_w if split else 0.0)
    out_b = ex.output_backward.duration_s - (out_w if split else 0.0)
    # each virtual stage's passes: F, B (with W unless split), W, and BW (a full B)
    passes: list[dict[str, float]] = []
    for stage in range(p * v):
        rank, chunk = holder_of(stage, p, placement)
        layers = scenario.chunk_layers[rank][chunk]
        first, last = pipeline_ends(stage, p, v, placement)
        f = host + layers * (times.forward + times.tp_forward[rank])
        b = host + layers * (layer_b + times.tp_backward[rank])
        w = host + layers * times.weight
        if first:
            f += ex.embedding_forward.duration_s
            b += emb_b
            w += emb_w
        if last:
            f += ex.output_forward.duration_s
            b += out_b
            w += out_w
        passes.append({"F": f, "B": b, "W": w, "BW": b + w - host})

    def chain(stage: int, kind: str) -> tuple[float, int]:
        """The passes of ``kind`` one micro-batch needs before it reaches ``stage``
        (forwards from its pipeline's first stage) or after it leaves it (backwards down
        to that first stage), one after the other: their time, and that first stage."""
        total = 0.0
        while not pipeline_ends(stage, p, v, placement)[0]:
            stage -= 1
            total += passes[stage][kind]
        return total, stage

    best = 0.0
    for rank, ends in enumerate(shape.ranks):
        busy = 0.0
        for kind, chunk, count in ends.counts:
            busy += count * passes[stage_of(rank, chunk, p, placement)][kind]
        tail = 0.0
        for step in ends.after:
            tail += passes[stage_of(rank, step.chunk, p, placement)][step.kind]
        fill = 0.0
        if ends.first.kind == "F":
            fill = chain(stage_of(rank, ends.first.chunk, p, placement), "F")[0]
        drain = own = tail + times.optimizer[rank]
        if ends.last_backward is not None:
            stage = stage_of(rank, ends.last_backward.chunk, p, placement)
            down, first_stage = chain(stage, "B")
            drain = down + times.optimizer[holder_of(first_stage, p, placement)[0]]
        best = max(best, fill + busy - tail + max(own, drain))
    return best
