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
"""

from __future__ import annotations

from typing import NamedTuple

from .pipeline import Step


class Xfer(NamedTuple):
    direction: str  # "send" or "recv"
    kind: str  # "F": activation of micro-batch mb, "B": its gradient
    microbatch: int


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
        if sends and receives and previous.kind != step.kind:
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
