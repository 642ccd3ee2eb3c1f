"""Pipeline schedules as per-rank op orders; no simulation here.

A schedule turns (ranks p, micro-batches m, chunks per rank v) into, for each
rank, the list of `Step`s it runs strictly in order: ``F`` a forward pass of
one micro-batch through one chunk, ``B`` its backward pass (input gradient
only when the schedule splits the backward, otherwise the whole backward),
``W`` the weight gradient of a split backward. Chunk k of rank r is pipeline
stage k*p + r ("looped" placement), except for ZB-V and DualPipeV, where rank r
holds stages r and 2p-1-r ("v" placement), and DualPipe, where rank r holds stage r
of one copy of the model and stage p-1-r of a second copy ("dual" placement:
numbered as the V, but stages 0..p-1 and p..2p-1 are two pipelines).

A step may run overlapped with the step just before it on its rank (``F&B``:
the forward of one micro-batch and the backward of another, DualPipe's
overlapped pair): its ``overlapped`` is True (`overlapped(step)` marks it). A
marked step equals and hashes as the plain one, so lookups by (kind,
micro-batch, chunk) are unchanged; labels join a pair as ``F3.0&B1.1``. Under a
schedule that splits the backward, a B whose W never comes is a full backward
(input and weight gradients at once), as DualPipe runs some of them.

Every schedule below documents its rule, its bubble with uniform stages and
free communication (F, B, W per micro-batch and rank), and its peak number of
micro-batch activations in flight per rank.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

# Where a rank's chunks sit (stage_of): chunk k of rank r is virtual stage k*p + r
# (LOOPED), or, with two chunks, rank r holds stages r and 2p-1-r (V_SHAPE, ZB-V's),
# or the same numbering split into two pipelines of p stages, 0..p-1 entered at rank 0
# and p..2p-1 entered at rank p-1 (DUAL, DualPipe's two copies of the model).
LOOPED, V_SHAPE, DUAL = "looped", "v", "dual"
PLACEMENTS: tuple[str, ...] = (LOOPED, V_SHAPE, DUAL)
# the schedules other code names (the default one, and Megatron's interleaving)
ONE_F_ONE_B, INTERLEAVED = "1f1b", "interleaved"


class Step(NamedTuple):
    kind: str  # "F", "B" or "W"
    microbatch: int
    chunk: int = 0

    @property
    def overlapped(self) -> bool:
        """Whether this step runs overlapped with the one before it (see `overlapped`)."""
        return False


class _Overlapped(Step):
    """A step that runs overlapped with the step before it on its rank: the B of an
    F&B pair. Equal to (and hashed as) the plain step."""

    __slots__ = ()

    @property
    def overlapped(self) -> bool:
        return True


def overlapped(step: Step) -> Step:
    """``step`` marked to run overlapped with the step just before it in its rank's
    order (the pair's forward): the two make one F&B."""
    return _Overlapped(*step)


def step_label(step: Step, num_chunks: int = 1) -> str:
    """The reference label format: ``F3``, or ``F3.1`` for chunk 1 when chunks > 1."""
    base = f"{step.kind}{step.microbatch}"
    return f"{base}.{step.chunk}" if num_chunks > 1 else base


def order_labels(order: Sequence[Step], num_chunks: int = 1) -> list[str]:
    """A rank's order as labels, an overlapped pair as one ``F3.0&B1.1``."""
    labels: list[str] = []
    for step in order:
        label = step_label(step, num_chunks)
        if step.overlapped and labels:
            labels[-1] += "&" + label
        else:
            labels.append(label)
    return labels


def parse_label(label: str) -> Step:
    """``F3`` or ``B3.1`` back to a Step; ValueError if it is not one."""
    kind, body = label[:1], label[1:]
    mb, _, chunk = body.partition(".")
    if kind not in ("F", "B", "W") or not mb.isdigit() or (chunk and not chunk.isdigit()):
        raise ValueError(f"{label!r} is not an op label like F3, B3, W3, F3.1 or F3&B1")
    return Step(kind, int(mb), int(chunk) if chunk else 0)


def parse_labels(label: str) -> list[Step]:
    """One label, or an overlapped pair ``F3&B1`` (the second step marked), as steps."""
    first, sep, second = label.partition("&")
    if not sep:
        return [parse_label(label)]
    return [parse_label(first), overlapped(parse_label(second))]


def peak_inflight(order: Sequence[Step], release_at: str = "W") -> int:
    """Most chunk activations held at once: +1 at F, -1 at B (``release_at="B"``) or
    at W, or at a full B, one whose W the order does not hold (``release_at="W"``)."""
    weights = {(s.microbatch, s.chunk) for s in order if s.kind == "W"}
    alive = peak = 0
    for step in order:
        if step.kind == "F":
            alive += 1
            peak = max(peak, alive)
        elif step.kind == ("W" if release_at == "W" else "B") or (
            step.kind == "B" and (step.microbatch, step.chunk) not in weights
        ):
            alive -= 1
    return peak


# -- building blocks --------------------------------------------------------------------


def _one_f_one_b(forwards: list[Step], backwards: list[Step], warmup: int) -> list[Step]:
    """Warm-up forwards, then one forward and one backward in turn, then the rest."""
    warmup = min(warmup, len(forwards))
    order = forwards[:warmup]
    rest = forwards[warmup:]
    for i, backward in enumerate(backwards):
        if i < len(rest):
            order.append(rest[i])
        order.append(backward)
    return order


def _zero_bubble(
    forwards: list[Step], backwards: list[Step], warmup: int, delay: int
) -> list[Step]:
    """Warm-up forwards, then per backward: B, the W held back ``delay`` backwards,
    and the next forward; the remaining W's at the end."""
    warmup = min(warmup, len(forwards))
    order = forwards[:warmup]
    weights = [Step("W", b.microbatch, b.chunk) for b in backwards]
    for j, backward in enumerate(backwards):
        order.append(backward)
        if j >= delay:
            order.append(weights[j - delay])
        if warmup + j < len(forwards):
            order.append(forwards[warmup + j])
    order += weights[max(len(backwards) - delay, 0) :]
    return order


def _plain(m: int) -> tuple[list[Step], list[Step]]:
    return [Step("F", i) for i in range(m)], [Step("B", i) for i in range(m)]


def _virtual(m: int, v: int, group: int, kind: str) -> list[Step]:
    """Megatron's order of (micro-batch, chunk) pairs: groups of ``group`` micro-batches
    go through chunk 0, then chunk 1, ...; backward passes take the chunks last first."""
    steps = []
    for k in range(m * v):
        chunk = (k // group) % v
        if kind == "B":
            chunk = v - 1 - chunk
        steps.append(Step(kind, (k // (group * v)) * group + k % group, chunk))
    return steps


# -- the schedules ----------------------------------------------------------------------


def gpipe(p: int, m: int, v: int = 1, group_size: int | None = None) -> list[list[Step]]:
    """All forwards, then all backwards (Huang et al. 2019).

    Makespan (m + p - 1)(F + B); bubble (p - 1)/m of the ideal; m activations in flight.
    """
    forwards, backwards = _plain(m)
    return [forwards + backwards for _ in range(p)]


def one_f_one_b(p: int, m: int, v: int = 1, group_size: int | None = None) -> list[list[Step]]:
    """Megatron-LM's non-interleaved 1F1B (PipeDream-Flush, Narayanan et al. 2021).

    Rank r warms up with min(p - r - 1, m) forwards, then alternates one forward and one
    backward, then drains. Same makespan as GPipe, (m + p - 1)(F + B), with at most
    min(p - r, m) activations in flight.
    """
    forwards, backwards = _plain(m)
    return [_one_f_one_b(forwards, backwards, p - r - 1) for r in range(p)]


def interleaved(p: int, m: int, v: int = 2, group_size: int | None = None) -> list[list[Step]]:
    """Megatron-LM's interleaved 1F1B (virtual pipeline, Narayanan et al. 2021).

    Micro-batches go in groups of g (default p) through chunk 0, then chunk 1, ...
    Rank r warms up with (p - r - 1) * 2 + (v - 1) * g forwards (all of them when
    m == p), then 1F1B. Megatron requires m to be a multiple of g. Makespan
    m(F + B) + (p - 1)(F + B)/v: the bubble shrinks v-fold; rank 0 holds up to
    (p - 1) * 2 + (v - 1) * g + 1 chunk activations.
    """
    group = group_size or p
    forwards, backwards = _virtual(m, v, group, "F"), _virtual(m, v, group, "B")
    return [
        _one_f_one_b(forwards, backwards, interleaved_warmup(p, r, m, v, group)) for r in range(p)
    ]


def interleaved_warmup(p: int, rank: int, m: int, v: int, group: int) -> int:
    """Forward passes rank ``rank`` runs before its first backward under Megatron's
    interleaving (megatron/schedules.py `forward_backward_pipelining_with_interleaving`,
    v2.5): all m*v when m == p, else (p - rank - 1) * 2 + (v - 1) * group, at most m*v."""
    if m == p:
        return m * v
    return min((p - rank - 1) * 2 + (v - 1) * group, m * v)


def looped_bfs(p: int, m: int, v: int = 2, group_size: int | None = None) -> list[list[Step]]:
    """Breadth-first looping (Lamy-Poirier 2023): every micro-batch through chunk 0,
    then chunk 1, ...; backwards in reverse. GPipe over p*v stages folded onto p ranks:
    all m*v chunk activations in flight."""
    forwards = [Step("F", i, k) for k in range(v) for i in range(m)]
    backwards = [Step("B", i, k) for k in reversed(range(v)) for i in reversed(range(m))]
    return [forwards + backwards for _ in range(p)]


def zbh1(p: int, m: int, v: int = 1, group_size: int | None = None) -> list[list[Step]]:
    """ZB-H1 (Qi et al. 2023, zero bubble): backward split into B (input gradient) and
    W (weight gradient). Rank r warms up with p - r forwards; then B, the W of r
    backwards earlier, the next F. Makespan about m(F + B + W) + (p - 1)(F + B - W);
    activations held until W: p per rank (1F1B's peak of rank 0)."""
    forwards, backwards = _plain(m)
    return [_zero_bubble(forwards, backwards, p - r, r) for r in range(p)]


def zbh2(p: int, m: int, v: int = 1, group_size: int | None = None) -> list[list[Step]]:
    """ZB-H2: as ZB-H1 with 2p - 1 - 2r warm-up forwards and W held back 2r backwards,
    filling the bubble when F = B = W (makespan m(F + B + W) + (p - 1)(F + B - 2W) at
    best); 2p - 1 activations held until W."""
    forwards, backwards = _plain(m)
    return [_zero_bubble(forwards, backwards, 2 * p - 1 - 2 * r, 2 * r) for r in range(p)]


def interleaved_zb(p: int, m: int, v: int = 2, group_size: int | None = None) -> list[list[Step]]:
    """Interleaved zero bubble: Megatron's interleaved order of (micro-batch, chunk) with
    the backward split as in ZB-H1: rank r warms up with (v - 1) * g + p - r forwards,
    then B, the W of r backwards earlier, the next F."""
    group = group_size or p
    forwards, backwards = _virtual(m, v, group, "F"), _virtual(m, v, group, "B")
    return [_zero_bubble(forwards, backwards, (v - 1) * group + p - r, r) for r in range(p)]


def zbv_unit(p: int, m: int, v: int = 2, group_size: int | None = None) -> list[list[Step]]:
    """ZB-V in unit time (schedule ``zbv_unit``; ``zbv`` is the authors' timed greedy,
    schedules/zbv_timed.py). Qi et al. 2024, "Pipeline parallelism with controllable
    memory": two chunks
    per rank in a V, rank r holding stages r and 2p - 1 - r, so the first and last
    stage share rank 0; backward split into B and W.

    The order is that of a greedy list scheduler run in unit time steps (every op one
    step, hops free), where "in flight" counts chunk forwards whose W has not run and
    the cap is 2p. A free rank takes, among the ops whose input is ready:
      1. at the cap, a W, else a B (else it waits);
      2. while it still has forwards to run, right after a B, that B's W (the
         "F B W" steady state);
      3. a forward, chunk 1 first, then the lowest micro-batch;
      4. a B, lowest micro-batch first, chunk 1 on a tie;
      5. once all its forwards ran, after a B with no B ready, one W;
      6. once all its B's ran, the remaining W's, chunk 1 first, in micro-batch order.
    Warm-up: rank r runs 2(p - r) - 1 chunk-0 forwards, then alternates chunks up to
    the cap. With F = B = W and no latency the makespan is m(F + B + W) + (p - 1)F/2
    for m >= 2p - 1; min(2p, 2m) chunk activations in flight (1F1B's peak of rank 0,
    in half-size chunks).
    """
    last_stage = 2 * p - 1
    orders: list[list[Step]] = [[] for _ in range(p)]
    finished: dict[tuple[int, Step], int] = {}  # (rank, step) -> end time step
    next_mb = [{(kind, k): 0 for kind in "FB" for k in (0, 1)} for _ in range(p)]
    # B run, W not yet: per rank and chunk, in micro-batch order (a chunk's B's run in
    # it), so the W's ready at any time are a prefix and each chunk's first is all
    # a choice needs (the scheduler stays linear in the ops; a sorted list was p x ops)
    waiting_w: list[tuple[deque[Step], deque[Step]]] = [(deque(), deque()) for _ in range(p)]
    num_waiting = 0
    inflight = [0] * p
    forwards_left = [2 * m] * p
    backwards_left = [2 * m] * p

    def source(rank: int, step: Step) -> tuple[int, Step] | None:
        """The op (rank, step) that ``step`` on ``rank`` waits for."""
        if step.kind == "W":
            return rank, Step("B", step.microbatch, step.chunk)
        if step.kind == "B" and stage_of(rank, step.chunk, p, V_SHAPE) == last_stage:
            return rank, Step("F", step.microbatch, step.chunk)
        return upstream(rank, step, p, 2, V_SHAPE)

    def ready(rank: int, step: Step, now: int) -> bool:
        dep = source(rank, step)
        return dep is None or finished.get(dep, now + 1) <= now

    def by_microbatch(step: Step) -> tuple[int, int]:
        return step.microbatch, -step.chunk

    # each rank's next F and B of each chunk with the op it waits for, found once per
    # micro-batch (a waiting rank asks again every step)
    next_step: dict[tuple[int, str, int], tuple[Step, tuple[int, Step] | None]] = {}
    busy_until = [0] * p
    now, stalled = 0, 0
    while any(forwards_left) or any(backwards_left) or num_waiting:
        progressed = False
        for r in range(p):
            if busy_until[r] > now:
                continue  # still busy
            candidates: dict[str, list[Step]] = {"F": [], "B": []}
            for kind in "FB":
                for k in (1, 0):
                    mb = next_mb[r][(kind, k)]
                    if mb >= m:
                        continue
                    known = next_step.get((r, kind, k))
                    if known is None or known[0].microbatch != mb:
                        step = Step(kind, mb, k)
                        known = next_step[(r, kind, k)] = (step, source(r, step))
                    step, dep = known
                    if dep is None or finished.get(dep, now + 1) <= now:
                        candidates[kind].append(step)
            firsts = [chunk[0] for chunk in waiting_w[r] if chunk]
            if not (candidates["F"] or candidates["B"] or firsts):
                continue  # nothing to run yet (every choice below would be None)
            forwards, backwards = candidates["F"], sorted(candidates["B"], key=by_microbatch)
            weights = sorted((w for w in firsts if ready(r, w, now)), key=by_microbatch)
            after_b = bool(orders[r]) and orders[r][-1].kind == "B"
            if inflight[r] >= 2 * p:
                choice = next(iter(weights or backwards), None)
            elif after_b and forwards_left[r] and weights:
                choice = weights[0]
            elif forwards or backwards:
                choice = (forwards or backwards)[0]
            elif weights and not backwards_left[r] and not after_b:
                choice = min(weights, key=lambda w: (-w.chunk, w.microbatch))
            elif weights and after_b:
                choice = weights[0]
            else:
                choice = None
            if choice is None:
                continue
            progressed = True
            orders[r].append(choice)
            finished[(r, choice)] = busy_until[r] = now + 1
            if choice.kind == "W":
                waiting_w[r][choice.chunk].popleft()  # the first of its chunk's
                num_waiting -= 1
                inflight[r] -= 1
                continue
            next_mb[r][(choice.kind, choice.chunk)] += 1
            if choice.kind == "F":
                forwards_left[r] -= 1
                inflight[r] += 1
            else:
                backwards_left[r] -= 1
                waiting_w[r][choice.chunk].append(Step("W", choice.microbatch, choice.chunk))
                num_waiting += 1
        stalled = 0 if progressed else stalled + 1
        if stalled > 2:
            raise RuntimeError(f"zbv list scheduler stalled at step {now} (p={p}, m={m})")
        now += 1
    return orders


def upstream(
    rank: int, step: Step, num_ranks: int, num_chunks: int, placement: str = LOOPED
) -> tuple[int, Step] | None:
    """The op on a neighbouring stage that ``step`` needs, as (rank, step): a forward
    waits for the forward on the stage before, a backward for the backward on the
    stage after. None for W and at the pipeline's ends."""
    if step.kind == "W":
        return None
    stage = stage_of(rank, step.chunk, num_ranks, placement)
    first, last = pipeline_ends(stage, num_ranks, num_chunks, placement)
    if (step.kind == "F" and first) or (step.kind == "B" and last):
        return None
    other = stage - 1 if step.kind == "F" else stage + 1
    other_rank, other_chunk = holder_of(other, num_ranks, placement)
    return other_rank, Step(step.kind, step.microbatch, other_chunk)


def pipeline_ends(
    stage: int, num_ranks: int, num_chunks: int, placement: str = LOOPED
) -> tuple[bool, bool]:
    """Whether a virtual stage is the first (embedding) and the last (loss) of its
    pipeline: of the one chain of p v stages, or under DUAL of its copy's p."""
    length = num_ranks if placement == DUAL else num_ranks * num_chunks
    return stage % length == 0, stage % length == length - 1


def holder_of(stage: int, num_ranks: int, placement: str = LOOPED) -> tuple[int, int]:
    """(rank, chunk) holding a virtual stage: the inverse of `stage_of`."""
    if placement in (V_SHAPE, DUAL):
        return (stage, 0) if stage < num_ranks else (2 * num_ranks - 1 - stage, 1)
    return stage % num_ranks, stage // num_ranks


def stage_of(rank: int, chunk: int, num_ranks: int, placement: str = LOOPED) -> int:
    """The pipeline stage that chunk ``chunk`` of rank ``rank`` holds."""
    if placement in (V_SHAPE, DUAL):
        return rank if chunk == 0 else 2 * num_ranks - 1 - rank
    return chunk * num_ranks + rank
