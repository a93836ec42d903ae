"""What every chat platform adapter offers the application runner (:class:`ThreadReach` is the
core's: it reaches threads with no message to answer)."""

from __future__ import annotations

from typing import Protocol

from bot.events import ThreadReach


class AdapterStartError(Exception):
    """A platform refused to start (bad token, missing permission); ``str()`` is one line naming the setting."""


class Adapter(ThreadReach, Protocol):
    """A platform edge: translates events for the dispatcher and posts its replies."""

    async def start(self) -> None:
        """Connect or start listening; return once running. Raises :class:`AdapterStartError`."""

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop taking events; give the turns it started ``grace_s`` to finish, cancel the rest
        (each tells its thread to send the message again), then disconnect."""
