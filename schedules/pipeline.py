"""GPipe and 1F1B as per-stage op orders; no simulation here.

A schedule function takes ``(num_stages, num_microbatches)`` and returns, for
each stage, the list of `Step`s that stage runs strictly in order. ``F`` is a
forward pass of one micro-batch through the stage, ``B`` its backward pass.
When each stage waits for its inputs (activations from the previous stage for
F, gradients from the next stage for B), uniform stages with free
communication finish in (m + p - 1)(F + B) under both schedules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple


class Step(NamedTuple):
    kind: str  # "F" or "B"
    microbatch: int
    chunk: int = 0


def step_label(step: Step, num_chunks: int = 1) -> str:
    """The reference label format: ``F3``, or ``F3.1`` for chunk 1 when chunks > 1."""
    base = f"{step.kind}{step.microbatch}"
    return f"{base}.{step.chunk}" if num_chunks > 1 else base


def _check(num_stages: int, num_microbatches: int) -> None:
    if num_stages < 1 or num_microbatches < 1:
        raise ValueError(
            f"need at least one stage and one micro-batch, got stages={num_stages}, "
            f"microbatches={num_microbatches}"
        )


def gpipe(num_stages: int, num_microbatches: int) -> list[list[Step]]:
    """All forwards, then all backwards (Huang et al. 2019).

    Bubble (p-1)/m of the ideal time; peak in-flight activations: m on every stage.
    """
    _check(num_stages, num_microbatches)
    order = [Step("F", i) for i in range(num_microbatches)]
    order += [Step("B", i) for i in range(num_microbatches)]
    return [list(order) for _ in range(num_stages)]


def one_f_one_b(num_stages: int, num_microbatches: int) -> list[list[Step]]:
    """Megatron-LM's non-interleaved 1F1B (PipeDream-Flush, Narayanan et al. 2021).

    Stage s warms up with min(p - s - 1, m) forwards, then alternates one
    forward and one backward, then drains the remaining backwards. Same bubble
    as GPipe, (p-1)/m, but at most min(p - s, m) micro-batches in flight.
    """
    _check(num_stages, num_microbatches)
    orders = []
    for stage in range(num_stages):
        warmup = min(num_stages - stage - 1, num_microbatches)
        order = [Step("F", i) for i in range(warmup)]
        next_b = 0
        for i in range(warmup, num_microbatches):
            order.append(Step("F", i))
            order.append(Step("B", next_b))
            next_b += 1
        order += [Step("B", i) for i in range(next_b, num_microbatches)]
        orders.append(order)
    return orders


def peak_inflight(order: Sequence[Step]) -> int:
    """Most micro-batches whose activations are held at once (+1 at F, -1 at B)."""
    alive = peak = 0
    for step in order:
        alive += 1 if step.kind == "F" else -1
        peak = max(peak, alive)
    return peak


ScheduleFn = Callable[[int, int], list[list[Step]]]

SCHEDULES: dict[str, ScheduleFn] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
}
