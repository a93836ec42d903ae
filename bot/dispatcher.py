"""The cross-cutting rules for every inbound message, in one place.

Order: ignore bots → allow-list → ignore unmentioned messages in threads the bot has no
session for → drop duplicates (the claim is in the store, so across replicas too) → one turn at
a time per thread, in order (others queue, and are told) → in-thread command or agent turn.
Adapters call :meth:`Dispatcher.handle` for messages, :meth:`Dispatcher.stop` for a Stop
button, :meth:`Dispatcher.feedback` for 👍/👎, and :meth:`Dispatcher.admits` where a platform
must answer before any message exists (a Discord slash command is acknowledged or refused at
once).

The line of a thread's turns is in the store (``Store.begin_turn`` hands out tickets), so it
holds across replicas: a turn waits until no earlier ticket of its thread is left, woken at
once by a turn ending in this process and by polling for one ending on another replica. A
queued or running turn stays marked in the store until it ends, so the turns of a process that
died are found and their threads told (here, when a later message finds them ahead of it, and
by ``bot.app.tell_interrupted``).

Replicas share no kernels: before a turn, a replica whose kernel of the thread is older than
another replica's turn drops it (the next kernel restores the saved variables), and with a
shared store every turn ends by saving the thread's variables for whichever replica is next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from bot import logs, metrics
from bot.commands import Commands
from bot.config import Settings
from bot.events import InboundMessage, Outbox, ThreadKey
from bot.hostpaths import HostPaths
from bot.outgoing import hiding_paths
from bot.store import QueuedTurn, Store
from bot.turn import TurnRunner, kernel_options
from kernels import KernelPool

log = logging.getLogger(__name__)

QUEUED_NOTICE = "⏳ I'm still working on the previous message in this thread; yours is queued and comes next."
RESTART_NOTICE = "🔁 I was restarted while working on this message; please send it again."
#: Posted at start-up into a thread whose turn an unclean stop (kill -9, crash) cut off.
INTERRUPTED_NOTICE = "🔁 I was restarted while working on your message; please send it again."
FAILURE_NOTICE = "⚠️ Something went wrong on my side while handling that message. Please try again."

#: How often a queued turn looks whether the turn ahead of it ended on another replica (a
#: turn ending in this process wakes it at once); with SQLite there is no other replica.
POLL_SHARED_S = 0.2
POLL_ALONE_S = 2.0
#: How often a running turn looks whether Stop was pressed on another replica.
STOP_POLL_S = 1.0


@dataclass
class _ThreadSlot:
    """This process's messages of one thread; dropped again when none is left."""

    #: Set (and replaced) each time a turn of the thread ends here.
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    #: Held from a message's arrival until its turn is queued in the store (a FIFO lock), so
    #: this process queues a thread's messages in the order they arrived, though the store's
    #: connections may answer in any order.
    intake: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0

    def wake(self) -> None:
        """Wake every turn of the thread waiting here."""
        self.ended.set()
        self.ended = asyncio.Event()


class Dispatcher:
    """Applies the bot's rules to each message and runs the resulting turn."""

    def __init__(
        self, *, settings: Settings, store: Store, turns: TurnRunner, commands: Commands, pool: KernelPool
    ) -> None:
        self._settings = settings
        self._store = store
        self._turns = turns
        self._commands = commands
        self._pool = pool
        self._slots: dict[ThreadKey, _ThreadSlot] = {}
        self._host_paths = HostPaths.of(settings)

    async def handle(self, message: InboundMessage, outbox: Outbox) -> None:
        """Handle one inbound message end to end. Never raises, except to pass on cancellation."""
        outbox = hiding_paths(outbox, self._host_paths)  # no host path reaches any platform
        slot = self._slots.setdefault(message.key, _ThreadSlot())  # before any await: arrival order
        slot.users += 1
        log_context = logs.enter_turn(message.key, message.message_id)  # every line logged for it names it
        try:
            async with slot.intake:
                if not await self._accepts(message):
                    return
                queued = await self._store.begin_turn(str(message.key), message.message_id)
            await self._serialised(message, outbox, queued, slot)
        except asyncio.CancelledError:
            # The bot is shutting down mid-turn: say so, so nobody waits for an answer that never comes.
            with contextlib.suppress(Exception):
                await asyncio.shield(outbox.notify(RESTART_NOTICE))
                # Told now, so the next start must not tell again; if the notice failed, the
                # in-flight mark stays and the next start tells the thread instead.
                await asyncio.shield(self._store.end_turn(str(message.key), message.message_id))
            raise
        except Exception:
            log.exception("turn failed for %s message %s", message.key, message.message_id)
            try:
                await outbox.notify(FAILURE_NOTICE)
            except Exception:
                log.exception("could not report the failure to %s", message.key)
        finally:
            logs.leave_turn(log_context)
            slot.users -= 1
            slot.wake()
            if slot.users == 0:
                self._slots.pop(message.key, None)

    def waiting_turns(self) -> list[int]:
        """For each thread with messages of this process waiting behind its running turn: how many (metrics)."""
        return [slot.users - 1 for slot in self._slots.values() if slot.users > 1]

    async def stop(self, key: ThreadKey) -> bool:
        """Interrupt the running turn of a thread (the Stop button), on whichever replica runs
        it. True if one was running."""
        if await self._turns.stop(key):
            return True
        return self._store.shared and await self._store.request_stop(str(key))

    async def feedback(self, key: ThreadKey, turn_id: str, user_id: str, good: bool) -> None:
        """Store a 👍 (``good``) or 👎 click on the answer to message ``turn_id`` of thread ``key``."""
        try:
            await self._store.add_feedback(str(key), turn_id, user_id, good=good)
        except Exception:
            log.exception("could not store feedback on %s in %s", turn_id, key)

    def admits(self, *, platform: str, channel: str, user_id: str) -> bool:
        """The allow-list rule alone, for adapters that must decide before opening a thread."""
        access = self._settings.access
        if (
            access.allow_channels
            and f"{platform}:{channel}" not in access.allow_channels
            and channel not in access.allow_channels
        ):
            log.info("ignored message in channel %s:%s: not in access.allow_channels", platform, channel)
            return False
        if access.allow_users and user_id not in access.allow_users:
            log.info("ignored message from user %s: not in access.allow_users", user_id)
            return False
        return True

    async def _accepts(self, message: InboundMessage) -> bool:
        key = message.key
        if message.is_bot:
            return False
        if not self.admits(platform=key.platform, channel=key.channel, user_id=message.user_id):
            return False
        if not message.mentioned and not message.is_dm and not await self._store.thread_exists(str(key)):
            return False
        if not await self._store.claim_message(f"{key.platform}:{message.message_id}"):
            log.info("dropped duplicate delivery of %s in %s", message.message_id, key)
            return False
        return True  # the thread's row is made (or marked active) when its turn is queued

    async def _serialised(self, message: InboundMessage, outbox: Outbox, queued: QueuedTurn, slot: _ThreadSlot) -> None:
        """Wait for the queued turn's turn, run it; its mark in the store goes when it ends."""
        key = str(message.key)
        try:
            if queued.ahead:  # else it is first in line already
                await outbox.notify(QUEUED_NOTICE)
                await self._wait_for_turn(key, queued.ticket, slot, outbox)
            await self._run_turn(message, outbox)
        except asyncio.CancelledError:
            raise  # shutdown: handle() clears the mark once the restart notice is out
        except BaseException:
            await self._store.end_turn(key, message.message_id)
            raise
        await self._store.end_turn(key, message.message_id)

    async def _wait_for_turn(self, key: str, ticket: int, slot: _ThreadSlot, outbox: Outbox) -> None:
        poll = POLL_SHARED_S if self._store.shared else POLL_ALONE_S
        while True:
            check = await self._store.check_turn(key, ticket)
            if check.interrupted:  # the turn ahead died with its replica: the thread hears it once
                await outbox.notify(INTERRUPTED_NOTICE)
            if check.ready:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slot.ended.wait(), poll)

    async def _run_turn(self, message: InboundMessage, outbox: Outbox) -> None:
        """Run the turn with this replica's kernel up to date, and leave the variables saved
        for the next replica when replicas share the store."""
        key = str(message.key)
        await self._take_kernel(message.key)
        if not self._store.shared:
            await self._run(message, outbox)
            return
        watcher = asyncio.create_task(self._watch_for_stop(message), name=f"stop-watch {message.message_id}")
        try:
            await self._run(message, outbox)
        finally:
            watcher.cancel()
        await self._pool.save(key)
        session = self._pool.get(key)
        await self._store.record_kernel(key, session.remote_id if session is not None else None)

    async def _take_kernel(self, thread: ThreadKey) -> None:
        """Make this replica's kernel of the thread the one that holds its variables: when
        another replica served the thread since, drop ours (out of date); when that replica is
        gone, take over its gateway kernel if it still runs (variables live), else the next
        kernel restores the saved variables."""
        key = str(thread)
        if not self._store.shared:
            return  # one process: any other owner was an earlier process, whose kernels are gone
        owner = await self._store.claim_kernel(key)
        if owner is None or owner.run == self._store.run:
            return
        if owner.gone and owner.remote_id is not None:
            options = kernel_options(self._settings, thread)
            if await self._pool.take_over(key, owner.remote_id, options):
                log.info("took over the kernel of %s from a replica that is gone", key)
                return
        await self._pool.discard(key)

    async def _watch_for_stop(self, message: InboundMessage) -> None:
        """Stop this turn when Stop was pressed on another replica."""
        while True:
            await asyncio.sleep(STOP_POLL_S)
            try:
                if await self._store.stop_requested(str(message.key), message.message_id):
                    await self._turns.stop(message.key)
                    return
            except Exception:
                log.exception("could not look for a Stop of %s", message.key)

    async def _run(self, message: InboundMessage, outbox: Outbox) -> None:
        with metrics.turn():  # counts the turn by its outcome, and times it
            if not message.attachments and await self._commands.try_run(message, outbox):
                metrics.turn_outcome("command")
                return
            await self._turns.run(message, outbox)
