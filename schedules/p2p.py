"""Where a framework's blocking pipeline p2p calls sit in a rank's op order.

Plain functions of the schedule's per-rank orders (one chunk per rank). A `Call` is
one blocking p2p op of a rank: the transfers it holds, each named by what moves
(`F`: the output activation of micro-batch ``mb``, `B`: its input gradient) and
whether this rank sends or receives it. The lowering puts each call on the rank's
lane between its passes; a transfer starts when its sender's and its receiver's
calls are both reached.

- `megatron_calls`: Megatron-LM's `_communicate` call sites in
  `forward_backward_pipelining_without_interleaving` (megatron/schedules.py, v2.5
  e269e20; unchanged at e1c334b): between two passes X then Y, the send of X and the
  receive of Y go in one batched call when X and Y differ in kind
  (`send_forward_recv_backward`, `send_backward_recv_forward`, both with one
  neighbour), else in two calls, send first (warm-up `send_forward` then
  `recv_forward`, cool-down `send_backward` then `recv_backward`).
- `deepspeed_calls`: DeepSpeed's `TrainSchedule.steps()` (deepspeed/runtime/pipe/
  schedule.py, v0.5.0-v0.7.7): 2(m + p - 1) steps, stage s forward on steps of its
  parity; a forward step is `RecvActivation(i)`, `SendGrad(prev)`, `ForwardPass(i)`,
  a backward step `SendActivation(prev)`, `RecvGrad(i)`, `BackwardPass(i)`, ``prev``
  being the previous step's micro-batch; each instruction is its own call.
- `megatron_interleaved_calls`: the `_communicate` call sites of Megatron-LM's
  `forward_backward_pipelining_with_interleaving` (same file and versions), for all
  ranks at once: the ranks form a ring (rank p - 1's chunk k sends to rank 0's chunk
  k + 1), and which tensor a receive gets is which the neighbour sends in its matching
  call, NCCL's pairing of a peer's sends and receives in order.
"""

from __future__ import annotations

from typing import NamedTuple

from .pipeline import Step, interleaved_warmup


class Xfer(NamedTuple):
    direction: str  # "send" or "recv"
    kind: str  # "F": activation of micro-batch mb, "B": its gradient
    microbatch: int
    chunk: int = 0  # the sending rank's chunk whose pass produced the tensor


class Call(NamedTuple):
    transfers: tuple[Xfer, ...]


def _sends(step: Step, rank: int, p: int) -> list[Xfer]:
    if (step.kind == "F" and rank < p - 1) or (step.kind == "B" and rank > 0):
        return [Xfer("send", step.kind, step.microbatch)]
    return []


def _receives(step: Step, rank: int, p: int) -> list[Xfer]:
    if (step.kind == "F" and rank > 0) or (step.kind == "B" and rank < p - 1):
        return [Xfer("recv", step.kind, step.microbatch)]
    return []


def megatron_calls(order: list[Step], rank: int, p: int) -> list[Step | Call]:
    """One rank's passes with Megatron's blocking batched p2p calls between them."""
    out: list[Step | Call] = []
    previous: Step | None = None
    for step in [*order, None]:
        sends = _sends(previous, rank, p) if previous is not None else []
        receives = _receives(step, rank, p) if step is not None else []
        if (
            sends
            and receives
            # always true when sends and receives are (each comes from a step)
            and previous is not None
            and step is not None
            and previous.kind != step.kind
        ):
            out.append(Call((*sends, *receives)))
        else:
            out.extend(Call((x,)) for x in (*sends, *receives))
        if step is not None:
            out.append(step)
        previous = step
    return out


def _deepspeed_step(step_id: int, stage: int, p: int) -> tuple[int, bool]:
    """(micro-batch, is_forward) of a TrainSchedule step (`_step_to_micro_batch`)."""
    if step_id % 2 == stage % 2:
        return (step_id - stage % 2) // 2 - stage // 2, True
    if step_id % 2 == 0:
        return step_id // 2 - p + (stage + 1) // 2, False
    return (step_id - 1) // 2 - p + 1 + stage // 2, False


def deepspeed_calls(stage: int, p: int, m: int) -> list[Step | Call]:
    """One stage's instructions in DeepSpeed's TrainSchedule order: passes and one
    call per Send/Recv instruction."""
    out: list[Step | Call] = []
    valid = range(m)
    previous = -1
    for step_id in range(2 * (m + p - 1)):
        mb, forward = _deepspeed_step(step_id, stage, p)
        if forward:
            if mb in valid and stage > 0:
                out.append(Call((Xfer("recv", "F", mb),)))
            if previous in valid and stage > 0:
                out.append(Call((Xfer("send", "B", previous),)))
        else:
            if previous in valid and stage < p - 1:
                out.append(Call((Xfer("send", "F", previous),)))
            if mb in valid and stage < p - 1:
                out.append(Call((Xfer("recv", "B", mb),)))
        if mb in valid:
            out.append(Step("F" if forward else "B", mb))
        previous = mb
    return out


class _Pending(NamedTuple):
    """A call of one rank before its receives are named: its sends, and whether it
    receives from the previous rank (an activation) and from the next (a gradient)."""

    sends: tuple[Xfer, ...]
    recv_prev: bool
    recv_next: bool


def _interleaved_sites(
    order: list[Step], rank: int, p: int, v: int, m: int, group: int
) -> list[Step | _Pending]:
    """One rank's passes and calls as `forward_backward_pipelining_with_interleaving`
    makes them (megatron/schedules.py, v2.5 e269e20; unchanged at e1c334b):
    `recv_forward` first; after each warm-up forward `send_forward_recv_forward` (the
    last warm-up one `send_forward_backward_recv_forward_backward`, unless every
    forward is warm-up); one `send_forward_backward_recv_forward_backward` after each
    steady forward + backward pair; `recv_backward` when every forward was warm-up;
    `send_backward_recv_backward` after each cool-down backward. The first virtual stage
    sends no gradient, the last no activation. recv_prev / recv_next are Megatron's:
    a middle rank receives the next pass's input; rank 0 (forward) and rank p - 1
    (backward), p - 1 passes ahead of the other end of the ring, receive what that end
    produced p - 1 passes before, unless it came from its last chunk. v2.5 states this
    for the steady state and, for groups of p micro-batches, an equivalent test in the
    warm-up and cool-down; Megatron-Core's `recv_tensor_from_previous_stage` (the
    version with microbatch_group_size_per_vp_stage) states it for every phase and any
    group size, as here."""
    n = m * v
    warmup = interleaved_warmup(p, rank, m, v, group)
    all_warmup = m == p
    forwards = [s for s in order if s.kind == "F"]
    backwards = [s for s in order if s.kind == "B"]

    def chunk(k: int, forward: bool) -> int:  # get_model_chunk_id (Python's modulo)
        c = (k % (group * v)) // group
        return c if forward else v - 1 - c

    assert [s.chunk for s in forwards] == [chunk(k, True) for k in range(n)], order
    assert [s.chunk for s in backwards] == [chunk(k, False) for k in range(n)], order
    first, last = rank == 0, rank == p - 1  # ignore_virtual

    def send_f(k: int) -> tuple[Xfer, ...]:
        f = forwards[k]
        return () if last and f.chunk == v - 1 else (Xfer("send", "F", f.microbatch, f.chunk),)

    def send_b(k: int) -> tuple[Xfer, ...]:
        b = backwards[k]
        return () if first and b.chunk == 0 else (Xfer("send", "B", b.microbatch, b.chunk),)

    def receives(k: int, forward: bool) -> bool:  # after the k-th pass of a direction
        if (first if forward else last) and k < p - 1:
            return False  # the other end has produced nothing yet
        if first if forward else last:
            return chunk(k - (p - 1), forward) != (v - 1 if forward else 0)
        return True

    out: list[Step | _Pending] = [_Pending((), not first, False)]  # recv_forward, chunk 0
    for k in range(warmup):
        out.append(forwards[k])
        recv_prev = receives(k, True) and k != n - 1
        recv_next = k == warmup - 1 and not all_warmup and not last
        out.append(_Pending(send_f(k), recv_prev, recv_next))
    remaining = n - warmup
    for k in range(remaining):
        forward_k = k + warmup
        out += [forwards[forward_k], backwards[k]]
        recv_prev = receives(forward_k, True) and k != remaining - 1
        out.append(_Pending(send_f(forward_k) + send_b(k), recv_prev, receives(k, False)))
    if all_warmup:  # recv_backward, the virtual rank left at the last forward's chunk
        out.append(_Pending((), False, not (last and chunk(n - 1, True) == v - 1)))
    for k in range(remaining, n):
        out.append(backwards[k])
        out.append(_Pending(send_b(k), False, receives(k, False) and k != n - 1))
    return out


def megatron_interleaved_calls(
    orders: list[list[Step]], v: int, group: int | None = None
) -> list[list[Step | Call]]:
    """Every rank's passes with the blocking batched calls of Megatron's interleaved
    schedule between them (calls with nothing to move left out). A receive is named by
    pairing, in order, a rank's receives from a neighbour with that neighbour's sends to
    it; the tensor must reach the rank before the pass that uses it."""
    p = len(orders)
    m = sum(s.kind == "F" for s in orders[0]) // v
    sites = [_interleaved_sites(o, r, p, v, m, group or p) for r, o in enumerate(orders)]
    sent = {
        (r, kind): [
            x for c in sites[r] if isinstance(c, _Pending) for x in c.sends if x.kind == kind
        ]
        for r in range(p)
        for kind in "FB"
    }
    queue = {
        (r, kind): iter(sent[(r - 1) % p if kind == "F" else (r + 1) % p, kind])
        for r in range(p)
        for kind in "FB"
    }
    out: list[list[Step | Call]] = []
    for r in range(p):
        calls: list[Step | Call] = []
        for c in sites[r]:
            if isinstance(c, Step):
                calls.append(c)
                continue
            receives = []
            for kind, wanted in (("F", c.recv_prev), ("B", c.recv_next)):
                if wanted:
                    x = next(queue[r, kind])
                    receives.append(Xfer("recv", kind, x.microbatch, x.chunk))
            if c.sends or receives:
                calls.append(Call((*c.sends, *receives)))
        for kind in "FB":
            assert next(queue[r, kind], None) is None, (r, kind)  # every tensor received
        _check_received_first(calls, r, p, v)
        out.append(calls)
    return out


def _check_received_first(calls: list[Step | Call], rank: int, p: int, v: int) -> None:
    """Each pass's input (activation or gradient) arrives in an earlier call."""
    arrived = set()
    for c in calls:
        if isinstance(c, Call):
            for x in c.transfers:
                if x.direction == "recv":
                    wrap = (x.kind == "F" and rank == 0) or (x.kind == "B" and rank == p - 1)
                    step = (1 if x.kind == "F" else -1) if wrap else 0
                    arrived.add((x.kind, x.microbatch, x.chunk + step))
            continue
        needs = not (
            (c.kind == "F" and rank == 0 and c.chunk == 0)
            or (c.kind == "B" and rank == p - 1 and c.chunk == v - 1)
        )
        assert not needs or (c.kind, c.microbatch, c.chunk) in arrived, (rank, c)
