"""ZB-V as its authors' scheduler builds it: a greedy that places ops in time.

Qi et al. 2024 ("Pipeline parallelism with controllable memory", arXiv 2405.15362)
build ZB-V's order with a list scheduler that knows the op times F, B, W and the
hop time c (sail-sg/zero-bubble-pipeline-parallelism,
megatron/core/pipeline_parallel/zerobubble/scheduler/zbv.py, class PipelineGraph,
read at commit 39f2c186). With unequal times its order differs from the unit-time
greedy `pipeline.zbv` (kept as the schedule ``zbv_unit``). This module reproduces the
authors' construction step for step; the tests compare its orders with orders their
code printed for the same inputs. Nothing here simulates: the times only steer
which op a rank takes next.

Rank r holds stages r (chunk 0) and 2p-1-r (chunk 1). Ops are placed one at a time;
each gets an end time max(rank free + cost, upstream end + c + cost), where the
upstream is the same pass on the neighbouring stage (another rank only). A rank's
"bubble" adds the idle time before each op after its first chunk-0 forward.
Memory: a forward adds ``f_mem``, a backward ``b_mem`` (negative: it frees most of
the activations), a weight gradient ``w_mem`` (frees the rest); the cap is
``max_mem`` (the authors' default: 2p forwards).

The construction, in the authors' order:

1. Warm-up. Every rank takes one chunk-0 forward. Then, from the last rank down, a
   rank takes chunk-0 forwards on itself and every rank below it while they fit in
   memory (with room for its V's later forwards) and finish before the chunk-1
   forward from the rank above arrives, then its first chunk-1 forward. Then, rank
   by rank upwards, the ranks above keep taking forwards, alternating chunks round
   by round from the last rank down, until each rank has run as many forwards as the
   one below it and one more chunk-1 forward (while any are left).
2. Steady phase, 2m rounds. Each round every rank takes one backward and then one
   forward:
   - backward: chunk 0's (the V's way back) when chunk 1's is ahead and chunk 0's
     gradient from the rank above is ready (always on the last rank, or when
     chunk 1's are done), else chunk 1's; chunk-0 ranks go first from the top rank
     down, then chunk-1 ranks from the bottom up;
   - forward: chunk 0's when chunk 1's has caught up with it, else chunk 1's if its
     input from the rank above is placed (the last rank: always), else chunk 0's if
     its input from the rank below is placed; nothing when neither is ready;
   - before either, pending weight gradients (in the order their backwards ran) fill
     the wait for the input: while the input arrives no earlier than a W would end,
     run a W; then one more W if the wait exceeds the rank's bubble budget (the
     largest bubble of any rank, or of the approved run below, minus its own); a
     chunk-0 backward always takes that W, a chunk-1 backward only with ``fill_b``,
     a forward only with ``fill_f``; and W's run whenever memory needs the room.
3. Every rank then runs its pending W's.

The whole construction is tried with the four (fill_b, fill_f) choices; each
attempt is repeated with the previous attempt's per-rank bubbles as the approved
budget while that lowers the largest bubble; the attempt with the smallest largest
bubble wins (the first of equals).

One of the authors' details is kept as it is: where an op has no upstream on
another rank, the extra-W test reads the end time of the last node of their table
(rank p-1's last chunk-0 W, -1 until placed) in place of an upstream's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache

from .pipeline import Step

# the authors' memory approximations per micro-batch and chunk, in their units
# (bytes / (micro-batch size x sequence) of one layer): forward 34h + 5as, the weight
# gradient frees 32h, the backward the rest (the authors' runtime.py and tests)


def default_memory(hidden: int, heads: int, seq: int) -> tuple[float, float, float]:
    """(f_mem, b_mem, w_mem) as the authors approximate them."""
    f_mem = 34.0 * hidden + 5.0 * heads * seq
    w_mem = -32.0 * hidden
    return f_mem, -f_mem - w_mem, w_mem


@dataclass(frozen=True)
class ZbvTimes:
    """Per-chunk op times (any unit) and the hop between ranks, plus memory per op."""

    forward: float = 1.0
    backward: float = 1.0
    weight: float = 1.0
    hop: float = 0.0
    f_mem: float = 1.0
    b_mem: float = -1.0 + 1.0 / 34.0
    w_mem: float = -1.0 / 34.0


class ZbvUnschedulable(ValueError):
    """The authors' construction cannot place these sizes (it would assert)."""


_F, _B, _W = 0, 1, 2
_F0, _F1, _B0, _B1 = 0, 1, 2, 3  # slots: kind * 2 + chunk
_KIND = "FBW"


class _Attempt:
    """One run of the construction with fixed fill choices and an approved budget."""

    def __init__(self, p: int, m: int, t: ZbvTimes, fill_b: bool, fill_f: bool, approved):
        self.p, self.m, self.t = p, m, t
        self.cost = (t.forward, t.backward, t.weight)
        self.mem_of = (t.f_mem, t.b_mem, t.w_mem)
        self.max_mem = t.f_mem * p * 2
        self.fill_b, self.fill_f = fill_b, fill_f
        self.approved = approved if approved is not None else [-1.0] * p
        self.max_approved = max(self.approved)
        # per rank, counts by slot kind * 2 + chunk; end times by [slot][rank][micro-batch]
        # (-1: not placed)
        self.count = [[0] * 6 for _ in range(p)]
        self.end = [[[-1.0] * m for _ in range(p)] for _ in range(6)]
        self.free = [0.0] * p
        self.mem = [0.0] * p
        self.bubble = [0.0] * p
        self.worst = 0.0  # max(self.bubble): bubbles only grow
        self.pending: list[deque[tuple[int, int]]] = [deque() for _ in range(p)]
        self.orders: list[list[tuple[int, int, int]]] = [[] for _ in range(p)]

    # -- the authors' bookkeeping ----------------------------------------------------

    def upstream(self, kind: int, chunk: int, rank: int, mb: int):
        """The same pass on the neighbouring stage on another rank, as (slot, rank,
        micro-batch), or None."""
        if kind == _W:
            return None
        # forward chunk 0 and backward chunk 1 flow up the ranks; the others down
        up = (kind == _F) == (chunk == 0)
        other = rank - 1 if up else rank + 1
        if not 0 <= other < self.p:
            return None
        return (kind * 2 + chunk, other, mb)

    def end_of(self, node) -> float:
        """An upstream's end time, -1 if not placed; with no upstream, the authors'
        reading of their table's last node (rank p-1's last chunk-0 W)."""
        if node is None:
            return self.end[_W * 2][self.p - 1][self.m - 1]
        slot, rank, mb = node
        return self.end[slot][rank][mb]

    def budget(self, rank: int | None = None) -> float:
        worst = self.worst
        if rank is not None:
            worst = max(worst, self.max_approved - self.approved[rank])
        return worst

    def put(self, kind: int, chunk: int, rank: int) -> None:
        slot = kind * 2 + chunk
        mb = self.count[rank][slot]
        if mb >= self.m:
            raise ZbvUnschedulable(f"rank {rank} would run {_KIND[kind]} past the last micro-batch")
        if self.mem[rank] + self.mem_of[kind] > self.max_mem:
            raise ZbvUnschedulable(f"rank {rank} would exceed ZB-V's memory cap")
        earliest = self.free[rank] + self.cost[kind]
        done = earliest
        up = self.upstream(kind, chunk, rank, mb)
        if up is not None:
            arrives = self.end_of(up)
            if arrives < 0:
                raise ZbvUnschedulable(f"rank {rank}'s {_KIND[kind]} has no input placed")
            done = max(done, arrives + self.t.hop + self.cost[kind])
        if self.count[rank][_F0] > 0:
            self.bubble[rank] += done - earliest
            self.worst = max(self.worst, self.bubble[rank])
        self.end[slot][rank][mb] = done
        self.free[rank] = done
        self.mem[rank] += self.mem_of[kind]
        self.orders[rank].append((kind, mb, chunk))
        if kind == _B:
            self.pending[rank].append((chunk, mb))
        self.count[rank][slot] += 1

    def put_w(self, rank: int) -> None:
        if not self.pending[rank]:
            raise ZbvUnschedulable(f"rank {rank} needs room but has no weight gradient to run")
        chunk, _ = self.pending[rank].popleft()
        self.put(_W, chunk, rank)

    def fill(self, rank: int, up, extra: bool) -> None:
        """Weight gradients ahead of an op whose input comes from ``up``."""
        w = self.cost[_W]
        while up is not None and self.pending[rank]:
            if self.end_of(up) + self.t.hop < self.free[rank] + w:
                break
            self.put_w(rank)
        wait = self.end_of(up) + self.t.hop - self.free[rank]
        if self.pending[rank] and wait > self.budget(rank) - self.bubble[rank] and extra:
            self.put_w(rank)

    # -- the construction -------------------------------------------------------------

    def warm_up(self) -> None:
        p, m, c = self.p, self.m, self.count
        for r in range(p):
            self.put(_F, 0, r)
        for r in range(p - 1, -1, -1):
            if r < p - 1:
                arrives = self.end[_F1][r + 1][0] + self.t.hop
                while (
                    self.mem[r] + self.t.f_mem * (2 + 2 * r) <= self.max_mem
                    and self.free[r] + self.t.forward <= arrives
                    and c[r][_F0] < m
                ):
                    for j in range(r + 1):
                        self.put(_F, 0, j)
            self.put(_F, 1, r)
        chunk = 0
        for r in range(1, p):
            rounds = 0
            while c[r][_F0] + c[r][_F1] < c[r - 1][_F0] + c[r - 1][_F1] or (
                c[r][_F1] <= c[r - 1][_F1] < m
            ):
                rounds += 1
                if rounds > 4 * m + 4:
                    raise ZbvUnschedulable("the warm-up does not converge")
                for j in range(p - 1, r - 1, -1):
                    if c[j][_F0 + chunk] < m:
                        self.put(_F, chunk, j)
                chunk = 1 - chunk

    def backward_chunk(self, r: int) -> int:
        c = self.count[r]
        if c[_B0] >= c[_B1]:
            return 1
        if r == self.p - 1:
            return 0
        return 0 if self.end[_B0][r + 1][c[_B0]] >= 0 or c[_B1] >= self.m else 1

    def forward_chunk(self, r: int) -> int | None:
        c, m = self.count[r], self.m
        if c[_F1] >= c[_F0]:
            return 0
        if r == self.p - 1 or self.end[_F1][r + 1][c[_F1]] >= 0:
            return 1
        if c[_F0] < m and (r == 0 or self.end[_F0][r - 1][c[_F0]] >= 0):
            return 0
        return None

    def steady(self) -> None:
        p = self.p
        for _ in range(2 * self.m):
            for r in range(p):
                while self.mem[r] + self.t.b_mem > self.max_mem:
                    self.put_w(r)
            chunks = [self.backward_chunk(r) for r in range(p)]
            turn = [r for r in reversed(range(p)) if chunks[r] == 0]
            turn += [r for r in range(p) if chunks[r] == 1]
            for r in turn:
                chunk = chunks[r]
                up = self.upstream(_B, chunk, r, self.count[r][_B0 + chunk])
                self.fill(r, up, extra=chunk == 0 or self.fill_b)
                self.put(_B, chunk, r)
            for r in range(p):
                if self.count[r][_F1] >= self.m:
                    continue
                f_chunk = self.forward_chunk(r)
                if f_chunk is None:
                    continue
                while self.mem[r] + self.t.f_mem > self.max_mem:
                    self.put_w(r)
                up = self.upstream(_F, f_chunk, r, self.count[r][_F0 + f_chunk])
                self.fill(r, up, extra=self.fill_f)
                self.put(_F, f_chunk, r)
        for r in range(p):
            while self.pending[r]:
                self.put_w(r)

    def run(self) -> _Attempt:
        self.warm_up()
        self.steady()
        return self


def _attempt(p: int, m: int, t: ZbvTimes, fill_b: bool, fill_f: bool, approved=None) -> _Attempt:
    """One attempt, repeated with its own bubbles as the approved budget while that
    lowers the largest bubble (the authors' recursion)."""
    best = _Attempt(p, m, t, fill_b, fill_f, approved).run()
    while best.max_approved < 0 or best.budget() < best.max_approved:
        retry = _Attempt(p, m, t, fill_b, fill_f, list(best.bubble)).run()
        if not retry.budget() < best.budget():
            break
        best = retry
    return best


def zbv_timed(p: int, m: int, times: ZbvTimes | None = None) -> list[list[Step]]:
    """Each rank's ZB-V order as the authors' scheduler builds it for these times.
    ZbvUnschedulable (a ValueError) when their construction cannot place the sizes."""
    if p < 1 or m < 1:
        raise ValueError(f"ranks and micro-batches must be at least 1 (got {p}, {m})")
    return [list(order) for order in _zbv_timed(p, m, times or ZbvTimes())]


@lru_cache(maxsize=16)  # a run asks twice (the lowering and the memory model)
def _zbv_timed(p: int, m: int, t: ZbvTimes) -> tuple[tuple[Step, ...], ...]:
    best: _Attempt | None = None
    for fill_b in (True, False):
        for fill_f in (True, False):
            attempt = _attempt(p, m, t, fill_b, fill_f)
            if best is None or attempt.budget() < best.budget():
                best = attempt
    assert best is not None  # the loops above always run, so an attempt was kept
    return tuple(
        tuple(Step(_KIND[kind], mb, chunk) for kind, mb, chunk in order) for order in best.orders
    )
