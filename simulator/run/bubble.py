"""The bubble study: a schedule on abstract op times, no cluster (``stepsim schedule``).

Times follow the reference vectors' conventions: F, B and W are per micro-batch
and rank; with v chunks each op lasts F/v, B/v or W/v; a schedule that does not
split the backward runs one fused backward of (B + W)/v; c is added to every
hop between ranks. The engine runs the orders exactly as the full simulator
runs a pipeline's compute lanes. With ``stage_layers`` (an uneven split, as
Megatron-Core's ``decoder_first/last_pipeline_num_layers`` give), F, B and W are per
layer and rank r's ops last its layers times as long.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import NamedTuple

from stepsim.schedules import (
    DUAL,
    LOOPED,
    SCHEDULES,
    V_SHAPE,
    Step,
    ZbvTimes,
    order_labels,
    peak_inflight,
    pipeline_ends,
    stage_of,
)
from stepsim.schedules import build as build_schedule
from stepsim.schedules.custom import sizes_of

from ..emit.abstract import abstract_pipeline
from ..engine.core import simulate
from ..ir.ops import Workload
from ..ir.results import SCHEMA_VERSION, Trace
from ..ir.vocabulary import BACKWARD, COMPUTE_STREAM, FORWARD, MODEL_KINDS, RECOMPUTE, WEIGHT
from ..scenario import ScenarioError, check_limit


@dataclass(frozen=True, slots=True, kw_only=True)
class OpTimes:
    forward: float
    backward: float
    weight: float = 0.0
    p2p_latency: float = 0.0
    overlapped: float | None = None  # an F&B pair (forward + full backward); None: F + B + W


@dataclass(frozen=True, slots=True, kw_only=True)
class Study:
    name: str
    num_ranks: int
    num_microbatches: int
    num_chunks: int
    split_backward: bool
    placement: str
    times: OpTimes
    orders: tuple[tuple[Step, ...], ...]
    trace: Trace
    stage_layers: tuple[int, ...] | None = None  # layers per rank; F, B, W are then per layer

    @property
    def makespan(self) -> float:
        return self.trace.end_s

    @property
    def chunks_per_stage(self) -> int:
        """Chunks that make one stage's worth of layers (1 under the dual placement,
        whose chunks are whole stages of two model copies)."""
        return 1 if self.placement == DUAL else self.num_chunks

    @property
    def overlaps(self) -> bool:
        """Whether the orders run overlapped F&B pairs at a time of their own."""
        return self.times.overlapped is not None and any(
            s.overlapped for order in self.orders for s in order
        )

    @property
    def ideal(self) -> float:
        """m(F + B + W) per rank; with overlapped pairs timed apart, the ranks' mean busy
        time (the work itself shrinks where pairs overlap)."""
        if self.overlaps:
            return sum(self.per_rank_busy) / self.num_ranks
        t = self.times
        ideal = self.num_microbatches * (t.forward + t.backward + t.weight)
        if self.stage_layers is not None:  # the busiest rank's work
            ideal *= max(self.stage_layers)
        return ideal

    @property
    def per_rank_busy(self) -> list[float]:
        busy = [0.0] * self.num_ranks
        for span in self.trace.spans:
            if span.stream == COMPUTE_STREAM and span.kind in MODEL_KINDS:
                busy[span.gpu] += span.end_s - span.start_s
        return busy

    @property
    def per_rank_bubble(self) -> list[float]:
        return [self.makespan - busy for busy in self.per_rank_busy]

    def peak_inflight(self, release_at: str = "W") -> list[int]:
        """Chunk activations alive per rank: +1 at F, -1 at W (or the fused B)."""
        return [peak_inflight(order, release_at) for order in self.orders]

    def rank_order(self) -> list[str]:
        return [" ".join(order_labels(o, self.num_chunks)) for o in self.orders]

    def as_dict(self) -> dict:
        ideal, makespan = self.ideal, self.makespan
        t = self.times
        layers = {} if self.stage_layers is None else {"stage_layers": list(self.stage_layers)}
        return {
            "schema_version": SCHEMA_VERSION,
            "schedule": self.name,
            "p": self.num_ranks,
            "m": self.num_microbatches,
            "v": self.num_chunks,
            "F": t.forward,
            "B": t.backward,
            "W": t.weight,
            "c": t.p2p_latency,
            **({} if t.overlapped is None else {"F&B": t.overlapped}),
            "split_backward": self.split_backward,
            "placement": self.placement,
            **layers,
            "makespan": makespan,
            "ideal": ideal,
            # the two meanings of "bubble", named apart: the idle share of the makespan
            # (what `stepsim run` reports as bubble_fraction) and Narayanan et al.'s
            # (makespan - ideal) / ideal (the reference vectors' bubble_ratio)
            "bubble_fraction": (makespan - ideal) / makespan,
            "bubble_over_ideal": (makespan - ideal) / ideal,
            "per_rank_busy": self.per_rank_busy,
            "per_rank_bubble": self.per_rank_bubble,
            "per_rank_peak_inflight_b": self.peak_inflight("B"),
            "per_rank_peak_inflight_w": self.peak_inflight("W"),
            "rank_order": self.rank_order(),
        }


def run_orders(
    name: str,
    orders: Sequence[Sequence[Step]],
    times: OpTimes,
    *,
    num_chunks: int,
    split_backward: bool,
    placement: str = LOOPED,
    stage_layers: Sequence[int] | None = None,
) -> Study:
    """Simulate given per-rank orders (already checked) on abstract op times. A chunk's
    op lasts its share of the rank's time (F / v), except under the dual placement,
    whose micro-batches pass one chunk per rank (F)."""
    v = num_chunks
    share = 1 if placement == DUAL else v
    backward = times.backward if split_backward else times.backward + times.weight
    workload = abstract_pipeline(
        orders,
        forward_s=times.forward / share,
        backward_s=backward / share,
        weight_s=times.weight / share if split_backward else 0.0,
        p2p_latency_s=times.p2p_latency,
        num_chunks=v,
        placement=placement,
        rank_scale=stage_layers,
        overlapped_s=None if times.overlapped is None else times.overlapped / share,
    )
    m = 1 + max(s.microbatch for order in orders for s in order)
    return Study(
        name=name,
        num_ranks=len(orders),
        num_microbatches=m,
        num_chunks=v,
        split_backward=split_backward,
        placement=placement,
        times=times,
        orders=tuple(tuple(o) for o in orders),
        trace=simulate(workload),
        stage_layers=None if stage_layers is None else tuple(stage_layers),
    )


def run_schedule(
    name: str,
    p: int,
    m: int,
    times: OpTimes,
    v: int = 1,
    group_size: int | None = None,
    stage_layers: Sequence[int] | None = None,
) -> Study:
    """Build a named schedule and simulate it; ValueError if the sizes do not suit it."""
    info = SCHEDULES[name]
    timed = None
    if info.timed:  # one chunk op lasts F/v, B/v, W/v; memory per op as ZbvTimes' defaults
        timed = ZbvTimes(times.forward / v, times.backward / v, times.weight / v, times.p2p_latency)
    orders = build_schedule(name, p, m, v, group_size, timed)
    return run_orders(
        name,
        orders,
        times,
        num_chunks=v,
        split_backward=info.split_backward,
        placement=info.placement,
        stage_layers=stage_layers,
    )


# -- what `stepsim schedule` accepts: op times, sizes, and which schedules run how --------

MAX_SIZE = 100_000  # stages, micro-batches, chunks or group size


def op_times(
    forward: float,
    backward: float,
    weight: float | None,
    p2p_latency: float,
    overlapped: float | None = None,
) -> OpTimes:
    """Checked op times (``weight`` None: the backward is not split; ``overlapped`` None:
    an F&B pair takes F + B + W). Errors name the command's flags."""
    values = {
        "--forward": forward,
        "--backward": backward,
        "--weight": weight or 0.0,
        "--p2p-latency": p2p_latency,
        "--overlapped": overlapped or 0.0,
    }
    for flag, value in values.items():
        if not 0 <= value < float("inf"):
            raise ScenarioError(f"{flag}={value} must be a finite number >= 0")
    total = forward + backward + (weight or 0.0)
    if total <= 0:
        raise ScenarioError("--forward, --backward and --weight cannot all be 0")
    if total > 1e12 or p2p_latency > 1e12 or (overlapped or 0.0) > 1e12:
        raise ScenarioError(
            "--forward, --backward, --weight, --p2p-latency and --overlapped must be <= 1e12"
        )
    return OpTimes(
        forward=forward,
        backward=backward,
        weight=weight or 0.0,
        p2p_latency=p2p_latency,
        overlapped=overlapped,
    )


def check_sizes(sizes: dict[str, int | None]) -> None:
    """Each given size (by flag) between 1 and MAX_SIZE."""
    for flag, value in sizes.items():
        if value is not None and not 1 <= value <= MAX_SIZE:
            raise ScenarioError(f"{flag}={value} must be between 1 and {MAX_SIZE}")


def study_of_orders(
    name: str,
    orders: Sequence[Sequence[Step]],
    times: OpTimes,
    *,
    weight_given: bool,
    placement: str,
    sizes: dict[str, int | None],
    where: str,
    stage_layers: Sequence[int] | None = None,
) -> Study:
    """Per-rank orders read from a file (``where`` names it in errors): within the op
    limit, agreeing with the sizes given (by flag: --stages, --microbatches, --chunks),
    with a weight time when they hold W ops; then simulated."""
    p, m, v, split = sizes_of(orders)
    check_limit(
        "schedule_ops", p * m * v * 3, f"{where}: {p} ranks x {m} micro-batches x {v} chunks is"
    )
    for (flag, given), found in zip(sizes.items(), (p, m, v), strict=True):
        if given is not None and given != found:
            raise ScenarioError(f"{flag}={given} but the schedule file has {found}")
    if split and not weight_given:
        raise ScenarioError("--weight is required: the schedule file has W ops")
    check_stage_layers(stage_layers, p)
    return run_orders(
        name,
        orders,
        times,
        num_chunks=v,
        split_backward=split,
        placement=placement,
        stage_layers=stage_layers,
    )


def check_stage_layers(stage_layers: Sequence[int] | None, stages: int) -> None:
    """One count per rank, each at least 1 (``--stage-layers``)."""
    if stage_layers is None:
        return
    text = ",".join(str(n) for n in stage_layers)
    if len(stage_layers) != stages:
        raise ScenarioError(
            f"--stage-layers={text} gives {len(stage_layers)} counts for {stages} stages"
        )
    if min(stage_layers) < 1:
        raise ScenarioError(f"--stage-layers={text}: every stage needs at least 1 layer")


def studies_of_schedules(
    names: Sequence[str],
    stages: int | None,
    microbatches: int | None,
    times: OpTimes,
    *,
    weight_given: bool,
    chunks: int | None = None,
    group_size: int | None = None,
    stage_layers: Sequence[int] | None = None,
) -> list[Study]:
    """Named schedules on the same sizes and op times, each checked and simulated. With
    one schedule a --chunks or --group-size it cannot take is an error; with several
    they apply where they can."""
    if stages is None:
        raise ScenarioError("--stages is required with --schedule or --compare")
    if microbatches is None:
        raise ScenarioError("--microbatches is required with --schedule or --compare")
    # every schedule runs (and is drawn) at most 3 max(v, 2) ops per micro-batch and stage
    ops = stages * microbatches * 3 * max(chunks or 2, 2) * len(names)
    check_limit(
        "schedule_ops",
        ops,
        f"--stages={stages} x --microbatches={microbatches} x {len(names)} schedule(s) means",
    )
    check_stage_layers(stage_layers, stages)
    studies = []
    single = len(names) == 1
    for name in names:
        if name not in SCHEDULES:
            raise ScenarioError(f"schedule {name!r} is not one of: {', '.join(SCHEDULES)}")
        info = SCHEDULES[name]
        if info.split_backward and not weight_given:
            raise ScenarioError(
                f"--weight is required for {name!r}, which splits the backward: --backward "
                "is then the input-gradient time and --weight the weight-gradient time"
            )
        v = 1
        if info.chunked:
            v = 2 if info.placement in (V_SHAPE, DUAL) or chunks is None else chunks
        if single and chunks not in (None, v):
            raise ScenarioError(f"--chunks={chunks}: schedule {name!r} runs {v} chunks")
        if single and group_size is not None and not info.grouped:
            raise ScenarioError(
                f"--group-size={group_size}: schedule {name!r} takes no micro-batch group"
            )
        group = group_size if info.grouped else None
        try:
            studies.append(run_schedule(name, stages, microbatches, times, v, group, stage_layers))
        except ValueError as exc:
            raise ScenarioError(
                f"--schedule {name} --stages {stages} --microbatches {microbatches}: {exc}"
            ) from None
    return studies


# -- the idle of a simulated iteration, by cause -------------------------------------------


@dataclass(frozen=True, slots=True)
class IdleCauses:
    """A run's mean idle per GPU split by cause, adding up to it: the schedule's own
    bubble (its idle with every stage's passes as long as the stages' mean and free
    communication), stage imbalance (what the stages' own pass times add, communication
    still free) and waits on communication (the rest: transfers and exposed collectives
    that delay a neighbour's input)."""

    schedule_s: float
    imbalance_s: float
    communication_s: float


# the pass each compute op kind belongs to (recomputation runs in the backward's)
PASS_OF_KIND: dict[str, str] = {FORWARD: "F", BACKWARD: "B", RECOMPUTE: "B", WEIGHT: "W"}


def pass_times(
    workload: Workload, stages: int, kinds: dict[str, str]
) -> list[tuple[float, float, float]]:
    """Each pipeline stage's mean forward, backward (recomputation included) and weight
    gradient compute time per micro-batch: the durations of the compute ops of the
    stage's first compute lane, by ``kinds`` (each op kind to "F", "B" or "W"), over the
    micro-batches they belong to (a fast-forwarded run's simulated ones)."""
    first: dict[int, int] = {}
    for lane in workload.lanes:
        if lane.stream == COMPUTE_STREAM:
            first.setdefault(lane.stage, lane.index)
    slot = {"F": 0, "B": 1, "W": 2}
    times = []
    for stage in range(stages):
        total, seen = [0.0, 0.0, 0.0], set()
        found = first.get(stage)
        for index in () if found is None else workload.lanes[found].ops:
            op = workload.ops[index]
            if op.kind in kinds and op.transfer is None:
                total[slot[kinds[op.kind]]] += op.duration_s
                if op.microbatch >= 0:
                    seen.add(op.microbatch)
        n = max(1, len(seen))
        times.append((total[0] / n, total[1] / n, total[2] / n))
    return times


def rank_passes(order: Sequence[Step]) -> list[tuple[Step, ...]]:
    """A rank's passes in order: each step alone, or an overlapped pair (a step and the
    one marked as overlapping it) as one pass."""
    out: list[tuple[Step, ...]] = []
    at = 0
    while at < len(order):
        paired = at + 1 < len(order) and order[at + 1].overlapped
        out.append((order[at], order[at + 1]) if paired else (order[at],))
        at += 2 if paired else 1
    return out


class FreeRun(NamedTuple):
    """The orders run on abstract time with free communication (`free_run`): per rank,
    the idle before each of its passes (`rank_passes`), counted from the start, and its
    idle over the whole run (the tail after its last pass included)."""

    idle_before: list[list[float]]
    idle: list[float]


def free_idle(
    orders: Sequence[Sequence[Step]],
    rank_times: Sequence[tuple[float, float, float]],
    *,
    num_chunks: int,
    placement: str,
) -> list[float]:
    """Each rank's idle when the orders run with the given per-op (forward, backward,
    weight) times per rank and free communication (`free_run`)."""
    return free_run(orders, rank_times, num_chunks=num_chunks, placement=placement).idle


# a rank's passes as the abstract runs take them (`pass_plans`): each pass's steps (an
# overlapped pair is one pass), the outputs of other passes it waits for and those it
# hands on, each (stage, kind, micro-batch) numbered (`PassPlan.keys` in all), and its
# steps' kinds of time (F, B, W, or a full B: `step_times`'s, for `free_run`)
F_TIME, B_TIME, W_TIME, FULL_B_TIME = 0, 1, 2, 3


class PassPlan(NamedTuple):
    """Each rank's passes with their dependencies (`pass_plans`): lists by rank, each
    of one entry per pass (`rank_passes`)."""

    passes: list[list[tuple[Step, ...]]]
    inputs: list[list[tuple[int, ...]]]  # the numbered outputs the pass waits for
    outputs: list[list[tuple[int, ...]]]  # those it hands on
    times: list[list[tuple[int, ...]]]  # each step's kind of time (F_TIME ... FULL_B_TIME)
    keys: int  # how many numbers the inputs and outputs take


def pass_plans(orders: Sequence[Sequence[Step]], *, num_chunks: int, placement: str) -> PassPlan:
    """Each rank's passes with their inputs and outputs (`free_run`'s dependencies): the
    same for every set of pass times, so `idle_causes` builds them once for its two runs.
    A forward waits for its micro-batch's forward on the stage before (unless its stage
    is its pipeline's first), a backward for its backward on the stage after (unless
    its stage is the last)."""
    ranks = len(orders)
    microbatches = [s.microbatch for order in orders for s in order]
    low = min(microbatches, default=0)
    width = max(microbatches, default=0) - low + 1
    letter = {"F": 0, "B": 1, "W": 2}
    plan = PassPlan([], [], [], [], 0)
    highest = 0  # stage
    for rank, order in enumerate(orders):
        weights = {(s.microbatch, s.chunk) for s in order if s.kind == "W"}
        where = {}  # chunk -> stage, first, last
        for chunk in sorted({s.chunk for s in order}):
            stage = stage_of(rank, chunk, ranks, placement)
            where[chunk] = (stage, *pipeline_ends(stage, ranks, num_chunks, placement))
            highest = max(highest, stage)
        passes = rank_passes(order)
        inputs, outputs, times = [], [], []
        for steps in passes:
            needs: tuple[int, ...] = ()
            gives: tuple[int, ...] = ()
            kinds: tuple[int, ...] = ()
            for kind, microbatch, chunk in steps:
                stage, first, last = where[chunk]
                code = letter[kind]
                mb = microbatch - low
                gives += ((stage * 3 + code) * width + mb,)
                if code == 0:
                    if not first:
                        needs += ((stage - 1) * 3 * width + mb,)
                elif code == 1:
                    if not last:
                        needs += (((stage + 1) * 3 + 1) * width + mb,)
                    if weights and (microbatch, chunk) not in weights:
                        code = FULL_B_TIME
                kinds += (code,)
            inputs.append(needs)
            outputs.append(gives)
            times.append(kinds)
        plan.passes.append(passes)
        plan.inputs.append(inputs)
        plan.outputs.append(outputs)
        plan.times.append(times)
    # a backward's input may be of the stage after the highest
    return plan._replace(keys=(highest + 2) * 3 * width)


def free_run(
    orders: Sequence[Sequence[Step]],
    rank_times: Sequence[tuple[float, float, float]],
    *,
    num_chunks: int,
    placement: str,
    plans: PassPlan | None = None,
) -> FreeRun:
    """The orders run with the given per-op (forward, backward, weight) times per rank
    and free communication: what `abstract_pipeline` run by the engine gives with no
    latency, computed directly as each op's earliest start (its rank's previous op and
    its input from the neighbouring stage), with no engine. ``plans``: the orders'
    `pass_plans`, when the caller has them."""
    if plans is None:
        plans = pass_plans(orders, num_chunks=num_chunks, placement=placement)
    ranks = len(orders)
    # each pass's seconds at these times (an overlapped pair: the fsum of its two), as
    # `step_times` gives a step's: a B whose W the order does not hold is a full backward
    seconds_of = []
    for rank, times in enumerate(plans.times):
        f, b, w = rank_times[rank]
        value = (f, b, w, b + w)  # FULL_B_TIME only where the order has W's
        of_kinds = {kinds: math.fsum([value[k] for k in kinds]) for kinds in set(times)}
        seconds_of.append([of_kinds[kinds] for kinds in times])
    ends: list[float | None] = [None] * plans.keys
    waiting: dict[int, int] = {}
    clock, busy, position = [0.0] * ranks, [0.0] * ranks, [0] * ranks
    idle_before: list[list[float]] = [[] for _ in range(ranks)]
    # run each rank as far as its inputs allow; a rank stopped on an input resumes when
    # that input's pass ends (each pass is visited once or twice: linear in the passes)
    ready = list(range(ranks - 1, -1, -1))
    while ready:
        rank = ready.pop()
        inputs, outputs, seconds_at = plans.inputs[rank], plans.outputs[rank], seconds_of[rank]
        gaps, count = idle_before[rank], len(inputs)
        at, now, spent = position[rank], clock[rank], busy[rank]
        while at < count:
            start, missing = now, -1
            for key in inputs[at]:
                end = ends[key]
                if end is None:
                    missing = key
                    break
                if end > start:  # max(start, end)
                    start = end
            if missing >= 0:
                waiting[missing] = rank
                break
            seconds = seconds_at[at]
            gaps.append(start - spent)
            now = start + seconds
            spent += seconds
            for key in outputs[at]:
                ends[key] = now
                if key in waiting:
                    ready.append(waiting.pop(key))
            at += 1
        position[rank], clock[rank], busy[rank] = at, now, spent
    if any(at < len(inputs) for at, inputs in zip(position, plans.inputs, strict=True)):
        raise ValueError("the orders deadlock: no rank can run its next op")
    makespan = max(clock)
    return FreeRun(idle_before, [makespan - b for b in busy])


def rank_times_of(
    times: Sequence[tuple[float, float, float]], num_chunks: int, placement: str
) -> tuple[list[tuple[float, float, float]], list[tuple[float, float, float]]]:
    """Per-op (forward, backward, weight) times per rank from each stage's pass times
    per micro-batch (`pass_times`): the ranks' mean for every rank, and each rank's own."""
    ranks = len(times)
    share = _share(num_chunks, placement)
    own = [(f / share, b / share, w / share) for f, b, w in times]
    mean = tuple(math.fsum(t[k] for t in own) / ranks for k in range(3))
    return [(mean[0], mean[1], mean[2])] * ranks, own


def idle_causes(
    orders: Sequence[Sequence[Step]],
    times: Sequence[tuple[float, float, float]],
    idle_s: float,
    *,
    num_chunks: int,
    placement: str,
) -> IdleCauses:
    """Split ``idle_s`` (a run's mean idle per GPU) by cause: the orders run on abstract
    time twice without communication (`free_idle`), once with every rank at the ranks'
    mean pass times (the schedule's bubble) and once with each rank's own (adding the
    imbalance); the rest of the run's idle is waiting on communication. Each part is
    clipped so that the three are non-negative and add up to ``idle_s``."""
    _, equal, own = abstract_runs(orders, times, num_chunks=num_chunks, placement=placement)
    return clipped_causes(equal.idle, own.idle, idle_s)


# the last few `abstract_runs`, by their orders and times: a run's metrics
# (`idle_causes`) and its idle map (run/idlemap.py) ask for the same ones
_KEPT_RUNS: dict[tuple, tuple[PassPlan, FreeRun, FreeRun]] = {}
KEEP_RUNS = 4


def abstract_runs(
    orders: Sequence[Sequence[Step]],
    times: Sequence[tuple[float, float, float]],
    *,
    num_chunks: int,
    placement: str,
) -> tuple[PassPlan, FreeRun, FreeRun]:
    """The orders' `pass_plans` and their two `free_run`s at the stages' pass times
    per micro-batch (`pass_times`): every rank at the ranks' mean, and each at its own
    (`rank_times_of`). The last KEEP_RUNS are kept, by the orders' steps (an
    overlapped one's mark included) and the times' bits; the caller does not change
    them."""
    key = (
        tuple(map(tuple, orders)),
        tuple(
            (r, k) for r, order in enumerate(orders) for k, s in enumerate(order) if s.overlapped
        ),
        array("d", chain.from_iterable(times)).tobytes(),
        num_chunks,
        placement,
    )
    found = _KEPT_RUNS.get(key)
    if found is None:
        equal, own = rank_times_of(times, num_chunks, placement)
        plans = pass_plans(orders, num_chunks=num_chunks, placement=placement)
        found = (
            plans,
            free_run(orders, equal, num_chunks=num_chunks, placement=placement, plans=plans),
            free_run(orders, own, num_chunks=num_chunks, placement=placement, plans=plans),
        )
        while len(_KEPT_RUNS) >= KEEP_RUNS:
            del _KEPT_RUNS[next(iter(_KEPT_RUNS))]
        _KEPT_RUNS[key] = found
    return found


def clipped_causes(
    equal_idle: Sequence[float], own_idle: Sequence[float], idle_s: float
) -> IdleCauses:
    """`idle_causes` from the ranks' idle in the two abstract runs (`free_idle` at the
    mean and at each rank's own times): the mean of each, clipped against ``idle_s``."""
    ranks = len(equal_idle)
    schedule = math.fsum(equal_idle) / ranks
    unequal = math.fsum(own_idle) / ranks
    schedule_s = min(max(schedule, 0.0), idle_s)
    imbalance_s = min(max(unequal - schedule, 0.0), idle_s - schedule_s)
    return IdleCauses(schedule_s, imbalance_s, max(0.0, idle_s - schedule_s - imbalance_s))


def _share(num_chunks: int, placement: str) -> int:
    """How many ops a rank's per-micro-batch pass time is split into (one per chunk;
    the dual placement's chunks are whole stages)."""
    return 1 if placement == DUAL else num_chunks
