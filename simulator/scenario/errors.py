"""The one error a user's scenario can cause, carrying what went wrong as data."""

from __future__ import annotations

from typing import Any


class ScenarioError(ValueError):
    """A scenario a user wrote is not valid; ``str()`` says why in one line.

    Besides the line, the error carries its parts for callers that act on them (the
    search groups the layouts it rejects by ``key``): ``key`` the scenario key at
    fault (``section.key``), ``value`` its value, ``rule`` what the value breaks and
    ``fix`` what to change. Built from parts, the line reads ``key=value rule; fix``;
    a rule whose sentence reads otherwise passes the whole line as ``message``.
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
            message = f"{key}={value!r} {rule}" + (f"; {fix}" if fix else "")
        super().__init__(message)
        self.key = key
        self.value = value
        self.rule = rule
        self.fix = fix
