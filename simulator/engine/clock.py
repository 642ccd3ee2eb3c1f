"""The engine's clock: a heap of (time, sequence, callback), nothing else.

The engine and the network only ever schedule a callback some delay from now. simpy
does that with a Timeout event per call (an object, its callback list, the step
loop's checks); this clock keeps one tuple per call and calls the function. Its order
is simpy's for the same calls: by time, then by the order they were scheduled (simpy's
event id; every event here has simpy's normal priority), so a simulation gives the
same result to the last bit on either. The network also runs on a simpy Environment
(tests drive it from simpy processes): see `after`.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from itertools import count

import simpy


class Clock:
    """Simulated time in seconds; ``after(delay_s, fn)`` calls ``fn()`` then."""

    __slots__ = ("now", "_queue", "_next")

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._next = count().__next__

    def after(self, delay_s: float, fn: Callable[[], None]) -> None:
        if delay_s < 0:
            raise ValueError(f"negative delay {delay_s}")
        heappush(self._queue, (self.now + delay_s, self._next(), fn))

    def run(self) -> None:
        """Call everything scheduled, in time order, until nothing is left."""
        queue = self._queue
        while queue:
            self.now, _, fn = heappop(queue)
            fn()

    @property
    def num_pending(self) -> int:
        return len(self._queue)


def after(env: Clock | simpy.Environment) -> Callable[[float, Callable[[], None]], None]:
    """The clock's way to call ``fn()`` in ``delay_s``: `Clock.after`, or a simpy
    timeout with ``fn`` as its callback."""
    if isinstance(env, Clock):
        return env.after

    def on_simpy(delay_s: float, fn: Callable[[], None]) -> None:
        env.timeout(delay_s).callbacks.append(lambda _event: fn())

    return on_simpy
