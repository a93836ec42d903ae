"""What every chat platform adapter offers the application runner (:class:`ThreadReach` is the
core's: it reaches threads with no message to answer), and what the platform adapters share.

:class:`PlatformAdapter` holds an adapter's background tasks and its shutdown: stop taking
events, give the turns under way a grace period, cancel the rest (each tells its thread to send
its message again), then disconnect. Every message goes to the core the same way,
:meth:`PlatformAdapter.dispatch`, where the one admission chain decides (``bot.admission``).
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from typing import Protocol

from adapters.tasks import BackgroundTasks
from bot.dispatcher import Dispatcher
from bot.events import InboundMessage, Outbox, ThreadReach

log = logging.getLogger(__name__)


class AdapterStartError(Exception):
    """A platform refused to start (bad token, missing permission); ``str()`` is one line naming the setting."""


class Adapter(ThreadReach, Protocol):
    """A platform edge: translates events for the dispatcher and posts its replies."""

    async def start(self) -> None:
        """Connect or start listening; return once running. Raises :class:`AdapterStartError`."""

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop taking events; give the turns it started ``grace_s`` to finish, cancel the rest
        (each tells its thread to send the message again), then disconnect."""


class PlatformAdapter(ABC):
    """The shared part of a chat platform's adapter: its tasks, how a message reaches the
    core, and :meth:`stop`. Subclasses say how to stop taking events and how to disconnect."""

    def __init__(self, dispatcher: Dispatcher, *, label: str) -> None:
        """``label``: the platform's name in log lines (``Slack``, ``Discord``)."""
        self._dispatcher = dispatcher
        self._label = label
        self._tasks = BackgroundTasks(log, label)

    def dispatch(self, message: InboundMessage, outbox: Outbox, *, name: str) -> asyncio.Task[None]:
        """Hand ``message`` to the core, the one way every platform and the console do: a
        background task named ``name`` (held, so :meth:`stop` lets it finish or cancels it) in
        which the admission chain, the thread's line of turns and the turn all run. Await the
        task where the platform must know when the message is handled."""
        return self._tasks.spawn(self._dispatcher.handle(message, outbox), name=name)

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop taking events; give running turns ``grace_s`` to finish, cancel the rest (each
        tells its thread), then disconnect."""
        await self._stop_intake()
        if grace_s > 0 and not await self._tasks.drain(grace_s):
            log.warning(
                "%s: %d turn(s) still running after %.0f s; cutting them off", self._label, len(self._tasks), grace_s
            )
        await self._tasks.cancel_all()
        await self._disconnect()

    async def wait_idle(self) -> None:
        """Wait until every task started so far has finished (tests, graceful shutdown)."""
        await self._tasks.drain()

    @abstractmethod
    async def _stop_intake(self) -> None:
        """Take no new events (the connection may stay up so running turns can answer)."""

    @abstractmethod
    async def _disconnect(self) -> None:
        """Close every connection; called once the tasks have ended."""
