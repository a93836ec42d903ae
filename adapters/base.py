"""What every chat platform adapter offers the application runner."""

from __future__ import annotations

from typing import Protocol

from bot.events import Outbox, ThreadKey


class AdapterStartError(Exception):
    """A platform refused to start (bad token, missing permission); ``str()`` is one line naming the setting."""


class ThreadReach(Protocol):
    """Reaches a thread with no inbound message to answer (start-up notices)."""

    def outbox_for(self, key: ThreadKey) -> Outbox | None:
        """An outbox that posts into thread ``key``; None when ``key`` is not one this adapter serves.

        Its ``notify`` and ``post`` work; there is no user message to mark with reactions.
        """


class Adapter(ThreadReach, Protocol):
    """A platform edge: translates events for the dispatcher and posts its replies."""

    async def start(self) -> None:
        """Connect or start listening; return once running. Raises :class:`AdapterStartError`."""

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop taking events; give the turns it started ``grace_s`` to finish, cancel the rest
        (each tells its thread to send the message again), then disconnect."""
