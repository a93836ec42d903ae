"""A fake Discord (REST v10 + gateway + attachment CDN) for tests: real aiohttp on 127.0.0.1, port 0.

The real discord.py client talks to it once ``discord.api_url`` / ``discord.gateway_url`` point
here (``fake.api_url`` / ``fake.gateway_url``). Everything that reaches the server is recorded
so a test asserts on what a user would see.

Usage::

    async with FakeDiscord(token="t0ken") as fake:
        adapter = DiscordAdapter(settings_with(fake.api_url, fake.gateway_url), dispatcher)
        await adapter.start()
        msg = await fake.user_message("<@BOT> plot this", mention_bot=True, files=[("d.csv", b"a,b\\n1,2")])
        thread = await fake.wait_for_thread(msg["id"])
        sent = await fake.wait_for_sent(thread["id"], lambda s: any(f.name.endswith(".png") for f in s.files))

World: one guild (``GUILD_ID``) with one text channel (``CHANNEL_ID``) — with ``guilds=2`` a
second one (``SECOND_GUILD_ID``, ``SECOND_CHANNEL_ID``) on the other shard of two — the bot user
(``BOT_ID``; also the application id), a human (``USER``) and another bot (``OTHER_BOT``).
DM channels come from :meth:`FakeDiscord.dm_channel`, user-made threads from
:meth:`FakeDiscord.user_thread`; :meth:`FakeDiscord.edit_user_message` dispatches MESSAGE_UPDATE and
:meth:`FakeDiscord.redeliver` a duplicate MESSAGE_CREATE. :meth:`FakeDiscord.delete_channel` deletes a
thread or channel (404 from then on), :meth:`FakeDiscord.set_thread_state` archives or locks a
thread (THREAD_DELETE / THREAD_UPDATE). Forum channels (type 15) come from
:meth:`FakeDiscord.forum_channel` (made before the client connects, they are in GUILD_CREATE;
after, CHANNEL_CREATE is dispatched), their posts from :meth:`FakeDiscord.forum_post`
(THREAD_CREATE, then the starter MESSAGE_CREATE, whose id is the post's).

Interactions: :meth:`FakeDiscord.press_button` (type 3, a component) and
:meth:`FakeDiscord.slash_command` (type 2, with options and resolved attachments) dispatch
INTERACTION_CREATE; each callback is recorded with its type and how long after the interaction
it arrived (``callbacks``). A callback of type 4 or 5 (a message, or "thinking…") creates the
interaction's original message; followups (``POST webhooks/{app}/{token}``) and edits of the
original (``PATCH webhooks/{app}/{token}/messages/@original``) are messages in the interaction's
channel too, in ``sent`` with ``interaction_id`` set. Slash command registrations
(``PUT applications/{app}/commands``, ``PUT applications/{app}/guilds/{guild}/commands``) are kept
in ``registered_commands`` (key: the guild id, None for global ones).

Gateway (``/gateway``, JSON encoding, ``compress=zlib-stream`` honoured as discord.py asks):
HELLO → client heartbeats (ACKed) → IDENTIFY (token checked, close 4004 otherwise) → READY
(``resume_gateway_url`` points back here) + GUILD_CREATE. Sharding: each connection that
IDENTIFYs with ``shard: [id, count]`` gets the guilds of its shard (``(guild_id >> 22) % count``,
Discord's rule) and only their events; DM events go to shard 0; an unsharded connection gets
everything; ``GET gateway/bot`` recommends ``shards``. RESUME replays the events after the
client's sequence number, then RESUMED. :meth:`request_reconnect` sends op 7. Dispatches sent
while no client is connected are kept and replayed on RESUME, like Discord does.

REST (``/api/v10``): ``GET users/@me``, ``GET oauth2/applications/@me``, ``GET gateway[/bot]``,
``GET channels/{c}`` (a thread: type 11 with ``parent_id`` and ``thread_metadata``; a deleted
one: 404, 10003 Unknown Channel), ``POST channels/{c}/messages`` (JSON or multipart with files;
files over ``upload_limit`` answer 413 like Discord), ``PATCH``/``DELETE channels/{c}/messages/{m}``,
``POST channels/{c}/messages/{m}/threads`` (the thread id equals the message id; THREAD_CREATE
is dispatched), ``PUT``/``DELETE channels/{c}/messages/{m}/reactions/{emoji}/@me``,
``POST channels/{c}/typing``, ``POST interactions/{id}/{token}/callback``, the interaction webhooks
and command registrations above. Messages the bot posts
are echoed back as MESSAGE_CREATE, like Discord does. Any other route answers 404 and is listed
in ``unknown_routes``. ``fail_next(method, pattern, status)`` makes the next matching request
(``times=n``: the next n) fail (403 with a Discord error body, 429 with ``retry_after`` and a
``Via`` header so discord.py retries, any other status with a Discord error body). CDN:
``GET /attachments/{channel}/{id}/{filename}`` serves uploads.

Recorded: ``sent`` (channel id → list of :class:`Sent`, the bot's messages with content, edits,
files and components), ``threads``, ``reactions`` (set of (channel, message, emoji)),
``reaction_log``, ``typing`` (channel ids, one per POST), ``interaction_responses``,
``gateway_queries`` (query string of each gateway connection), ``identifies``, ``resumes``,
``requests`` ("METHOD path" strings), ``cdn_downloads``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import pytest_asyncio
from aiohttp import WSMsgType, web

from tests.fakes.discord_components import IS_COMPONENTS_V2, check_v2, is_v2, text_of
from tests.fakes.local_http import serve_locally

BOT_ID = 1_100_000_000_000_000_001
GUILD_ID = 1_100_000_000_000_000_010
#: On the other shard of two: ``(GUILD_ID >> 22) % 2 != (SECOND_GUILD_ID >> 22) % 2``.
SECOND_GUILD_ID = GUILD_ID + (1 << 22)
SECOND_CHANNEL_ID = 1_100_000_000_000_000_050
CHANNEL_ID = 1_100_000_000_000_000_020
USER_ID = 1_100_000_000_000_000_030
OTHER_BOT_ID = 1_100_000_000_000_000_040

BOT_USER: dict[str, Any] = {
    "id": str(BOT_ID),
    "username": "threadbook",
    "discriminator": "0",
    "avatar": None,
    "global_name": "Threadbook",
    "bot": True,
}
USER: dict[str, Any] = {
    "id": str(USER_ID),
    "username": "alice",
    "discriminator": "0",
    "avatar": None,
    "global_name": "Alice",
}
OTHER_BOT: dict[str, Any] = {
    "id": str(OTHER_BOT_ID),
    "username": "otherbot",
    "discriminator": "0",
    "avatar": None,
    "global_name": None,
    "bot": True,
}

_HEARTBEAT_MS = 41_250
_PUBLIC_THREAD = 11
_DM = 1
_FORUM = 15
_EPHEMERAL = 64
#: Application command option types the fake knows (Discord's numbers).
OPTION_TYPES = {str: 3, int: 4, bool: 5}
_ATTACHMENT_OPTION = 11


@dataclass
class SentFile:
    """A file the bot uploaded."""

    name: str
    data: bytes


@dataclass
class Sent:
    """A message the bot posted; ``content`` is the latest text, ``edits`` every edit in order."""

    id: int
    channel_id: int
    content: str
    files: list[SentFile] = field(default_factory=list)
    components: list[dict[str, Any]] = field(default_factory=list)
    edits: list[str] = field(default_factory=list)
    deleted: bool = False
    content_length: int | None = None  # the request's Content-Length header (None: sent chunked)
    interaction_id: int | None = None  # set for an interaction's original message and its followups
    original: bool = False  # the interaction's original (deferred) message, not a followup
    ephemeral: bool = False  # only the user of the interaction sees it
    flags: int = 0  # the message's flags (IS_COMPONENTS_V2: laid out by its components)

    @property
    def v2(self) -> bool:
        """Whether the message is laid out by components v2 (no content; text displays instead)."""
        return bool(self.flags & IS_COMPONENTS_V2)

    @property
    def text(self) -> str:
        """What the message says: its content, or its text displays joined."""
        return "\n".join(text_of(self.components)) if self.v2 else self.content

    @property
    def custom_ids(self) -> list[str]:
        """The custom ids of the buttons currently on the message."""
        return [c["custom_id"] for row in self.components for c in row.get("components", []) if "custom_id" in c]


@dataclass
class Callback:
    """An interaction callback: its type (5: deferred "thinking…", 6: deferred update, 4: a
    message), its data, and how many seconds after the interaction was dispatched it arrived."""

    interaction_id: int
    type: int
    data: dict[str, Any]
    after_s: float

    @property
    def ephemeral(self) -> bool:
        """Whether only the user sees the answer."""
        return bool(self.data.get("flags", 0) & _EPHEMERAL)


@dataclass
class _Failure:
    method: str
    pattern: re.Pattern[str]
    status: int
    retry_after: float
    times: int  # requests left to fail


class _Connection:
    """One gateway websocket; sends are serialised because zlib-stream keeps state."""

    def __init__(self, ws: web.WebSocketResponse, compress: bool) -> None:
        self.ws = ws
        self._zlib = zlib.compressobj() if compress else None
        self._lock = asyncio.Lock()
        self.session: _Session | None = None

    async def send(self, payload: dict[str, Any]) -> None:
        text = json.dumps(payload)
        async with self._lock:
            if self.ws.closed:
                return
            if self._zlib is None:
                await self.ws.send_str(text)
            else:
                data = self._zlib.compress(text.encode()) + self._zlib.flush(zlib.Z_SYNC_FLUSH)
                await self.ws.send_bytes(data)


@dataclass
class _Session:
    id: str
    seq: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    connection: _Connection | None = None
    #: (shard id, shard count) from IDENTIFY; None: unsharded.
    shard: tuple[int, int] | None = None


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


class FakeDiscord:
    """The fake Discord server; use as ``async with FakeDiscord() as fake``."""

    def __init__(
        self, *, token: str = "fake-discord-token", upload_limit: int = 10 * 2**20, guilds: int = 1, shards: int = 1
    ) -> None:
        self.token = token
        self.upload_limit = upload_limit
        self.shards = shards
        self._ids = itertools.count(1_200_000_000_000_000_000)
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._changed = asyncio.Condition()
        self._sessions: dict[str, _Session] = {}
        self._session: _Session | None = None
        self._failures: list[_Failure] = []
        self._cdn: dict[str, tuple[str, bytes]] = {}  # attachment id → (filename, bytes)
        self._messages: dict[int, dict[str, Any]] = {}  # every message payload by id
        self._channels: dict[int, dict[str, Any]] = {CHANNEL_ID: self._text_channel()}
        self._guild_ids = [GUILD_ID]
        if guilds > 1:
            self._guild_ids.append(SECOND_GUILD_ID)
            self._channels[SECOND_CHANNEL_ID] = self._text_channel(SECOND_CHANNEL_ID, SECOND_GUILD_ID)
        self._dm_by_user: dict[int, int] = {}
        self.sent: dict[int, list[Sent]] = {}
        self.threads: dict[int, dict[str, Any]] = {}
        self.reactions: set[tuple[int, int, str]] = set()
        self.reaction_log: list[tuple[str, int, str]] = []  # ("add"|"remove", message id, emoji)
        self.typing: list[int] = []
        self.interaction_responses: list[dict[str, Any]] = []
        self.callbacks: list[Callback] = []
        #: Slash commands as registered: guild id (None: global) → the commands of the last PUT.
        self.registered_commands: dict[int | None, list[dict[str, Any]]] = {}
        self._interactions: dict[int, tuple[dict[str, Any], float]] = {}  # id → (payload, dispatched at)
        self.gateway_queries: list[str] = []
        self.identifies = 0
        #: The ``shard`` field of each IDENTIFY, in order (None: unsharded).
        self.identified_shards: list[tuple[int, int] | None] = []
        self.resumes = 0
        self.requests: list[str] = []
        #: Every message the bot sent or edited: (``METHOD /path``, the message's JSON: for an
        #: interaction callback its ``data``), e.g. to check ``allowed_mentions``.
        self.message_requests: list[tuple[str, dict[str, Any]]] = []
        self.unknown_routes: list[str] = []
        self.cdn_downloads: list[str] = []
        #: Discord here refuses the IS_COMPONENTS_V2 flag (400, as for an app or client without it).
        self.refuse_components_v2 = False
        #: Components-v2 messages out of schema (:mod:`tests.fakes.discord_components`): answered
        #: 400, and they fail the test when the fake stops unless it set :attr:`allow_invalid_components`.
        self.schema_errors: list[str] = []
        self.allow_invalid_components = False

    # ---- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> FakeDiscord:
        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_get("/gateway", self._gateway)
        app.router.add_get("/attachments/{channel}/{attachment}/{filename}", self._cdn_get)
        app.router.add_route("*", "/api/v10/{tail:.*}", self._rest)
        self._runner, self._port = await serve_locally(app)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for session in self._sessions.values():
            if session.connection is not None:
                await session.connection.ws.close(code=1001)
        if self._runner is not None:
            await self._runner.cleanup()
        if exc[0] is None and self.schema_errors and not self.allow_invalid_components:
            raise AssertionError(f"the bot sent components Discord refuses: {self.schema_errors}")

    def _refused_v2(self, body: dict[str, Any], files: list[SentFile]) -> web.Response | None:
        """Discord's 400 for a components-v2 message it will not take; None for any other message."""
        if not is_v2(body):
            return None
        if self.refuse_components_v2:
            return _error(400, 50035, "Invalid Form Body: flags: unknown message flag")
        why = check_v2(body, [f.name for f in files])
        if why is None:
            return None
        self.schema_errors.append(why)
        return _error(400, 50035, f"Invalid Form Body: components: {why}")

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self._port}"

    @property
    def api_url(self) -> str:
        """The REST base to configure as ``discord.api_url``."""
        return f"{self.base_url}/api/v10"

    @property
    def gateway_url(self) -> str:
        """The gateway URL to configure as ``discord.gateway_url``."""
        return f"ws://127.0.0.1:{self._port}/gateway"

    @property
    def connected(self) -> bool:
        """True while a client holds an identified gateway connection."""
        return any(s.connection is not None for s in self._sessions.values())

    # ---- driving the world from a test ---------------------------------------------------

    def dm_channel(self, user: dict[str, Any] = USER) -> int:
        """The DM channel between ``user`` and the bot (created on first use)."""
        user_id = int(user["id"])
        if user_id not in self._dm_by_user:
            channel_id = next(self._ids)
            self._dm_by_user[user_id] = channel_id
            self._channels[channel_id] = {
                "id": str(channel_id),
                "type": _DM,
                "last_message_id": None,
                "recipients": [user],
            }
        return self._dm_by_user[user_id]

    async def user_message(
        self,
        content: str,
        *,
        channel_id: int | str = CHANNEL_ID,
        author: dict[str, Any] = USER,
        mention_bot: bool = False,
        files: list[tuple[str, bytes]] | None = None,
    ) -> dict[str, Any]:
        """Post a message as ``author`` and dispatch MESSAGE_CREATE; returns the message payload.

        ``mention_bot`` prefixes ``<@BOT_ID>`` and lists the bot in ``mentions``.
        """
        channel_id = int(channel_id)
        assert channel_id in self._channels, f"unknown channel {channel_id}"
        if mention_bot:
            content = f"<@{BOT_ID}> {content}"
        message = self._message_payload(channel_id, author, content)
        message["mentions"] = [BOT_USER] if mention_bot else []
        message["attachments"] = [self._store_attachment(channel_id, name, data) for name, data in files or []]
        await self._dispatch("MESSAGE_CREATE", message)
        return message

    async def user_thread(self, name: str, *, author: dict[str, Any] = USER) -> int:
        """A public thread a user opened in ``#general`` (dispatches THREAD_CREATE); returns its id."""
        thread_id = next(self._ids)
        thread = self._thread_payload(thread_id, CHANNEL_ID, name, owner_id=int(author["id"]))
        self._channels[thread_id] = thread
        await self._dispatch("THREAD_CREATE", {**thread, "newly_created": True})
        return thread_id

    async def redeliver(self, message: dict[str, Any]) -> None:
        """Dispatch MESSAGE_CREATE for ``message`` again, as first sent (a duplicate delivery)."""
        await self._dispatch("MESSAGE_CREATE", {k: v for k, v in message.items() if k != "thread"})

    async def edit_user_message(self, message: dict[str, Any], content: str) -> None:
        """Edit a user's message and dispatch MESSAGE_UPDATE."""
        message.update(content=content, edited_timestamp=_now_iso())
        await self._dispatch("MESSAGE_UPDATE", dict(message))

    async def press_button(
        self, message_id: int, custom_id: str | None = None, *, user: dict[str, Any] = USER
    ) -> dict[str, Any]:
        """Click a button on a bot message (the first one unless ``custom_id``); dispatch INTERACTION_CREATE.

        Returns the interaction payload; its response lands in ``interaction_responses``.
        """
        sent = self._find_sent(message_id)
        ids = sent.custom_ids
        assert ids, f"message {message_id} has no buttons"
        chosen = custom_id or ids[0]
        assert chosen in ids, f"{chosen!r} is not a button on message {message_id}"
        interaction_id = next(self._ids)
        channel = self._channels[sent.channel_id]
        interaction: dict[str, Any] = {
            "id": str(interaction_id),
            "application_id": str(BOT_ID),
            "type": 3,
            "version": 1,
            "token": f"itoken-{interaction_id}",
            "channel_id": str(sent.channel_id),
            "channel": channel,
            "data": {"custom_id": chosen, "component_type": 2},
            "message": self._messages[message_id],
            "locale": "en-US",
            "app_permissions": "0",
            "attachment_size_limit": self.upload_limit,
            "entitlements": [],
            "authorizing_integration_owners": {},
        }
        guild_id = channel.get("guild_id")
        if guild_id:
            interaction["guild_id"] = guild_id
            interaction["member"] = self._member(user)
        else:
            interaction["user"] = user
        await self._dispatch_interaction(interaction)
        return interaction

    async def slash_command(
        self,
        name: str,
        options: dict[str, Any] | None = None,
        *,
        channel_id: int | str = CHANNEL_ID,
        user: dict[str, Any] = USER,
        files: dict[str, tuple[str, bytes]] | None = None,
    ) -> dict[str, Any]:
        """Use the slash command ``name`` in ``channel_id``; dispatch INTERACTION_CREATE (type 2).

        ``options``: string, integer and boolean options by name; ``files``: attachment options
        by name, as (filename, bytes), served by the CDN and listed in ``resolved``. Returns the
        interaction payload.
        """
        channel_id = int(channel_id)
        channel = self._channels[channel_id]
        guild_id = channel.get("guild_id")
        registered = self.registered_commands.get(int(guild_id) if guild_id else None) or self.registered_commands.get(
            None, []
        )
        command = next((c for c in registered if c["name"] == name), None)
        interaction_id = next(self._ids)
        data: dict[str, Any] = {
            "id": command["id"] if command else str(next(self._ids)),
            "name": name,
            "type": 1,
            "options": [{"name": k, "type": OPTION_TYPES[type(v)], "value": v} for k, v in (options or {}).items()],
        }
        if files:
            attachments = {}
            for option, (filename, content) in files.items():
                attachment = self._store_attachment(channel_id, filename, content)
                attachments[attachment["id"]] = attachment
                data["options"].append({"name": option, "type": _ATTACHMENT_OPTION, "value": attachment["id"]})
            data["resolved"] = {"attachments": attachments}
        if guild_id:
            data["guild_id"] = guild_id
        interaction: dict[str, Any] = {
            "id": str(interaction_id),
            "application_id": str(BOT_ID),
            "type": 2,
            "version": 1,
            "token": f"itoken-{interaction_id}",
            "channel_id": str(channel_id),
            "channel": channel,
            "data": data,
            "locale": "en-US",
            "app_permissions": "0",
            "attachment_size_limit": self.upload_limit,
            "entitlements": [],
            "authorizing_integration_owners": {"0": guild_id or "0"},
            "context": 0 if guild_id else 1,
        }
        if guild_id:
            interaction["guild_id"] = guild_id
            interaction["member"] = self._member(user)
        else:
            interaction["user"] = user
        await self._dispatch_interaction(interaction)
        return interaction

    def forum_channel(self, name: str = "questions") -> int:
        """A forum channel in the guild; returns its id. Made before the client connects it is
        part of GUILD_CREATE; after, use :meth:`announce_channel`."""
        channel_id = next(self._ids)
        self._channels[channel_id] = {
            **self._text_channel(channel_id),
            "type": _FORUM,
            "name": name,
            "available_tags": [],
            "default_reaction_emoji": None,
            "default_thread_rate_limit_per_user": 0,
            "default_sort_order": None,
            "default_forum_layout": 0,
            "flags": 0,
        }
        return channel_id

    async def announce_channel(self, channel_id: int) -> None:
        """Dispatch CHANNEL_CREATE for a channel made while a client is connected."""
        await self._dispatch("CHANNEL_CREATE", self._channels[channel_id])

    async def forum_post(
        self,
        forum_id: int,
        title: str,
        content: str,
        *,
        author: dict[str, Any] = USER,
        mention_bot: bool = False,
        files: list[tuple[str, bytes]] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """A new post in a forum: THREAD_CREATE, then its starter message (MESSAGE_CREATE, same id).

        Returns the post's (thread's) id and the starter message.
        """
        assert self._channels[forum_id]["type"] == _FORUM, f"{forum_id} is not a forum channel"
        thread_id = next(self._ids)
        thread = self._thread_payload(thread_id, forum_id, title, owner_id=int(author["id"]))
        thread["applied_tags"] = []
        self._channels[thread_id] = thread
        await self._dispatch("THREAD_CREATE", {**thread, "newly_created": True})
        if mention_bot:
            content = f"<@{BOT_ID}> {content}"
        message = self._message_payload(thread_id, author, content, message_id=thread_id)
        message["mentions"] = [BOT_USER] if mention_bot else []
        message["attachments"] = [self._store_attachment(thread_id, name, data) for name, data in files or []]
        await self._dispatch("MESSAGE_CREATE", message)
        return thread_id, message

    def interaction_messages(self, interaction_id: int | str) -> list[Sent]:
        """The original message and the followups of an interaction, in order (ephemeral ones included)."""
        return [s for s in self.all_sent() if s.interaction_id == int(interaction_id)]

    async def request_reconnect(self) -> None:
        """Ask the connected client to reconnect (gateway op 7)."""
        assert self._session is not None and self._session.connection is not None, "no client connected"
        await self._session.connection.send({"op": 7, "d": None})

    def fail_next(
        self, method: str, path_pattern: str, status: int, *, retry_after: float = 0.05, times: int = 1
    ) -> None:
        """Make the next ``times`` ``method`` requests whose path (after ``/api/v10``) matches fail
        with ``status`` (discord.py itself retries a 500, 502, 504 or 524, up to five tries)."""
        self._failures.append(_Failure(method.upper(), re.compile(path_pattern), status, retry_after, times))

    async def delete_channel(self, channel_id: int | str, *, announce: bool = True) -> None:
        """Delete a channel or thread, as a moderator would: requests on it answer 404 (10003
        Unknown Channel) from now on. ``announce``: dispatch THREAD_DELETE (CHANNEL_DELETE for a
        channel) like Discord; False: the client missed the event (its cache is stale)."""
        channel = self._channels.pop(int(channel_id))
        if not announce:
            return
        if channel["type"] == _PUBLIC_THREAD:
            await self._dispatch("THREAD_DELETE", {k: channel[k] for k in ("id", "guild_id", "parent_id", "type")})
        else:
            await self._dispatch("CHANNEL_DELETE", channel)

    async def set_thread_state(
        self, thread_id: int | str, *, archived: bool | None = None, locked: bool | None = None, announce: bool = True
    ) -> dict[str, Any]:
        """Archive/unarchive or lock/unlock a thread, as a moderator would: its ``thread_metadata``
        (``GET channels/{id}``) shows it. ``announce``: dispatch THREAD_UPDATE like Discord; False:
        the client missed the event. Returns the thread payload."""
        thread = self._channels[int(thread_id)]
        assert thread["type"] == _PUBLIC_THREAD, f"{thread_id} is not a thread"
        metadata = thread["thread_metadata"]
        if archived is not None:
            metadata["archived"] = archived
            metadata["archive_timestamp"] = _now_iso()
        if locked is not None:
            metadata["locked"] = locked
        if announce:
            await self._dispatch("THREAD_UPDATE", thread)
        return thread

    # ---- waiting -------------------------------------------------------------------------

    async def wait_until(self, predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Wait until ``predicate()`` is truthy (re-checked whenever the fake records something)."""

        async def check() -> Any:
            async with self._changed:
                while not (value := predicate()):
                    await self._changed.wait()
                return value

        try:
            return await asyncio.wait_for(check(), timeout)
        except TimeoutError:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {predicate}; requests: "
                f"{self.requests[-15:]}, sent: {self.all_sent()[-5:]}"
            ) from None

    async def wait_for_thread(self, message_id: int | str, timeout: float = 10.0) -> dict[str, Any]:
        """The thread created from ``message_id``."""
        return await self.wait_until(lambda: self.threads.get(int(message_id)), timeout)

    async def wait_for_sent(
        self, channel_id: int | str, predicate: Callable[[Sent], bool], timeout: float = 10.0
    ) -> Sent:
        """The first bot message in ``channel_id`` that satisfies ``predicate``."""
        return await self.wait_until(
            lambda: next((s for s in self.sent.get(int(channel_id), []) if predicate(s)), None), timeout
        )

    def all_sent(self) -> list[Sent]:
        """Every bot message in every channel, in id order."""
        return sorted((s for msgs in self.sent.values() for s in msgs), key=lambda s: s.id)

    # ---- gateway -------------------------------------------------------------------------

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        self.gateway_queries.append(request.query_string)
        conn = _Connection(ws, compress=request.query.get("compress") == "zlib-stream")
        await conn.send({"op": 10, "d": {"heartbeat_interval": _HEARTBEAT_MS}})
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                payload = json.loads(msg.data)
                await self._gateway_op(conn, payload.get("op"), payload.get("d"))
        finally:
            if conn.session is not None and conn.session.connection is conn:
                conn.session.connection = None
            await self._notify()
        return ws

    async def _gateway_op(self, conn: _Connection, op: int | None, data: Any) -> None:
        if op == 1:
            await conn.send({"op": 11})
        elif op == 2:
            if data.get("token") != self.token:
                await conn.ws.close(code=4004, message=b"Authentication failed.")
                return
            shard = tuple(data["shard"]) if data.get("shard") else None
            session = _Session(id=f"session-{next(self._ids)}", shard=shard)  # type: ignore[arg-type]
            self._sessions[session.id] = session
            self._session, session.connection, conn.session = session, conn, session
            self.identifies += 1
            self.identified_shards.append(session.shard)
            guilds = [g for g in self._guild_ids if self._shard_of(g, session.shard)]
            await self._send(
                session,
                "READY",
                {
                    "v": 10,
                    "user": BOT_USER,
                    "guilds": [{"id": str(g), "unavailable": True} for g in guilds],
                    "session_id": session.id,
                    "resume_gateway_url": self.gateway_url,
                    "shard": data.get("shard"),
                    "application": {"id": str(BOT_ID), "flags": 0},
                    "private_channels": [],
                },
            )
            for guild in guilds:
                await self._send(session, "GUILD_CREATE", self._guild(guild))
        elif op == 6:
            session = self._sessions.get(data.get("session_id", ""))
            if session is None or data.get("token") != self.token:
                await conn.send({"op": 9, "d": False})
                return
            self._session, session.connection, conn.session = session, conn, session
            self.resumes += 1
            for event in session.history:
                if event["s"] > (data.get("seq") or 0):
                    await conn.send(event)
            await self._send(session, "RESUMED", {})

    async def _dispatch_interaction(self, interaction: dict[str, Any]) -> None:
        self._interactions[int(interaction["id"])] = (interaction, time.monotonic())
        await self._dispatch("INTERACTION_CREATE", interaction)

    async def _dispatch(self, event: str, data: dict[str, Any]) -> None:
        """Send an event to the connection that serves its guild (see the module docstring)."""
        if self._session is None:
            raise AssertionError("no gateway session: start the client first")
        guild = data.get("guild_id") or self._channels.get(int(data.get("channel_id") or 0), {}).get("guild_id")
        sharded = [s for s in self._sessions.values() if s.shard is not None]
        if not sharded:
            await self._send(self._session, event, data)
            return
        targets = [s for s in sharded if self._shard_of(int(guild) if guild else None, s.shard)]
        if targets:  # the newest session of that shard (an older one was replaced by a new IDENTIFY)
            await self._send(targets[-1], event, data)

    @staticmethod
    def _shard_of(guild_id: int | None, shard: tuple[int, int] | None) -> bool:
        """Whether ``shard`` receives the events of ``guild_id`` (None: DMs, shard 0)."""
        if shard is None:
            return True
        index, count = shard
        return index == (0 if guild_id is None else (guild_id >> 22) % count)

    async def _send(self, session: _Session, event: str, data: dict[str, Any]) -> None:
        session.seq += 1
        payload = {"op": 0, "t": event, "s": session.seq, "d": data}
        session.history.append(payload)
        if session.connection is not None:
            await session.connection.send(payload)
        await self._notify()

    # ---- REST ----------------------------------------------------------------------------

    def _keep(self, request: web.Request, body: dict[str, Any]) -> None:
        self.message_requests.append((f"{request.method} {request.path}", body))

    async def _rest(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["tail"]
        self.requests.append(f"{request.method} {path}")
        if request.headers.get("Authorization") != f"Bot {self.token}" and not path.startswith(
            ("/interactions/", "/webhooks/")
        ):
            return _error(401, 0, "401: Unauthorized")
        for failure in self._failures:
            if failure.method == request.method and failure.pattern.search(path):
                failure.times -= 1
                if failure.times <= 0:
                    self._failures.remove(failure)
                await self._notify()
                return _failure_response(failure)
        for method, pattern, handler in self._routes():
            match = pattern.fullmatch(path)
            if method == request.method and match:
                response = await handler(request, *match.groups())
                await self._notify()
                return response
        self.unknown_routes.append(f"{request.method} {path}")
        await self._notify()
        return _error(404, 0, "404: Not Found")

    def _routes(self) -> list[tuple[str, re.Pattern[str], Callable[..., Any]]]:
        c, m = r"(\d+)", r"(\d+)"
        table: list[tuple[str, str, Callable[..., Any]]] = [
            ("GET", "/users/@me", self._me),
            ("GET", "/oauth2/applications/@me", self._application),
            ("GET", "/gateway/bot", self._gateway_bot),
            ("GET", "/gateway", self._gateway_bot),
            ("GET", f"/channels/{c}", self._get_channel),
            ("POST", f"/channels/{c}/messages", self._post_message),
            ("PATCH", f"/channels/{c}/messages/{m}", self._edit_message),
            ("DELETE", f"/channels/{c}/messages/{m}", self._delete_message),
            ("POST", f"/channels/{c}/messages/{m}/threads", self._create_thread),
            ("PUT", f"/channels/{c}/messages/{m}/reactions/([^/]+)/@me", self._add_reaction),
            ("DELETE", f"/channels/{c}/messages/{m}/reactions/([^/]+)/@me", self._remove_reaction),
            ("POST", f"/channels/{c}/typing", self._typing),
            ("POST", r"/interactions/(\d+)/([^/]+)/callback", self._interaction_callback),
            ("PUT", r"/applications/(\d+)/commands", self._register_commands),
            ("PUT", r"/applications/(\d+)/guilds/(\d+)/commands", self._register_commands),
            ("POST", r"/webhooks/(\d+)/([^/]+)", self._followup),
            ("PATCH", r"/webhooks/(\d+)/([^/]+)/messages/@original", self._edit_original),
            ("GET", r"/webhooks/(\d+)/([^/]+)/messages/@original", self._get_original),
        ]
        return [(method, re.compile(pattern), handler) for method, pattern, handler in table]

    async def _me(self, request: web.Request) -> web.Response:
        return _json(BOT_USER)

    async def _application(self, request: web.Request) -> web.Response:
        return _json(
            {
                "id": str(BOT_ID),
                "name": "Threadbook",
                "description": "",
                "icon": None,
                "bot_public": True,
                "bot_require_code_grant": False,
                "owner": USER,
                "verify_key": "00",
                "flags": 0,
                "bot": BOT_USER,
            }
        )

    async def _gateway_bot(self, request: web.Request) -> web.Response:
        return _json(
            {
                "url": self.gateway_url,
                "shards": self.shards,
                "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 16},
            }
        )

    async def _get_channel(self, request: web.Request, channel_id: str) -> web.Response:
        channel = self._channels.get(int(channel_id))
        return _json(channel) if channel else _error(404, 10003, "Unknown Channel")

    async def _post_message(self, request: web.Request, channel_id: str) -> web.Response:
        cid = int(channel_id)
        if cid not in self._channels:
            return _error(404, 10003, "Unknown Channel")
        body, files = await _message_body(request)
        self._keep(request, body)
        if any(len(f.data) > self.upload_limit for f in files):
            return _error(413, 40005, "Request entity too large")
        content = body.get("content") or ""
        if len(content) > 2000:
            return _error(400, 50035, "Invalid Form Body: content: Must be 2000 or fewer in length.")
        if (refused := self._refused_v2(body, files)) is not None:
            return refused
        if not content and not files and not is_v2(body):
            return _error(400, 50006, "Cannot send an empty message")
        message = self._message_payload(cid, BOT_USER, content)
        message["components"] = body.get("components") or []
        message["flags"] = int(body.get("flags") or 0)
        message["attachments"] = [self._store_attachment(cid, f.name, f.data) for f in files]
        self.sent.setdefault(cid, []).append(
            Sent(
                int(message["id"]),
                cid,
                content,
                files,
                message["components"],
                content_length=request.content_length,
                flags=message["flags"],
            )
        )
        await self._dispatch("MESSAGE_CREATE", message)
        return _json(message)

    async def _edit_message(self, request: web.Request, channel_id: str, message_id: str) -> web.Response:
        message = self._messages.get(int(message_id))
        if message is None or int(message["channel_id"]) != int(channel_id):
            return _error(404, 10008, "Unknown Message")
        body = await request.json()
        self._keep(request, body)
        sent = self._find_sent(int(message_id))
        if "content" in body:
            message["content"] = sent.content = body["content"] or ""
            sent.edits.append(sent.content)
        if "components" in body:
            message["components"] = sent.components = body["components"] or []
        message["edited_timestamp"] = _now_iso()
        return _json(message)

    async def _delete_message(self, request: web.Request, channel_id: str, message_id: str) -> web.Response:
        self._find_sent(int(message_id)).deleted = True
        return web.Response(status=204)

    async def _create_thread(self, request: web.Request, channel_id: str, message_id: str) -> web.Response:
        parent = self._channels.get(int(channel_id))
        if parent is None or parent["type"] != 0 or int(message_id) not in self._messages:
            return _error(404, 10003, "Unknown Channel")
        if int(message_id) in self.threads:
            return _error(400, 160004, "A thread has already been created for this message")
        body = await request.json()
        name = body.get("name") or ""
        if not 1 <= len(name) <= 100:
            return _error(400, 50035, "Invalid Form Body: name: Must be between 1 and 100 in length.")
        thread = self._thread_payload(
            int(message_id),
            int(channel_id),
            name,
            owner_id=BOT_ID,
            archive_minutes=body.get("auto_archive_duration") or 1440,
        )
        self.threads[int(message_id)] = thread
        self._channels[int(message_id)] = thread
        self._messages[int(message_id)]["thread"] = thread
        await self._dispatch("THREAD_CREATE", {**thread, "newly_created": True})
        return _json(thread, status=201)

    async def _add_reaction(self, request: web.Request, channel_id: str, message_id: str, emoji: str) -> web.Response:
        emoji = unquote(emoji)
        self.reactions.add((int(channel_id), int(message_id), emoji))
        self.reaction_log.append(("add", int(message_id), emoji))
        return web.Response(status=204)

    async def _remove_reaction(
        self, request: web.Request, channel_id: str, message_id: str, emoji: str
    ) -> web.Response:
        emoji = unquote(emoji)
        self.reactions.discard((int(channel_id), int(message_id), emoji))
        self.reaction_log.append(("remove", int(message_id), emoji))
        return web.Response(status=204)

    async def _typing(self, request: web.Request, channel_id: str) -> web.Response:
        self.typing.append(int(channel_id))
        return web.Response(status=204)

    async def _interaction_callback(self, request: web.Request, interaction_id: str, token: str) -> web.Response:
        if token != f"itoken-{interaction_id}":
            return _error(401, 50027, "Invalid Webhook Token")
        body = await request.json()
        if body.get("type") in (4, 7):  # a message, or an update of the button's message
            self._keep(request, body.get("data") or {})
        self.interaction_responses.append({"interaction_id": int(interaction_id), **body})
        found = self._interactions.get(int(interaction_id))
        if found is None:
            return _error(404, 10062, "Unknown interaction")
        interaction, dispatched_at = found
        if any(c.interaction_id == int(interaction_id) for c in self.callbacks):
            return _error(400, 40060, "Interaction has already been acknowledged.")
        data = body.get("data") or {}
        self.callbacks.append(Callback(int(interaction_id), body["type"], data, time.monotonic() - dispatched_at))
        answer: dict[str, Any] = {"id": interaction_id, "type": interaction["type"]}
        if body["type"] in (4, 5):  # a message: the answer, or "thinking…" until it is edited
            message = self._interaction_message(interaction, data.get("content") or "", [], original=True, body=data)
            answer.update(
                response_message_id=message["id"],
                response_message_loading=body["type"] == 5,
                response_message_ephemeral=bool((data.get("flags") or 0) & _EPHEMERAL),
            )
        return _json({"interaction": answer})

    async def _register_commands(
        self, request: web.Request, application_id: str, guild_id: str | None = None
    ) -> web.Response:
        if int(application_id) != BOT_ID:
            return _error(403, 50001, "Missing Access")
        commands = []
        for command in await request.json():
            commands.append(
                {
                    "id": str(next(self._ids)),
                    "application_id": application_id,
                    "version": "1",
                    "type": 1,
                    "options": [],
                    "default_member_permissions": None,
                    "nsfw": False,
                    **command,
                    **({"guild_id": guild_id} if guild_id else {}),
                }
            )
        self.registered_commands[int(guild_id) if guild_id else None] = commands
        return _json(commands)

    def _interaction_for(self, application_id: str, token: str) -> dict[str, Any] | None:
        match = re.fullmatch(r"itoken-(\d+)", token)
        found = self._interactions.get(int(match.group(1))) if match else None
        return found[0] if found and int(application_id) == BOT_ID else None

    def _interaction_message(
        self, interaction: dict[str, Any], content: str, files: list[SentFile], *, original: bool, body: dict[str, Any]
    ) -> dict[str, Any]:
        """A message of an interaction in its channel, recorded in ``sent`` (ephemeral ones too)."""
        cid = int(interaction["channel_id"])
        message = self._message_payload(cid, BOT_USER, content)
        message.update(
            webhook_id=str(BOT_ID),
            application_id=str(BOT_ID),
            flags=body.get("flags") or 0,
            components=body.get("components") or [],
        )
        message["attachments"] = [self._store_attachment(cid, f.name, f.data) for f in files]
        self.sent.setdefault(cid, []).append(
            Sent(
                int(message["id"]),
                cid,
                content,
                files,
                message["components"],
                interaction_id=int(interaction["id"]),
                original=original,
                ephemeral=bool(message["flags"] & _EPHEMERAL),
                flags=int(message["flags"]),
            )
        )
        return message

    def _original(self, interaction_id: int) -> Sent | None:
        return next((s for s in self.all_sent() if s.interaction_id == interaction_id and s.original), None)

    async def _followup(self, request: web.Request, application_id: str, token: str) -> web.Response:
        interaction = self._interaction_for(application_id, token)
        if interaction is None:
            return _error(401, 50027, "Invalid Webhook Token")
        body, files = await _message_body(request)
        self._keep(request, body)
        content = body.get("content") or ""
        if len(content) > 2000:
            return _error(400, 50035, "Invalid Form Body: content: Must be 2000 or fewer in length.")
        if (refused := self._refused_v2(body, files)) is not None:
            return refused
        if not content and not files and not is_v2(body):
            return _error(400, 50006, "Cannot send an empty message")
        if any(len(f.data) > self.upload_limit for f in files):
            return _error(413, 40005, "Request entity too large")
        return _json(self._interaction_message(interaction, content, files, original=False, body=body))

    async def _edit_original(self, request: web.Request, application_id: str, token: str) -> web.Response:
        interaction = self._interaction_for(application_id, token)
        if interaction is None:
            return _error(401, 50027, "Invalid Webhook Token")
        sent = self._original(int(interaction["id"]))
        if sent is None:
            return _error(404, 10008, "Unknown Message")
        body, files = await _message_body(request)
        self._keep(request, body)
        message = self._messages[sent.id]
        if "content" in body:
            message["content"] = sent.content = body["content"] or ""
            sent.edits.append(sent.content)
        if "components" in body:
            message["components"] = sent.components = body["components"] or []
        sent.files.extend(files)
        message["edited_timestamp"] = _now_iso()
        return _json(message)

    async def _get_original(self, request: web.Request, application_id: str, token: str) -> web.Response:
        interaction = self._interaction_for(application_id, token)
        sent = self._original(int(interaction["id"])) if interaction is not None else None
        return _json(self._messages[sent.id]) if sent is not None else _error(404, 10008, "Unknown Message")

    async def _cdn_get(self, request: web.Request) -> web.Response:
        attachment_id = request.match_info["attachment"]
        if attachment_id not in self._cdn:
            return web.Response(status=404)
        name, data = self._cdn[attachment_id]
        self.cdn_downloads.append(name)
        await self._notify()
        return web.Response(body=data, content_type="application/octet-stream")

    # ---- payload builders ----------------------------------------------------------------

    def _text_channel(self, channel_id: int = CHANNEL_ID, guild_id: int = GUILD_ID) -> dict[str, Any]:
        return {
            "id": str(channel_id),
            "type": 0,
            "guild_id": str(guild_id),
            "name": "general",
            "position": 0,
            "permission_overwrites": [],
            "nsfw": False,
            "parent_id": None,
            "topic": None,
            "last_message_id": None,
            "rate_limit_per_user": 0,
            "default_auto_archive_duration": 1440,
        }

    def _thread_payload(
        self, thread_id: int, parent_id: int, name: str, *, owner_id: int, archive_minutes: int = 1440
    ) -> dict[str, Any]:
        return {
            "id": str(thread_id),
            "guild_id": self._channels[parent_id]["guild_id"],
            "parent_id": str(parent_id),
            "owner_id": str(owner_id),
            "name": name,
            "type": _PUBLIC_THREAD,
            "last_message_id": None,
            "rate_limit_per_user": 0,
            "message_count": 0,
            "member_count": 1,
            "flags": 0,
            "thread_metadata": {
                "archived": False,
                "auto_archive_duration": archive_minutes,
                "archive_timestamp": _now_iso(),
                "locked": False,
            },
        }

    def _member(self, user: dict[str, Any]) -> dict[str, Any]:
        return {
            "user": user,
            "roles": [],
            "joined_at": _now_iso(),
            "deaf": False,
            "mute": False,
            "flags": 0,
            "permissions": "0",
        }

    def _guild(self, guild_id: int = GUILD_ID) -> dict[str, Any]:
        mine = [
            c for c in self._channels.values() if c.get("guild_id") == str(guild_id) and c.get("type") in (0, _FORUM)
        ]
        active = [
            t
            for i, t in self.threads.items()  # like Discord: not deleted, not archived
            if t["guild_id"] == str(guild_id) and i in self._channels and not t["thread_metadata"]["archived"]
        ]
        return {
            "id": str(guild_id),
            "name": "Test Guild",
            "owner_id": str(USER_ID),
            "unavailable": False,
            "channels": mine,
            "threads": active,
            "members": [self._member(BOT_USER)],
            "member_count": 3,
            "large": False,
            "features": [],
            "roles": [
                {
                    "id": str(guild_id),
                    "name": "@everyone",
                    "permissions": "1071698660929",
                    "position": 0,
                    "color": 0,
                    "hoist": False,
                    "managed": False,
                    "mentionable": False,
                    "flags": 0,
                }
            ],
            "emojis": [],
            "stickers": [],
            "voice_states": [],
            "presences": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
            "premium_tier": 0,
            "preferred_locale": "en-US",
            "joined_at": _now_iso(),
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "nsfw_level": 0,
            "system_channel_flags": 0,
        }

    def _message_payload(
        self, channel_id: int, author: dict[str, Any], content: str, *, message_id: int | None = None
    ) -> dict[str, Any]:
        message_id = message_id or next(self._ids)
        message: dict[str, Any] = {
            "id": str(message_id),
            "channel_id": str(channel_id),
            "type": 0,
            "content": content,
            "author": author,
            "timestamp": _now_iso(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "pinned": False,
            "flags": 0,
            "components": [],
        }
        channel = self._channels.get(channel_id, {})
        if channel.get("guild_id"):
            message["guild_id"] = channel["guild_id"]
            message["member"] = {k: v for k, v in self._member(author).items() if k != "user"}
        self._messages[message_id] = message
        return message

    def _store_attachment(self, channel_id: int, name: str, data: bytes) -> dict[str, Any]:
        attachment_id = str(next(self._ids))
        self._cdn[attachment_id] = (name, data)
        url = f"{self.base_url}/attachments/{channel_id}/{attachment_id}/{name}"
        return {
            "id": attachment_id,
            "filename": name,
            "size": len(data),
            "url": url,
            "proxy_url": url,
            "content_type": "text/csv" if name.endswith(".csv") else "application/octet-stream",
        }

    def _find_sent(self, message_id: int) -> Sent:
        for sent in self.all_sent():
            if sent.id == message_id:
                return sent
        raise AssertionError(f"the bot never sent message {message_id}")

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


async def _message_body(request: web.Request) -> tuple[dict[str, Any], list[SentFile]]:
    """The JSON body of a message request and its files (multipart with ``payload_json``, or JSON)."""
    files: list[SentFile] = []
    if not request.content_type.startswith("multipart/"):
        return await request.json(), files
    body: dict[str, Any] = {}
    reader = await request.multipart()
    async for part in reader:
        if part.name == "payload_json":
            body = json.loads(await part.text())  # type: ignore[union-attr]
        else:
            files.append(SentFile(part.filename or "file", bytes(await part.read())))  # type: ignore[union-attr]
    return body, files


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response whose Content-Type is exactly ``application/json`` (discord.py compares it)."""
    return web.Response(
        body=json.dumps(data).encode(), status=status, headers={"Content-Type": "application/json", **(headers or {})}
    )


def _error(status: int, code: int, message: str) -> web.Response:
    return _json({"message": message, "code": code}, status=status)


def _failure_response(failure: _Failure) -> web.Response:
    if failure.status == 429:
        return _json(
            {"message": "You are being rate limited.", "retry_after": failure.retry_after, "global": False},
            status=429,
            headers={"Via": "1.1 google", "Retry-After": str(failure.retry_after), "X-RateLimit-Scope": "user"},
        )
    if failure.status == 403:
        return _error(403, 50013, "Missing Permissions")
    return _error(failure.status, 0, f"{failure.status}: injected failure")


@pytest_asyncio.fixture
async def fake_discord() -> AsyncIterator[FakeDiscord]:
    """A running :class:`FakeDiscord` for one test."""
    async with FakeDiscord() as fake:
        yield fake
