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
from itertools import compress
from operator import getitem, itemgetter
from typing import NamedTuple

import numpy as np

from stepsim.schedules import Step, parse_label

from ..cost.orders import stage_orders
from ..ir.ops import Lane
from ..ir.results import IDLE_CAUSES, Result, Trace
from ..ir.vocabulary import CATEGORY_OF_KIND, COMPUTE_STREAM, IDLE_TIME
from ..report.idle import IdleMap, IdlePiece
from .bubble import PASS_OF_KIND, FreeRun, abstract_runs, clipped_causes, pass_times
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
    plans, *runs = abstract_runs(orders, times, num_chunks=num_chunks, placement=placement)
    lanes = [lane for lane in trace.lanes if lane.stream == COMPUTE_STREAM]
    weights = [lane.stands_for * lane.copies for lane in lanes]
    stretches = _stretches(trace, lanes, _PassIndex.of(plans.passes))
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


class _PassIndex(NamedTuple):
    """Each rank's passes (`rank_passes`) by their steps: ``keys[rank]`` the rank's
    steps numbered ((kind * microbatches + micro-batch) * chunks + chunk, the kinds F, B,
    W as 0, 1, 2), sorted, ``passes[rank]`` the index of the pass that runs each, and
    ``numbers[rank]`` the number of the rank's passes."""

    keys: list[np.ndarray]
    passes: list[np.ndarray]
    numbers: list[int]
    microbatches: int  # steps' micro-batches and chunks lie below these
    chunks: int

    @classmethod
    def of(cls, passes: Sequence[Sequence[tuple[Step, ...]]]) -> _PassIndex:
        steps = [step for each in passes for run in each for step in run]
        microbatches = 1 + max((step.microbatch for step in steps), default=0)
        chunks = 1 + max((step.chunk for step in steps), default=0)
        keys, indices = [], []
        for each in passes:
            found = {  # a step named twice: its last pass, as in a dict
                (LETTERS.index(step.kind) * microbatches + step.microbatch) * chunks + step.chunk: k
                for k, run in enumerate(each)
                for step in run
            }
            numbered = np.fromiter(found, np.int64, len(found))
            order = np.argsort(numbered)
            keys.append(numbered[order])
            indices.append(np.fromiter(found.values(), np.int64, len(found))[order])
        return cls(keys, indices, [len(each) for each in passes], microbatches, chunks)

    def of_steps(
        self, rank: int, letter: np.ndarray, microbatch: np.ndarray, chunk: np.ndarray
    ) -> np.ndarray:
        """The index of the pass of ``rank`` that runs each step (F/B/W as 0/1/2, -1:
        none), NO_PASS where none does."""
        out = np.full(len(letter), NO_PASS, dtype=np.int64)
        known = (letter >= 0) & (microbatch >= 0) & (microbatch < self.microbatches)
        known &= chunk < self.chunks
        wanted = (letter[known] * self.microbatches + microbatch[known]) * self.chunks
        wanted += chunk[known]
        keys = self.keys[rank]
        at = np.minimum(np.searchsorted(keys, wanted), max(len(keys) - 1, 0))
        hit = keys[at] == wanted if len(keys) else np.zeros(len(wanted), dtype=bool)
        where = np.nonzero(known)[0]
        out[where[hit]] = self.passes[rank][at[hit]]
        return out


LETTERS = ("F", "B", "W")  # a pass table's kinds, in order
NO_PASS = -2  # a busy span of no pass


def _stretches(
    trace: Trace, lanes: Sequence[Lane], index: _PassIndex
) -> list[list[tuple[float, float, int]]]:
    """Each lane's idle stretches, (start, end, context): what its GPU's compute stream's
    busy spans leave of the iteration, each with the index of the pass it precedes (in
    its stage's ``index``), the number of passes (after the last), or WITHIN (no new
    pass follows it). From arrays: the spans read into columns once, the busy compute
    spans' times and the pass spans' micro-batches and labels alone, each distinct kind
    and label looked up once."""
    spans = trace.spans
    n = len(spans)
    # each span's class by its stream and kind: BUSY_STEP for a busy compute span of
    # no pass, the pass's kind (F/B/W as 0/1/2) for one of a pass, IDLE_SPAN for the rest
    stream_of = list(map(itemgetter(1), spans))
    kind_of = list(map(itemgetter(2), spans))
    kinds = list(dict.fromkeys(kind_of))
    row_of = {
        stream: {kind: _class_of(kind) for kind in kinds}
        if stream == COMPUTE_STREAM
        else dict.fromkeys(kinds, IDLE_SPAN)
        for stream in dict.fromkeys(stream_of)
    }
    classes = np.fromiter(map(getitem, map(row_of.__getitem__, stream_of), kind_of), np.int64, n)
    if np.any(classes == UNKNOWN_KIND):  # a compute span of a kind with no category
        CATEGORY_OF_KIND[kind_of[int(np.argmax(classes == UNKNOWN_KIND))]]
    chosen = list(compress(spans, (classes >= 0).tolist()))
    m = len(chosen)
    letter = classes[classes >= 0]
    letter[letter == BUSY_STEP] = -1
    # each busy compute span's lane (the first of its GPU's; len(lanes): none), times
    # and step
    gpu = np.fromiter(map(itemgetter(0), chosen), np.int64, m)
    gpus = [each.gpu for each in lanes]
    most = max(max(gpus, default=0), int(gpu.max(initial=0)))
    lane_of = np.full(most + 1, len(lanes), dtype=np.int64)
    lane_of[gpus[::-1]] = np.arange(len(lanes) - 1, -1, -1)
    lane = lane_of[gpu]
    start = np.fromiter(map(itemgetter(5), chosen), np.float64, m)
    end = np.fromiter(map(itemgetter(6), chosen), np.float64, m)
    # the step (F/B/W as 0/1/2, -1: none; micro-batch; chunk): its kind's pass, its
    # micro-batch, and the chunk of the first step of its label of that pass and batch
    microbatch = np.full(m, -1, dtype=np.int64)
    chunk = np.zeros(m, dtype=np.int64)
    passing = np.nonzero(letter >= 0)[0]
    if len(passing):
        ran = list(compress(chosen, (letter >= 0).tolist()))
        mb = np.fromiter(map(itemgetter(4), ran), np.int64, len(ran))
        label_of = list(map(itemgetter(3), ran))
        labels = list(dict.fromkeys(label_of))
        found, part_chunk = _parts_matched(labels, _codes(label_of, labels), letter[passing], mb)
        letter[passing[~found]] = -1
        microbatch[passing] = mb
        chunk[passing] = part_chunk
    order = _by_lane_then_start(lane, start, len(lanes))
    lane, start, end = lane[order], start[order], end[order]
    letter, microbatch, chunk = letter[order], microbatch[order], chunk[order]
    bounds = np.searchsorted(lane, np.arange(len(lanes) + 1), "left").tolist()
    out = []
    for each, first in zip(lanes, lane_of[gpus].tolist(), strict=True):
        rows = slice(bounds[first], bounds[first + 1])
        passes = index.of_steps(each.stage, letter[rows], microbatch[rows], chunk[rows])
        after = index.numbers[each.stage]
        out.append(_lane_stretches(start[rows], end[rows], passes, after, trace.end_s))
    return out


IDLE_SPAN, BUSY_STEP, UNKNOWN_KIND = -1, 3, -2  # `_stretches`' classes of spans


def _class_of(kind: str) -> int:
    """A compute span's class by its kind (`_stretches`): the pass it belongs to
    (LETTERS' index), BUSY_STEP for a busy span of no pass, IDLE_SPAN for idle, and
    UNKNOWN_KIND for a kind with no category."""
    category = CATEGORY_OF_KIND.get(kind)
    if category is None:
        return UNKNOWN_KIND
    if category == IDLE_TIME:
        return IDLE_SPAN
    letter = PASS_OF_KIND.get(kind)
    return BUSY_STEP if letter is None else LETTERS.index(letter)


def _parts_matched(
    labels: list[str], label: np.ndarray, letter: np.ndarray, microbatch: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For spans of a pass kind (``letter``) with their micro-batch and label (codes in
    ``labels``): whether a step of the label (an overlapped pair's: F3&B1) is of the
    span's kind and micro-batch, the first such one's chunk (0 where none is)."""
    parts = [_label_steps(text) for text in labels]
    width = max(map(len, parts), default=0)
    kinds = np.full((len(labels), max(width, 1)), -1, dtype=np.int64)
    microbatches = np.full_like(kinds, -1)
    chunks = np.zeros_like(kinds)
    for row, steps in enumerate(parts):
        for col, step in enumerate(steps):
            # a micro-batch beyond any span's matches none
            if step is not None and step.microbatch < 2**63:
                kinds[row, col] = LETTERS.index(step.kind)
                microbatches[row, col] = step.microbatch
                chunks[row, col] = min(step.chunk, 2**63 - 1)  # beyond, no pass's
    found = np.zeros(len(label), dtype=bool)
    chunk = np.zeros(len(label), dtype=np.int64)
    for col in range(width):  # the first part that matches
        match = ~found & (kinds[label, col] == letter) & (microbatches[label, col] == microbatch)
        chunk[match] = chunks[label[match], col]
        found |= match
    return found, chunk


def _label_steps(label: str) -> list[Step | None]:
    """The steps a compute span's label names, part by part (None: a part no step's)."""
    steps: list[Step | None] = []
    for part in label.split("&"):  # an overlapped pair's label: F3&B1
        try:
            steps.append(parse_label(part.strip()))
        except ValueError:
            steps.append(None)
    return steps


def _by_lane_then_start(lane: np.ndarray, start: np.ndarray, lanes: int) -> np.ndarray:
    """The order of spans by lane, each lane's by start, ties in trace order: a stable
    sort by lane alone where that leaves each lane's starts in order already (as the
    engine records them), a sort by both where not."""
    order = np.argsort(lane.astype(np.int16 if lanes < 2**15 else np.int64), kind="stable")
    g, s = lane[order], start[order]
    if np.any((g[1:] == g[:-1]) & (s[1:] < s[:-1])):
        return np.lexsort((start, lane))
    return order


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
    lists = [row for rows in raw for _, _, row in rows]
    seconds = np.array(lists, dtype=np.float64).reshape(len(lists), 3)
    per_row = np.repeat(np.asarray(weights, dtype=np.float64), [len(rows) for rows in raw])

    def mean(cause: int, where: np.ndarray | None = None) -> float:
        found = per_row * seconds[:, cause]
        return math.fsum((found if where is None else found[where]).tolist()) / total

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
            lies = seconds[:, taker] > 0  # where the taker lies
            beside = mean(giver, lies)
            rest = mean(giver, seconds[:, taker] <= 0)
            near = min(amount / beside, 1.0) if beside > 0 else 0.0
            far = min((amount - beside) / rest, 1.0) if amount > beside and rest > 0 else 0.0
            taken = seconds[:, giver] * np.where(lies, near, far)
            seconds[:, giver] -= taken
            seconds[:, taker] += taken
    for row, values in zip(lists, seconds.tolist(), strict=True):
        row[:] = values


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
