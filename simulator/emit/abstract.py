"""A pipeline in abstract time as ops: each rank's schedule order with fixed op times and
a fixed latency on every hop between ranks (the reference vectors' setting, `stepsim
schedule` and the schedule study)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stepsim.schedules import (
    LOOPED,
    Step,
    holder_of,
    pipeline_ends,
    stage_of,
    step_label,
)

from ..ir.flows import delay
from ..ir.keys import PipelineKey
from ..ir.ops import Workload, WorkloadBuilder
from ..ir.vocabulary import BACKWARD, COMPUTE_STREAM, FORWARD, PP_SEND, WEIGHT


def step_times(
    order: Sequence[Step], forward_s: float, backward_s: float, weight_s: float
) -> Callable[[Step], float]:
    """Each step's own time in a rank's order: a B whose W the order (one with W's)
    does not hold is a full backward."""
    weights = {(s.microbatch, s.chunk) for s in order if s.kind == "W"}
    full = backward_s + weight_s if weights else backward_s
    duration = {"F": forward_s, "B": backward_s, "W": weight_s}

    def own_time(step: Step) -> float:
        if step.kind == "B" and (step.microbatch, step.chunk) not in weights:
            return full
        return duration[step.kind]

    return own_time


def abstract_pipeline(
    orders: Sequence[Sequence[Step]],
    *,
    forward_s: float,
    backward_s: float,
    weight_s: float = 0.0,
    p2p_latency_s: float = 0.0,
    num_chunks: int = 1,
    placement: str = LOOPED,
    rank_scale: Sequence[float] | None = None,
    overlapped_s: float | None = None,
    rank_times: Sequence[tuple[float, float, float]] | None = None,
) -> Workload:
    """A pipeline with fixed op times and a fixed latency on every rank-to-rank hop.

    This is the setting of the reference pipeline vectors: rank r runs its order
    strictly; F of a micro-batch on stage s waits for its F on stage s-1, B waits for
    its B on stage s+1, plus the latency when the two stages sit on different ranks.
    Durations are per op (one chunk's share); ``rank_scale`` multiplies rank r's by
    ``rank_scale[r]`` (its layers, when the times are per layer: an uneven split).

    A B whose W the order does not hold, in an order that has W's, is a full backward
    (``backward_s + weight_s``). An overlapped pair (F, then a B marked
    `schedules.overlapped`) starts when both inputs have arrived and lasts
    ``overlapped_s`` (default: the forward plus the full backward), shared between its
    two ops in proportion to their own times; both outputs leave when it ends.

    ``rank_times``: each rank's own (forward, backward, weight) op times instead of the
    shared ones (stages of unequal work: the idle they cause apart from the schedule's).
    """
    builder = WorkloadBuilder()
    num_ranks = len(orders)

    def rank_of(stage: int) -> int:
        return holder_of(stage, num_ranks, placement)[0]

    def output(stage: int, step: Step) -> PipelineKey:
        """What the neighbouring stage waits for (one GPU per rank: who is (0, 0))."""
        return PipelineKey((0, 0), stage, step.kind, step.microbatch)

    hop = delay(p2p_latency_s)
    kind_of = {"F": FORWARD, "B": BACKWARD, "W": WEIGHT}
    for rank, order in enumerate(orders):
        lane = builder.lane(gpu=rank, stream=COMPUTE_STREAM, stage=rank)
        scale = 1 if rank_scale is None else rank_scale[rank]
        times = (forward_s, backward_s, weight_s) if rank_times is None else rank_times[rank]
        own_time = step_times(order, *times)

        pending: list[tuple[int, Step]] = []  # outputs to send once the pair ends
        for position, step in enumerate(order):
            stage = stage_of(rank, step.chunk, num_ranks, placement)
            first, last = pipeline_ends(stage, num_ranks, num_chunks, placement)
            deps = []
            if (step.kind == "F" and not first) or (step.kind == "B" and not last):
                deps.append(output(stage - 1 if step.kind == "F" else stage + 1, step))
            after = order[position + 1] if position + 1 < len(order) else None
            seconds = own_time(step)
            pair = after if after is not None and after.overlapped else None
            if pair is not None or step.overlapped:
                partner = pair if pair is not None else order[position - 1]
                together = own_time(step) + own_time(partner)
                pair_s = together if overlapped_s is None else overlapped_s
                seconds = pair_s * own_time(step) / together if together else 0.0
            if pair is not None:  # the pair starts once its backward's input is here too
                at = stage_of(rank, pair.chunk, num_ranks, placement)
                if not pipeline_ends(at, num_ranks, num_chunks, placement)[1]:
                    deps.append(output(at + 1, pair))
            builder.add(
                lane,
                kind_of[step.kind],
                step_label(step, num_chunks),
                microbatch=step.microbatch,
                duration_s=seconds * scale,
                deps=deps,
            )
            if step.kind == "W" or (step.kind == "F" and last) or (step.kind == "B" and first):
                continue
            pending.append((stage, step))
            if pair is not None:
                continue
            for at, done in pending:
                target = at + 1 if done.kind == "F" else at - 1
                if rank_of(target) == rank:  # handed over on the rank, no transfer
                    builder.name_last(lane, output(at, done))
                    continue
                builder.add(
                    lane,
                    PP_SEND,
                    step_label(done, num_chunks),
                    microbatch=done.microbatch,
                    transfer=hop,
                    blocking=False,
                    key=output(at, done),
                )
            pending = []
    return builder.build()
