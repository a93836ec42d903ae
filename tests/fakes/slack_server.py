"""A fake Slack on 127.0.0.1: Web API, file hosting, signed Events API delivery, Socket Mode.

The real ``slack_sdk`` / ``slack_bolt`` talk to it through ``base_url``; tests assert on what
reached it. Everything is one aiohttp server on an ephemeral port::

    async with FakeSlack() as slack:
        settings = {"slack": {"bot_token": slack.bot_token, "api_url": slack.api_url, ...}}
        ...
        await slack.post_event(slack.mention("C1", "hi"), url=adapter_events_url)   # HTTP mode
        await slack.socket_send("events_api", slack.event_callback(event))          # Socket Mode
        msg = await slack.wait_for(lambda: slack.bot_messages("C1", thread_ts))

Web API (``POST /api/<method>``, form or JSON body, ``Authorization: Bearer``):
``auth.test``, ``chat.postMessage`` / ``chat.update`` / ``chat.delete``, ``reactions.add`` /
``reactions.remove``, ``conversations.replies`` / ``conversations.info``, ``users.info`` (each
person's ``tz`` from :attr:`FakeSlack.user_timezones`), ``files.getUploadURLExternal`` (+ ``POST
/upload/<file_id>``) and ``files.completeUploadExternal``, ``apps.connections.open`` (app
token); streaming (``chat.startStream`` / ``appendStream`` / ``stopStream``: the message keeps
each piece; :attr:`FakeSlack.refuse_streaming` makes Slack refuse, as for an app or plan it
will not stream for); ``assistant.threads.setStatus`` / ``setTitle`` / ``setSuggestedPrompts``
(recorded per thread); ``agents.sessions.setStatus`` / ``rename`` (statuses and titles per thread
in :attr:`FakeSlack.sessions` / :attr:`FakeSlack.session_titles`; :attr:`FakeSlack.refuse_sessions`
makes Slack refuse them, as for an app not declared an agent), and Slack's own Stop on a session,
:meth:`FakeSlack.agent_session_stopped`. Events for the AI-app surface: :meth:`FakeSlack.assistant_thread_started`,
and :meth:`FakeSlack.feedback_action` clicks an answer's feedback buttons. Blocks are checked
against Block Kit's documented limits (:mod:`tests.fakes.slack_blocks`): out of schema, or of a
type in :attr:`FakeSlack.refuse_blocks` (not rolled out in this workspace), Slack answers
``invalid_blocks``; blocks out of schema also fail the test when the fake stops. Every call is recorded in :attr:`FakeSlack.calls`. A wrong token gets
``invalid_auth``; :meth:`FakeSlack.fail` makes the next calls of a method fail with an error
(``"ratelimited"`` answers HTTP 429 with ``Retry-After: 1``); channels in
:attr:`FakeSlack.not_in_channel` refuse posts, as do :attr:`FakeSlack.archived_channels` and
:attr:`FakeSlack.deleted_channels`; :meth:`FakeSlack.delete_thread` deletes a thread.

Files: :meth:`FakeSlack.add_file` hosts bytes at ``url_private_download``; like Slack, a
download without the bot token gets an HTML login page with status 200.

Events: :meth:`FakeSlack.post_event` / :meth:`FakeSlack.post_interactive` sign the body with
the signing secret (``X-Slack-Retry-Num`` on request). Socket Mode: ``GET /socket`` sends
``hello``; :meth:`FakeSlack.socket_send` delivers an envelope and waits for its ack;
:meth:`FakeSlack.socket_disconnect` sends ``disconnect`` and waits for the client to come back.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlencode

from aiohttp import WSMsgType, web
from aiohttp.client import ClientSession

from tests.fakes.local_http import serve_locally
from tests.fakes.slack_blocks import check_blocks

T = TypeVar("T")


@dataclass
class Call:
    """One Web API call as it reached the server."""

    method: str
    args: dict[str, Any]
    token: str
    at: float = field(default_factory=time.monotonic)


@dataclass
class Message:
    """A message the bot posted (``updates`` holds every later ``chat.update`` text)."""

    channel: str
    ts: str
    text: str
    thread_ts: str | None
    blocks: list[dict[str, Any]] | None
    updates: list[str] = field(default_factory=list)
    deleted: bool = False
    #: A streamed message: each piece of Markdown as it arrived (start, appends, stop).
    pieces: list[str] = field(default_factory=list)
    #: ``streaming`` until ``chat.stopStream``, then ``stopped``; None for a posted message.
    stream_state: str | None = None
    #: A streamed message: every chunk as it arrived (text, ``task_update``, ``plan_update``).
    chunks: list[dict[str, Any]] = field(default_factory=list)
    #: Files shared in this very message (``files.completeUploadExternal`` with a comment or blocks).
    files: list[str] = field(default_factory=list)


@dataclass
class Upload:
    """A file shared by the external upload flow (getUploadURLExternal, upload URL, completeUploadExternal).

    ``data`` holds the bytes when there are at most :attr:`FakeSlack.keep_upload_bytes` of them
    (else it is empty); ``size`` and ``sha256`` always describe everything that arrived.
    ``length`` is what ``files.getUploadURLExternal`` was told; ``content_length`` is the
    upload request's header (None when the body came chunked).
    """

    file_id: str
    filename: str
    title: str
    data: bytes
    channel: str | None
    thread_ts: str | None
    size: int = 0
    sha256: str = ""
    length: int | None = None
    content_length: int | None = None


@dataclass
class _Received:
    """An upload URL's state: what getUploadURLExternal was told, then what the POST carried."""

    filename: str
    length: int
    data: bytes | None = None
    size: int = 0
    sha256: str = ""
    content_length: int | None = None


#: What a streamed message's chunks may be (docs.slack.dev, chat.appendStream "Using the chunks
#: parameter"; slack_sdk's ``TaskUpdateChunk``: status pending, in_progress, complete or error).
_TASK_STATUSES = frozenset({"pending", "in_progress", "complete", "error"})


def _check_chunk(chunk: Any) -> None:
    """Raise :class:`ValueError` unless ``chunk`` is a streaming chunk Slack takes."""
    if not isinstance(chunk, dict):
        raise ValueError(f"a chunk that is no object: {chunk!r}")
    kind = chunk.get("type")
    if kind == "markdown_text":
        if not isinstance(chunk.get("text"), str) or len(chunk["text"]) > 12_000:
            raise ValueError("markdown_text chunk without text, or over 12,000 characters")
    elif kind == "plan_update":
        if not isinstance(chunk.get("title"), str) or not chunk["title"]:
            raise ValueError("plan_update chunk without a title")
    elif kind == "task_update":
        if not (isinstance(chunk.get("id"), str) and chunk["id"] and isinstance(chunk.get("title"), str)):
            raise ValueError("task_update chunk without an id or title")
        if chunk.get("status") not in _TASK_STATUSES:
            raise ValueError(f"task_update chunk with status {chunk.get('status')!r}")
        if any(not isinstance(chunk.get(f, ""), str) for f in ("details", "output")):
            raise ValueError("task_update details or output that is no text")
        if set(chunk) - {"type", "id", "title", "status", "details", "output", "sources"}:
            raise ValueError(f"task_update chunk with unknown fields {sorted(set(chunk))}")
    elif kind != "blocks":
        raise ValueError(f"unknown chunk type {kind!r}")


def app_context(channel: str) -> dict[str, Any]:
    """The ``app_context`` (and ``app_context_changed`` ``context``) of a person viewing ``channel``."""
    return {"entities": [{"type": "slack#/types/channel_id", "value": channel, "team_id": "T1"}]}


class FakeSlack:
    """A local Slack workspace with one bot; see the module docstring."""

    def __init__(
        self,
        *,
        team_id: str = "T1",
        bot_user_id: str = "UBOT",
        bot_id: str = "BBOT",
        bot_token: str = "xoxb-test-token",
        app_token: str = "xapp-test-token",
        signing_secret: str = "test-signing-secret",
    ) -> None:
        self.team_id, self.bot_user_id, self.bot_id = team_id, bot_user_id, bot_id
        self.bot_token, self.app_token, self.signing_secret = bot_token, app_token, signing_secret
        self.calls: list[Call] = []
        self.messages: list[Message] = []
        self.uploads: list[Upload] = []
        self.reactions: dict[tuple[str, str], set[str]] = {}
        self.not_in_channel: set[str] = set()
        self.archived_channels: set[str] = set()
        self.deleted_channels: set[str] = set()
        #: ``users.info``'s ``tz`` per user id (people not listed have none).
        self.user_timezones: dict[str, str] = {}
        self.socket_connects = 0
        #: An error code ``chat.startStream`` answers with (a workspace or app Slack will not stream for).
        self.refuse_streaming: str | None = None
        #: ``assistant.threads.*`` calls per (channel, thread_ts): statuses set, titles, prompt lists.
        self.statuses: dict[tuple[str, str], list[str]] = {}
        self.titles: dict[tuple[str, str], str] = {}
        self.suggested_prompts: dict[tuple[str, str], list[dict[str, Any]]] = {}
        #: Each channel's members (``conversations.members``) and name (``conversations.info``);
        #: a channel not listed has no members and no name.
        self.channel_members: dict[str, set[str]] = {}
        self.channel_names: dict[str, str] = {}
        #: ``agents.sessions.setStatus`` statuses per (channel, thread_ts), and each session's title.
        self.sessions: dict[tuple[str, str], list[str]] = {}
        self.session_titles: dict[tuple[str, str], str] = {}
        #: The error ``agents.sessions.*`` answer with (an app not declared as an agent); None: sessions work.
        self.refuse_sessions: str | None = None
        #: Block types this workspace does not have yet: a message carrying one gets ``invalid_blocks``.
        self.refuse_blocks: set[str] = set()
        #: Every call answered ``invalid_blocks``: (method, why). Those for blocks out of schema
        #: (:mod:`tests.fakes.slack_blocks`) fail the test when the fake stops, unless
        #: :attr:`allow_invalid_blocks` says the test means to send them.
        self.refused_blocks: list[tuple[str, str]] = []
        self.schema_errors: list[str] = []
        self.allow_invalid_blocks = False
        self.downloads: list[tuple[str, bool]] = []  # (file id, authorised)
        self._failures: dict[str, list[str]] = {}
        self._files: dict[str, tuple[bytes, str]] = {}
        self._pending_uploads: dict[str, _Received] = {}
        #: Uploads larger than this are hashed while they arrive, not kept (tests of big files).
        self.keep_upload_bytes = 32 * 2**20
        self._user_messages: list[dict[str, Any]] = []
        self._sockets: list[web.WebSocketResponse] = []
        self._acks: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._changed = asyncio.Event()
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None
        self.port = 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Bind 127.0.0.1 on an ephemeral port."""
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/api/{method}", self._api)  # slack_sdk reads some methods with GET
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_get("/files-pri/{file_id}/{name}", self._download)
        app.router.add_get("/socket", self._socket)
        self._runner, self.port = await serve_locally(app)
        self._session = ClientSession()

    async def stop(self) -> None:
        """Close sockets, the client session and the server."""
        for ws in list(self._sockets):
            await ws.close()
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakeSlack:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        if exc[0] is None and self.schema_errors and not self.allow_invalid_blocks:
            raise AssertionError(f"the bot sent blocks Slack refuses: {self.schema_errors}")

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        """The Web API base URL to configure as ``slack.api_url``."""
        return f"{self.base_url}/api/"

    # ------------------------------------------------------------------ test helpers
    def fail(self, method: str, error: str, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` fail with ``error``."""
        self._failures.setdefault(method, []).extend([error] * times)

    def delete_thread(self, channel: str, thread_ts: str) -> None:
        """Delete a thread's parent and every reply (``conversations.replies`` then answers ``thread_not_found``)."""
        self._user_messages = [
            e
            for e in self._user_messages
            if not (e["channel"] == channel and thread_ts in (e["ts"], e.get("thread_ts")))
        ]
        for message in self.bot_messages(channel, thread_ts):
            message.deleted = True

    def calls_to(self, method: str) -> list[Call]:
        """The recorded calls of one Web API method."""
        return [c for c in self.calls if c.method == method]

    def bot_messages(self, channel: str, thread_ts: str | None = None) -> list[Message]:
        """Messages the bot posted in a channel (and thread), not deleted, oldest first."""
        return [
            m
            for m in self.messages
            if m.channel == channel and not m.deleted and (thread_ts is None or m.thread_ts == thread_ts)
        ]

    def add_file(self, name: str, data: bytes, mimetype: str = "application/octet-stream") -> dict[str, Any]:
        """Host a file and return its Slack file object (for an event's ``files`` list)."""
        file_id = f"F{next(self._ids):06d}"
        self._files[file_id] = (data, mimetype)
        url = f"{self.base_url}/files-pri/{self.team_id}-{file_id}/{name}"
        return {
            "id": file_id,
            "name": name,
            "title": name,
            "mimetype": mimetype,
            "filetype": name.rsplit(".", 1)[-1],
            "size": len(data),
            "url_private": url,
            "url_private_download": url + "?download=1",
        }

    async def wait_for(self, predicate: Callable[[], T], timeout: float = 10.0) -> T:
        """Wait until ``predicate()`` is truthy (re-checked on every server change)."""
        deadline = time.monotonic() + timeout
        while True:
            result = predicate()
            if result:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout}s; calls: {[c.method for c in self.calls]}")
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), min(remaining, 0.5))
            except TimeoutError:
                pass

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ------------------------------------------------------------------ payload builders
    def next_ts(self) -> str:
        """A fresh, increasing message timestamp."""
        n = next(self._ids)
        return f"{1_700_000_000 + n}.{n:06d}"

    def message_event(
        self,
        channel: str,
        text: str,
        *,
        user: str = "U1",
        ts: str | None = None,
        thread_ts: str | None = None,
        files: list[dict[str, Any]] | None = None,
        event_type: str = "message",
        channel_type: str = "channel",
        **extra: Any,
    ) -> dict[str, Any]:
        """A ``message`` (or ``app_mention``) event from a user; recorded for conversations.replies."""
        event: dict[str, Any] = {
            "type": event_type,
            "user": user,
            "text": text,
            "ts": ts or self.next_ts(),
            "channel": channel,
            "team": self.team_id,
            "event_ts": "0",
        }
        event["event_ts"] = event["ts"]
        if event_type == "message":
            event["channel_type"] = channel_type
        if thread_ts:
            event["thread_ts"] = thread_ts
        if files:
            event["files"] = files
            if event_type == "message":
                event["subtype"] = "file_share"
        event.update(extra)
        self._user_messages.append(event)
        return event

    def mention(self, channel: str, text: str, **kwargs: Any) -> dict[str, Any]:
        """An ``app_mention`` event whose text starts with the bot mention."""
        return self.message_event(channel, f"<@{self.bot_user_id}> {text}", event_type="app_mention", **kwargs)

    def event_callback(self, event: dict[str, Any], *, event_id: str | None = None) -> dict[str, Any]:
        """Wrap an event the way the Events API and Socket Mode deliver it."""
        return {
            "token": "legacy-verification-token",
            "team_id": self.team_id,
            "api_app_id": "A1",
            "event": event,
            "type": "event_callback",
            "event_id": event_id or f"Ev{uuid.uuid4().hex[:10].upper()}",
            "event_time": int(time.time()),
            "authorizations": [
                {"enterprise_id": None, "team_id": self.team_id, "user_id": self.bot_user_id, "is_bot": True}
            ],
            "is_ext_shared_channel": False,
        }

    def block_action(self, message: Message, action_id: str, value: str, *, user: str = "U1") -> dict[str, Any]:
        """A ``block_actions`` payload: ``user`` clicked button ``action_id`` on ``message``."""
        return {
            "type": "block_actions",
            "team": {"id": self.team_id, "domain": "test"},
            "user": {"id": user, "username": user, "team_id": self.team_id},
            "api_app_id": "A1",
            "token": "legacy-verification-token",
            "container": {"type": "message", "message_ts": message.ts, "channel_id": message.channel},
            "trigger_id": "1.2.3",
            "channel": {"id": message.channel, "name": message.channel},
            "message": {"type": "message", "ts": message.ts, "text": message.text, "thread_ts": message.thread_ts},
            "actions": [
                {
                    "type": "button",
                    "action_id": action_id,
                    "block_id": "b1",
                    "value": value,
                    "action_ts": str(time.time()),
                }
            ],
        }

    def assistant_thread_started(
        self, channel: str, *, user: str = "U1", context_channel: str | None = None
    ) -> dict[str, Any]:
        """An ``assistant_thread_started`` event: ``user`` opened a new assistant thread in the
        bot's DM ``channel`` while viewing ``context_channel``. Its ``thread_ts`` is the thread."""
        thread_ts = self.next_ts()
        return {
            "type": "assistant_thread_started",
            "assistant_thread": {
                "user_id": user,
                "context": {"channel_id": context_channel, "team_id": self.team_id, "enterprise_id": None},
                "channel_id": channel,
                "thread_ts": thread_ts,
            },
            "event_ts": thread_ts,
        }

    def app_home_opened(
        self, user: str, dm_channel: str, *, tab: str = "messages", viewing: str | None = None
    ) -> dict[str, Any]:
        """An ``app_home_opened`` event: ``user`` opened the app's Messages tab (their DM
        ``dm_channel``), with the channel they view as its ``app_context`` when given."""
        event: dict[str, Any] = {"type": "app_home_opened", "user": user, "channel": dm_channel, "tab": tab}
        event["event_ts"] = self.next_ts()
        if viewing is not None:
            event["app_context"] = app_context(viewing)
        return event

    def app_context_changed(self, user: str, dm_channel: str, viewing: str | None) -> dict[str, Any]:
        """An ``app_context_changed`` event: ``user`` now views channel ``viewing`` (None: nothing)."""
        return {
            "type": "app_context_changed",
            "user": user,
            "channel": dm_channel,
            "context": app_context(viewing) if viewing is not None else {},
            "event_ts": self.next_ts(),
        }

    def agent_session_stopped(self, channel: str, thread_ts: str, *, user: str = "U1") -> dict[str, Any]:
        """An ``agent_session_stopped`` event: ``user`` clicked Slack's own Stop on the thread's session."""
        return {
            "type": "agent_session_stopped",
            "channel": channel,
            "thread_ts": thread_ts,
            "user": user,
            "streaming_message_ts": [],
            "event_ts": self.next_ts(),
        }

    def feedback_action(self, message: Message, *, positive: bool, user: str = "U1") -> dict[str, Any]:
        """A ``block_actions`` payload: ``user`` clicked 👍 (``positive``) or 👎 on ``message``'s
        feedback buttons (a ``context_actions`` block's ``feedback_buttons`` element)."""
        element = next(
            element
            for block in message.blocks or []
            if block.get("type") == "context_actions"
            for element in block.get("elements", [])
            if element.get("type") == "feedback_buttons"
        )
        button = element["positive_button" if positive else "negative_button"]
        payload = self.block_action(message, element["action_id"], button["value"], user=user)
        payload["actions"][0]["type"] = "feedback_buttons"
        return payload

    # ------------------------------------------------------------------ delivery
    def sign(self, body: bytes, timestamp: str, secret: str | None = None) -> str:
        """The ``X-Slack-Signature`` for ``body`` (v0 scheme)."""
        base = f"v0:{timestamp}:".encode() + body
        key = (secret if secret is not None else self.signing_secret).encode()
        return "v0=" + hmac.new(key, base, hashlib.sha256).hexdigest()

    async def post_signed(
        self,
        url: str,
        body: bytes,
        content_type: str,
        *,
        retry_num: int | None = None,
        secret: str | None = None,
    ) -> tuple[int, str]:
        """POST a signed body to the bot; returns (status, response text)."""
        assert self._session is not None
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": content_type,
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": self.sign(body, timestamp, secret),
        }
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = "http_timeout"
        async with self._session.post(url, data=body, headers=headers) as resp:
            return resp.status, await resp.text()

    async def post_event(
        self, url: str, payload: dict[str, Any], *, retry_num: int | None = None, secret: str | None = None
    ) -> tuple[int, str]:
        """Deliver an Events API body (an event is wrapped by :meth:`event_callback` first)."""
        if payload.get("type") not in ("event_callback", "url_verification"):
            payload = self.event_callback(payload)
        body = json.dumps(payload).encode()
        return await self.post_signed(url, body, "application/json", retry_num=retry_num, secret=secret)

    async def post_interactive(self, url: str, payload: dict[str, Any]) -> tuple[int, str]:
        """Deliver an interactivity payload (``payload=<json>`` form body), signed."""
        body = urlencode({"payload": json.dumps(payload)}).encode()
        return await self.post_signed(url, body, "application/x-www-form-urlencoded")

    async def socket_send(
        self, kind: str, payload: dict[str, Any], *, timeout: float = 5.0, connection: int = -1
    ) -> dict[str, Any]:
        """Send an envelope (``events_api``, ``interactive``) on one open socket (the newest by
        default; ``connection`` indexes the open ones, oldest first, as Slack hands each event
        to one of an app's connections); return its ack."""
        ws = await self.wait_for(lambda: [s for s in self._sockets if not s.closed], timeout)
        envelope_id = str(uuid.uuid4())
        ack: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._acks[envelope_id] = ack
        envelope = {
            "envelope_id": envelope_id,
            "type": kind,
            "accepts_response_payload": False,
            "retry_attempt": 0,
            "retry_reason": "",
            "payload": payload,
        }
        await ws[connection].send_str(json.dumps(envelope))
        try:
            return await asyncio.wait_for(ack, timeout)
        finally:
            self._acks.pop(envelope_id, None)

    async def socket_disconnect(self, timeout: float = 5.0) -> None:
        """Send ``disconnect`` (refresh_requested); wait for the client to open a new socket."""
        old = [s for s in self._sockets if not s.closed]
        assert old, "no socket connected"
        connects = self.socket_connects
        await old[-1].send_str(json.dumps({"type": "disconnect", "reason": "refresh_requested"}))
        await self.wait_for(lambda: self.socket_connects > connects, timeout)
        for ws in old:
            await ws.close()

    # ------------------------------------------------------------------ HTTP handlers
    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        args = await _read_args(request)
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip() or str(args.get("token", ""))
        self.calls.append(Call(method, args, token))
        self._notify()
        expected = self.app_token if method == "apps.connections.open" else self.bot_token
        if token != expected:
            return web.json_response({"ok": False, "error": "invalid_auth"})
        if method in _BLOCK_METHODS and args.get("blocks") and (refused := self._refused(method, args["blocks"])):
            return web.json_response({"ok": False, "error": "invalid_blocks", "errors": [refused]})
        failures = self._failures.get(method)
        if failures:
            error = failures.pop(0)
            if error == "ratelimited":
                return web.json_response({"ok": False, "error": error}, status=429, headers={"Retry-After": "1"})
            return web.json_response({"ok": False, "error": error})
        handler = _METHODS.get(method)
        if handler is None:
            return web.json_response({"ok": False, "error": "unknown_method"})
        result = handler(self, args)
        self._notify()
        return web.json_response(result)

    def _refused(self, method: str, blocks: Any) -> str | None:
        """Why Slack refuses a message's blocks: out of schema, or of a type not rolled out here."""
        why = check_blocks(blocks)
        if why is not None:
            self.schema_errors.append(f"{method}: {why}")
        else:
            kinds = {str(b.get("type")) for b in blocks if isinstance(b, dict)} & self.refuse_blocks
            why = f"unsupported block type {sorted(kinds)[0]}" if kinds else None
        if why is not None:
            self.refused_blocks.append((method, why))
        return why

    async def _upload(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        if file_id not in self._pending_uploads:
            return web.Response(status=404, text="no such upload")
        pending = self._pending_uploads[file_id]
        keep = pending.length <= self.keep_upload_bytes  # decided up front: a big upload is never buffered
        digest, kept, size = hashlib.sha256(), bytearray(), 0
        async for chunk in request.content.iter_chunked(1 << 20):
            digest.update(chunk)
            size += len(chunk)
            if keep and size <= self.keep_upload_bytes:
                kept += chunk
        pending.data = bytes(kept) if size <= self.keep_upload_bytes else b""
        pending.size, pending.sha256, pending.content_length = size, digest.hexdigest(), request.content_length
        self._notify()
        return web.Response(text=f"OK - {size}")

    async def _download(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"].removeprefix(f"{self.team_id}-")
        authorised = request.headers.get("Authorization") == f"Bearer {self.bot_token}"
        self.downloads.append((file_id, authorised))
        self._notify()
        if not authorised:  # what Slack really does: a login page, status 200
            return web.Response(text="<html><body>Sign in to Slack</body></html>", content_type="text/html")
        if file_id not in self._files:
            return web.Response(status=404, text="file_not_found")
        data, mime = self._files[file_id]
        return web.Response(body=data, content_type=mime)

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._sockets.append(ws)
        self.socket_connects += 1
        self._notify()
        await ws.send_str(json.dumps({"type": "hello", "num_connections": 1, "connection_info": {"app_id": "A1"}}))
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                data = json.loads(msg.data)
                ack = self._acks.get(data.get("envelope_id", ""))
                if ack is not None and not ack.done():
                    ack.set_result(data)
        finally:
            self._sockets.remove(ws)
            self._notify()
        return ws

    # ------------------------------------------------------------------ Web API methods
    def _auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "url": "https://test.slack.com/",
            "team": "Test",
            "user": "threadbook",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    def _post_message(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = str(args.get("channel", ""))
        if channel in self.not_in_channel:
            return {"ok": False, "error": "not_in_channel"}
        if gone := self._channel_gone(channel):
            return gone
        text = str(args.get("text") or "")
        if not text and not args.get("blocks"):
            return {"ok": False, "error": "no_text"}
        if len(text) > 40_000:
            return {"ok": False, "error": "msg_too_long"}
        message = Message(channel, self.next_ts(), text, args.get("thread_ts") or None, args.get("blocks"))
        self.messages.append(message)
        return {"ok": True, "channel": channel, "ts": message.ts, "message": _as_event(message, self)}

    def _find(self, args: dict[str, Any]) -> Message | None:
        channel, ts = args.get("channel"), args.get("ts")
        return next((m for m in self.messages if m.channel == channel and m.ts == ts and not m.deleted), None)

    def _update(self, args: dict[str, Any]) -> dict[str, Any]:
        message = self._find(args)
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        message.text = str(args.get("text") or "")
        message.blocks = args.get("blocks")
        message.updates.append(message.text)
        return {"ok": True, "channel": message.channel, "ts": message.ts, "text": message.text}

    def _delete(self, args: dict[str, Any]) -> dict[str, Any]:
        message = self._find(args)
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        message.deleted = True
        return {"ok": True, "channel": message.channel, "ts": message.ts}

    def _reaction(self, args: dict[str, Any], add: bool) -> dict[str, Any]:
        names = self.reactions.setdefault((str(args.get("channel")), str(args.get("timestamp"))), set())
        name = str(args.get("name"))
        if add and name in names:
            return {"ok": False, "error": "already_reacted"}
        if not add and name not in names:
            return {"ok": False, "error": "no_reaction"}
        (names.add if add else names.discard)(name)
        return {"ok": True}

    def _channel_gone(self, channel: str) -> dict[str, Any] | None:
        """Slack's error for a deleted or archived channel; None for one that takes messages."""
        if channel in self.deleted_channels:
            return {"ok": False, "error": "channel_not_found"}
        if channel in self.archived_channels:
            return {"ok": False, "error": "is_archived"}
        return None

    def _replies(self, args: dict[str, Any]) -> dict[str, Any]:
        channel, ts = args.get("channel"), args.get("ts")
        if channel in self.deleted_channels:
            return {"ok": False, "error": "channel_not_found"}
        users = [e for e in self._user_messages if e["channel"] == channel and ts in (e["ts"], e.get("thread_ts"))]
        bots = [_as_event(m, self) for m in self.bot_messages(str(channel), str(ts))]
        messages = sorted(users + bots, key=lambda e: float(e["ts"]))
        if not messages:
            return {"ok": False, "error": "thread_not_found"}
        limit = int(args.get("limit") or 1000)
        return {"ok": True, "messages": messages[:limit], "has_more": len(messages) > limit}

    def _conversation_info(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = str(args.get("channel", ""))
        if channel in self.deleted_channels:
            return {"ok": False, "error": "channel_not_found"}
        info: dict[str, Any] = {"id": channel, "is_archived": channel in self.archived_channels}
        if channel in self.channel_names:
            info["name"] = self.channel_names[channel]
        return {"ok": True, "channel": info}

    def _conversation_members(self, args: dict[str, Any]) -> dict[str, Any]:
        """``conversations.members``, paged as Slack pages it (``limit``, ``cursor``)."""
        channel = str(args.get("channel", ""))
        if channel in self.deleted_channels or not channel:
            return {"ok": False, "error": "channel_not_found"}
        members = sorted(self.channel_members.get(channel, set()))
        limit, start = int(args.get("limit") or 100), int(args.get("cursor") or 0)
        page = members[start : start + limit]
        following = str(start + limit) if start + limit < len(members) else ""
        return {"ok": True, "members": page, "response_metadata": {"next_cursor": following}}

    def _user_info(self, args: dict[str, Any]) -> dict[str, Any]:
        user = str(args.get("user", ""))
        if not user:
            return {"ok": False, "error": "user_not_found"}
        info: dict[str, Any] = {"id": user, "team_id": self.team_id, "name": user.lower()}
        if user in self.user_timezones:
            info["tz"] = self.user_timezones[user]
        return {"ok": True, "user": info}

    def _get_upload_url(self, args: dict[str, Any]) -> dict[str, Any]:
        if not args.get("filename") or not str(args.get("length", "")).isdigit():
            return {"ok": False, "error": "invalid_arguments"}
        file_id = f"F{next(self._ids):06d}"
        self._pending_uploads[file_id] = _Received(str(args["filename"]), int(args["length"]))
        return {"ok": True, "upload_url": f"{self.base_url}/upload/{file_id}", "file_id": file_id}

    def _complete_upload(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = args.get("channel_id")
        if channel in self.not_in_channel:
            return {"ok": False, "error": "not_in_channel"}
        files = args.get("files") or []
        done: list[dict[str, Any]] = []
        for item in files:
            pending = self._pending_uploads.get(item.get("id"))
            if pending is None or pending.data is None:
                return {"ok": False, "error": "file_not_found"}
        for item in files:
            received = self._pending_uploads.pop(item["id"])
            assert received.data is not None
            title = item.get("title") or received.filename
            self.uploads.append(
                Upload(
                    item["id"],
                    received.filename,
                    title,
                    received.data,
                    channel,
                    args.get("thread_ts"),
                    size=received.size,
                    sha256=received.sha256,
                    length=received.length,
                    content_length=received.content_length,
                )
            )
            done.append({"id": item["id"], "name": received.filename, "title": title, "size": received.size})
        if channel and (args.get("initial_comment") or args.get("blocks")):
            # Shared with words: one message holding the text (or blocks) and the files.
            sections = [b["text"]["text"] for b in args.get("blocks") or [] if b.get("type") == "section"]
            text = str(args.get("initial_comment") or "\n".join(sections))
            message = Message(str(channel), self.next_ts(), text, args.get("thread_ts") or None, args.get("blocks"))
            message.files = [item["id"] for item in files]
            self.messages.append(message)
        return {"ok": True, "files": done}

    def _start_stream(self, args: dict[str, Any]) -> dict[str, Any]:
        if self.refuse_streaming:
            return {"ok": False, "error": self.refuse_streaming}
        channel = str(args.get("channel", ""))
        if channel in self.not_in_channel:
            return {"ok": False, "error": "not_in_channel"}
        if not args.get("thread_ts"):
            return {"ok": False, "error": "invalid_arguments"}
        if not channel.startswith("D") and not (args.get("recipient_user_id") and args.get("recipient_team_id")):
            return {"ok": False, "error": "missing_recipient_user_id"}  # required outside DMs
        message = Message(channel, self.next_ts(), "", str(args["thread_ts"]), None, stream_state="streaming")
        if (refused := self._streamed(message, args, "chat.startStream")) is not None:
            return refused
        self.messages.append(message)
        return {"ok": True, "channel": channel, "ts": message.ts}

    def _append_stream(self, args: dict[str, Any]) -> dict[str, Any]:
        message = self._find(args)
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        if message.stream_state != "streaming":
            return {"ok": False, "error": "message_not_in_streaming_state"}
        if not (args.get("markdown_text") or args.get("chunks")):
            return {"ok": False, "error": "no_text"}
        if (refused := self._streamed(message, args, "chat.appendStream")) is not None:
            return refused
        return {"ok": True, "channel": message.channel, "ts": message.ts}

    def _stop_stream(self, args: dict[str, Any]) -> dict[str, Any]:
        message = self._find(args)
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        if message.stream_state != "streaming":
            return {"ok": False, "error": "message_not_in_streaming_state"}
        if (refused := self._streamed(message, args, "chat.stopStream")) is not None:
            return refused
        message.stream_state = "stopped"
        message.blocks = args.get("blocks")
        return {"ok": True, "channel": message.channel, "ts": message.ts, "message": _as_event(message, self)}

    def _streamed(self, message: Message, args: dict[str, Any], method: str) -> dict[str, Any] | None:
        """Take the call's text and chunks into ``message``; Slack's refusal (recorded as a
        schema error, which fails the test) when a chunk is out of schema."""
        try:
            self._stream_in(message, args)
        except ValueError as exc:
            self.schema_errors.append(f"{method}: {exc}")
            return {"ok": False, "error": "invalid_arguments"}
        return None

    @staticmethod
    def _stream_in(message: Message, args: dict[str, Any]) -> bool:
        """Append the call's chunks in order (``markdown_text`` given alone is one text chunk):
        text to the message's text, task and plan updates to its ``chunks``; False if none.
        Raises :class:`ValueError` on a chunk Slack's docs would not take."""
        chunks = args.get("chunks") or []
        if isinstance(chunks, str):
            chunks = json.loads(chunks)
        if chunks and args.get("markdown_text"):
            raise ValueError("markdown_text and chunks in one call")
        if args.get("markdown_text"):
            chunks = [{"type": "markdown_text", "text": str(args["markdown_text"])}]
        for chunk in chunks:
            _check_chunk(chunk)
            if chunk["type"] == "markdown_text":
                message.pieces.append(chunk["text"])
                message.text += chunk["text"]
            message.chunks.append(dict(chunk))
        return bool(chunks)

    def _assistant(self, args: dict[str, Any], field_name: str) -> dict[str, Any]:
        where = (str(args.get("channel_id", "")), str(args.get("thread_ts", "")))
        # An agent app sets a DM's prompts without thread_ts (recorded under (channel, "")).
        if not where[0] or (not where[1] and field_name != "prompts"):
            return {"ok": False, "error": "invalid_arguments"}
        if field_name == "status":
            self.statuses.setdefault(where, []).append(str(args.get("status", "")))
        elif field_name == "title":
            self.titles[where] = str(args.get("title", ""))
        else:
            prompts = args.get("prompts")
            if isinstance(prompts, str):
                prompts = json.loads(prompts)
            self.suggested_prompts[where] = list(prompts or [])
        return {"ok": True}

    def _agent_session(self, args: dict[str, Any], rename: bool) -> dict[str, Any]:
        if self.refuse_sessions is not None:
            return {"ok": False, "error": self.refuse_sessions}
        where = (str(args.get("channel_id", "")), str(args.get("thread_ts", "")))
        if not all(where):
            return {"ok": False, "error": "invalid_arguments"}
        title = args.get("title")
        if rename:
            self.session_titles[where] = str(title or "")
            return {"ok": True}
        status = str(args.get("status", ""))
        if status not in ("active", "processing", "suspended", "closed"):
            return {"ok": False, "error": "invalid_status"}
        if where not in self.sessions and title:
            self.session_titles[where] = str(title)  # the title counts only when the session is created
        self.sessions.setdefault(where, []).append(status)
        return {"ok": True, "status": status, "title": self.session_titles.get(where, "")}

    def _connections_open(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "url": f"ws://127.0.0.1:{self.port}/socket?ticket={uuid.uuid4().hex}"}


_METHODS: dict[str, Callable[[FakeSlack, dict[str, Any]], dict[str, Any]]] = {
    "auth.test": FakeSlack._auth_test,
    "chat.postMessage": FakeSlack._post_message,
    "chat.update": FakeSlack._update,
    "chat.delete": FakeSlack._delete,
    "reactions.add": lambda s, a: s._reaction(a, True),
    "reactions.remove": lambda s, a: s._reaction(a, False),
    "conversations.replies": FakeSlack._replies,
    "conversations.info": FakeSlack._conversation_info,
    "conversations.members": FakeSlack._conversation_members,
    "users.info": FakeSlack._user_info,
    "files.getUploadURLExternal": FakeSlack._get_upload_url,
    "files.completeUploadExternal": FakeSlack._complete_upload,
    "apps.connections.open": FakeSlack._connections_open,
    "chat.startStream": FakeSlack._start_stream,
    "chat.appendStream": FakeSlack._append_stream,
    "chat.stopStream": FakeSlack._stop_stream,
    "assistant.threads.setStatus": lambda s, a: s._assistant(a, "status"),
    "assistant.threads.setTitle": lambda s, a: s._assistant(a, "title"),
    "assistant.threads.setSuggestedPrompts": lambda s, a: s._assistant(a, "prompts"),
    "agents.sessions.setStatus": lambda s, a: s._agent_session(a, rename=False),
    "agents.sessions.rename": lambda s, a: s._agent_session(a, rename=True),
}


#: Methods whose ``blocks`` the fake checks against Block Kit's documented limits.
_BLOCK_METHODS = frozenset({"chat.postMessage", "chat.update", "chat.stopStream", "files.completeUploadExternal"})


def _as_event(message: Message, slack: FakeSlack) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "message",
        "user": slack.bot_user_id,
        "bot_id": slack.bot_id,
        "text": message.text,
        "ts": message.ts,
        "channel": message.channel,
    }
    if message.thread_ts:
        event["thread_ts"] = message.thread_ts
    return event


async def _read_args(request: web.Request) -> dict[str, Any]:
    """Web API arguments from a JSON or form body plus the query string; JSON-in-form decoded."""
    args: dict[str, Any] = dict(request.query)
    if request.content_type == "application/json":
        args.update(await request.json())
    elif request.can_read_body:
        args.update({k: v for k, v in (await request.post()).items() if isinstance(v, str)})
    for key in ("blocks", "files", "attachments", "chunks", "prompts"):
        value = args.get(key)
        if isinstance(value, str) and value[:1] in "[{":
            args[key] = json.loads(value)
    return args
