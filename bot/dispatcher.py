"""The cross-cutting rules for every inbound message, in one place.

Order: ignore bots → allow-list → ignore unmentioned messages in threads the bot has no
session for → drop duplicates → one turn at a time per thread (others queue, and are told) →
in-thread command or agent turn, marked in flight in the store while it runs (so a start
after an unclean stop tells the thread: ``bot.app.tell_interrupted``). Adapters call
:meth:`Dispatcher.handle` and nothing else (plus :meth:`Dispatcher.stop` for a Stop button).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from bot.commands import Commands
from bot.config import Settings
from bot.events import InboundMessage, Outbox, ThreadKey
from bot.store import Store
from bot.turn import TurnRunner

log = logging.getLogger(__name__)

QUEUED_NOTICE = "⏳ I'm still working on the previous message in this thread; yours is queued and comes next."
RESTART_NOTICE = "🔁 I was restarted while working on this message; please send it again."
#: Posted at start-up into a thread whose turn an unclean stop (kill -9, crash) cut off.
INTERRUPTED_NOTICE = "🔁 I was restarted while working on your message; please send it again."
FAILURE_NOTICE = "⚠️ Something went wrong on my side while handling that message. Please try again."


@dataclass
class _ThreadSlot:
    """Serialises turns of one thread; dropped again when nobody holds or waits for it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class Dispatcher:
    """Applies the bot's rules to each message and runs the resulting turn."""

    def __init__(self, *, settings: Settings, store: Store, turns: TurnRunner, commands: Commands) -> None:
        self._settings = settings
        self._store = store
        self._turns = turns
        self._commands = commands
        self._slots: dict[ThreadKey, _ThreadSlot] = {}

    async def handle(self, message: InboundMessage, outbox: Outbox) -> None:
        """Handle one inbound message end to end. Never raises, except to pass on cancellation."""
        try:
            if not await self._accepts(message):
                return
            await self._serialised(message, outbox)
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

    async def stop(self, key: ThreadKey) -> bool:
        """Interrupt the running turn of a thread (the Stop button). True if one was running."""
        return await self._turns.stop(key)

    def admits(self, *, platform: str, channel: str, user_id: str) -> bool:
        """The allow-list rule alone, for adapters that must decide before opening a thread."""
        access = self._settings.access
        if access.allow_channels and f"{platform}:{channel}" not in access.allow_channels and channel not in access.allow_channels:
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
        await self._store.touch_thread(str(key), key.channel_key)
        return True

    async def _serialised(self, message: InboundMessage, outbox: Outbox) -> None:
        slot = self._slots.setdefault(message.key, _ThreadSlot())
        slot.users += 1
        try:
            if slot.lock.locked():
                await outbox.notify(QUEUED_NOTICE)
            async with slot.lock:
                await self._in_flight(message, outbox)
        finally:
            slot.users -= 1
            if slot.users == 0:
                self._slots.pop(message.key, None)

    async def _in_flight(self, message: InboundMessage, outbox: Outbox) -> None:
        """Run the turn with its in-flight mark in the store, so a start after kill -9 can tell the thread."""
        key = str(message.key)
        await self._store.begin_turn(key, message.message_id)
        try:
            await self._run(message, outbox)
        except asyncio.CancelledError:
            raise  # shutdown: handle() clears the mark once the restart notice is out
        except BaseException:
            await self._store.end_turn(key, message.message_id)
            raise
        await self._store.end_turn(key, message.message_id)

    async def _run(self, message: InboundMessage, outbox: Outbox) -> None:
        if not message.attachments and await self._commands.try_run(message, outbox):
            return
        await self._turns.run(message, outbox)
