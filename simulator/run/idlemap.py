"""Each idle stretch of a simulated iteration's timeline by cause: the pieces the
timeline picture and the trace draw (report/idle.py), adding up per cause to the run's
``idle_by_cause_s`` (run/bubble.py `idle_causes`).

The three runs the split compares (the pipeline's orders on abstract time at the stages'
mean pass times, the same at each stage's own, both with free communication, and the
simulated run) execute the same passes in the same order on each pipeline rank, so a
GPU's idle before its k-th pass can be set against the abstract runs' idle before theirs.
Counted from the iteration's start, with S and I what this GPU's earlier idle already gave
the schedule and the imbalance, a stretch of g seconds before pass k gives
``s = clip(A_k - S, 0, g)`` to the schedule (A_k: the mean-time run's idle up to pass k),
then ``i = clip(B_k - S - I, 0, g - s)`` to the imbalance (B_k: the own-time run's), and
the rest to communication. Cumulative rather than gap by gap, so that a GPU held up
early (a late input) and idling less later is not charged twice. Idle inside a pass (a
stretch that no new pass ends) is communication's; idle after the last pass is set
against the abstract runs' whole idle.

Gap by gap, these raw pieces need not add up to the split, which is taken over the means:
a slower stage idles less than the schedule's own bubble, so it cannot hold its share of
it, while the faster ones idle more, and the mean nets the two. The pieces are therefore
moved between causes, over every GPU at once: a cause with more raw seconds than the
split gives it gives up the same fraction of each of its pieces, and the seconds freed
go to the causes short of their share, in proportion to what each is short. Each
stretch keeps its length; the pieces' mean over GPUs (weighted by the GPUs each
simulated one stands for) then equals the split, per cause, to rounding. A
fast-forwarded run shows only the micro-batches it simulated: its pieces are split
against the orders of that shorter run (the metrics' split is the whole iteration's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import itemgetter

import numpy as np

from stepsim.schedules import Step, parse_label

from ..cost.orders import stage_orders
from ..ir.ops import Lane
from ..ir.results import IDLE_CAUSES, Result, Trace
from ..ir.vocabulary import CATEGORY_OF_KIND, COMPUTE_STREAM, IDLE_TIME
from ..report.idle import IdleMap, IdlePiece
from .bubble import (
    PASS_OF_KIND,
    FreeRun,
    clipped_causes,
    free_run,
    pass_plans,
    pass_times,
    rank_passes,
    rank_times_of,
)
from .fastforward import with_microbatches

WITHIN = -1  # a stretch of idle inside a pass
TINY_S = 1e-12  # shorter than this, a cause's share of a stretch joins its neighbour's


def idle_pieces(result: Result) -> IdleMap | None:
    """Each simulated GPU's idle pieces by cause (`split_idle`), or None where the run's
    idle is not split (no pipeline, `run(idle_split=False)`) or its spans were not kept.
    Their mean over GPUs is the metrics' ``idle_by_cause_s``; a fast-forwarded run's,
    that of the micro-batches it simulated (the shorter run's orders)."""
    scenario, metrics = result.scenario, result.metrics
    if metrics.idle_by_cause_s is None or not result.trace.spans:
        return None
    par, ff = scenario.parallel, metrics.fast_forward
    shown = scenario if ff is None else with_microbatches(scenario, ff.simulated_microbatches)
    return split_idle(
        result.trace,
        stage_orders(shown),
        pass_times(result.workload, par.pipeline_model_parallel_size, PASS_OF_KIND),
        num_chunks=par.virtual_pipeline_model_parallel_size,
        placement=scenario.training.placement,
        targets=None if ff is not None else [metrics.idle_by_cause_s[c] for c in IDLE_CAUSES],
    )


def split_idle(
    trace: Trace,
    orders: Sequence[Sequence[Step]],
    times: Sequence[tuple[float, float, float]],
    *,
    num_chunks: int,
    placement: str,
    targets: Sequence[float] | None = None,
) -> dict[int, list[IdlePiece]]:
    """Each GPU's idle pieces by cause (the module's rule) in a simulated run of the
    pipeline ``orders`` whose stages' pass times per micro-batch are ``times``
    (`pass_times`); their mean over GPUs is ``targets`` (schedule, imbalance and
    communication seconds; None: the split `idle_causes` gives the trace's own idle)."""
    equal, own = rank_times_of(times, num_chunks, placement)
    plans = pass_plans(orders, num_chunks=num_chunks, placement=placement)
    runs = tuple(
        free_run(orders, each, num_chunks=num_chunks, placement=placement, plans=plans)
        for each in (equal, own)
    )
    lanes = [lane for lane in trace.lanes if lane.stream == COMPUTE_STREAM]
    weights = [lane.stands_for * lane.copies for lane in lanes]
    stretches = _stretches(trace, lanes, [_pass_index(order) for order in orders])
    raw = [
        _raw_split(rows, lane.stage, len(runs[0].idle_before[lane.stage]), runs)
        for lane, rows in zip(lanes, stretches, strict=True)
    ]
    if targets is None:
        idle_s = math.fsum(
            w * (end - start)
            for w, rows in zip(weights, raw, strict=True)
            for start, end, _ in rows
        )
        causes = clipped_causes(runs[0].idle, runs[1].idle, idle_s / math.fsum(weights))
        targets = [causes.schedule_s, causes.imbalance_s, causes.communication_s]
    _rebalance(raw, weights, targets)
    out: dict[int, list[IdlePiece]] = {}
    for lane, rows in zip(lanes, raw, strict=True):
        pieces = _laid_out(rows)
        for k in range(lane.copies):
            out[lane.gpu + k] = pieces
    return out


def _pass_index(order) -> dict[tuple[str, int, int], int]:
    """(F/B/W, micro-batch, chunk) -> the index of its pass in the rank's `rank_passes`."""
    return {
        (step.kind, step.microbatch, step.chunk): k
        for k, steps in enumerate(rank_passes(order))
        for step in steps
    }


def _step_of(kind: str, microbatch: int, label: str) -> tuple[str, int, int] | None:
    """The (F/B/W, micro-batch, chunk) of the pass a compute span belongs to (by its kind,
    micro-batch and label's chunk), or None when the span is no pass's or its label
    names none."""
    letter = PASS_OF_KIND.get(kind)
    if letter is None:
        return None
    for part in label.split("&"):  # an overlapped pair's label: F3&B1
        try:
            step = parse_label(part.strip())
        except ValueError:
            continue
        if step.microbatch == microbatch and step.kind == letter:
            return (letter, step.microbatch, step.chunk)
    return None


NO_PASS = -2  # a busy span of no pass


def _stretches(
    trace: Trace, lanes: Sequence[Lane], index: Sequence[dict]
) -> list[list[tuple[float, float, int]]]:
    """Each lane's idle stretches, (start, end, context): what its GPU's compute stream's
    busy spans leave of the iteration, each with the index of the pass it precedes (in
    its stage's ``index``, `_pass_index`), the number of passes (after the last), or
    WITHIN (no new pass follows it). From arrays: the spans read into columns once,
    each distinct (kind, micro-batch, label) looked up once."""
    spans = trace.spans
    n = len(spans)
    kind_of = list(map(itemgetter(2), spans))
    kinds = list(dict.fromkeys(kind_of))
    kind = _codes(kind_of, kinds)
    compute = np.fromiter(map(COMPUTE_STREAM.__eq__, map(itemgetter(1), spans)), bool, n)
    busy = np.zeros(len(kinds), dtype=bool)  # of the kinds on compute streams, not idle
    for k in np.unique(kind[compute]).tolist():
        busy[k] = CATEGORY_OF_KIND[kinds[k]] != IDLE_TIME
    chosen = [spans[i] for i in np.nonzero(compute & busy[kind])[0].tolist()]
    m = len(chosen)
    gpu = np.fromiter(map(itemgetter(0), chosen), np.int64, m)
    start = np.fromiter(map(itemgetter(5), chosen), np.float64, m)
    end = np.fromiter(map(itemgetter(6), chosen), np.float64, m)
    keys = list(
        zip(
            map(itemgetter(2), chosen),
            map(itemgetter(4), chosen),
            map(itemgetter(3), chosen),
            strict=True,
        )
    )
    distinct = list(dict.fromkeys(keys))
    steps = [_step_of(*key) for key in distinct]  # stage-free: a stage's index then
    order = np.lexsort((start, gpu))  # by GPU, each in order of start (ties: trace order)
    gpu, start, end, code = gpu[order], start[order], end[order], _codes(keys, distinct)[order]
    gpus = [lane.gpu for lane in lanes]
    lows, highs = np.searchsorted(gpu, gpus, "left"), np.searchsorted(gpu, gpus, "right")
    out = []
    for lane, low, high in zip(lanes, lows.tolist(), highs.tolist(), strict=True):
        passes = index[lane.stage]
        pass_of = np.array(
            [NO_PASS if step is None else passes.get(step, NO_PASS) for step in steps],
            dtype=np.int64,
        )
        after = max(passes.values(), default=-1) + 1
        at = slice(low, high)
        out.append(_lane_stretches(start[at], end[at], pass_of[code[at]], after, trace.end_s))
    return out


def _codes(values: list, distinct: list) -> np.ndarray:
    """Each value's position in ``distinct`` (which holds them all)."""
    position = dict(zip(distinct, range(len(distinct)), strict=True))
    return np.fromiter(map(position.__getitem__, values), np.int64, len(values))


def _lane_stretches(
    start: np.ndarray, end: np.ndarray, passes: np.ndarray, after: int, end_s: float
) -> list[tuple[float, float, int]]:
    """One GPU's idle stretches (`_stretches`) from its busy spans in order of start and
    each one's pass (NO_PASS: none): a stretch lies before each span that starts after
    every earlier one ended (the cursor), and takes its context from the first span of a
    pass at or after it: that pass if it is later than every earlier span's pass,
    WITHIN if not; with none, ``after``, as the stretch after the last span."""
    cursor = np.maximum.accumulate(np.concatenate([[0.0], end]))  # before each span, then
    before = np.nonzero(start > cursor[:-1])[0]  # the spans an idle stretch precedes
    found = np.nonzero(passes != NO_PASS)[0]
    k = passes[found]
    started = np.maximum.accumulate(np.concatenate([[-1], k]))[:-1]
    context = np.concatenate([np.where(k > started, k, WITHIN), [after]])
    contexts = context[np.searchsorted(found, before)]
    out = list(zip(cursor[before].tolist(), start[before].tolist(), contexts.tolist(), strict=True))
    if end_s > cursor[-1]:
        out.append((float(cursor[-1]), end_s, after))
    return out


def _raw_split(
    stretches: list[tuple[float, float, int]], rank: int, passes: int, runs: Sequence[FreeRun]
) -> list[tuple[float, float, list[float]]]:
    """Each stretch with its seconds of schedule, imbalance and communication by the
    cumulative rule (the module's docstring)."""
    mean, own = runs
    assigned = [0.0, 0.0]  # schedule, imbalance so far
    out = []
    for start, end, context in stretches:
        length = end - start
        schedule = imbalance = 0.0
        if context != WITHIN:
            last = context >= passes
            up_to_mean = mean.idle[rank] if last else mean.idle_before[rank][context]
            up_to_own = own.idle[rank] if last else own.idle_before[rank][context]
            schedule = min(max(up_to_mean - assigned[0], 0.0), length)
            imbalance = min(max(up_to_own - assigned[0] - assigned[1], 0.0), length - schedule)
        assigned[0] += schedule
        assigned[1] += imbalance
        out.append((start, end, [schedule, imbalance, max(length - schedule - imbalance, 0.0)]))
    return out


def _rebalance(
    raw: list[list[tuple[float, float, list[float]]]],
    weights: Sequence[float],
    targets: Sequence[float],
) -> None:
    """Move seconds between the causes of the stretches (in place) so that each cause's
    mean over GPUs (``weights``: the GPUs each row stands for) becomes its target. A
    cause over its target gives its excess to the causes short of theirs, split in
    proportion to what each is short; each such move takes the same fraction of the
    giving cause's seconds in every stretch where the receiving cause already is, and
    only when those fall short, a fraction of the rest as well: a cause grows where it
    already lies rather than as slivers in every stretch."""
    total = math.fsum(weights)

    def mean(cause: int, where=lambda row: True) -> float:
        found = (
            w * row[cause]
            for w, rows in zip(weights, raw, strict=True)
            for _, _, row in rows
            if where(row)
        )
        return math.fsum(found) / total

    means = [mean(k) for k in range(3)]
    short = [max(t - m, 0.0) for m, t in zip(means, targets, strict=True)]
    wanted = math.fsum(short)
    if wanted <= 0:
        return
    for giver in range(3):
        excess = means[giver] - targets[giver]
        if excess <= 0:
            continue
        for taker in range(3):
            if short[taker] <= 0:
                continue
            amount = excess * short[taker] / wanted
            beside = mean(giver, lambda row, t=taker: row[t] > 0)  # where the taker lies
            rest = mean(giver, lambda row, t=taker: row[t] <= 0)
            near = min(amount / beside, 1.0) if beside > 0 else 0.0
            far = min((amount - beside) / rest, 1.0) if amount > beside and rest > 0 else 0.0
            for rows in raw:
                for _, _, row in rows:
                    taken = row[giver] * (near if row[taker] > 0 else far)
                    row[giver] -= taken
                    row[taker] += taken


def _laid_out(rows: list[tuple[float, float, list[float]]]) -> list[IdlePiece]:
    """Each stretch cut into its causes' pieces, in IDLE_CAUSES order (the schedule's
    first); pieces of no length are left out."""
    pieces = []
    for start, end, seconds in rows:
        # a cause's rounding remainder (under a picosecond) is no piece of its own
        causes = [y for y in range(3) if seconds[y] > TINY_S] or [seconds.index(max(seconds))]
        at = start
        for y in causes:  # the last one ends the stretch, whatever the rounding left
            stop = end if y == causes[-1] else min(at + seconds[y], end)
            if stop > at:
                pieces.append(IdlePiece(at, stop, IDLE_CAUSES[y]))
                at = stop
    return pieces
