"""Every inbound message, end to end: the admission chain, the thread's line of turns, the turn.

Adapters call :meth:`Dispatcher.handle` for messages, :meth:`Dispatcher.may_open` where a
platform must decide before any message exists (a Discord thread opened for a mention, a
slash command acknowledged at once), :meth:`Dispatcher.stop` for a Stop button and
:meth:`Dispatcher.feedback` for 👍/👎. Which messages become turns is :mod:`bot.admission`
(author, mention, access, duplicate, then the queue, then the budget); this module runs that
chain and the turn or in-thread command it admits.

The line of a thread's turns is in the store (``Store.turns`` hands out tickets), so it
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
from bot.admission import Admission
from bot.commands import Commands
from bot.config import Settings
from bot.events import InboundMessage, Outbox, Reply, ThreadKey
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
        self,
        *,
        settings: Settings,
        store: Store,
        admission: Admission,
        turns: TurnRunner,
        commands: Commands,
        pool: KernelPool,
    ) -> None:
        self._settings = settings
        self._store = store
        self._admission = admission
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
                if not await self._admission.screen(message):
                    return
                queued = await self._store.turns.begin(message.key, message.message_id)
            await self._serialised(message, outbox, queued, slot)
        except asyncio.CancelledError:
            # The bot is shutting down mid-turn: say so, so nobody waits for an answer that never comes.
            with contextlib.suppress(Exception):
                await asyncio.shield(outbox.notify(RESTART_NOTICE))
                # Told now, so the next start must not tell again; if the notice failed, the
                # in-flight mark stays and the next start tells the thread instead.
                await asyncio.shield(self._store.turns.end(message.key, message.message_id))
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

    def running(self, key: ThreadKey) -> bool:
        """Whether a turn of the thread runs in this process now."""
        return self._turns.running(key)

    def may_stop(self, key: ThreadKey, user_id: str) -> bool:
        """Whether ``user_id`` may stop turns in ``key``'s thread: whoever the access lists admit
        to its channel (:meth:`bot.admission.Admission.may_open`); anyone else's Stop is logged
        and ignored."""
        if self._admission.may_open(platform=key.platform, channel=key.channel, user_id=user_id):
            return True
        log.warning("ignored Stop from %s in %s: not admitted by access", user_id, key)
        return False

    async def stop(self, key: ThreadKey, *, user_id: str) -> bool:
        """Interrupt the running turn of a thread (the Stop button), on whichever replica runs
        it, when ``user_id`` :meth:`may_stop` it. True if one was running and was stopped."""
        if not self.may_stop(key, user_id):
            return False
        if await self._turns.stop(key):
            return True
        return self._store.shared and await self._store.turns.request_stop(key)

    async def feedback(self, key: ThreadKey, turn_id: str, user_id: str, good: bool) -> None:
        """Store a 👍 (``good``) or 👎 click on the answer to message ``turn_id`` of thread ``key``."""
        try:
            await self._store.feedback.add(key, turn_id, user_id, good=good)
        except Exception:
            log.exception("could not store feedback on %s in %s", turn_id, key)

    async def first_visit(self, *, platform: str, workspace: str, channel: str, user_id: str) -> bool:
        """Whether a person opening the bot's home (Slack's Messages tab, ``channel`` their DM)
        is greeted now: the first time ever, on any replica, and only when access admits them."""
        if not self._admission.may_open(platform=platform, channel=channel, user_id=user_id):
            return False
        return await self._store.greetings.claim(platform, workspace, user_id)

    def may_open(self, *, platform: str, channel: str, user_id: str, is_bot: bool = False) -> bool:
        """Whether a person may open a session here, for a platform that must decide before a
        message exists (:meth:`bot.admission.Admission.may_open`)."""
        return self._admission.may_open(platform=platform, channel=channel, user_id=user_id, is_bot=is_bot)

    async def _serialised(self, message: InboundMessage, outbox: Outbox, queued: QueuedTurn, slot: _ThreadSlot) -> None:
        """Wait for the queued turn's turn, run it; its mark in the store goes when it ends."""
        key = message.key
        try:
            if queued.ahead:  # else it is first in line already
                await outbox.notify(QUEUED_NOTICE)
                await self._wait_for_turn(key, queued.ticket, slot, outbox)
            await self._run_turn(message, outbox)
        except asyncio.CancelledError:
            raise  # shutdown: handle() clears the mark once the restart notice is out
        except BaseException:
            await self._store.turns.end(key, message.message_id)
            raise
        await self._store.turns.end(key, message.message_id)

    async def _wait_for_turn(self, key: ThreadKey, ticket: int, slot: _ThreadSlot, outbox: Outbox) -> None:
        poll = POLL_SHARED_S if self._store.shared else POLL_ALONE_S
        while True:
            check = await self._store.turns.check(key, ticket)
            if check.interrupted:  # the turn ahead died with its replica: the thread hears it once
                await outbox.notify(INTERRUPTED_NOTICE)
            if check.ready:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slot.ended.wait(), poll)

    async def _run_turn(self, message: InboundMessage, outbox: Outbox) -> None:
        """Run the turn with this replica's kernel up to date, and leave the variables saved
        for the next replica when replicas share the store."""
        await self._take_kernel(message.key)
        if not self._store.shared:
            await self._run(message, outbox)
            return
        watcher = asyncio.create_task(self._watch_for_stop(message), name=f"stop-watch {message.message_id}")
        try:
            await self._run(message, outbox)
        finally:
            watcher.cancel()
        kernel_key = str(message.key)  # the kernel layer's name of the thread
        await self._pool.save(kernel_key)
        session = self._pool.get(kernel_key)
        await self._store.kernel_owners.record(message.key, session.remote_id if session is not None else None)

    async def _take_kernel(self, thread: ThreadKey) -> None:
        """Make this replica's kernel of the thread the one that holds its variables: when
        another replica served the thread since, drop ours (out of date); when that replica is
        gone, take over its gateway kernel if it still runs (variables live), else the next
        kernel restores the saved variables."""
        if not self._store.shared:
            return  # one process: any other owner was an earlier process, whose kernels are gone
        owner = await self._store.kernel_owners.claim(thread)
        if owner is None or owner.run == self._store.replicas.run:
            return
        key = str(thread)  # the kernel layer's name of the thread
        if owner.gone and owner.remote_id is not None:
            options = kernel_options(self._settings, await self._turns.policy(thread))
            if await self._pool.take_over(key, owner.remote_id, options):
                log.info("took over the kernel of %s from a replica that is gone", key)
                return
        await self._pool.discard(key)

    async def _watch_for_stop(self, message: InboundMessage) -> None:
        """Stop this turn when Stop was pressed on another replica."""
        while True:
            await asyncio.sleep(STOP_POLL_S)
            try:
                if await self._store.turns.stop_requested(message.key, message.message_id):
                    await self._turns.stop(message.key)
                    return
            except Exception:
                log.exception("could not look for a Stop of %s", message.key)

    async def _run(self, message: InboundMessage, outbox: Outbox) -> None:
        with metrics.turn():  # counts the turn by its outcome, and times it
            if not message.attachments and await self._commands.try_run(message, outbox):
                metrics.turn_outcome("command")
                return
            check = await self._admission.budget(message)
            if check.refusal is not None:
                metrics.turn_outcome("refused")
                await outbox.post(Reply(text=check.refusal, ok=False))
                return
            await self._turns.run(message, outbox, check.allowance)
