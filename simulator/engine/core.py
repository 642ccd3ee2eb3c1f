"""When things run: each lane walks its ops in order on a simpy clock.

A lane is a small state machine driven by simpy callbacks (see `_Engine`). In
exact mode, ops that share a ``rendezvous`` are one collective: it starts when
the last member lane reaches it and ends every member's op.

The engine records a `Span` for everything a lane does or waits for. A wait is
split by what it waited on: waiting for another GPU's transfer to start is
``idle`` (the pipeline bubble), the time while it is in flight is exposed
communication (``pp_wait``, ``dp_wait``); waiting for one of the GPU's own
transfers, queued or in flight, is exposed communication throughout.
Non-blocking transfers get spans of their own on the lane's GPU, on a stream
named after their kind.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from functools import partial
from heapq import heappop, heappush

import simpy
from simpy.events import NORMAL

from ..ir.flows import Interval, Transfer
from ..ir.ops import Op, Workload
from ..ir.results import Span, Trace, Wait
from ..ir.vocabulary import (
    BARRIER,
    CATEGORY_OF_KIND,
    COMPUTE_KINDS,
    COMPUTE_STREAM,
    IDLE,
    PP_SEND,
    STREAM_OF_COMM,
    WAIT_OF_COMM,
)
from .events import Call, Callback, queue_of
from .lookover import scan
from .network import FairShareNetwork, NetworkFactory, _Alone, _Flow

# builds a named tuple from a tuple of its fields without the Python-level __new__ the
# namedtuple factory writes: the same object, one call frame less per span
_new = tuple.__new__


class _LaneEnd(Call):
    """A lane's event "the compute op it runs ends" (`_Engine.lane_event`): a `Call`
    that knows its lane, for the run loop (`_Engine._run_clock`)."""

    __slots__ = ("lane",)

    def __init__(self, lane: int) -> None:
        self.lane = lane


class DeadlockError(RuntimeError):
    """The workload cannot finish: some lanes wait for ops that never complete."""


def simulate(
    workload: Workload,
    *,
    network: NetworkFactory | None = None,
    progress: Callable[[float], None] | None = None,
    blame: bool = False,
) -> Trace:
    """Run every lane to its end and return what happened, span by span.

    ``network`` makes the network on the engine's simpy Environment, e.g.
    ``FairShareNetwork.factory(capacities)``; without one, a network with no links,
    enough for workloads whose transfers only take time (abstract pipelines).
    ``progress``, if given, is called with the fraction of ops done, about every 1 % of
    them. ``blame`` records who waited for whom at collectives (`Trace.waits`, `_Blame`)."""
    engine = _Engine(workload, network or FairShareNetwork.factory(()), progress)
    if blame:
        engine.blame = _Blame()
    return engine.run()


def simulate_totals(
    workload: Workload,
    *,
    network: NetworkFactory | None = None,
    progress: Callable[[float], None] | None = None,
    blame: bool = False,
) -> tuple[Trace, dict[tuple[int, str], dict[str, float]], int]:
    """`simulate` for a caller that writes no spans (`stepsim run --json` without --out):
    the trace without spans, each compute lane's seconds per category added up as its
    spans end, in the order `report.metrics.lane_seconds` adds them from a trace (the
    same floats, bit for bit), and the number of spans. Workloads without congruent
    groups (``copies`` 1) only: the reports give a group's lane to each of its GPUs."""
    if any(lane.copies != 1 for lane in workload.lanes):
        raise ValueError("simulate_totals: a lane stands for a congruent group (copies > 1)")
    engine = _Engine(workload, network or FairShareNetwork.factory(()), progress, totals=True)
    if blame:
        engine.blame = _Blame()
    return engine.run(), engine.seconds, engine.num_spans


class _Blame:
    """Who waited for whom: at a collective the members that arrived before the last one
    wait, and their wait is charged to the last arriver's lane. A member that did not
    block (an overlapped gradient bucket) is charged, when its lane later waits for the
    bucket, the part of that wait before the last member arrived. Only collectives of
    one pipeline stage (tensor-, data-, context-, expert-parallel) are charged: pipeline
    idle, blocking p2p pairs and the tied embedding's all-reduce wait on the pipeline."""

    def __init__(self) -> None:
        self.waits: list[Wait] = []
        # a non-blocking member op -> (the last arriver's lane, when it arrived)
        self.pending: dict[int, tuple[int, float]] = {}

    def collective(self, engine: _Engine, first: int, last_lane: int) -> None:
        now, ops, start_s = engine.env._now, engine.ops, engine.start_s
        lanes = engine.workload.lanes
        stage = lanes[last_lane].stage
        members = engine.members[first]
        # members that arrived at the same instant as the last share its place; the
        # charge goes to the one standing for the fewest GPUs (a representative lane
        # stands for replicas no perturbation touches)
        for index in members:
            lane = ops[index].lane
            if start_s[index] == now and lanes[lane].stands_for < lanes[last_lane].stands_for:
                last_lane = lane
        for index in members:
            op = ops[index]
            if lanes[op.lane].stage != stage:
                # between pipeline stages (a blocking p2p pair, the tied embedding's
                # all-reduce): waiting on the pipeline, not charged
                continue
            if not op.blocking:
                # a member that arrived at this instant waited for no one: a lane
                # waiting for it later waited for it, not for the last arriver
                if op.lane != last_lane and start_s[index] != now:
                    self.pending[index] = (last_lane, now)
                continue
            wait = now - start_s[index]  # type: ignore[operator]  # arrived, so started
            if wait > 0 and op.lane != last_lane:
                self.waits.append(_new(Wait, (op.lane, last_lane, wait, op.kind)))

    def waited(self, lane: int, dep: int, dep_kind: str, waited_from: float, now: float) -> None:
        pending = self.pending.pop(dep, None)
        if pending is not None and pending[1] > waited_from:
            wait = min(pending[1], now) - waited_from
            self.waits.append(_new(Wait, (lane, pending[0], wait, dep_kind)))


class _Engine:
    """Each lane is a small state machine driven by simpy callbacks: it runs its ops
    until one must wait (a compute op's end, a blocking transfer, an op another lane
    has not finished) and resumes from the callback. That is one simpy event per compute
    op and none per dependency, where a generator process per lane costs a resume per
    yield; the walk itself is the same. A compute op's end is the lane's own `Call`
    event, scheduled again for each op (a lane has at most one pending: it waits for
    it), rather than a new Timeout per op."""

    def __init__(
        self,
        workload: Workload,
        network: NetworkFactory,
        progress: Callable[[float], None] | None = None,
        totals: bool = False,
    ) -> None:
        self.workload = workload
        self.progress = progress
        # ops done: `_done` counts them, the run loop's own ends too (`_run_clock`), and
        # the progress callback is called once the count has passed each 1 % of them
        self.num_done = 0
        self.report_every = max(len(workload.ops) // 100, 1)
        self.next_report = self.report_every
        self.env = simpy.Environment(0.0)  # float time from the start, as spans record it
        self.queue, self.eid = queue_of(self.env)  # to schedule as simpy does, in line
        self.network = network(self.env)
        n = len(workload.ops)
        self.start_s: list[float | None] = [None] * n
        self.end_s: list[float | None] = [None] * n
        self.waiters: dict[int, list[int]] = {}  # op -> lanes waiting for it
        self.spans: list[Span] = []
        # The last op's end, not env.now: stale network wake-ups (simpy cannot cancel a
        # timeout) may still be queued after the last op and would run the clock on.
        self.last_end_s = 0.0
        num_lanes = len(workload.lanes)
        self.position = [0] * num_lanes  # next op per lane (also for deadlock reports)
        self.next_dep = [0] * num_lanes  # within that op, the first dep not yet checked
        self.waited_from = [0.0] * num_lanes
        self.ready: deque[int] = deque()  # lanes to advance now, in order
        self.draining = False
        # exact mode: a collective's member ops by its first member (and below, how many
        # arrived); the transfers that never share a link with another running one (`alone`)
        self.members, self.alone = scan(workload)
        self.arrived: dict[int, int] = {}
        # per lane, for the hot paths: its ops, GPU and stream
        self.ops = workload.ops
        self.lane_ops = [lane.ops for lane in workload.lanes]
        self.lane_gpu = [lane.gpu for lane in workload.lanes]
        self.lane_stream = [lane.stream for lane in workload.lanes]
        self.blame: _Blame | None = None
        # `simulate_totals`: no spans, each compute lane's seconds per category (one
        # table per (GPU, stream), shared by lanes of the same) and the spans' count
        self.keeps_spans = not totals
        self.totals: list[defaultdict[str, float] | None] = []
        self.seconds: dict[tuple[int, str], dict[str, float]] = {}
        self.num_spans = 0
        # what ends the op a lane runs: records its span, or adds its seconds up
        self._end_running_op: Callable[[int], None] = self._end_running_op_span
        if totals:
            tables: dict[tuple[int, str], defaultdict[str, float]] = {}
            self.totals = [
                tables.setdefault((lane.gpu, lane.stream), defaultdict(float))
                if lane.stream == COMPUTE_STREAM
                else None
                for lane in workload.lanes
            ]
            self.seconds.update(tables)
            self._end_running_op = self._end_running_op_totals
        # one callback per lane for "the op it is running has ended"
        self.op_ended = [self._op_ended_callback(i) for i in range(num_lanes)]
        self.lane_event = [_LaneEnd(i) for i in range(num_lanes)]
        self.lane_callbacks = [(ended,) for ended in self.op_ended]

    def run(self) -> Trace:
        self._wake(range(len(self.workload.lanes)))
        self._run_clock()
        return self.result()

    def _run_clock(self) -> None:
        """`simpy.Environment.run` until the queue is empty, with its `step` written out
        (events.py, `queue_of`): pop the next event (by time, priority, then the order
        scheduled), set the clock, call its callbacks.

        The two commonest events, a lane's compute op ending and a transfer alone on its
        links ending (the network's `_Alone`, whose one callback ends the lane's op), are
        done here in a few steps where nothing else happens: the op released no other
        lane, and the lane's next op has no deps and is a compute op or another transfer
        alone on its links. That is what the callback would do (`_end_running_op`, then
        `_drain` of that lane alone, whose `_advance` starts the op; on the fair-share
        network `FairShareNetwork._alone_ended` and `start_alone` written out): the same
        writes, the same one event scheduled, in the same order, so the same run to the
        last bit. Anything else goes the callback's way, and so do the ops of a lane
        whose end event is not a `_LaneEnd` (engine.steady watches a lane so, to see
        each of its ops start in `_advance`). The last op's end and the count of spans
        are kept here and added to the engine's at the end (a maximum and a sum;
        nothing reads them before). Every event here succeeds: the engine's and the
        network's (events.py) cannot fail, so simpy's check for a failed event is left
        out."""
        env, network = self.env, self.network
        queue, eid = self.queue, self.eid
        # the fair-share network's transfers alone on their links are written out here
        # (not a subclass's: tests give one its own start_alone): each lane's end event
        # for them, and their rate and time by transfer as start_alone keeps them
        alone_event: list[_Alone] = []
        alone_timing: dict[int, tuple[Transfer, float, float]] = {}
        # by the op's transfer (its collective of one phase), once it moved bytes
        alone_known: dict[int, tuple[Transfer, float, float]] = {}
        if type(network) is FairShareNetwork:
            alone_event = [network.alone_event(ended) for ended in self.op_ended]
            alone_timing = network._alone_timing
        fair = bool(alone_event)
        # a lane whose end event is not a `_LaneEnd` (engine.steady gives the lane it
        # watches another) ends its ops through their callbacks, both kinds: its end
        # event for transfers alone on their links knows no lane (-1, as every other's)
        for lane, event in enumerate(alone_event):
            event.lane = lane if type(self.lane_event[lane]) is _LaneEnd else -1
        alone_ends = network._alone_ends if fair else ()  # type: ignore[attr-defined]
        # the fair-share network's claimed flows' ends (`FairShareNetwork._finish` of a
        # claimed flow) are written out here too
        busy = network._busy if fair else set()  # type: ignore[attr-defined]
        finish = network._finish if fair else None  # type: ignore[attr-defined]
        add_interval = network.intervals.append
        ops, start_s, end_s, positions = self.ops, self.start_s, self.end_s, self.position
        lane_ops_of, lane_event = self.lane_ops, self.lane_event
        lane_callbacks = self.lane_callbacks
        op_ended, waiters, ready, alone = self.op_ended, self.waiters, self.ready, self.alone
        start_alone, record_wait, drain = network.start_alone, self._record_wait, self._drain
        keeps_spans, add_span = self.keeps_spans, self.spans.append
        lane_gpu, lane_stream, totals_of = self.lane_gpu, self.lane_stream, self.totals
        # ops ended here (added to the engine's count at the end); the progress callback
        # is asked about the count when that reaches report_at, and after other events
        counting = self.progress is not None
        done = 0
        report_at = self._report(self.num_done) if counting else len(ops) + 1
        num_spans = 0
        last_end_s = 0.0
        while queue:
            now, _, _, event = heappop(queue)
            env._now = now
            cls = type(event)
            if cls is _LaneEnd:
                lane = event.lane  # its class says so
            elif cls is _Alone:
                lane = event.lane
                if lane < 0:  # (another network's, or not a lane's)
                    callbacks, event.callbacks = event.callbacks, None
                    for callback in callbacks:
                        callback(event)
                    if counting and self.num_done + done >= self.next_report:
                        report_at = done + self._report(self.num_done + done)
                    continue
                start = event.start_s  # `FairShareNetwork._alone_ended`
                if now > start:
                    transfer = event.transfer
                    add_interval(
                        _new(Interval, (transfer.links, transfer.mults, event.rate, start, now))
                    )
            elif cls is _Flow and fair:
                # a flow's first end event (`_claim_ended`, `_finish(flow, 1)`): void once
                # it was re-rated; else, claimed from start to end, its links freed, its
                # interval recorded and the transfer's on_done called
                event.callbacks = None
                if event.version != 1:
                    continue
                if event.claimed:
                    event.claimed = False
                    busy.difference_update(event.links)
                    start = event.updated_s  # `_close_interval`
                    if event.rate > 0 and now > start:
                        add_interval(
                            _new(Interval, (event.links, event.mults, event.rate, start, now))
                        )
                    event.on_done(None)
                else:
                    finish(event, 1)  # type: ignore[misc]  # fair: the network's
                if counting and self.num_done + done >= self.next_report:
                    report_at = done + self._report(self.num_done + done)
                continue
            else:
                callbacks, event.callbacks = event.callbacks, None
                for callback in callbacks:
                    callback(event)
                if counting and self.num_done + done >= self.next_report:
                    report_at = done + self._report(self.num_done + done)
                continue
            event.callbacks = None
            # `_end_running_op`: the span (or its seconds added up), then `_done`
            position = positions[lane]
            lane_ops = lane_ops_of[lane]
            index = lane_ops[position]
            start = start_s[index]  # the lane runs it: started
            if now > start:
                if keeps_spans:
                    op = ops[index]
                    add_span(
                        _new(
                            Span,
                            (
                                lane_gpu[lane],
                                lane_stream[lane],
                                op.kind,
                                op.label,
                                op.microbatch,
                                start,
                                now,
                                index,
                            ),
                        )
                    )
                else:
                    num_spans += 1
                    totals = totals_of[lane]
                    if totals is not None:
                        totals[CATEGORY_OF_KIND[ops[index].kind]] += now - start
            done += 1
            if done >= report_at:
                report_at = done + self._report(self.num_done + done)
            end_s[index] = now
            if now > last_end_s:
                last_end_s = now
            position += 1
            positions[lane] = position
            if index in waiters:  # (no method call for the common case: none waits)
                released = waiters.pop(index)
                for other in released:
                    record_wait(other, index)
                ready.extend(released)
            elif position < len(lane_ops):
                # `_advance` of this lane alone (next_dep is 0: the lane ran an op)
                index = lane_ops[position]
                op = ops[index]
                if not op.deps:
                    kind = op.kind
                    if kind in COMPUTE_KINDS:
                        if op.duration_s > 0:
                            start_s[index] = now
                            event = lane_event[lane]
                            event.callbacks = lane_callbacks[lane]
                            heappush(queue, (now + op.duration_s, NORMAL, next(eid), event))
                            continue
                    else:
                        # a transfer alone on its links, its rate and time known:
                        # `FairShareNetwork.start_alone` written out
                        timing = alone_known.get(id(op.transfer))
                        if timing is not None:
                            start_s[index] = now
                            network.num_transfers += 1
                            transfer = timing[0]
                            event = alone_event[lane]
                            event.transfer = transfer
                            event.rate = timing[1]
                            event.start_s = now + transfer.latency_s
                            event.callbacks = alone_ends
                            heappush(queue, (now + timing[2], NORMAL, next(eid), event))
                            continue
                        if (
                            kind != BARRIER
                            and op.blocking
                            and op.rendezvous < 0
                            and id(op.transfer) in alone
                        ):
                            # its first start: the network works its rate and time out
                            start_s[index] = now
                            transfer = op.transfer[0]  # its one phase
                            start_alone(transfer, op_ended[lane])
                            if fair:
                                timing = alone_timing[id(transfer)]
                                if timing[1] != 0.0:  # it moves bytes: the same again
                                    alone_known[id(op.transfer)] = timing
                            continue
            ready.append(lane)
            drain()
            if counting and self.num_done + done >= self.next_report:
                report_at = done + self._report(self.num_done + done)
        if last_end_s > self.last_end_s:
            self.last_end_s = last_end_s
        self.num_spans += num_spans
        self.num_done += done
        if counting:
            self._report(self.num_done)

    def result(self) -> Trace:
        """What happened, once the clock has run out (raises DeadlockError if some
        lane could not finish)."""
        self._check_finished()
        return Trace(
            self.spans,
            self.workload.lanes,
            self.last_end_s,
            self.network.num_transfers,
            self.network.intervals,
            tuple(self.blame.waits) if self.blame is not None else (),
        )

    def _op_ended_callback(self, lane: int) -> Callback:
        """The callback for "the op the lane runs has ended": the lane, and any it
        released, advance."""
        end_running_op, ready = self._end_running_op, self.ready

        def ended(_event: object = None) -> None:
            end_running_op(lane)
            ready.append(lane)
            if not self.draining:
                self._drain()

        return ended

    def _wake(self, lanes: Iterable[int]) -> None:
        """Advance these lanes, and any they release, one after another (no recursion)."""
        self.ready.extend(lanes)
        if not self.draining:
            self._drain()

    def _drain(self) -> None:
        self.draining = True
        ready, advance = self.ready, self._advance
        popleft = ready.popleft
        while ready:
            advance(popleft())
        self.draining = False

    def _report(self, num_done: int) -> int:
        """``num_done`` ops done: the progress callback if that passed the next 1 % of
        them since the last call (once, however many it passed). The count of ops the
        run loop may end itself before it asks again."""
        if num_done >= self.next_report:
            every = self.report_every
            self.next_report = (num_done // every + 1) * every
            if self.progress is not None:
                self.progress(num_done / len(self.workload.ops))
        return self.next_report - num_done

    def _done(self, index: int, now: float) -> None:
        self.num_done += 1
        self.end_s[index] = now
        if now > self.last_end_s:
            self.last_end_s = now
        lanes = self.waiters.pop(index, None)
        if lanes is not None:
            for lane in lanes:
                self._record_wait(lane, index)
            self.ready.extend(lanes)

    def _end_running_op_span(self, lane_index: int) -> None:
        """The compute op or blocking transfer the lane was running has finished."""
        position = self.position[lane_index]
        index = self.lane_ops[lane_index][position]
        op = self.ops[index]
        start, now = self.start_s[index], self.env._now
        if now > start:  # type: ignore[operator]  # the lane runs it, so it started
            self.spans.append(
                _new(
                    Span,
                    (
                        self.lane_gpu[lane_index],
                        self.lane_stream[lane_index],
                        op.kind,
                        op.label,
                        op.microbatch,
                        start,
                        now,
                        index,
                    ),
                )
            )
        self._done(index, now)
        self.position[lane_index] = position + 1

    def _end_running_op_totals(self, lane_index: int) -> None:
        """`_end_running_op_span` adding the span's seconds up instead of recording it."""
        position = self.position[lane_index]
        index = self.lane_ops[lane_index][position]
        start, now = self.start_s[index], self.env._now
        if now > start:  # type: ignore[operator]  # the lane runs it, so it started
            self.num_spans += 1
            totals = self.totals[lane_index]
            if totals is not None:
                totals[CATEGORY_OF_KIND[self.ops[index].kind]] += now - start  # type: ignore[operator]  # it started
        self._done(index, now)
        self.position[lane_index] = position + 1

    def _advance(self, lane_index: int) -> None:
        """Run the lane's ops until one has to wait."""
        env, ops, end_s, start_s = self.env, self.ops, self.end_s, self.start_s
        now = env._now  # the clock does not move while a lane advances
        lane_ops = self.lane_ops[lane_index]
        num_ops = len(lane_ops)
        position = self.position[lane_index]
        d = self.next_dep[lane_index]
        while position < num_ops:
            index = lane_ops[position]
            op = ops[index]
            deps = op.deps
            if deps:
                num_deps = len(deps)
                while d < num_deps:
                    dep = deps[d]
                    d += 1
                    if end_s[dep] is None:
                        self.next_dep[lane_index] = d
                        self.position[lane_index] = position
                        self.waited_from[lane_index] = now
                        waiting = self.waiters.get(dep)
                        if waiting is None:
                            self.waiters[dep] = [lane_index]
                        else:
                            waiting.append(lane_index)
                        return
            start_s[index] = now
            d = 0
            kind = op.kind
            if kind in COMPUTE_KINDS:
                if op.duration_s > 0:
                    self.position[lane_index] = position
                    self.next_dep[lane_index] = 0
                    event = self.lane_event[lane_index]
                    event.callbacks = self.lane_callbacks[lane_index]
                    heappush(self.queue, (now + op.duration_s, NORMAL, next(self.eid), event))
                    return
            elif kind != BARRIER:  # a comm op: it carries a transfer
                if op.rendezvous >= 0:
                    self._arrive(op)
                elif op.blocking:
                    if id(op.transfer) in self.alone:  # a collective of one phase
                        self.network.start_alone(
                            op.transfer[0],  # type: ignore[index, arg-type]  # its one phase
                            self.op_ended[lane_index],
                        )
                    else:
                        self.network.start(
                            op.transfer,  # type: ignore[arg-type]  # a comm op's: not None
                            self.op_ended[lane_index],
                        )
                else:
                    gpu = self.lane_gpu[lane_index]
                    self.network.start(
                        op.transfer,  # type: ignore[arg-type]  # a comm op's: not None
                        partial(self._transfer_done, index, gpu),
                    )
                if op.blocking:
                    self.position[lane_index] = position
                    self.next_dep[lane_index] = 0
                    return
                position += 1
                continue
            # a barrier, or a compute op of no time: done now
            self._done(index, now)
            position += 1
        self.position[lane_index] = position
        self.next_dep[lane_index] = 0

    def _arrive(self, op: Op) -> None:
        """A member GPU reached a collective; the last one to arrive starts it."""
        first = op.rendezvous
        members, arrived = self.members[first], self.arrived
        count = arrived.get(first, 0) + 1
        if count < len(members):
            arrived[first] = count
        else:
            arrived.pop(first, None)
            if self.blame is not None:
                self.blame.collective(self, first, op.lane)
            if op.kind == PP_SEND:  # a blocking p2p pair: its span starts with the transfer
                now, start_s = self.env._now, self.start_s
                for index in members:
                    start_s[index] = now
            transfer = op.transfer
            if id(transfer) in self.alone:  # of one phase, alone on its links while it runs
                self.network.start_alone(
                    transfer if type(transfer) is Transfer else transfer[0],  # type: ignore[index]  # one phase
                    partial(self._collective_done, first),
                    reuse=False,
                )
                return
            self.network.start(
                transfer,  # type: ignore[arg-type]  # a collective's: not None
                partial(self._collective_done, first),
            )

    def _collective_done(self, first: int, _event: object = None) -> None:
        """Every member's op ends: the lanes blocked on it go on."""
        ops, now, ready = self.ops, self.env._now, self.ready
        for index in self.members[first]:
            op = ops[index]
            lane = op.lane
            if op.blocking:
                self._end_running_op(lane)
                ready.append(lane)
                continue
            self._comm_span(index, self.lane_gpu[lane])  # its span, or its count
            self._done(index, now)
        if not self.draining:
            self._drain()

    def _comm_span(self, index: int, gpu: int) -> None:
        """The span of a non-blocking transfer, on its own stream of the GPU."""
        op = self.workload.ops[index]
        start = self.start_s[index]
        if self.env._now > start:  # type: ignore[operator]  # it started: it has ended
            if not self.keeps_spans:  # on a stream of its own: in no compute lane's totals
                self.num_spans += 1
                return
            stream = STREAM_OF_COMM[op.kind]
            self.spans.append(
                Span(gpu, stream, op.kind, op.label, op.microbatch, start, self.env._now, index)  # type: ignore[arg-type]  # it started
            )

    def _transfer_done(self, index: int, gpu: int, _event: object = None) -> None:
        """A non-blocking transfer has finished: its span, and the lanes waiting for it."""
        self._comm_span(index, gpu)
        self._done(index, self.env._now)
        self._wake(())

    def _record_wait(self, lane_index: int, dep: int) -> None:
        """The lane waited for ``dep`` from ``waited_from`` until now: idle or exposed comm."""
        now, waited_from = self.env._now, self.waited_from[lane_index]
        ops, lane_gpu = self.ops, self.lane_gpu
        op = ops[self.lane_ops[lane_index][self.position[lane_index]]]
        gpu = lane_gpu[lane_index]
        dep_op = ops[dep]
        dep_kind = dep_op.kind
        if self.blame is not None:
            self.blame.waited(lane_index, dep, dep_kind, waited_from, now)
        wait_kind = WAIT_OF_COMM.get(dep_kind)
        if wait_kind is None:
            busy_from = now  # waited on another GPU's compute: all of it is bubble
        elif lane_gpu[dep_op.lane] == gpu and dep_kind != PP_SEND:
            busy_from = waited_from  # own transfer, queued or in flight: all exposed comm
        else:
            # Until another GPU starts sending (or, blocking p2p, both sides reach the
            # call), this one waits on the pipeline, not the wire.
            busy_from = max(waited_from, self.start_s[dep])  # type: ignore[type-var, assignment]  # it ended
        if self.keeps_spans:
            stream, label, microbatch = self.lane_stream[lane_index], op.label, op.microbatch
            if busy_from > waited_from:
                self.spans.append(
                    _new(
                        Span,
                        (gpu, stream, IDLE, label, microbatch, waited_from, busy_from, op.index),
                    )
                )
            if now > busy_from:
                span = (gpu, stream, wait_kind, label, microbatch, busy_from, now, op.index)
                self.spans.append(_new(Span, span))
            return
        # `simulate_totals`: the spans' seconds added up
        totals = self.totals[lane_index]
        if busy_from > waited_from:
            self.num_spans += 1
            if totals is not None:
                totals[CATEGORY_OF_KIND[IDLE]] += busy_from - waited_from
        if now > busy_from:
            self.num_spans += 1
            if totals is not None:
                totals[CATEGORY_OF_KIND[wait_kind]] += now - busy_from  # type: ignore[index]  # None: busy_from is now

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
