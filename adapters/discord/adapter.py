"""The Discord edge: a discord.py client that turns messages into turns, one thread per question.

- A mention in a guild text channel opens a public thread from that message (named from the
  question); the thread's id keys the session. Messages in the thread continue it without a
  mention (the dispatcher knows the thread has a session); a mention inside an existing thread
  uses that thread; a DM channel is one session.
- Bot and webhook authors (ourselves included) are dropped here; edits never reach us (only
  MESSAGE_CREATE is handled); replays after a gateway RESUME are dropped by the dispatcher's
  message-id dedupe.
- Each message runs as a tracked task, so one bad event never stops the client and
  :meth:`DiscordAdapter.stop` can cancel what is still running.
- ``discord.api_url`` / ``discord.gateway_url`` are installed before login: see
  :mod:`adapters.discord.endpoints` for the mechanism.
- Replicas: with ``discord.shard_count`` the client is discord.py's ``AutoShardedClient`` and
  runs ``discord.shard_ids`` (all shards when unset); Discord sends each replica only the
  events of its shards' guilds (DMs: shard 0), so replicas never see each other's messages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
import discord
import yarl

from adapters.base import AdapterStartError
from adapters.discord import endpoints
from adapters.discord.inbound import (
    PLATFORM,
    is_bot_author,
    is_mentioned,
    session_key,
    strip_mention,
    thread_name,
    to_inbound,
)
from adapters.discord.outbox import Conversation, DiscordOutbox
from adapters.tasks import BackgroundTasks
from bot.config import DiscordSettings
from bot.events import ThreadKey

if TYPE_CHECKING:
    from bot.dispatcher import Dispatcher

log = logging.getLogger(__name__)

THREAD_ARCHIVE_MINUTES: Literal[60, 1440, 4320, 10080] = 1440
_CHUNK = 256 * 1024
_THREAD_ALREADY_CREATED = 160004  # Discord's JSON error code
_USER_MESSAGE_TYPES = (discord.MessageType.default, discord.MessageType.reply)
NO_THREAD_PERMISSION = (
    "I can't open a thread for this here: I need the **Create Public Threads** and **Send Messages in "
    "Threads** permissions in this channel."
)


class DiscordStartError(AdapterStartError):
    """The bot could not log in or connect; the message says what to fix."""


class DiscordFileError(Exception):
    """An attachment could not be downloaded from Discord's CDN."""


class _Client(discord.Client):
    """discord.Client that hands every new message to the adapter."""

    def __init__(self, adapter: DiscordAdapter, **options: Any) -> None:
        super().__init__(**options)
        self._adapter = adapter

    async def on_message(self, message: discord.Message) -> None:
        self._adapter.received(message)

    async def on_error(self, event_method: str, /, *args: Any, **kwargs: Any) -> None:
        log.exception("discord event %s failed", event_method)


class _ShardedClient(discord.AutoShardedClient, _Client):
    """The same, running a set of shards (``discord.shard_count`` / ``discord.shard_ids``)."""


class DiscordAdapter:
    """Connects to Discord's gateway and serves one session per thread (or DM)."""

    def __init__(self, settings: DiscordSettings, dispatcher: Dispatcher, *,
                 guild_ready_timeout_s: float = 2.0, status_interval_s: float = 1.5) -> None:
        self._settings = settings
        self._dispatcher = dispatcher
        self._guild_ready_timeout_s = guild_ready_timeout_s
        self._status_interval_s = status_interval_s
        self._client: _Client | None = None
        self._connection: asyncio.Task[None] | None = None
        self._cdn: aiohttp.ClientSession | None = None
        self._tasks = BackgroundTasks(log, "Discord")
        self._undo_endpoints: Callable[[], None] | None = None
        self._stopping = False

    @property
    def client(self) -> discord.Client:
        """The running discord.py client."""
        assert self._client is not None, "start() first"
        return self._client

    async def start(self) -> None:
        """Log in, connect to the gateway and return once READY (guilds loaded)."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise
        me = self.client.user
        shards = self._settings.shard_ids or range(self._settings.shard_count or 1)
        log.info("Discord: connected as %s (%s), shard(s) %s of %d", me, me and me.id, ", ".join(map(str, shards)),
                 self._settings.shard_count or 1)

    async def _start(self) -> None:
        self._undo_endpoints = endpoints.install(self._settings.api_url, self._settings.gateway_url)
        intents = discord.Intents.none()
        intents.guilds = intents.guild_messages = intents.dm_messages = intents.message_content = True
        options: dict[str, Any] = dict(intents=intents, guild_ready_timeout=self._guild_ready_timeout_s,
                                       allowed_mentions=discord.AllowedMentions.none(), chunk_guilds_at_startup=False)
        if self._settings.shard_count is None:
            self._client = _Client(self, **options)
        else:
            if self._settings.shard_ids is not None:  # unset: this replica runs every shard
                options["shard_ids"] = list(self._settings.shard_ids)
            self._client = _ShardedClient(self, shard_count=self._settings.shard_count, **options)
        self._cdn = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60))
        try:
            await self._client.login(self._settings.token.get_secret_value())
        except discord.LoginFailure:
            raise DiscordStartError("discord.token was refused: copy the bot token again from the Developer Portal "
                                    "(Bot → Reset Token) into DISCORD_BOT_TOKEN") from None
        except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
            raise DiscordStartError(f"could not reach the Discord API at {self._settings.api_url or 'discord.com'}: "
                                    f"{exc}") from None
        self._connection = asyncio.create_task(self._client.connect(reconnect=True), name="discord-gateway")
        ready = asyncio.create_task(self._client.wait_until_ready())
        await asyncio.wait({ready, self._connection}, return_when=asyncio.FIRST_COMPLETED)
        if ready.done():
            return
        ready.cancel()
        error = None if self._connection.cancelled() else self._connection.exception()
        if isinstance(error, discord.PrivilegedIntentsRequired):
            raise DiscordStartError("Discord refused the Message Content intent: enable it under Bot → "
                                    "Privileged Gateway Intents (docs/discord-setup.md)") from None
        raise DiscordStartError(f"the Discord gateway connection ended before READY: {error!r}") from None

    async def stop(self, grace_s: float = 0.0) -> None:
        """Take no new messages; give running turns ``grace_s`` to finish (the connection stays
        up so they can answer), cancel the rest (each tells its thread), disconnect, restore
        discord.py's endpoints."""
        self._stopping = True
        if grace_s > 0 and not await self._tasks.drain(grace_s):
            log.warning("Discord: %d turn(s) still running after %.0f s; cutting them off", len(self._tasks), grace_s)
        await self._tasks.cancel_all()
        if self._client is not None:
            await self._client.close()
        if self._connection is not None:
            await asyncio.gather(self._connection, return_exceptions=True)
        if self._cdn is not None:
            await self._cdn.close()
        if self._undo_endpoints is not None:
            self._undo_endpoints()
            self._undo_endpoints = None

    def outbox_for(self, key: ThreadKey) -> DiscordOutbox | None:
        """An outbox posting into the thread (or DM) of ``key``; None for another platform or before start."""
        me = self._client.user if self._client is not None else None
        if key.platform != PLATFORM or me is None or not (key.thread.isdigit() and key.channel.isdigit()):
            return None
        channel = self.client.get_partial_messageable(int(key.thread))
        # No question to react to: the thread's starter message stands in (only a status would use it).
        source = self.client.get_partial_messageable(int(key.channel)).get_partial_message(int(key.thread))
        conversation = Conversation(channel=channel, source=source, me=me, key=key, stop_turn=self._dispatcher.stop)
        return DiscordOutbox(conversation, upload_limit=self._upload_limit, status_interval_s=self._status_interval_s)

    def received(self, message: discord.Message) -> None:
        """Take a new message off the gateway: drop what never starts a turn, run the rest as a task."""
        if self._stopping or is_bot_author(message) or message.type not in _USER_MESSAGE_TYPES:
            return
        self._tasks.spawn(self._handle(message), name=f"discord-message-{message.id}")

    async def _handle(self, message: discord.Message) -> None:
        try:
            channel = await self._session_channel(message)
            if channel is None:
                return
            key = session_key(channel)
            me = self.client.user
            assert me is not None
            inbound = to_inbound(message, key=key, bot_id=me.id, download=self._download)
            conversation = Conversation(channel=channel, source=message, me=me, key=key, stop_turn=self._dispatcher.stop)
            outbox = DiscordOutbox(conversation, upload_limit=self._upload_limit, status_interval_s=self._status_interval_s)
            await self._dispatcher.handle(inbound, outbox)
        except Exception:
            log.exception("handling Discord message %s failed", message.id)

    async def _session_channel(self, message: discord.Message) -> discord.Thread | discord.DMChannel | None:
        """The thread or DM the session lives in; opens a thread for a mention in a text channel."""
        channel: Any = message.channel
        if isinstance(channel, discord.PartialMessageable):  # not in the cache (e.g. a thread we never saw)
            channel = await self.client.fetch_channel(channel.id)
        if isinstance(channel, (discord.Thread, discord.DMChannel)):
            return channel
        me = self.client.user
        if not isinstance(channel, discord.TextChannel) or me is None or not is_mentioned(message, me.id):
            return None
        if not self._dispatcher.admits(platform="discord", channel=str(channel.id), user_id=str(message.author.id)):
            return None  # no thread for someone the allow-list keeps out
        name = thread_name(strip_mention(message.content, me.id), [a.filename for a in message.attachments])
        try:
            return await message.create_thread(name=name, auto_archive_duration=THREAD_ARCHIVE_MINUTES)
        except discord.Forbidden as exc:
            log.warning("no permission to open a thread in channel %s: %s", channel.id, exc.text)
            try:
                await message.reply(NO_THREAD_PERMISSION)
            except discord.HTTPException as reply_exc:
                log.warning("could not tell the user either: %s", reply_exc.text)
            return None
        except discord.HTTPException as exc:
            if exc.code != _THREAD_ALREADY_CREATED:
                raise
            # A redelivered event: the thread exists (its id is the message id); the dispatcher drops the duplicate.
            existing = await self.client.fetch_channel(message.id)
            return existing if isinstance(existing, discord.Thread) else None

    @property
    def _upload_limit(self) -> int:
        return int(self._settings.upload_limit_mb * 2**20)

    async def _download(self, url: str) -> AsyncIterator[bytes]:
        assert self._cdn is not None
        async with self._cdn.get(url) as response:
            if response.status != 200:
                # The file name only: the query string of a CDN link is its signature.
                raise DiscordFileError(f"downloading {yarl.URL(url).name!r} failed: HTTP {response.status}")
            async for chunk in response.content.iter_chunked(_CHUNK):
                yield chunk
