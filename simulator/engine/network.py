"""How long bytes take: transfers become flows on directed links.

The network's inputs (`Transfer`, `Collective`) and its record (`Interval`) are its
own types, in flows.py. Two models share one method, ``start(transfer, on_done)``,
which calls ``on_done(event)`` when the transfer (or every phase of a collective) has
finished (the event it fired from, or None: callbacks ignore it, see events.py):

- `AnalyticalNetwork`: every transfer runs as if alone on the cluster:
  latency + bytes / bottleneck, where the bottleneck counts only the
  transfer's own flows (a ring crossing one NIC twice gets half of it).
- `FairShareNetwork`: transfers active at the same time share every link
  max-min fairly (progressive filling). A transfer first waits its latency,
  then streams its bytes at the rate the sharing gives it; rates are
  recomputed whenever a flow starts or ends, only for the flows connected
  to the change through shared links, and changes at one instant are
  coalesced into one recompute (maxmin.py: on groups of flows of one shape
  and classes of alike links). A stale wake-up (the flow's rate changed
  since it was scheduled) is ignored by a version counter, because simpy
  cannot cancel a timeout.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import partial
from heapq import heappush

import simpy
from simpy.events import NORMAL

from ..ir.flows import Collective, Interval, Members, Transfer, Uncertified
from .events import Callback, after, queue_of
from .maxmin import max_min

# builds a named tuple from a tuple of its fields, skipping the Python-level __new__
_new = tuple.__new__


def start_phases(
    start: Callable[[Transfer, Callback], None], phases: Collective, on_done: Callback
) -> None:
    """Start each phase when the previous one ends; ``on_done`` after the last."""
    if len(phases) == 1:
        start(phases[0], on_done)
        return
    next_phase(start, phases, on_done, 0)


def next_phase(
    start: Callable[[Transfer, Callback], None],
    phases: Collective,
    on_done: Callback,
    index: int,
    _event: object = None,
) -> None:
    """Start phase ``index``, whose end calls this for the next one (a partial: its
    arguments are what engine/steady.py reads of a pending phase); ``on_done`` after
    the last."""
    if index == len(phases):
        on_done(None)
    else:
        start(phases[index], partial(next_phase, start, phases, on_done, index + 1))


class Network:
    """What both models share: a transfer or collective started now calls ``on_done``
    when it has finished (a callback rather than a simpy event: one event less per
    transfer, and the engine's lanes are driven by callbacks too)."""

    def __init__(
        self,
        env: simpy.Environment,
        capacities: Sequence[float],
        members: Members | None = None,
        uncertified: list[Uncertified] | None = None,
    ) -> None:
        self.env = env  # the engine's, or one that simpy processes share (tests, scripts)
        self._after = after(env)
        # read only: a list is kept as given (a cluster's, megabytes at 100,000 GPUs)
        self.capacities = capacities if type(capacities) is list else list(capacities)
        self.num_transfers = 0
        self.intervals: list[Interval] = []  # every stretch of constant rate, for link stats
        # class mode (comm/classes.py): the members of its coupled transfers, whose rates
        # are certified wherever they are set (`certify_alone`, `certify`); None elsewhere
        self.members = members
        # what failed the certificate: raised at once (None), or gathered here and the
        # run left to go on (the rates after it are not exact mode's; class mode's next
        # run splits them all, and only a run with none is its result)
        self.uncertified = uncertified
        self._alone_certified: set[int] = set()  # links tuples, by identity
        self._failed: set[int] = set()  # links tuples (by identity) that failed once

    @classmethod
    def factory(
        cls,
        capacities: Sequence[float],
        members: Members | None = None,
        uncertified: list[Uncertified] | None = None,
    ) -> NetworkFactory:
        """This model over links of these capacities (bytes/s, by link index), made when
        a simulation starts: the network runs on the engine's clock, which the engine
        creates (see engine.core.simulate). ``members``, ``uncertified``: class mode's
        (`certify`)."""
        return partial(cls, capacities=capacities, members=members, uncertified=uncertified)

    def _uncertified(self, links: tuple[int, ...], error: Uncertified | None) -> None:
        """A failed certificate: raised, or gathered once per transfer."""
        if error is None:
            return
        if self.uncertified is None:
            raise error
        if id(links) not in self._failed:
            self._failed.add(id(links))
            self.uncertified.append(error)

    def certify_alone(self, links: tuple[int, ...], mults: tuple[float, ...]) -> None:
        """Class mode: a coupled transfer alone on its links runs at its tightest link's
        share, which holds a member only if one of that member's links is that tight
        (the certificate, `certify`, with no other flow); Uncertified otherwise."""
        members = self.members
        if members is None or id(links) in self._alone_certified:
            return
        entry = members.get(id(links))
        if entry is not None:
            capacities = self.capacities
            share = [capacities[link] / mult for link, mult in zip(links, mults, strict=True)]
            rate = min(share)
            tight = {link for link, s in zip(links, share, strict=True) if s <= rate * _HELD}
            self._uncertified(links, _check(entry[1], tight))
            self._alone_certified.add(id(links))

    def certify(self, flows: Sequence[_Flow], rates: Sequence[float]) -> None:
        """Class mode: every member of a coupled transfer among ``flows`` (a recompute's
        component, so every flow on their links) held at the transfer's rate by a link
        of its own that is saturated and on which no flow is faster (Bertsekas and
        Gallager's max-min certificate, within `CERTIFY_RTOL`); a transfer whose members
        are not all held is Uncertified (`_uncertified`)."""
        members = self.members
        assert members is not None  # called in class mode only
        watched = [
            (flow, rate)
            for flow, rate in zip(flows, rates, strict=True)
            if id(flow.links) in members
        ]
        if not watched:
            return
        load: dict[int, float] = {}
        fastest: dict[int, float] = {}
        for flow, rate in zip(flows, rates, strict=True):
            for link, mult in zip(flow.links, flow.mults, strict=True):
                load[link] = load.get(link, 0.0) + mult * rate
                if rate > fastest.get(link, 0.0):
                    fastest[link] = rate
        capacities = self.capacities
        for flow, rate in watched:
            held = {
                link
                for link in flow.links
                if load[link] >= capacities[link] * _SATURATED and rate * _HELD >= fastest[link]
            }
            self._uncertified(flow.links, _check(members[id(flow.links)][1], held))

    def start(self, transfer: Transfer | Collective, on_done: Callback) -> None:
        if type(transfer) is not Transfer:
            if len(transfer) > 1:
                start_phases(self.start, transfer, on_done)
                return
            transfer = transfer[0]  # most collectives are one ring: skip the phase chain
        self.num_transfers += 1
        self._start_transfer(transfer, on_done)

    def start_alone(self, transfer: Transfer, on_done: Callback, reuse: bool = True) -> None:
        """`start` for a transfer that no other transfer shares a link with while it runs
        (the caller knows: engine.lookover.alone). The same result as `start`, with less
        bookkeeping. ``reuse``: no other transfer calling the same ``on_done`` overlaps
        (a lane's), so one end event serves them all; else ``on_done`` is this
        transfer's own (a collective's)."""
        self.start(transfer, on_done)

    def transfer(self, transfer: Transfer | Collective) -> simpy.Event:
        """The same as an event, for simpy processes (tests, scripts)."""
        done = self.env.event()

        def succeed(_event: object) -> None:
            done.succeed()

        self.start(transfer, succeed)
        return done

    def _start_transfer(self, transfer: Transfer, on_done: Callback) -> None:
        raise NotImplementedError


# Makes a network on the engine's clock: ``Network.factory(capacities)``.
NetworkFactory = Callable[[simpy.Environment], Network]


# Class mode's certificate: a link is saturated within this relative tolerance of its
# capacity, and a flow as fast as another within it. Progressive filling's roundings
# are near 1e-15, so exact mode's held members pass; members whose own rates would
# differ by less than this pass too, and class mode's result then agrees with exact
# mode's within it (a tighter test would split classes over roundings: more lanes).
CERTIFY_RTOL = 1e-9
_SATURATED = 1 - CERTIFY_RTOL
_HELD = 1 + CERTIFY_RTOL


def _check(entry, held: set[int]) -> Uncertified | None:
    """Uncertified unless every member (its links, its GPUs) has a link in ``held``."""
    holders = [gpus for own, gpus in entry if not own.isdisjoint(held)]
    if len(holders) == len(entry):
        return None
    others = [gpus for own, gpus in entry if own.isdisjoint(held)]
    return Uncertified(
        frozenset(g for gpus in holders for g in gpus),
        frozenset(g for gpus in others for g in gpus),
        f"{len(others)} of {len(entry)} members of a class transfer would run faster alone",
    )


def solo_rate_bytes_per_s(
    links: Sequence[int], mults: Sequence[float], capacities: Sequence[float]
) -> float:
    """Rate of a coupled flow alone on the network: its tightest link divided among its flows."""
    return min(capacities[link] / mult for link, mult in zip(links, mults, strict=True))


class AnalyticalNetwork(Network):
    def _start_transfer(self, transfer: Transfer, on_done: Callback) -> None:
        duration_s = transfer.latency_s
        if transfer.bytes_per_flow > 0 and transfer.links:
            rate = solo_rate_bytes_per_s(transfer.links, transfer.mults, self.capacities)
            start_s = self.env._now + duration_s
            duration_s += transfer.bytes_per_flow / rate
            self.intervals.append(
                Interval(transfer.links, transfer.mults, rate, start_s, self.env._now + duration_s)
            )
        self._after(duration_s, on_done)


class _Flow:
    __slots__ = (
        "seq",
        "links",
        "link_set",  # its links as a frozenset, shared by the flows of one transfer
        "mults",
        "bytes_left",
        "rate",
        "solo_rate",
        "start_s",
        "claimed",
        "updated_s",
        "version",
        "on_done",
        "callbacks",  # a claimed flow is its own end event, see FairShareNetwork
    )
    callbacks: tuple[Callable[[_Flow], None], ...] | None
    _ok = True  # what simpy's Environment.step reads of an event after its callbacks

    def __init__(self, seq: int, transfer: Transfer, on_done: Callback) -> None:
        self.seq = seq
        self.links = transfer.links
        self.link_set: frozenset[int] = frozenset()
        self.mults = transfer.mults
        self.bytes_left = transfer.bytes_per_flow
        self.rate = 0.0
        self.solo_rate = 0.0
        self.start_s = 0.0  # when its latency is over and bytes start to move
        self.claimed = False  # running alone on claimed links, see FairShareNetwork
        self.updated_s = 0.0
        self.version = 0
        self.on_done = on_done


class _Alone:
    """A transfer alone on its links (`FairShareNetwork.start_alone`): its own end event,
    reused for the next one of the same ``on_done`` (they never overlap). ``lane``: the
    engine's lane whose ops' ends the run loop does itself (engine.core, `_run_clock`),
    else -1."""

    __slots__ = ("transfer", "rate", "start_s", "on_done", "lane", "callbacks")
    transfer: Transfer
    rate: float
    start_s: float
    on_done: Callback
    lane: int
    callbacks: tuple[Callable[[_Alone], None], ...] | None
    _ok = True  # what simpy's Environment.step reads of an event after its callbacks

    def __init__(self, on_done: Callback) -> None:
        self.on_done = on_done
        self.lane = -1


class FairShareNetwork(Network):
    def __init__(
        self,
        env: simpy.Environment,
        capacities: Sequence[float],
        members: Members | None = None,
        uncertified: list[Uncertified] | None = None,
    ) -> None:
        super().__init__(env, capacities, members, uncertified)
        # (each distinct capacity once: a cluster's links have a handful)
        assert all(0 < c < float("inf") for c in set(self.capacities)), (
            "link capacities must be finite"
        )
        # Active (ordinary) flows by shape: a shape is a flow's set of links, and the
        # flows of one transfer (ZeRO-2's gradient buckets: tens at a time) share one.
        # The active shapes per link, made for a link when a flow first crosses it (a
        # pattern cluster's links are many), and the active flows of each shape, in start
        # order (dicts keep insertion order: deterministic). A flow of a shape already
        # active costs no loop over its links.
        self._on_link: defaultdict[int, dict[frozenset[int], None]] = defaultdict(dict)
        self._flows_of: dict[frozenset[int], dict[_Flow, None]] = {}
        # the active shapes sharing a link with each active shape (for _component)
        self._neighbours: dict[frozenset[int], dict[frozenset[int], None]] = {}
        # A transfer launched onto idle, unclaimed links claims them: it is scheduled
        # to end at latency + bytes / solo rate with a single event. The first flow to
        # start on a claimed link turns the claimant into an ordinary flow (from its
        # start if it has started, else with a start event of its own), after which
        # the usual max-min sharing applies. Most transfers of a large run never meet
        # another one, and this saves their start event and bookkeeping.
        # links with an active or a claimed flow (set operations run in C: the common
        # case, a transfer onto idle links, costs no Python loop over its links)
        self._busy: set[int] = set()
        # the last flow to claim each link; stale once that flow is no longer claimed
        self._claimant: dict[int, _Flow] = {}
        self._dirty: set[int] = set()
        self._recompute_pending = False
        self._seq = 0
        # solo rate and link set per transfer, by identity (a workload reuses one Transfer
        # for every collective of a kind on a stage); the transfer is kept so its id stays
        # unique
        self._solo: dict[int, tuple[Transfer, float, frozenset[int]]] = {}
        # the link classes of each set of flow shapes met by a recompute (engine.maxmin)
        self._structures: dict = {}
        self._claim_ends = (self._claim_ended,)
        self._alone_ends = (self._alone_ended,)
        self._alone: dict[Callback, _Alone] = {}  # by on_done
        # start_alone's rate and time per transfer, by identity (see _solo)
        self._alone_timing: dict[int, tuple[Transfer, float, float]] = {}
        self._queue, self._eid = queue_of(env)

    def _start_transfer(self, transfer: Transfer, on_done: Callback) -> None:
        if transfer.bytes_per_flow <= 0 or not transfer.links:
            self._after(transfer.latency_s, on_done)
            return
        self._seq += 1
        flow = _Flow(self._seq, transfer, on_done)
        cached = self._solo.get(id(transfer))
        if cached is None:
            cached = self._solo_entry(transfer)
        flow.solo_rate = rate = cached[1]
        flow.link_set = cached[2]
        flow.start_s = self.env._now + transfer.latency_s
        if not self._busy.isdisjoint(flow.links):
            self._start_later(flow)
            return
        # onto idle, unclaimed links: the flow claims them and runs alone
        if self.members is not None:
            self.certify_alone(flow.links, flow.mults)
        flow.claimed = True
        self._busy.update(flow.links)
        self._claimant.update(dict.fromkeys(flow.links, flow))
        flow.rate = rate
        flow.updated_s = flow.start_s
        # version 1, its first end event: the flow itself, scheduled once (events.Call),
        # pushed as simpy's ``schedule`` pushes (events.queue_of)
        flow.version = 1
        flow.callbacks = self._claim_ends
        heappush(
            self._queue,
            (
                self.env._now + (transfer.latency_s + transfer.bytes_per_flow / rate),
                NORMAL,
                next(self._eid),
                flow,
            ),
        )

    def _claim_ended(self, flow: _Flow) -> None:
        self._finish(flow, 1)

    def start_alone(self, transfer: Transfer, on_done: Callback, reuse: bool = True) -> None:
        """What a transfer claiming idle links does (`_start_transfer`), without the
        claim: no other flow will ever start on its links while it runs, so it stays
        claimed from start to end and no table needs to know it. One end event, at the
        same time and in the same order; the same interval recorded at its end. Its rate
        and its time, latency + bytes / rate, are worked out once per transfer (the same
        floats each time), and the event goes on simpy's queue as ``schedule`` puts it
        (events.queue_of). The end event is kept for the next transfer of the same
        ``on_done`` (``reuse``: a lane's, one at a time), else made for this one (a
        collective's ``on_done`` is its own)."""
        self.num_transfers += 1
        timing = self._alone_timing.get(id(transfer))
        if timing is None:
            timing = self._alone_timing_entry(transfer)
            if self.members is not None:
                self.certify_alone(transfer.links, transfer.mults)
        rate = timing[1]
        if rate == 0.0:  # no bytes or no links: its latency only
            self._after(transfer.latency_s, on_done)
            return
        if reuse:
            event = self._alone.get(on_done)
            if event is None:
                event = self.alone_event(on_done)
        else:
            event = _Alone(on_done)
        now = self.env._now
        event.transfer = transfer
        event.rate = rate
        event.start_s = now + transfer.latency_s
        event.callbacks = self._alone_ends
        heappush(self._queue, (now + timing[2], NORMAL, next(self._eid), event))

    def alone_event(self, on_done: Callback) -> _Alone:
        """The end event of the transfers alone on their links that call ``on_done``
        (one at a time: a lane's), made once."""
        event = self._alone.get(on_done)
        if event is None:
            event = self._alone[on_done] = _Alone(on_done)
        return event

    def _alone_timing_entry(self, transfer: Transfer) -> tuple[Transfer, float, float]:
        """A transfer alone on its links: its rate (0 when it moves no bytes) and its
        time from start to end; the transfer is kept so that its id stays unique."""
        if transfer.bytes_per_flow <= 0 or not transfer.links:
            entry = (transfer, 0.0, transfer.latency_s)
        else:
            rate = solo_rate_bytes_per_s(transfer.links, transfer.mults, self.capacities)
            entry = (transfer, rate, transfer.latency_s + transfer.bytes_per_flow / rate)
        self._alone_timing[id(transfer)] = entry
        return entry

    def _alone_ended(self, event: _Alone) -> None:
        now, start_s = self.env._now, event.start_s
        if now > start_s:  # as _close_interval (its rate, a solo rate, is positive)
            transfer = event.transfer
            self.intervals.append(
                _new(Interval, (transfer.links, transfer.mults, event.rate, start_s, now))
            )
        event.on_done(None)

    def _start_later(self, flow: _Flow) -> None:
        """An ordinary flow: it starts sharing links when its latency is over."""
        delay_s = max(flow.start_s - self.env._now, 0.0)
        self._after(delay_s, partial(self._start, flow))

    def _release_claims(self, links: Sequence[int]) -> None:
        """Turn the claimants of these links into ordinary flows."""
        now = self.env._now
        for link in links:
            flow = self._claimant.get(link)
            if flow is None or not flow.claimed:
                continue
            flow.claimed = False
            if flow.start_s <= now:
                # streaming at its solo rate since start_s; its end event stays valid
                # until a recompute re-rates it
                self._add(flow)
            else:
                self._busy.difference_update(own for own in flow.links if not self._on_link[own])
                flow.version += 1  # its end event is void
                flow.rate = 0.0
                self._start_later(flow)

    def _solo_entry(self, transfer: Transfer) -> tuple[Transfer, float, frozenset[int]]:
        rate = solo_rate_bytes_per_s(transfer.links, transfer.mults, self.capacities)
        entry = self._solo[id(transfer)] = (transfer, rate, frozenset(transfer.links))
        return entry

    def link_load_bytes_per_s(self) -> list[float]:
        """Bytes/s each link carries right now (multiplicities included)."""
        load = [0.0] * len(self.capacities)
        for link, shapes in self._on_link.items():
            for flow in sorted((f for shape in shapes for f in self._flows_of[shape]), key=_by_seq):
                load[link] += flow.rate * flow.mults[flow.links.index(link)]
        for link, flow in self._claimant.items():
            if flow.claimed and flow.start_s <= self.env._now:
                load[link] += flow.rate * flow.mults[flow.links.index(link)]
        return load

    # -- flow lifecycle ----------------------------------------------------------------

    def _start(self, flow: _Flow, _event: object = None) -> None:
        self._release_claims(flow.links)
        self._busy.update(flow.links)
        flow.updated_s = self.env._now
        if self._add(flow):
            # Nothing else on its links: max-min gives the solo rate, no recompute needed.
            # A flow joining later (even at this instant) marks the links and re-rates it.
            if self.members is not None:
                self.certify_alone(flow.links, flow.mults)
            self._set_rate(flow, flow.solo_rate)
        else:
            self._mark_dirty(flow.links)

    def _finish(self, flow: _Flow, version: int, _event: object = None) -> None:
        if version != flow.version:
            return  # its rate changed after this wake-up was scheduled
        if flow.claimed:  # alone from start to end
            flow.claimed = False
            self._busy.difference_update(flow.links)
            self._close_interval(flow, self.env._now)
            flow.on_done(None)
            return
        shared = self._remove(flow)
        self._close_interval(flow, self.env._now)
        flow.bytes_left = 0.0
        flow.rate = 0.0
        if shared:  # only flows on these links can speed up
            self._mark_dirty(shared)
        flow.on_done(None)

    def _add(self, flow: _Flow) -> bool:
        """Make the flow active on its links; whether no other flow was on them."""
        shape = flow.link_set
        flows = self._flows_of.get(shape)
        if flows is not None:  # its shape is on its links already
            flows[flow] = None
            return False
        self._flows_of[shape] = {flow: None}
        neighbours: dict[frozenset[int], None] = {}
        on_link = self._on_link
        for link in flow.links:
            shapes = on_link[link]
            if shapes:
                neighbours.update(shapes)
            shapes[shape] = None
        self._neighbours[shape] = neighbours
        for other in neighbours:
            self._neighbours[other][shape] = None
        return not neighbours

    def _remove(self, flow: _Flow) -> Sequence[int]:
        """Take the flow off its links; the links other flows are still on (the others
        are no longer busy)."""
        shape = flow.link_set
        flows = self._flows_of[shape]
        del flows[flow]
        if flows:  # others of its shape are on all its links
            return flow.links
        del self._flows_of[shape]
        for other in self._neighbours.pop(shape):
            del self._neighbours[other][shape]
        shared = []
        on_link = self._on_link
        for link in flow.links:
            shapes = on_link[link]
            del shapes[shape]
            if shapes:
                shared.append(link)
            else:
                self._busy.discard(link)
        return shared

    def _set_rate(self, flow: _Flow, rate: float) -> None:
        """Give the flow a new rate and schedule its end at that rate."""
        flow.rate = rate
        flow.version += 1
        self._after(max(flow.bytes_left, 0.0) / rate, partial(self._finish, flow, flow.version))

    def _close_interval(self, flow: _Flow, now: float) -> None:
        if flow.rate > 0 and now > flow.updated_s:
            self.intervals.append(
                _new(Interval, (flow.links, flow.mults, flow.rate, flow.updated_s, now))
            )

    def _mark_dirty(self, links: Sequence[int]) -> None:
        self._dirty.update(links)
        if not self._recompute_pending:
            self._recompute_pending = True
            self._after(0, self._recompute)

    # -- max-min fair rates ------------------------------------------------------------

    def _recompute(self, _event: object = None) -> None:
        self._recompute_pending = False
        dirty = sorted(self._dirty)
        self._dirty.clear()
        flows = self._component(dirty)
        if not flows:
            return
        now = self.env._now
        for flow in flows:
            self._close_interval(flow, now)
            flow.bytes_left -= flow.rate * (now - flow.updated_s)
            flow.updated_s = now
        rates = max_min(flows, self.capacities, self._structures)
        if self.members is not None:
            self.certify(flows, rates)
        for flow, rate in zip(flows, rates, strict=True):
            if rate != flow.rate:
                self._set_rate(flow, rate)

    def _component(self, links: list[int]) -> list[_Flow]:
        """Every active flow connected to these links through shared links, in start order:
        the flows of the shapes on these links and of the shapes reachable from them
        through shapes sharing a link."""
        on_link = self._on_link
        seen: dict[frozenset[int], None] = {}
        for link in links:
            seen.update(on_link[link])
        stack = list(seen)
        neighbours = self._neighbours
        while stack:
            for other in neighbours[stack.pop()]:
                if other not in seen:
                    seen[other] = None
                    stack.append(other)
        flows_of = self._flows_of
        return sorted((flow for shape in seen for flow in flows_of[shape]), key=_by_seq)


def _by_seq(flow: _Flow) -> int:
    return flow.seq
