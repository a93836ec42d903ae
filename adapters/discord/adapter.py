"""The Discord edge: a discord.py client that turns messages into turns, one thread per question.

- A mention in a guild text channel opens a public thread from that message (named from the
  question); the thread's id keys the session. Messages in the thread continue it without a
  mention (the core's admission chain knows the thread has a session); a mention inside an existing thread
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
- Forum channels: a new post is a thread like any other; its starter message (which has the
  post's id) opens the session when it mentions the bot, or always in ``discord.forum_channels``.
  The post's title is part of the question.
- Slash commands (:mod:`adapters.discord.slash`) are registered once READY, per guild in
  ``discord.guild_ids`` (else globally), by the replica running shard 0. Every interaction is
  deferred at once and answered afterwards; one that cannot be served gets one sentence.
- Buttons survive a restart: Stop (a persistent view) and 👍/👎 (dynamic items) are registered
  with the client at start-up and find their thread from the channel of the clicked message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
import discord
import yarl

from adapters.base import AdapterStartError, PlatformAdapter
from adapters.discord import endpoints, render
from adapters.discord.feedback import THANKS, feedback_item, feedback_view
from adapters.discord.inbound import (
    PLATFORM,
    attachment_of,
    forum_question,
    is_bot_author,
    is_mentioned,
    is_post_start,
    session_key,
    strip_mention,
    thread_name,
    to_inbound,
)
from adapters.discord.interactions import InteractionReplies
from adapters.discord.layout import LayoutSupport
from adapters.discord.outbox import STOPPED, Conversation, DiscordOutbox, StopView
from adapters.discord.slash import CommandTree, build_tree
from bot.config import DiscordSettings
from bot.events import Attachment, InboundMessage, ThreadKey
from bot.safetext import inline_code, shown

if TYPE_CHECKING:
    from bot.dispatcher import Dispatcher

log = logging.getLogger(__name__)

THREAD_ARCHIVE_MINUTES: Literal[60, 1440, 4320, 10080] = 1440
#: How long :meth:`DiscordAdapter.thread_open` waits for Discord (5xx answers are retried within it).
THREAD_CHECK_TIMEOUT_S = 10.0
_CHUNK = 256 * 1024
_THREAD_ALREADY_CREATED = 160004  # Discord's JSON error code
_USER_MESSAGE_TYPES = (discord.MessageType.default, discord.MessageType.reply)
NO_THREAD_PERMISSION = (
    "I can't open a thread for this here: I need the **Create Public Threads** and **Send Messages in "
    "Threads** permissions in this channel."
)
NOT_ALLOWED = "Sorry, Threadbook is not enabled for you here."
OUTSIDE_SESSION = "This command works inside a Threadbook thread or a DM with me; `/ask` opens a thread."
HELP_OUTSIDE_SESSION = (
    "**Threadbook** runs Python for you: `/ask` (or mention me) in a channel and I open a thread with its own "
    "kernel, where I write and run the code and post the answer, charts and files. Inside that thread, "
    "`/files`, `/status`, `/export` and `/reset` work."
)
ASK_NOWHERE = "`/ask` works in a text channel, a thread or a DM with me."
NO_ANSWER = "⚠️ I could not answer that; please try again."
RESTARTING = "🔁 I'm restarting; please try again in a minute."
_ASKED_LIMIT = 1800  # of the question shown in the command's reply (a message holds 2,000)


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


class DiscordAdapter(PlatformAdapter):
    """Connects to Discord's gateway and serves one session per thread (or DM)."""

    def __init__(
        self,
        settings: DiscordSettings,
        dispatcher: Dispatcher,
        *,
        guild_ready_timeout_s: float = 2.0,
        status_interval_s: float = 1.5,
    ) -> None:
        super().__init__(dispatcher, label="Discord")
        self._settings = settings
        self._guild_ready_timeout_s = guild_ready_timeout_s
        self._status_interval_s = status_interval_s
        self._client: _Client | None = None
        self._connection: asyncio.Task[None] | None = None
        self._cdn: aiohttp.ClientSession | None = None
        self._undo_endpoints: Callable[[], None] | None = None
        self._stopping = False
        self._tree: CommandTree | None = None
        self._feedback_item = feedback_item(self._feedback_clicked)
        #: Whether Discord takes components-v2 messages (False once refused, for the process).
        self._layout = LayoutSupport()

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
        log.info(
            "Discord: connected as %s (%s), shard(s) %s of %d",
            me,
            me and me.id,
            ", ".join(map(str, shards)),
            self._settings.shard_count or 1,
        )

    async def _start(self) -> None:
        self._undo_endpoints = endpoints.install(self._settings.api_url, self._settings.gateway_url)
        intents = discord.Intents.none()
        intents.guilds = intents.guild_messages = intents.dm_messages = intents.message_content = True
        options: dict[str, Any] = dict(
            intents=intents,
            guild_ready_timeout=self._guild_ready_timeout_s,
            allowed_mentions=discord.AllowedMentions.none(),
            chunk_guilds_at_startup=False,
        )
        if self._settings.shard_count is None:
            self._client = _Client(self, **options)
        else:
            if self._settings.shard_ids is not None:  # unset: this replica runs every shard
                options["shard_ids"] = list(self._settings.shard_ids)
            self._client = _ShardedClient(self, shard_count=self._settings.shard_count, **options)
        self._tree = build_tree(self._client, self)
        self._client.add_view(StopView(self._stop_clicked))  # a Stop on a status from before a restart
        self._client.add_dynamic_items(self._feedback_item)
        self._cdn = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60))
        try:
            await self._client.login(self._settings.token.get_secret_value())
        except discord.LoginFailure:
            raise DiscordStartError(
                "discord.token was refused: copy the bot token again from the Developer Portal "
                "(Bot → Reset Token) into DISCORD_BOT_TOKEN"
            ) from None
        except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
            raise DiscordStartError(
                f"could not reach the Discord API at {self._settings.api_url or 'discord.com'}: {exc}"
            ) from None
        self._connection = asyncio.create_task(self._client.connect(reconnect=True), name="discord-gateway")
        ready = asyncio.create_task(self._client.wait_until_ready())
        await asyncio.wait({ready, self._connection}, return_when=asyncio.FIRST_COMPLETED)
        if ready.done():
            await self._sync_commands()
            return
        ready.cancel()
        error = None if self._connection.cancelled() else self._connection.exception()
        if isinstance(error, discord.PrivilegedIntentsRequired):
            raise DiscordStartError(
                "Discord refused the Message Content intent: enable it under Bot → "
                "Privileged Gateway Intents (docs/discord-setup.md)"
            ) from None
        raise DiscordStartError(f"the Discord gateway connection ended before READY: {error!r}") from None

    async def _stop_intake(self) -> None:
        self._stopping = True  # the connection stays up so running turns can answer

    async def _disconnect(self) -> None:
        """Disconnect and restore discord.py's endpoints."""
        if self._client is not None:
            await self._client.close()
        if self._connection is not None:
            await asyncio.gather(self._connection, return_exceptions=True)
        if self._cdn is not None:
            await self._cdn.close()
        if self._undo_endpoints is not None:
            self._undo_endpoints()
            self._undo_endpoints = None

    def _may_open(self, channel: str, user: discord.abc.User) -> bool:
        """The core's admission rules for a session opened before any message exists."""
        return self._dispatcher.may_open(platform=PLATFORM, channel=channel, user_id=str(user.id), is_bot=user.bot)

    def _thread_id(self, key: ThreadKey) -> int | None:
        """The Discord channel id of the thread (or DM) of ``key``; None for another platform or before start."""
        me = self._client.user if self._client is not None else None
        if key.platform != PLATFORM or me is None or not (key.thread.isdigit() and key.channel.isdigit()):
            return None
        return int(key.thread)

    def outbox_for(self, key: ThreadKey) -> DiscordOutbox | None:
        """An outbox posting into the thread (or DM) of ``key``; None for another platform or before start."""
        if (thread_id := self._thread_id(key)) is None or (me := self.client.user) is None:
            return None
        channel = self.client.get_partial_messageable(thread_id)
        # No question to react to: the thread's starter message stands in (only a status would use it).
        source = self.client.get_partial_messageable(int(key.channel)).get_partial_message(int(key.thread))
        conversation = Conversation(channel=channel, source=source, me=me, key=key, stop_turn=self._dispatcher.stop)
        return DiscordOutbox(
            conversation,
            upload_limit=self._upload_limit,
            status_interval_s=self._status_interval_s,
            layout=self._layout,
        )

    async def thread_open(self, key: ThreadKey) -> bool:
        """False when Discord says the thread (or DM) of ``key`` is gone: deleted (404), out of
        the bot's reach (403) or locked. An archived thread that is not locked is open (posting
        un-archives it). True as well for a key this adapter does not serve, and when Discord
        could not be asked (an error, a timeout): a failed request is not a gone thread.

        Always a REST call (``fetch_channel``): the cache can be stale.
        """
        thread_id = self._thread_id(key)
        if thread_id is None:
            return True
        try:
            async with asyncio.timeout(THREAD_CHECK_TIMEOUT_S):
                channel = await self.client.fetch_channel(thread_id)
        except (discord.NotFound, discord.Forbidden) as exc:
            log.info("Discord: thread %s is gone (HTTP %d: %s)", key, exc.status, exc.text)
            return False
        except TimeoutError:
            log.warning("Discord: could not check thread %s: no answer in %g s", key, THREAD_CHECK_TIMEOUT_S)
            return True
        except (discord.HTTPException, discord.InvalidData, aiohttp.ClientError, OSError) as exc:
            log.warning("Discord: could not check thread %s: %r", key, exc)
            return True
        if isinstance(channel, discord.Thread) and channel.locked:
            log.info("Discord: thread %s is locked", key)
            return False
        return True

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
            if isinstance(channel, discord.Thread) and is_post_start(message, channel):
                inbound = self._forum_post(inbound, channel)
            outbox = self._outbox(channel, message, key, turn_id=inbound.message_id)
            await self.dispatch(inbound, outbox, name=f"discord turn {inbound.message_id}")
        except Exception:
            log.exception("handling Discord message %s failed", message.id)

    def _forum_post(self, inbound: InboundMessage, thread: discord.Thread) -> InboundMessage:
        """The starter message of a forum post asks the post's title too; in ``discord.forum_channels``
        it opens a session without a mention."""
        listed = thread.parent_id in self._settings.forum_channels
        if not listed and not isinstance(thread.parent, discord.ForumChannel):
            return inbound  # a thread opened from a message: its first message is not a post
        return dataclasses.replace(
            inbound, text=forum_question(thread.name, inbound.text), mentioned=inbound.mentioned or listed
        )

    def _outbox(
        self, channel: discord.abc.Messageable, source: discord.PartialMessage, key: ThreadKey, *, turn_id: str
    ) -> DiscordOutbox:
        """Where the answers to the question ``turn_id`` (shown by ``source``) go: ``channel``."""
        me = self.client.user
        assert me is not None
        conversation = Conversation(channel=channel, source=source, me=me, key=key, stop_turn=self._dispatcher.stop)
        return DiscordOutbox(
            conversation,
            upload_limit=self._upload_limit,
            status_interval_s=self._status_interval_s,
            turn_id=turn_id,
            feedback=functools.partial(feedback_view, self._feedback_item),
            layout=self._layout,
        )

    # ---- slash commands ------------------------------------------------------------------

    async def _sync_commands(self) -> None:
        """Register the slash commands: per guild in ``discord.guild_ids`` (at once), else globally.
        Only the replica running shard 0 does it; a refusal is logged, never fatal."""
        assert self._tree is not None
        if self._settings.shard_ids is not None and 0 not in self._settings.shard_ids:
            return
        targets: list[discord.Object | None] = [discord.Object(id=g) for g in self._settings.guild_ids] or [None]
        for guild in targets:
            if guild is not None:
                self._tree.copy_global_to(guild=guild)
            where = f"guild {guild.id}" if guild is not None else "all guilds"
            try:
                commands = await self._tree.sync(guild=guild)
                log.info("Discord: %d slash command(s) registered for %s", len(commands), where)
            except discord.Forbidden as exc:
                log.warning(
                    "Discord: could not register the slash commands for %s (%s): invite the bot with the "
                    "applications.commands scope (docs/discord-setup.md)",
                    where,
                    exc.text,
                )
            except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
                log.warning("Discord: could not register the slash commands for %s: %r", where, exc)

    async def in_thread(self, interaction: discord.Interaction, text: str) -> None:
        """A slash command that runs in the current thread (``/status`` → ``status``): deferred
        at once, then handled like the message ``text`` in that thread; its answers are followups."""
        if await self._defer(interaction):
            self._tasks.spawn(self._command(interaction, text), name=f"discord-command-{interaction.id}")

    async def ask(self, interaction: discord.Interaction, question: str, attachment: discord.Attachment | None) -> None:
        """``/ask``: deferred at once; then a thread opens (in a text channel) as for a mention."""
        if await self._defer(interaction):
            self._tasks.spawn(self._ask(interaction, question, attachment), name=f"discord-ask-{interaction.id}")

    async def _defer(self, interaction: discord.Interaction) -> bool:
        """Acknowledge the interaction (Discord shows "thinking…"); False when it cannot be served."""
        try:
            if self._stopping:
                await interaction.response.send_message(RESTARTING, ephemeral=True)
                return False
            await interaction.response.defer(thinking=True)
            return True
        except discord.HTTPException as exc:  # expired (over 3 s) or answered by another replica
            log.warning("could not acknowledge Discord interaction %s: %s", interaction.id, exc)
            return False

    async def _command(self, interaction: discord.Interaction, text: str) -> None:
        replies = InteractionReplies(interaction, upload_limit=self._upload_limit, layout=self._layout)
        try:
            channel = await self._interaction_channel(interaction)
            if not isinstance(channel, (discord.Thread, discord.DMChannel)):
                await replies.say(HELP_OUTSIDE_SESSION if text == "help" else OUTSIDE_SESSION)
                return
            key = session_key(channel)
            if not self._may_open(key.channel, interaction.user):
                await replies.say(NOT_ALLOWED)
                return
            command = self._interaction_message(interaction, key, text)
            await self.dispatch(command, replies, name=f"discord command {command.message_id}")
        except Exception:
            log.exception("Discord command %r (interaction %s) failed", text, interaction.id)
        finally:
            if not replies.answered:
                await replies.say(NO_ANSWER)

    async def _ask(
        self, interaction: discord.Interaction, question: str, attachment: discord.Attachment | None
    ) -> None:
        answered = False
        try:
            channel = await self._interaction_channel(interaction)
            if not isinstance(channel, (discord.Thread, discord.DMChannel, discord.TextChannel)):
                answered = await self._edit_answer(interaction, ASK_NOWHERE)
                return
            future_key = session_key(channel) if not isinstance(channel, discord.TextChannel) else None
            allow_channel = future_key.channel if future_key is not None else str(channel.id)
            if not self._may_open(allow_channel, interaction.user):
                answered = await self._edit_answer(interaction, NOT_ALLOWED)
                return
            asked = f"❓ **{interaction.user.display_name}** asked: {_cut(question.strip(), _ASKED_LIMIT)}"
            if attachment is not None:
                asked += f" 📎 {inline_code(shown(attachment.filename))}"
            asked = render.text(asked)
            source = await interaction.edit_original_response(content=asked)
            answered = True
            if isinstance(channel, discord.TextChannel):
                names = [attachment.filename] if attachment is not None else []
                try:
                    thread = await source.create_thread(
                        name=thread_name(question, names), auto_archive_duration=THREAD_ARCHIVE_MINUTES
                    )
                except discord.Forbidden as exc:
                    log.warning("no permission to open a thread in channel %s: %s", channel.id, exc.text)
                    await self._edit_answer(interaction, NO_THREAD_PERMISSION)
                    return
                await self._edit_answer(interaction, f"{asked}\n🧵 {thread.mention}")
                session: discord.Thread | discord.DMChannel = thread
            else:
                session = channel
            key = session_key(session)
            attachments = (attachment_of(attachment, self._download),) if attachment is not None else ()
            inbound = self._interaction_message(interaction, key, question.strip(), attachments=attachments)
            outbox = self._outbox(session, source, key, turn_id=inbound.message_id)
            await self.dispatch(inbound, outbox, name=f"discord ask {inbound.message_id}")
        except Exception:
            log.exception("Discord /ask (interaction %s) failed", interaction.id)
            if not answered:
                await self._edit_answer(interaction, NO_ANSWER)

    def _interaction_message(
        self, interaction: discord.Interaction, key: ThreadKey, text: str, *, attachments: tuple[Attachment, ...] = ()
    ) -> InboundMessage:
        """The message a slash command stands for: its id is the interaction's (so feedback and
        the dispatcher's dedupe refer to it)."""
        return InboundMessage(
            key=key,
            message_id=str(interaction.id),
            user_id=str(interaction.user.id),
            user_name=interaction.user.display_name,
            text=text,
            attachments=attachments,
            mentioned=True,
            is_dm=key.workspace == "dm",
            is_bot=interaction.user.bot,
        )

    async def _edit_answer(self, interaction: discord.Interaction, text: str) -> bool:
        """Make ``text`` the interaction's answer (its deferred message); True when it went through."""
        try:
            await interaction.edit_original_response(content=text)
            return True
        except discord.HTTPException as exc:
            log.warning("could not answer Discord interaction %s: %s", interaction.id, exc)
            return False

    async def _interaction_channel(self, interaction: discord.Interaction) -> Any:
        """The channel an interaction came from, fetched when discord.py only knows its id."""
        channel: Any = interaction.channel
        if (channel is None or isinstance(channel, discord.PartialMessageable)) and interaction.channel_id is not None:
            channel = await self.client.fetch_channel(interaction.channel_id)
        return channel

    # ---- buttons -------------------------------------------------------------------------

    async def _stop_clicked(self, interaction: discord.Interaction) -> None:
        """Stop on a status message no running progress of this process owns (posted before a
        restart, or by another replica): stop the thread's turn wherever it runs."""
        try:
            await interaction.response.defer()
            channel = await self._interaction_channel(interaction)
            if not isinstance(channel, (discord.Thread, discord.DMChannel)):
                return
            key = session_key(channel)
            if not self._dispatcher.may_stop(key, str(interaction.user.id)):
                return
            stopped = await self._dispatcher.stop(key, user_id=str(interaction.user.id))
            log.info("Stop pressed by %s in %s after a restart (turn running: %s)", interaction.user.id, key, stopped)
            message = interaction.message
            if message is None:
                return
            if stopped:
                await message.edit(content=f"{STOPPED} Stopping…", view=None)
            elif message.content.startswith("⏳"):
                await message.edit(content=f"{STOPPED} Not running any more.", view=None)
        except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
            log.warning("handling Stop in channel %s failed: %r", interaction.channel_id, exc)

    async def _feedback_clicked(self, interaction: discord.Interaction, turn_id: str, good: bool) -> None:
        """👍/👎: thank the user at once (ephemeral), then record the vote for the thread's turn."""
        try:
            await interaction.response.send_message(THANKS, ephemeral=True)
        except discord.HTTPException as exc:
            log.warning("could not acknowledge feedback %s: %s", interaction.id, exc)
        try:
            channel = await self._interaction_channel(interaction)
        except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
            log.warning("feedback on %s: no channel: %r", turn_id, exc)
            return
        if isinstance(channel, (discord.Thread, discord.DMChannel)):
            await self._dispatcher.feedback(session_key(channel), turn_id, str(interaction.user.id), good)

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
        if not self._may_open(str(channel.id), message.author):
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


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
