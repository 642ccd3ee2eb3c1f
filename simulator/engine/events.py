"""The engine's events: a function called some delay from now, on a simpy Environment.

The engine and the network only ever ask simpy for one thing: call this function
``delay_s`` from now. A `simpy.Timeout` per call does that with an Event object (its
environment, value, callback list) and a Python ``__init__``; `Call` is the least
`simpy.Environment.step` reads of an event it pops (``callbacks``, then ``_ok``), put
on the queue with `simpy.Environment.schedule` or, on the hot paths, as it puts them
(`queue_of`). The queue, the time and the order stay simpy's: by time, then by the
order things were scheduled (simpy's event counter; every event here has simpy's
normal priority, as a Timeout has), so a simulation gives the same result to the last
bit as with Timeouts, and simpy processes (tests, scripts) can share the Environment.
The engine's `run` pops the queue itself (`engine.core._Engine._run_clock`, `step`
written out), `engine.steady` too.

A callback receives the event it was called from, as a simpy callback does; the
engine's and the network's callbacks ignore it (``on_done(None)`` when called
directly).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast

import simpy
from simpy.events import NORMAL, EventPriority

Callback = Callable[[object], None]


class Scheduled(Protocol):
    """What `simpy.Environment.step` reads of an event it pops besides ``callbacks``
    (each kind of event types its own): ``_ok``, whether it succeeded."""

    @property
    def _ok(self) -> bool: ...


# ``schedule(event, priority, delay_s)``: `simpy.Environment.schedule` for these events
Schedule = Callable[[Scheduled, EventPriority, float], None]


def scheduler(env: simpy.Environment) -> Schedule:
    """``env.schedule`` for the engine's own events (`Call`, the network's flows)."""
    # simpy types its argument as its Event, of which step reads only these two
    return cast(Schedule, env.schedule)


class Call:
    """An event for `simpy.Environment.schedule`: step calls each of ``callbacks`` with
    it, then reads ``_ok`` (always true: a call cannot fail). One object may be
    scheduled again once its callbacks have run (step sets them to None first)."""

    __slots__ = ("callbacks",)
    callbacks: tuple[Callback, ...] | None
    _ok = True


def after(env: simpy.Environment) -> Callable[[float, Callback], None]:
    """``after(env)(delay_s, fn)`` calls ``fn(event)`` when ``delay_s`` has passed on
    ``env``, in simpy's order."""
    schedule = scheduler(env)

    def call_after(delay_s: float, fn: Callback) -> None:
        if delay_s < 0:
            raise ValueError(f"negative delay {delay_s}")
        event = Call()
        event.callbacks = (fn,)
        schedule(event, NORMAL, delay_s)

    return call_after


def queue_of(env: simpy.Environment) -> tuple[list[tuple[Any, ...]], Iterator[int]]:
    """simpy's event queue (a heap of ``(time, priority, event id, event)``) and the
    counter its ``schedule`` numbers events with, for a run loop that pops the queue
    itself and schedules as ``schedule`` does (engine.core, `_Engine._run_clock`):
    ``heappush(queue, (env._now + delay_s, NORMAL, next(eid), event))``. Private to
    simpy 4 (pyproject pins simpy below 5), as `Environment.step` uses them."""
    return env._queue, env._eid
