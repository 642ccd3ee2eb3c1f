"""The engine's state at chosen instants, for the steady-state fast-forward.

`simulate_observed` runs a workload as `core.simulate` does (the same engine, the same
events in the same order, so the same trace to the bit) and, each time one of the
``triggers`` ops has started and the clock is about to move past that instant, takes a
`snapshot`: everything the rest of the run depends on, written relative to that instant
and to each lane's position, so that two snapshots compare equal when the state one
period later is the state now, shifted (simulator/run/fastforward.py says how that is used).

What the rest of a run depends on, and how it is written:

- each lane: the op it is at (its position), and if that op has not started, which of
  its deps it waits on and since when (an op that has started is in flight, below);
- every op in flight (started, not finished: the lanes' compute ops and blocking
  transfers, non-blocking transfers, collectives whose members are arriving), named by
  its lane and its position relative to the lane's, with its start; ops before a lane's
  position that are not in flight are done, ops from it on are not started;
- every event on simpy's queue, in the order the queue pops them, with its time: a
  lane's compute op ending, a flow ending (its links, multiplicities, bytes left now,
  rate, whether it runs alone on claimed links, when its bytes started to move, its
  place in start order, and what it calls when done: a lane's op, a non-blocking op, a
  collective's members, the next phase of a collective), a transfer alone on its links
  ending (`FairShareNetwork.start_alone`: its links, multiplicities, rate, when its
  bytes started to move and what it calls), a flow's latency ending, a zero-byte
  transfer ending. A wake-up made stale by a later rate change does nothing
  and is left out.

The network's other tables (flows per link and shape, claimed links, neighbours) follow
from the flows; its caches (solo rates, link classes) change no result. A callback the
description does not know makes `NotSteady`: the fast-forward is then not used. It
knows the engine's by what they are: a lane's (`_Engine.op_ended`, `_Engine.lane_event`)
by identity, the others as `functools.partial` objects of the functions named here
(`_Engine._transfer_done`, `FairShareNetwork._finish`, ...), their arguments read by
position; a renamed function fails here by name, not by quietly making `NotSteady`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from heapq import heappush
from typing import Any

from simpy.events import NORMAL

from ..ir.ops import Workload
from ..ir.results import Trace
from .core import _Engine, _LaneEnd
from .events import Call, Callback
from .network import FairShareNetwork, NetworkFactory, _Alone, _Flow, next_phase


class NotSteady(Exception):
    """The state cannot be written down (an event of a kind the snapshot does not know)."""


class Snapshot:
    """The state right after every event at ``time_s`` (see the module's docstring)."""

    __slots__ = ("time_s", "positions", "state", "num_transfers")

    def __init__(self, time_s: float, positions: tuple[int, ...], state: tuple, transfers: int):
        self.time_s = time_s
        self.positions = positions
        self.state = state
        self.num_transfers = transfers


def simulate_observed(
    workload: Workload, network: NetworkFactory, triggers: Sequence[int]
) -> tuple[Trace, list[Snapshot], list, list]:
    """Simulate the workload; a snapshot once each trigger op has started (in order).
    Also every op's start and end.

    The triggers are ops of lane 0 (a period's first op on the first lane). The run is
    `_Engine.run`'s loop, except that lane 0's ops end through their callbacks, so that
    each of its ops starts in `_Engine._advance` (`_Observed`); once the next trigger
    has started there, a marker goes on simpy's queue at that instant with a priority
    after every event's, so it pops once every event of that instant has run and the
    clock is about to move on, where the snapshot is taken. The events and their order
    are the run's without the markers (a marker schedules nothing; it only takes a
    number of simpy's event counter, which orders ties by increasing number as
    before), so the trace is `simulate`'s to the bit."""
    engine = _Observed(workload, network, triggers)
    engine._wake(range(len(workload.lanes)))
    engine._run_clock()
    return engine.result(), engine.snapshots, engine.start_s, engine.end_s


# a marker's priority: after simpy's URGENT (0) and NORMAL (1), which the engine's and
# the network's events have, at the same instant
_AFTER_EVERY_EVENT = NORMAL + 1


class _Watched(_LaneEnd):
    """Lane 0's end event in an observed run: not a `_LaneEnd` to the run loop
    (`_Engine._run_clock` does a lane's ops itself only for that class), so the lane's
    compute ops, and its transfers alone on their links, end through their callbacks."""

    __slots__ = ()


class _Observed(_Engine):
    """The engine, with a snapshot (`_Describer`) once each trigger has started and
    every event of that instant has run."""

    def __init__(self, workload: Workload, network: NetworkFactory, triggers: Sequence[int]):
        super().__init__(workload, network)
        self.lane_event[0] = _Watched(0)
        pos_of = [0] * len(workload.ops)
        for lane in workload.lanes:
            for position, index in enumerate(lane.ops):
                pos_of[index] = position
        self.describe = _Describer(self, pos_of)
        self.snapshots: list[Snapshot] = []
        self.pending = list(reversed(triggers))  # the next one last
        self.marker = Call()
        self.marked = False  # a marker is on the queue

    def _advance(self, lane_index: int) -> None:
        _Engine._advance(self, lane_index)
        if lane_index == 0 and not self.marked and self.pending:
            started_s = self.start_s[self.pending[-1]]
            if started_s is not None:  # started now, by this advance
                self.marked = True
                self.marker.callbacks = (self._observe,)
                heappush(self.queue, (started_s, _AFTER_EVERY_EVENT, next(self.eid), self.marker))

    def _observe(self, _event: object) -> None:
        """Every event of the instant has run: a snapshot per trigger started by now."""
        self.marked = False
        pending, start_s = self.pending, self.start_s
        while pending:
            started_s = start_s[pending[-1]]
            if started_s is None:
                break
            pending.pop()
            self.snapshots.append(self.describe(started_s))


class _Describer:
    def __init__(self, engine: _Engine, pos_of: list[int]) -> None:
        self.engine = engine
        self.pos_of = pos_of
        self.lane_of_event = {id(event): i for i, event in enumerate(engine.lane_event)}
        self.lane_of_callback = {id(fn): i for i, fn in enumerate(engine.op_ended)}
        self.low = [0] * len(engine.lane_ops)  # per lane, every op before it has finished

    def __call__(self, t0: float) -> Snapshot:
        engine = self.engine
        self.t0 = t0
        positions = tuple(engine.position)
        self.positions = positions
        start_s, end_s = engine.start_s, engine.end_s
        lanes: list[tuple[object, ...]] = []
        for lane, lane_ops in enumerate(engine.lane_ops):
            position = positions[lane]
            if position >= len(lane_ops):
                lanes.append(("done",))
            elif start_s[lane_ops[position]] is None:
                lanes.append(("waits", engine.next_dep[lane], engine.waited_from[lane] - t0))
            else:
                lanes.append(("runs",))
        # ops in flight: started, not finished; before each lane's first unfinished op
        # (kept from one snapshot to the next: it only moves on) every op has finished
        inflight: list[tuple[tuple[int, int], float]] = []
        for lane, lane_ops in enumerate(engine.lane_ops):
            low, position = self.low[lane], positions[lane]
            while low < position and end_s[lane_ops[low]] is not None:
                low += 1
            self.low[lane] = low
            for index in lane_ops[low : position + 1]:
                s = start_s[index]
                if s is not None and end_s[index] is None:
                    inflight.append((self.op(index), s - t0))
        # the queue in the order it pops: by time, priority, then the order scheduled
        queue = sorted(engine.env._queue, key=lambda item: item[:3])
        self.seqs: dict[int, int] = {}
        for _t, _p, _eid, event in queue:  # flows' start order, as ranks
            flow = self.flow_of(event)
            if flow is not None:
                self.seqs[flow.seq] = 0
        for rank, seq in enumerate(sorted(self.seqs)):
            self.seqs[seq] = rank
        events = []
        for t, priority, _eid, event in queue:
            described = self.event(event)
            if described is not None:
                events.append((t - t0, priority, described))
        state = (tuple(lanes), tuple(inflight), tuple(events))
        return Snapshot(t0, positions, state, engine.network.num_transfers)

    def op(self, index: int) -> tuple[int, int]:
        lane = self.engine.ops[index].lane
        return (lane, self.pos_of[index] - self.positions[lane])

    def flow_of(self, event: object) -> _Flow | None:
        """The flow an event on the queue ends or starts, if any."""
        if isinstance(event, _Flow):
            return event
        callbacks = event.callbacks if type(event) is Call else None
        if callbacks is not None and len(callbacks) == 1:
            called = _partial_of(callbacks[0])
            if called is not None and called[0] in _FLOW_EVENTS:
                flow: _Flow = called[1][0]
                return flow
        return None

    def event(self, event: object) -> tuple | None:
        lane = self.lane_of_event.get(id(event))
        if lane is not None:
            return ("op ends", lane)
        if isinstance(event, _Flow):  # a claimed flow's end; void once re-rated
            return ("flow ends", self.flow(event)) if event.version == 1 else None
        if type(event) is _Alone:  # a transfer alone on its links (start_alone)
            transfer = event.transfer
            return (
                "alone ends",
                transfer.links,
                transfer.mults,
                event.rate,
                event.start_s - self.t0,
                self.callback(event.on_done),
            )
        callbacks = event.callbacks if type(event) is Call else None
        if callbacks is None or len(callbacks) != 1:
            raise NotSteady(f"an event of type {type(event).__name__}")
        fn = callbacks[0]
        called = _partial_of(fn)
        if called is not None:
            function, args = called
            if function is FairShareNetwork._finish:  # a flow's end at the rate it was given
                flow: _Flow = args[0]
                if args[1] != flow.version:
                    return None  # stale: the flow was re-rated after this was scheduled
                return ("flow ends", self.flow(flow))
            if function is FairShareNetwork._start:  # a flow's latency is over
                return ("flow starts", self.flow(args[0]))
        return ("calls", self.callback(fn))

    def flow(self, flow: _Flow) -> tuple:
        moved = flow.rate * max(self.t0 - flow.updated_s, 0.0)
        return (
            flow.links,
            flow.mults,
            flow.bytes_left - moved,
            flow.rate,
            flow.claimed,
            flow.start_s - self.t0,
            self.seqs.get(flow.seq, -1),
            self.callback(flow.on_done),
        )

    def callback(self, fn: Callback) -> tuple:
        """What a transfer's ``on_done`` finishes, by op (lane, relative position)."""
        lane = self.lane_of_callback.get(id(fn))
        if lane is not None:
            return ("lane op", lane)
        called = _partial_of(fn)
        if called is not None:
            function, args = called
            if function is _Engine._transfer_done:  # a non-blocking op's (index, gpu)
                return ("op", self.op(args[0]))
            if function is _Engine._collective_done:  # a collective's, by its first member
                return ("collective", self.op(args[0]))
            if function is next_phase:  # (start, phases, on_done, the phase to start next)
                return ("phase", args[3], args[1], self.callback(args[2]))
        raise NotSteady(f"a callback {getattr(fn, '__qualname__', '')!r}")


# the functions whose partials are a flow's events: its end at a rate, its latency's end
_FLOW_EVENTS = (FairShareNetwork._finish, FairShareNetwork._start)


def _partial_of(fn: object) -> tuple[object, tuple[Any, ...]] | None:
    """What a `functools.partial` calls, the function (the class's, for a bound method),
    and the arguments it gives first; None for anything else."""
    if type(fn) is not partial:
        return None
    return getattr(fn.func, "__func__", fn.func), fn.args


def same(a: object, b: object, time_tol: float, rel_tol: float = 1e-9) -> bool:
    """Whether two snapshots' states are equal: numbers within ``rel_tol`` or, near
    zero, ``time_tol``; everything else exactly."""
    if type(a) is float or type(b) is float:
        if not isinstance(a, int | float) or not isinstance(b, int | float):
            return False
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=time_tol)
    if type(a) is tuple and type(b) is tuple:
        if len(a) != len(b):
            return False
        if a == b:
            return True
        return all(same(x, y, time_tol, rel_tol) for x, y in zip(a, b, strict=True))
    return a == b
