"""When things run: a simpy process per lane walks its ops in order.

The engine records a `Span` for everything a lane does or waits for. A wait
is split by what it waited on: waiting for another GPU's transfer to start is
``idle`` (the pipeline bubble), the time while it is in flight is exposed
communication (``pp_wait``, ``dp_wait``); waiting for one of the GPU's own
transfers, queued or in flight, is exposed communication throughout. Non-blocking transfers get
spans of their own on the lane's GPU, on a stream named after their kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import simpy

from .network import AnalyticalNetwork, FairShareNetwork
from .workload import BARRIER, COMPUTE_KINDS, DP_SYNC, PP_SEND, TP_COMM, Lane, Workload

IDLE = "idle"
PP_WAIT = "pp_wait"
DP_WAIT = "dp_wait"
TP_WAIT = "tp_wait"
_WAIT_KIND = {PP_SEND: PP_WAIT, DP_SYNC: DP_WAIT, TP_COMM: TP_WAIT}
_STREAM_OF_COMM = {PP_SEND: "pp", DP_SYNC: "dp", TP_COMM: "tp"}

NETWORKS = {"fair-share": FairShareNetwork, "analytical": AnalyticalNetwork}


class Span(NamedTuple):
    gpu: int
    stream: str
    kind: str
    label: str
    microbatch: int
    start_s: float
    end_s: float


class Trace(NamedTuple):
    spans: list[Span]
    lanes: tuple[Lane, ...]
    end_s: float  # when the last op finished
    num_transfers: int
    link_intervals: list  # network.Interval: which links carried what, when


class DeadlockError(RuntimeError):
    """The workload cannot finish: some lanes wait for ops that never complete."""


def simulate(
    workload: Workload,
    *,
    network: str = "fair-share",
    capacities_bytes_per_s: Sequence[float] = (),
) -> Trace:
    """Run every lane to its end and return what happened, span by span."""
    return _Engine(workload, network, capacities_bytes_per_s).run()


class _Engine:
    def __init__(self, workload: Workload, network: str, capacities: Sequence[float]) -> None:
        self.workload = workload
        self.env = simpy.Environment()
        self.network = NETWORKS[network](self.env, capacities)
        n = len(workload.ops)
        self.start_s: list[float | None] = [None] * n
        self.end_s: list[float | None] = [None] * n
        self.events: dict[int, simpy.Event] = {}
        self.spans: list[Span] = []
        # The last op's end, not env.now: stale network wake-ups (simpy cannot cancel a
        # timeout) may still be queued after the last op and would run the clock on.
        self.last_end_s = 0.0
        self.position = [0] * len(workload.lanes)  # next op per lane, for deadlock reports

    def run(self) -> Trace:
        for lane in self.workload.lanes:
            self.env.process(self._walk(lane))
        self.env.run()
        self._check_finished()
        return Trace(
            self.spans,
            self.workload.lanes,
            self.last_end_s,
            self.network.num_transfers,
            self.network.intervals,
        )

    def _done(self, index: int) -> None:
        self.end_s[index] = now = self.env.now
        if now > self.last_end_s:
            self.last_end_s = now
        event = self.events.pop(index, None)
        if event is not None:
            event.succeed()

    def _walk(self, lane: Lane):
        env, ops, spans = self.env, self.workload.ops, self.spans
        gpu, stream = lane.gpu, lane.stream
        for position, index in enumerate(lane.ops):
            self.position[lane.index] = position
            op = ops[index]
            for dep in op.deps:
                if self.end_s[dep] is None:
                    waited_from = env.now
                    event = self.events.get(dep)
                    if event is None:
                        event = self.events[dep] = env.event()
                    yield event
                    self._record_wait(gpu, stream, op, dep, waited_from)
            start = env.now
            self.start_s[index] = start
            kind = op.kind
            if kind in COMPUTE_KINDS:
                if op.duration_s > 0:
                    yield env.timeout(op.duration_s)
                    spans.append(Span(gpu, stream, kind, op.label, op.microbatch, start, env.now))
            elif kind != BARRIER:
                done = self.network.transfer(op.transfer)
                if not op.blocking:
                    done.callbacks.append(lambda _, i=index, g=gpu: self._transfer_done(i, g))
                    continue
                yield done
                if env.now > start:
                    spans.append(Span(gpu, stream, kind, op.label, op.microbatch, start, env.now))
            self._done(index)
        self.position[lane.index] = len(lane.ops)

    def _transfer_done(self, index: int, gpu: int) -> None:
        op = self.workload.ops[index]
        start = self.start_s[index]
        if self.env.now > start:
            stream = _STREAM_OF_COMM[op.kind]
            self.spans.append(
                Span(gpu, stream, op.kind, op.label, op.microbatch, start, self.env.now)
            )
        self._done(index)

    def _record_wait(self, gpu: int, stream: str, op, dep: int, waited_from: float) -> None:
        now = self.env.now
        dep_op = self.workload.ops[dep]
        wait_kind = _WAIT_KIND.get(dep_op.kind)
        if wait_kind is None:
            busy_from = now  # waited on another GPU's compute: all of it is bubble
        elif self.workload.lanes[dep_op.lane].gpu == gpu:
            busy_from = waited_from  # own transfer, queued or in flight: all exposed comm
        else:
            # Until another GPU starts sending, this one waits on the pipeline, not the wire.
            busy_from = max(waited_from, self.start_s[dep])
        if busy_from > waited_from:
            self.spans.append(
                Span(gpu, stream, IDLE, op.label, op.microbatch, waited_from, busy_from)
            )
        if now > busy_from:
            self.spans.append(Span(gpu, stream, wait_kind, op.label, op.microbatch, busy_from, now))

    def _check_finished(self) -> None:
        ops = self.workload.ops
        blocked = []
        for lane in self.workload.lanes:
            position = self.position[lane.index]
            if position >= len(lane.ops):
                continue
            op = ops[lane.ops[position]]
            waiting = [ops[d] for d in op.deps if self.end_s[d] is None]
            on = (
                ", ".join(
                    f"{w.kind} {w.label!r} of GPU {self.workload.lanes[w.lane].gpu}"
                    for w in waiting
                )
                or "a transfer that never finished"
            )
            blocked.append(f"GPU {lane.gpu} {lane.stream}: {op.kind} {op.label!r} waits for {on}")
        if blocked:
            shown = "; ".join(blocked[:6])
            more = f" (and {len(blocked) - 6} more lanes)" if len(blocked) > 6 else ""
            raise DeadlockError(f"deadlock: {len(blocked)} lanes cannot go on: {shown}{more}")
