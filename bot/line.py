"""One turn at a time per thread, in the order its messages arrived, across replicas.

The line of a thread's turns is in the store (``Store.turns`` hands out tickets), so it holds
across replicas: a turn waits until no earlier ticket of its thread is left, woken at once by
a turn ending in this process and by polling for one ending on another replica. A queued or
running turn stays marked in the store until it ends, so the turns of a process that died are
found and their threads told (here, when a later message finds them ahead of it, and by
``bot.app.tell_interrupted``).

:class:`ThreadLine` gives the admission chain (:mod:`bot.admission`) two of its rules:
:meth:`~ThreadLine.in_order` first (this process takes a thread's messages into the chain in the
order they arrived, though the store's connections may answer in any order) and
:meth:`~ThreadLine.queue` after the duplicate rule (the turn takes its ticket, waits for its
place, and is unmarked however it ends).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from bot.chain import Arrival, Next
from bot.events import ThreadKey
from bot.store import Store

QUEUED_NOTICE = "⏳ I'm still working on the previous message in this thread; yours is queued and comes next."
RESTART_NOTICE = "🔁 I was restarted while working on this message; please send it again."
#: Posted at start-up into a thread whose turn an unclean stop (kill -9, crash) cut off.
INTERRUPTED_NOTICE = "🔁 I was restarted while working on your message; please send it again."

#: How often a queued turn looks whether the turn ahead of it ended on another replica (a
#: turn ending in this process wakes it at once); with SQLite there is no other replica.
POLL_SHARED_S = 0.2
POLL_ALONE_S = 2.0


@dataclass
class _ThreadSlot:
    """This process's messages of one thread; dropped again when none is left."""

    #: Set (and replaced) each time a turn of the thread ends here.
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    #: Held from a message's arrival until its turn is queued in the store (a FIFO lock).
    intake: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0

    def wake(self) -> None:
        """Wake every turn of the thread waiting here."""
        self.ended.set()
        self.ended = asyncio.Event()


class ThreadLine:
    """The line of each thread's turns (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._slots: dict[ThreadKey, _ThreadSlot] = {}

    def arrive(self, arrival: Arrival) -> None:
        """Take the message's place in its thread's line here; call before any await, so the
        line keeps the order messages arrived in. :meth:`leave` when it is handled."""
        self._slots.setdefault(arrival.message.key, _ThreadSlot()).users += 1

    def leave(self, arrival: Arrival) -> None:
        """The message is handled: wake the turns behind it; forget the thread when none is left."""
        key = arrival.message.key
        slot = self._slots[key]
        slot.users -= 1
        slot.wake()
        if slot.users == 0:
            del self._slots[key]

    def waiting_turns(self) -> list[int]:
        """For each thread with messages of this process waiting behind its running turn: how many (metrics)."""
        return [slot.users - 1 for slot in self._slots.values() if slot.users > 1]

    async def in_order(self, arrival: Arrival, proceed: Next) -> None:
        """Rule: the rules up to the queue see a thread's messages one at a time, in arrival order."""
        intake = self._slots[arrival.message.key].intake
        await intake.acquire()
        arrival.intake_held = True
        try:
            await proceed()
        finally:
            if arrival.intake_held:  # stopped before the queue took it
                arrival.intake_held = False
                intake.release()

    async def queue(self, arrival: Arrival, proceed: Next) -> None:
        """Rule: the turn takes its ticket (then the next message may enter), waits for its
        place (told it is queued when a turn is ahead), runs; unmarked however it ends. On
        shutdown the thread is told to send its message again."""
        message, outbox = arrival.message, arrival.outbox
        slot = self._slots[message.key]
        try:
            queued = await self._store.turns.begin(message.key, message.message_id)
        finally:
            arrival.intake_held = False
            slot.intake.release()
        try:
            if queued.ahead:  # else it is first in line already
                await outbox.notify(QUEUED_NOTICE)
                await self._wait(arrival, queued.ticket, slot)
            await proceed()
        except asyncio.CancelledError:
            # The bot is shutting down mid-turn: say so, so nobody waits for an answer that never comes.
            with contextlib.suppress(Exception):
                await asyncio.shield(outbox.notify(RESTART_NOTICE))
                # Told now, so the next start must not tell again; if the notice failed, the
                # in-flight mark stays and the next start tells the thread instead.
                await asyncio.shield(self._store.turns.end(message.key, message.message_id))
            raise
        except BaseException:
            await self._store.turns.end(message.key, message.message_id)
            raise
        await self._store.turns.end(message.key, message.message_id)

    async def _wait(self, arrival: Arrival, ticket: int, slot: _ThreadSlot) -> None:
        key, outbox = arrival.message.key, arrival.outbox
        poll = POLL_SHARED_S if self._store.shared else POLL_ALONE_S
        while True:
            check = await self._store.turns.check(key, ticket)
            if check.interrupted:  # the turn ahead died with its replica: the thread hears it once
                await outbox.notify(INTERRUPTED_NOTICE)
            if check.ready:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slot.ended.wait(), poll)
