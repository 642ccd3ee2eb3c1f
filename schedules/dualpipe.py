"""DualPipe and DualPipeV (DeepSeek-V3 technical report, 2024; DualPipe's repository,
github.com/deepseek-ai/DualPipe, dualpipe/dualpipe.py and dualpipe/dualpipev.py).

Both run, on each rank, eight phases over two chunks ("phase 0" and "phase 1" in the
sources), whose steady phase pairs the forward of one chunk with the backward of the
other as one overlapped F&B (`pipeline.overlapped`). A backward is a full one (input
and weight gradients at once, a B with no W) unless the sources defer its weight
gradient to a later W ("zero bubble": phases 3, 7 and the second half of 6); a W runs
the oldest deferred one (the sources' first-in first-out WeightGradStore).

- DualPipeV ("cut-in-half", Sea AI Lab): V placement, rank r holding stages r
  (chunk 0) and 2p-1-r (chunk 1) of one model; all m micro-batches enter at rank 0.
- DualPipe: rank r holds stage r of one copy of the model (chunk 0) and stage p-1-r
  of a second copy (chunk 1): parameters twice, their gradients summed over the two
  copies (rank r's two chunks are the same layers' weights, as are its partner's, rank
  p-1-r); micro-batches 0..m/2-1 enter at rank 0 through chunk 0, m/2..m-1 at rank p-1
  through chunk 1. Rank r runs what DualPipeV's rank min(r, p-1-r) of p/2 ranks runs,
  its "phase 0" being the direction whose entry is nearer.

Bubble (the DualPipe README, per rank, F, B (full backward), W per chunk, F&B an
overlapped pair): (PP/2 - 1)(F&B + B - 3W), PP the stages; activations PP + 1 chunks.
"""

from __future__ import annotations

from .pipeline import Step, _one_f_one_b, overlapped


class _Rank:
    """One rank's order under construction: its chunks' next micro-batches and the
    weight gradients deferred so far (first in, first out)."""

    def __init__(self, firsts: tuple[int, int], direction: tuple[int, int]) -> None:
        self.order: list[Step] = []
        self.next_f = list(firsts)
        self.next_b = list(firsts)
        self.chunk = direction  # phase -> chunk
        self.deferred: list[Step] = []

    def forward(self, phase: int) -> Step:
        chunk = self.chunk[phase]
        step = Step("F", self.next_f[chunk], chunk)
        self.next_f[chunk] += 1
        self.order.append(step)
        return step

    def backward(self, phase: int, zero_bubble: bool = False, paired: bool = False) -> None:
        chunk = self.chunk[phase]
        step = Step("B", self.next_b[chunk], chunk)
        self.next_b[chunk] += 1
        self.order.append(overlapped(step) if paired else step)
        if zero_bubble:
            self.deferred.append(Step("W", step.microbatch, chunk))

    def forward_backward(self, forward_phase: int, backward_phase: int) -> None:
        self.forward(forward_phase)
        self.backward(backward_phase, paired=True)

    def weight(self) -> None:
        self.order.append(self.deferred.pop(0))


def _phases(rank: _Rank, ranks: int, index: int, per_chunk: int, middle: bool) -> list[Step]:
    """The eight phases of DualPipeV's rank ``index`` of ``ranks`` (DualPipe's half rank
    of its half ranks) with ``per_chunk`` micro-batches through each chunk; ``middle``:
    the rank whose first steady pair runs unoverlapped (the V's turn, DualPipe's middle)."""
    tail = ranks - index - 1
    for _ in range(2 * tail):  # 1: nF0
        rank.forward(0)
    for _ in range(index + 1):  # 2: nF0F1
        rank.forward(0)
        rank.forward(1)
    for _ in range(tail):  # 3: nB1W1F1, zero bubble
        rank.backward(1, zero_bubble=True)
        rank.weight()
        rank.forward(1)
    for i in range(per_chunk - 2 * ranks + index + 1):  # 4: nF0B1F1B0, the steady phase
        if i == 0 and middle:  # "we don't overlap these two chunks to further reduce bubble"
            rank.forward(0)
            rank.backward(1)
        else:
            rank.forward_backward(0, 1)
        rank.forward_backward(1, 0)
    for _ in range(tail):  # 5: nB1F1B0
        rank.backward(1)
        rank.forward_backward(1, 0)
    zero_bubble = False
    for i in range(index + 1):  # 6: nB1B0, the second half zero bubble
        if i == (index + 1) // 2 and index % 2 == 1:
            zero_bubble = True
        rank.backward(1, zero_bubble=zero_bubble)
        if i == (index + 1) // 2 and index % 2 == 0:
            zero_bubble = True
        rank.backward(0, zero_bubble=zero_bubble)
    for _ in range(tail):  # 7: nWB0, zero bubble
        rank.weight()
        rank.backward(0, zero_bubble=True)
    for _ in range(index + 1):  # 8: nW
        rank.weight()
    assert not rank.deferred
    return rank.order


def dualpipev(p: int, m: int, v: int = 2, group_size: int | None = None) -> list[list[Step]]:
    """DualPipeV: V placement (rank r holds stages r and 2p - 1 - r), micro-batches
    enter at rank 0. Rank r: 2(p - r - 1) chunk-0 forwards, r + 1 pairs F0 F1, p - r - 1
    of B1 W1 F1, then m - 2p + r + 1 steady F0&B1 F1&B0, then the drain (see `_phases`).
    The sources require m >= 2p. Bubble (p - 1)(F&B + B - 3W) per rank (2p stages), at
    most 2p + 1... chunk activations: see tests/test_dualpipe.py for the counts."""
    return [_phases(_Rank((0, 0), (0, 1)), p, r, m, middle=r == p - 1) for r in range(p)]


def dualpipe(p: int, m: int, v: int = 2, group_size: int | None = None) -> list[list[Step]]:
    """DualPipe: rank r holds stage r of copy 0 (chunk 0, micro-batches 0..m/2-1 from
    rank 0) and stage p - 1 - r of copy 1 (chunk 1, micro-batches m/2..m-1 from rank
    p - 1). Rank r runs DualPipeV's order for its half rank h = min(r, p - 1 - r) of p/2
    with m/2 micro-batches per chunk, its phase 0 being the nearer entry's chunk. The
    sources require even p and even m >= 2p."""
    half = m // 2
    orders = []
    for r in range(p):
        second = r >= p // 2
        rank = _Rank((0, half), (1, 0) if second else (0, 1))
        index = min(r, p - 1 - r)
        orders.append(_phases(rank, p // 2, index, half, middle=index == p // 2 - 1))
    return orders


def combined_1f1b(orders: list[list[Step]]) -> list[list[Step]]:
    """Megatron-Core's combined 1F1B (`overlap_moe_expert_parallel_comm`): each steady
    forward merged with the backward after it into an F&B pair (a B right after an F of
    another micro-batch or chunk is marked overlapped). One rank alone runs F0, then
    F(i+1)&B(i), then the last B, as Megatron-Core's pipeline-free loop does."""
    if len(orders) == 1 and all(s.chunk == 0 for s in orders[0]):
        forwards = [s for s in orders[0] if s.kind == "F"]
        backwards = [s for s in orders[0] if s.kind != "F"]
        if all(s.kind == "B" for s in backwards):
            orders = [_one_f_one_b(forwards, backwards, 1)]
    out = []
    for order in orders:
        marked = list(order)
        for i in range(1, len(marked)):
            before, step = marked[i - 1], marked[i]
            if before.kind == "F" and step.kind == "B" and before[1:] != step[1:]:
                marked[i] = overlapped(step)
        out.append(marked)
    return out
