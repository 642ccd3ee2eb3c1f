"""The one error a user's scenario can cause, carrying what went wrong as data."""

from __future__ import annotations

from typing import Any

MAX_VALUE = 200  # characters of a value an error line echoes (its repr)
MAX_MESSAGE = 1_000  # characters of a whole error line


def elided(text: str, most: int) -> str:
    """``text`` when at most ``most`` characters, else its start and end with the middle
    elided, saying how long it was: an error line stays a line to read, whatever was
    typed or read (a 100 kB --set value, a file's name)."""
    if len(text) <= most:
        return text
    gap = f" ...({len(text):,} characters)... "
    keep = max(most - len(gap), 2)
    head = keep * 2 // 3
    return text[:head] + gap + text[len(text) - (keep - head) :]


def shown(value: Any) -> str:
    """A value as an error line echoes it: its repr, elided past MAX_VALUE characters."""
    return elided(repr(value), MAX_VALUE)


class ScenarioError(ValueError):
    """A scenario a user wrote is not valid; ``str()`` says why in one line.

    Besides the line, the error carries its parts for callers that act on them (the
    search groups the layouts it rejects by ``key``): ``key`` the scenario key at
    fault (``section.key``), ``value`` its value, ``rule`` what the value breaks and
    ``fix`` what to change. Built from parts, the line reads ``key=value rule; fix``;
    a rule whose sentence reads otherwise passes the whole line as ``message``. The
    line echoes at most MAX_VALUE characters of the value and is at most MAX_MESSAGE
    long, elided in the middle past them (``value`` keeps the whole value).
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        key: str | None = None,
        value: Any = None,
        rule: str | None = None,
        fix: str | None = None,
    ) -> None:
        if message is None:
            message = f"{key}={shown(value)} {rule}" + (f"; {fix}" if fix else "")
        super().__init__(elided(message, MAX_MESSAGE))
        self.key = key
        self.value = value
        self.rule = rule
        self.fix = fix
